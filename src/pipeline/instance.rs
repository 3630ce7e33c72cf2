//! This process's claim of its pipeline (see [`crate::checkpoint::fence`]): taken in every
//! sink before anything else happens, renewed while the pipeline runs, released on a clean
//! stop.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::checkpoint::Holder;
use crate::error::ErrorClass;
use crate::retry::{Backoff, Budget};
use crate::sink::{Lease, SinkConnector, SinkError};

/// How long a stop waits for the renewing task and for each release.
const RELEASE_WAIT: Duration = Duration::from_secs(3);

/// The claims of every sink, renewed by a task of their own.
pub(crate) struct Claims {
    stop: watch::Sender<bool>,
    task: JoinHandle<Vec<Box<dyn Lease>>>,
    /// Resolves when a renewal found another instance in charge (its error).
    pub(crate) lost: oneshot::Receiver<(String, SinkError)>,
}

/// Claims every sink, in name order (so two instances starting at once meet at the same
/// first sink and exactly one goes on). On a refusal the claims already taken are released.
pub(crate) async fn claim(
    sinks: &[Arc<dyn SinkConnector>],
    lease: Duration,
) -> Result<Claims, (String, SinkError)> {
    let holder = Holder::this_process();
    let mut order: Vec<&Arc<dyn SinkConnector>> = sinks.iter().collect();
    order.sort_by(|a, b| a.name().cmp(b.name()));
    order.dedup_by(|a, b| a.name() == b.name());
    let mut leases: Vec<(String, Box<dyn Lease>)> = Vec::with_capacity(order.len());
    for sink in order {
        match claim_one(&**sink, &holder, lease).await {
            Ok(l) => leases.push((sink.name().to_owned(), l)),
            Err(e) => {
                for (_, l) in leases {
                    l.release(None).await;
                }
                return Err((sink.name().to_owned(), e));
            }
        }
    }
    let (stop, stopped) = watch::channel(false);
    let (lost_tx, lost) = oneshot::channel();
    let task = tokio::spawn(renew(leases, lease / 3, stopped, lost_tx));
    Ok(Claims { stop, task, lost })
}

/// One sink's claim; a sink that cannot be reached yet is tried again for a while (the same
/// patience as a lane's connection), a refusal is final.
async fn claim_one(
    sink: &dyn SinkConnector,
    holder: &Holder,
    lease: Duration,
) -> Result<Box<dyn Lease>, SinkError> {
    let mut backoff = Backoff::new(
        format!("sink {}: cannot claim the sink yet; retrying", sink.name()),
        Budget::Retries(10),
    );
    loop {
        match sink.claim(holder, lease).await {
            Ok(l) => return Ok(l),
            Err(e) if e.class == ErrorClass::Transient && backoff.wait(&e).await => {}
            Err(e) => return Err(e),
        }
    }
}

async fn renew(
    mut leases: Vec<(String, Box<dyn Lease>)>,
    every: Duration,
    mut stopped: watch::Receiver<bool>,
    lost: oneshot::Sender<(String, SinkError)>,
) -> Vec<Box<dyn Lease>> {
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    let mut lost = Some(lost);
    loop {
        tokio::select! {
            _ = stopped.changed() => break,
            _ = ticker.tick() => {}
        }
        for (name, lease) in &mut leases {
            // A stalled fence session must not hold the renewals (or a stop) up.
            let renewed = tokio::time::timeout(every, lease.renew())
                .await
                .unwrap_or_else(|_| {
                    Err(SinkError::transient(format!(
                        "sink {name}: no answer to renewing the claim within {every:?}"
                    )))
                });
            match renewed {
                Ok(()) => {}
                Err(e) if e.class == ErrorClass::Transient => {
                    tracing::warn!(sink = %name, error = %crate::error::Report(&e), "cannot renew the pipeline's claim; the sink's writes stay fenced either way, retrying");
                }
                Err(e) => {
                    if let Some(tx) = lost.take() {
                        let _ = tx.send((name.clone(), e));
                    }
                }
            }
        }
    }
    leases.into_iter().map(|(_, l)| l).collect()
}

impl Claims {
    /// Stops renewing; when `release`, marks every claim released, so the next instance need
    /// not wait for the lease, with the error the pipeline stopped with (`failure`).
    pub(crate) async fn end(self, release: bool, failure: Option<String>) {
        let _ = self.stop.send(true);
        let mut task = self.task;
        let leases = match tokio::time::timeout(RELEASE_WAIT, &mut task).await {
            Ok(Ok(leases)) => leases,
            _ => {
                task.abort();
                return;
            }
        };
        if release {
            for lease in leases {
                // A claim not released in time lapses with its session or its lease.
                let _ = tokio::time::timeout(RELEASE_WAIT, lease.release(failure.clone())).await;
            }
        }
    }
}
