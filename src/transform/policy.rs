//! [`Transformer`]: one route's transform with its failure policy — calls the instance, throws
//! it away after a trap and starts a fresh one, finds which changes of a failed batch are to
//! blame, and applies `on_error` to each of them.
//!
//! A failed call (trap, timeout, limit, `err`, invalid output) does not say which change
//! caused it, and batch boundaries depend on timing, so blaming the whole batch would make the
//! outcome depend on timing too. Instead each change of a failed batch is run again alone (in a
//! fresh instance when the last one trapped): the changes that succeed alone go through, the
//! ones that fail alone get the policy. With `halt` the first change that fails alone stops the
//! route, named in the error. A guest that fails on everything thus costs one call per change;
//! that is the price of never dropping an innocent change.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::TransformError;
use super::bindings::InputBatch;
use super::dead_letter::DeadLetter;
use super::engine::Module;
use super::output::{Checked, TableCache};
use super::runner::{Failure, Instance};
use crate::change::Change;
use crate::config::{OnError, TransformSpec};
use crate::metrics::{Histogram, SECONDS};

/// Counters of one route's transform.
#[derive(Debug)]
pub struct TransformStats {
    /// Calls into the component (including single-change retries).
    pub calls: AtomicU64,
    /// Changes handed to the transform.
    pub changes_in: AtomicU64,
    /// Changes it produced (what the lanes received).
    pub changes_out: AtomicU64,
    /// Changes skipped under `on_error: skip`.
    pub skipped: AtomicU64,
    /// Changes written to the dead-letter file.
    pub dead_lettered: AtomicU64,
    /// Instances thrown away after a trap, timeout or limit breach.
    pub restarts: AtomicU64,
    /// Changes the transform failed on, whatever `on_error` then did with them.
    pub failed: AtomicU64,
    /// Changes that produced no output (filtered out, or failed and set aside).
    pub dropped: AtomicU64,
    /// Seconds per batch, single-change retries included.
    pub seconds: Histogram,
}

impl Default for TransformStats {
    fn default() -> Self {
        TransformStats {
            calls: AtomicU64::new(0),
            changes_in: AtomicU64::new(0),
            changes_out: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            dead_lettered: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            seconds: Histogram::new(SECONDS),
        }
    }
}

/// A route's transform, synchronous: [`super::RouteTransform`] runs one on its own thread;
/// `zipline transform test` and the benchmarks use one directly.
pub struct Transformer {
    module: Arc<Module>,
    route: String,
    spec: TransformSpec,
    instance: Option<Instance>,
    cache: TableCache,
    dead_letter: DeadLetter,
    stats: Arc<TransformStats>,
    /// The last batch's input, kept until [`Transformer::release`]: freeing its thousands of
    /// values is work the caller need not wait for.
    spent: Option<InputBatch>,
}

impl std::fmt::Debug for Transformer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transformer")
            .field("route", &self.route)
            .field("module", &self.module.name)
            .finish_non_exhaustive()
    }
}

impl Transformer {
    /// Loads the module of `spec` and starts an instance (running `init`).
    pub fn new(route: &str, spec: &TransformSpec) -> Result<Self, TransformError> {
        let module = Module::load(&spec.module, &spec.module_label).map_err(|message| {
            TransformError::Module {
                module: spec.module_label.clone(),
                message,
            }
        })?;
        Transformer::with_module(module, route, spec)
    }

    /// Starts an instance of an already loaded module.
    pub fn with_module(
        module: Arc<Module>,
        route: &str,
        spec: &TransformSpec,
    ) -> Result<Self, TransformError> {
        let instance =
            Instance::start(&module, route, spec.limits, &spec.config).map_err(|message| {
                TransformError::Init {
                    route: route.to_owned(),
                    module: spec.module_label.clone(),
                    message,
                }
            })?;
        Ok(Transformer {
            module,
            route: route.to_owned(),
            spec: spec.clone(),
            instance: Some(instance),
            cache: TableCache::default(),
            dead_letter: DeadLetter::new(&spec.dead_letter),
            stats: Arc::new(TransformStats::default()),
            spent: None,
        })
    }

    /// The counters, shared.
    pub fn stats(&self) -> Arc<TransformStats> {
        self.stats.clone()
    }

    /// Counts into `stats` from now on (counters that outlive this instance).
    pub fn counting_into(mut self, stats: Arc<TransformStats>) -> Self {
        self.stats = stats;
        self
    }

