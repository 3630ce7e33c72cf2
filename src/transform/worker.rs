//! [`RouteTransform`]: a route's [`Transformer`] on its own thread, called from async code.
//!
//! Guest code runs synchronously for up to its timeout, and wasmtime-wasi's synchronous
//! bindings enter a Tokio runtime of their own, which must not happen on a runtime worker.
//! So each route's instance lives on a dedicated thread; the source hands it a batch and
//! awaits the answer, meanwhile free to serve acks and keepalives. The thread ends when the
//! handle is dropped.

use std::sync::Arc;
use std::sync::mpsc;

use tokio::sync::oneshot;

use super::TransformError;
use super::policy::{TransformStats, Transformer};
use crate::change::Change;
use crate::config::TransformSpec;

type Reply = oneshot::Sender<Result<Vec<(usize, Change)>, TransformError>>;

/// A route's transform, ready to take batches.
pub struct RouteTransform {
    jobs: mpsc::Sender<(Vec<Change>, Reply)>,
    route: String,
    module: String,
    batch_size: usize,
    stats: Arc<TransformStats>,
}

impl std::fmt::Debug for RouteTransform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteTransform")
            .field("route", &self.route)
            .field("module", &self.module)
            .field("batch_size", &self.batch_size)
            .finish_non_exhaustive()
    }
}

impl RouteTransform {
    /// Loads the module and starts an instance (running `init`) on a new thread, counting
    /// into `stats`.
    pub async fn start(
        route: &str,
        spec: &TransformSpec,
        stats: Arc<TransformStats>,
    ) -> Result<RouteTransform, TransformError> {
        let (ready_tx, ready_rx) = oneshot::channel();
        let (jobs, rx) = mpsc::channel::<(Vec<Change>, Reply)>();
        let (route_owned, spec_owned) = (route.to_owned(), spec.clone());
        std::thread::Builder::new()
            .name(format!("zipline-transform-{route}"))
            .spawn(move || {
                let mut t = match Transformer::new(&route_owned, &spec_owned) {
                    Ok(t) => t.counting_into(stats),
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                if ready_tx.send(Ok(t.stats())).is_err() {
                    return;
                }
                while let Ok((changes, reply)) = rx.recv() {
                    let _ = reply.send(t.transform(changes));
                    // While the source dispatches the outputs.
                    t.release();
                }
            })
            .map_err(|e| TransformError::Stopped {
                route: format!("{route} (cannot start its thread: {e})"),
            })?;
        let stats = ready_rx.await.map_err(|_| TransformError::Stopped {
            route: route.to_owned(),
        })??;
        tracing::info!(route, module = %spec.module_label, on_error = spec.on_error.as_str(), batch_size = spec.batch_size, "transform ready");
        Ok(RouteTransform {
            jobs,
            route: route.to_owned(),
            module: spec.module_label.clone(),
            batch_size: spec.batch_size,
            stats,
        })
    }

    /// Hands `changes` to the transform's thread; the future resolves to what
    /// [`Transformer::transform`] returned. It borrows nothing, so the caller may go on using
    /// its state (serving acks, say) while it waits.
    pub fn transform(
        &self,
        changes: Vec<Change>,
    ) -> impl Future<Output = Result<Vec<(usize, Change)>, TransformError>> + Send + 'static {
        let route = self.route.clone();
        let (tx, rx) = oneshot::channel();
        let sent = self.jobs.send((changes, tx)).is_ok();
        async move {
            let stopped = || TransformError::Stopped { route };
            if !sent {
                return Err(stopped());
            }
            rx.await.map_err(|_| stopped())?
        }
    }

    /// Most changes to collect before calling [`RouteTransform::transform`].
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// The counters.
    pub fn stats(&self) -> &Arc<TransformStats> {
        &self.stats
    }
}

impl Drop for RouteTransform {
    fn drop(&mut self) {
        let n = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        let s = &self.stats;
        tracing::info!(
            route = %self.route,
            module = %self.module,
            changes_in = n(&s.changes_in),
            changes_out = n(&s.changes_out),
            skipped = n(&s.skipped),
            dead_lettered = n(&s.dead_lettered),
            restarts = n(&s.restarts),
            calls = n(&s.calls),
            "transform stopped"
        );
    }
}
