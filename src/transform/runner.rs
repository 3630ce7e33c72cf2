//! One live instance of a transform: its own store (memory, limits, WASI context), `init`
//! called once, then `transform` per batch under a time limit.
//!
//! A call ends one of four ways: a checked output, a refusal (`err`: the instance is fine),
//! an invalid output (the instance is fine, its answer is not), or a trap — a timeout, a
//! memory limit, `unreachable` (a Rust panic), a stack overflow — after which the instance's
//! state is unknown and the caller must throw it away ([`Failure::broken`]).

use std::sync::Arc;
use std::time::Duration;

use wasmtime::{Store, Trap};

use super::abi::{OutputSize, hostcall_fuel};
use super::bindings::{InputBatch, Transform};
use super::engine::{Module, TICK};
use super::host::{HostState, LogTags};
use super::output::{Checked, TableCache, check_output};
use crate::config::TransformLimits;

/// Why a call produced no usable output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    /// What happened, for logs, errors and dead letters.
    pub(crate) reason: String,
    /// The instance trapped; it must not be called again.
    pub(crate) broken: bool,
}

pub(crate) struct Instance {
    store: Store<HostState>,
    bindings: Transform,
    limits: TransformLimits,
}

impl Instance {
    /// Instantiates `module` and calls its `init` with `config`. `Err` is the reason.
    pub(crate) fn start(
        module: &Module,
        route: &str,
        limits: TransformLimits,
        config: &[(String, String)],
    ) -> Result<Instance, String> {
        let tags = LogTags {
            route: route.into(),
            module: Arc::clone(&module.name),
        };
        let mut store = Store::new(module.pre.engine(), HostState::new(tags, limits.memory));
        store.limiter(|s| &mut s.limiter);
        // wasmtime's own cap on what one call copies out of the guest (128 MiB by default)
        // must not fire before `limits.output` does.
        store.set_hostcall_fuel(hostcall_fuel(limits.output));
        store.set_epoch_deadline(deadline_ticks(limits.timeout));
        store.epoch_deadline_trap();
        let linked = module
            .pre
            .instance_pre()
            .instantiate(&mut store)
            .and_then(|instance| Transform::new(&mut store, &instance));
        let bindings = match linked {
            Ok(b) => b,
            Err(e) => {
                let why = describe(&e, &mut store, limits.timeout);
                store.data_mut().end_call();
                return Err(format!("cannot instantiate: {why}"));
            }
        };
        let mut inst = Instance {
            store,
            bindings,
            limits,
        };
        let result = inst.bindings.call_init(&mut inst.store, config);
        inst.store.data_mut().end_call();
        match result {
            Ok(Ok(())) => Ok(inst),
            Ok(Err(msg)) => Err(format!("init refused the config: {msg}")),
            Err(e) => Err(format!(
                "init failed: {}",
                describe(&e, &mut inst.store, limits.timeout)
            )),
        }
    }

    /// One `transform` call over `input`, checked.
    pub(crate) fn call(
        &mut self,
        input: &InputBatch,
        cache: &mut TableCache,
    ) -> Result<Checked, Failure> {
        self.store
            .set_epoch_deadline(deadline_ticks(self.limits.timeout));
        self.store.data_mut().take_last_error_log();
        let limit = self.limits.output;
        let result = self.bindings.call_transform(&mut self.store, &input.wit);
        self.store.data_mut().end_call();
        let invalid = |m: String| Failure {
            reason: format!("invalid output: {m}"),
            broken: false,
        };
        match result {
            Ok(Ok(output)) => {
                let size = OutputSize::of(&output);
                if size.total > limit {
                    return Err(invalid(size.refusal(limit)));
                }
                check_output(output, input, cache, limit).map_err(invalid)
            }
            Ok(Err(msg)) if msg.len() as u64 > limit => Err(invalid(format!(
                "the transform returned an error message of {} bytes, over the limit of \
                 {limit} bytes (limits.output)",
                msg.len()
            ))),
            Ok(Err(msg)) => Err(Failure {
                reason: format!("the transform returned an error: {msg}"),
                broken: false,
            }),
            Err(e) => Err(Failure {
                reason: describe(&e, &mut self.store, self.limits.timeout),
                broken: true,
            }),
        }
    }
}

/// Ticks until a call started now must stop: the timeout rounded up, plus one because the
/// current tick may be almost over.
fn deadline_ticks(timeout: Duration) -> u64 {
    (timeout.as_nanos().div_ceil(TICK.as_nanos()) as u64).max(1) + 1
}

/// A trap or host error, in an operator's words.
fn describe(e: &wasmtime::Error, store: &mut Store<HostState>, timeout: Duration) -> String {
    let last_log = store.data_mut().take_last_error_log();
    let mut why = if let Some(bytes) = store.data_mut().limiter.denied.take() {
        format!(
            "memory limit exceeded: the guest tried to grow its memory to {} (limits.memory is {})",
            mib(bytes as u64),
            mib(store.data().limiter.limit())
        )
    } else {
        match e.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => format!("timed out after {timeout:?} (limits.timeout)"),
            Some(Trap::UnreachableCodeReached) => {
                "trapped: unreachable code reached (a panic or abort in the guest)".to_owned()
            }
            Some(Trap::StackOverflow) => "trapped: stack overflow".to_owned(),
            Some(t) => format!("trapped: {t}"),
            None => format!("{e:#}"),
        }
    };
    if let Some(line) = last_log {
        why.push_str(&format!(" (last guest error log: {line})"));
    }
    why
}

fn mib(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{}MiB", bytes >> 20)
    } else {
        format!("{bytes} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_round_up_and_add_a_tick() {
        assert_eq!(deadline_ticks(Duration::from_millis(200)), 21);
        assert_eq!(deadline_ticks(Duration::from_millis(1)), 2);
        assert_eq!(deadline_ticks(Duration::from_millis(15)), 3);
    }

    #[test]
    fn sizes_print_in_mib_when_whole() {
        assert_eq!(mib(64 << 20), "64MiB");
        assert_eq!(mib(1000), "1000 bytes");
    }
}