    /// Transforms `changes` (in commit order, distinct positions). Returns what the lanes
    /// should receive as `(input index, change)` in input order; fanned-out changes carry
    /// `position.sub` 0, 1, 2…. Failed changes have been skipped or dead-lettered (durably)
    /// per policy; `Err` means the route must halt.
    pub fn transform(
        &mut self,
        changes: Vec<Change>,
    ) -> Result<Vec<(usize, Change)>, TransformError> {
        self.release();
        let started = std::time::Instant::now();
        let n = changes.len();
        self.stats.changes_in.fetch_add(n as u64, Ordering::Relaxed);
        let input = InputBatch::new(changes);
        let mut outputs = Vec::new();
        match self.call(&input) {
            Ok(checked) => self.accept(&input, checked, |i| i, &mut outputs)?,
            Err(failure) if n == 1 => self.fail(&input, 0, &failure.reason)?,
            Err(failure) => {
                tracing::warn!(route = %self.route, module = %self.module.name, changes = n, reason = %failure.reason, "transform failed on a batch; retrying its changes one at a time");
                for i in 0..n {
                    let single = input.single(i);
                    match self.call(&single) {
                        Ok(checked) => self.accept(&single, checked, |_| i, &mut outputs)?,
                        Err(f) => self.fail(&input, i, &f.reason)?,
                    }
                }
            }
        }
        self.dead_letter
            .sync()
            .map_err(|e| self.dead_letter_error(&e))?;
        self.stats
            .changes_out
            .fetch_add(outputs.len() as u64, Ordering::Relaxed);
        // Outputs come in input order: count the inputs that produced any.
        let mut produced = 0u64;
        let mut last = None;
        for (i, _) in &outputs {
            if last != Some(*i) {
                produced += 1;
                last = Some(*i);
            }
        }
        self.stats
            .dropped
            .fetch_add((n as u64).saturating_sub(produced), Ordering::Relaxed);
        self.stats.seconds.observe(started.elapsed().as_secs_f64());
        self.spent = Some(input);
        Ok(outputs)
    }

    /// Frees the last batch's input (the next [`Transformer::transform`] does it otherwise).
    /// [`super::RouteTransform`]'s thread calls it after handing the outputs over.
    pub fn release(&mut self) {
        self.spent = None;
    }

    fn call(&mut self, input: &InputBatch) -> Result<Checked, Failure> {
        if self.instance.is_none() {
            let fresh = Instance::start(
                &self.module,
                &self.route,
                self.spec.limits,
                &self.spec.config,
            )
            .map_err(|reason| Failure {
                reason: format!("cannot restart the transform: {reason}"),
                broken: true,
            })?;
            self.instance = Some(fresh);
        }
        let Some(instance) = self.instance.as_mut() else {
            unreachable!("an instance was just started")
        };
        self.stats.calls.fetch_add(1, Ordering::Relaxed);
        let result = instance.call(input, &mut self.cache);
        if let Err(f) = &result
            && f.broken
        {
            // Its memory and globals may be mid-update: never call it again.
            self.instance = None;
            self.stats.restarts.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    fn accept(
        &mut self,
        input: &InputBatch,
        checked: Checked,
        index: impl Fn(usize) -> usize,
        outputs: &mut Vec<(usize, Change)>,
    ) -> Result<(), TransformError> {
        for (i, message) in &checked.errors {
            self.fail(
                input,
                *i,
                &format!("the transform refused the change: {message}"),
            )?;
        }
        outputs.extend(checked.outputs.into_iter().map(|(i, c)| (index(i), c)));
        Ok(())
    }

    /// Applies the policy to input change `i`.
    fn fail(&mut self, input: &InputBatch, i: usize, reason: &str) -> Result<(), TransformError> {
        let change = input.change(i);
        self.stats.failed.fetch_add(1, Ordering::Relaxed);
        let (route, module) = (&self.route, &*self.module.name);
        let (position, table, op) = (
            change.position,
            change.table.qualified_name(),
            change.op.as_str(),
        );
        match self.spec.on_error {
            OnError::Halt => Err(TransformError::Halted {
                route: route.clone(),
                module: module.to_owned(),
                change: format!("{position} ({op} on {table})"),
                reason: reason.to_owned(),
            }),
            OnError::Skip => {
                tracing::warn!(route = %route, module, %position, table, op, reason, "transform failed on a change; skipped (on_error: skip)");
                self.stats.skipped.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            OnError::DeadLetter => {
                self.dead_letter
                    .append(route, module, &change, reason)
                    .map_err(|e| self.dead_letter_error(&e))?;
                tracing::warn!(route = %route, module, %position, table, op, reason, file = %self.dead_letter.path().display(), "transform failed on a change; dead-lettered");
                self.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
        }
    }

    fn dead_letter_error(&self, e: &std::io::Error) -> TransformError {
        TransformError::DeadLetter {
            route: self.route.clone(),
            path: self.dead_letter.path().display().to_string(),
            message: e.to_string(),
        }
    }
}
