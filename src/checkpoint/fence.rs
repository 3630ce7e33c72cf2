//! One live instance per pipeline: the claim each process takes in every sink before it does
//! anything else, and the epoch that fences out a process that lost it.
//!
//! Two instances of one pipeline writing into one sink lose rows silently: each replays and
//! overwrites what the other applied, and a snapshot reloads chunks under rows the other is
//! streaming into. So every sink keeps a *fence row* per (pipeline, sink connector) in
//! [`FENCE_TABLE`]: the claim's epoch, who holds it (pid, host, since when) and a heartbeat.
//!
//! - **Claim.** At start a process takes a session-level lock (MySQL `GET_LOCK`, PostgreSQL
//!   `pg_try_advisory_lock`) on a fence connection it keeps open, then raises the epoch by one
//!   and records itself. While a live holder keeps that lock, a second process is refused at
//!   once, naming the holder. A holder that was SIGKILLed loses its session with its process, so
//!   a restart proceeds at once. A holder whose session lingers though it stopped heartbeating
//!   (a frozen process, a machine that vanished) is taken over once its heartbeat is older than
//!   the lease: its fence session is terminated and the epoch raised.
//! - **Fence.** Every transaction that writes the sink (a lane's batch, a truncate, a snapshot
//!   chunk, the snapshot state, raising idle checkpoints) checks under a shared lock that the
//!   fence row still holds the writer's epoch, and fails otherwise, so it commits nothing. The
//!   claim raises the epoch under the exclusive form of that lock, so it waits for writes in
//!   flight and every later write of the old holder fails. A zombie therefore cannot write,
//!   whatever its sessions and clocks do.
//! - **Heartbeat.** The holder renews the fence row every third of the lease; a renewal that
//!   finds another epoch stops the pipeline.
//!
//! The SQL lives with each sink (`sink/mysql/fence.rs`, `sink/postgres/fence.rs`); the
//! decisions and the messages are here.

use std::time::Duration;

use sha2::{Digest, Sha256};

/// The fence table, next to the checkpoint table.
pub(crate) const FENCE_TABLE: &str = "_zipline_fence";

/// Claim attempts that find the lock held but no fence row yet (another instance is in the
/// middle of claiming) before the claim is refused.
pub(crate) const STARTING_RETRIES: u32 = 25;

/// The process that runs a pipeline, as recorded in each sink's fence row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Operating-system process id.
    pub pid: u32,
    /// Host name.
    pub host: String,
}

impl Holder {
    /// This process.
    pub fn this_process() -> Holder {
        Holder {
            pid: std::process::id(),
            host: host_name(),
        }
    }
}

/// The kernel's host name (what `hostname` prints), read without `unsafe`.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// A fence row as read back from a sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FenceRow {
    pub(crate) epoch: u64,
    pub(crate) pid: u32,
    pub(crate) host: String,
    /// When the holder claimed, `YYYY-MM-DD HH:MM:SS` UTC.
    pub(crate) started_at: String,
    /// How long ago the holder last renewed its heartbeat, by the sink server's clock.
    pub(crate) heartbeat_age: Duration,
    /// The holder stopped cleanly (it released the claim).
    pub(crate) stopped: bool,
}

/// What a claim does when the liveness lock is held by another session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// A live holder: refuse, naming it.
    Refuse(FenceRow),
    /// The holder stopped heartbeating a lease ago but its session lingers: terminate that
    /// session and claim.
    TakeOver(FenceRow),
    /// Another process holds the lock but has not recorded itself yet (it is claiming right
    /// now): look again shortly.
    Wait,
}

/// Decides what to do about a held lock, from the fence row (`None`: no row yet).
pub(crate) fn judge(row: Option<FenceRow>, lease: Duration) -> Verdict {
    match row {
        None => Verdict::Wait,
        Some(row) if row.stopped || row.heartbeat_age >= lease => Verdict::TakeOver(row),
        Some(row) => Verdict::Refuse(row),
    }
}

/// The refusal of a second instance.
pub(crate) fn refusal(pipeline: &str, sink: &str, row: &FenceRow, lease: Duration) -> String {
    format!(
        "sink {sink}: pipeline {pipeline} is already running: process {} on host {} has held \
         it since {} UTC (last heartbeat {:.1}s ago, epoch {}); stop that instance first. \
         Zipline runs one instance per pipeline; an instance that vanished without releasing \
         its claim is taken over once its heartbeat is {}s old (settings.instance_lease)",
        row.pid,
        row.host,
        row.started_at,
        row.heartbeat_age.as_secs_f64(),
        row.epoch,
        lease.as_secs()
    )
}

/// The refusal when the lock stays held but no holder ever records itself.
pub(crate) fn refusal_unknown(pipeline: &str, sink: &str) -> String {
    format!(
        "sink {sink}: pipeline {pipeline} is being started by another instance (it holds the \
         claim's lock but has not recorded itself); stop it first"
    )
}

/// The error of a write or heartbeat that found another instance's epoch.
pub(crate) fn fenced(pipeline: &str, sink: &str, mine: u64, row: Option<&FenceRow>) -> String {
    match row {
        Some(row) => format!(
            "sink {sink}: another instance of pipeline {pipeline} took over this sink (process \
             {} on host {} since {} UTC, epoch {} > this instance's {mine}); this instance \
             stops without writing anything more",
            row.pid, row.host, row.started_at, row.epoch
        ),
        None => format!(
            "sink {sink}: the claim of pipeline {pipeline} (epoch {mine}) is gone from \
             {FENCE_TABLE} (was the sink's state dropped?); this instance stops without \
             writing anything more"
        ),
    }
}

/// Log line of a takeover.
pub(crate) fn log_takeover(pipeline: &str, sink: &str, row: &FenceRow) {
    tracing::warn!(
        pipeline,
        sink,
        previous_pid = row.pid,
        previous_host = %row.host,
        since = %row.started_at,
        heartbeat_age_secs = row.heartbeat_age.as_secs(),
        "taking over from an instance that stopped heartbeating (its session lingers); its writes are fenced out"
    );
}

/// The 64-bit keys of a sink's locks for (`scope`, pipeline, connector): `scope` is the
/// database or schema the fence table lives in. `live` is the holder's session lock, `fence`
/// the lock writers share and a claim takes exclusively.
pub(crate) fn lock_keys(scope: &str, pipeline: &str, connector: &str) -> (i64, i64) {
    let digest = Sha256::new()
        .chain_update(scope.as_bytes())
        .chain_update([0])
        .chain_update(pipeline.as_bytes())
        .chain_update([0])
        .chain_update(connector.as_bytes())
        .finalize();
    let word = |i: usize| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&digest[i..i + 8]);
        i64::from_be_bytes(bytes)
    };
    (word(0), word(8))
}

/// The name of a MySQL user lock (at most 64 characters) for the same triple.
pub(crate) fn lock_name(scope: &str, pipeline: &str, connector: &str) -> String {
    let (live, _) = lock_keys(scope, pipeline, connector);
    format!("zipline-fence-{live:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(age_secs: u64, stopped: bool) -> FenceRow {
        FenceRow {
            epoch: 3,
            pid: 4242,
            host: "db-7".into(),
            started_at: "2026-12-01 20:00:00".into(),
            heartbeat_age: Duration::from_secs(age_secs),
            stopped,
        }
    }

    #[test]
    fn a_fresh_heartbeat_is_a_live_holder() {
        let lease = Duration::from_secs(30);
        assert_eq!(
            judge(Some(row(2, false)), lease),
            Verdict::Refuse(row(2, false))
        );
        assert_eq!(
            judge(Some(row(30, false)), lease),
            Verdict::TakeOver(row(30, false))
        );
        assert_eq!(
            judge(Some(row(1, true)), lease),
            Verdict::TakeOver(row(1, true))
        );
        assert_eq!(judge(None, lease), Verdict::Wait);
    }

    #[test]
    fn the_refusal_names_the_holder() {
        let text = refusal("orders", "out", &row(2, false), Duration::from_secs(30));
        assert_eq!(
            text,
            "sink out: pipeline orders is already running: process 4242 on host db-7 has held \
             it since 2026-12-01 20:00:00 UTC (last heartbeat 2.0s ago, epoch 3); stop that \
             instance first. Zipline runs one instance per pipeline; an instance that vanished \
             without releasing its claim is taken over once its heartbeat is 30s old \
             (settings.instance_lease)"
        );
        let text = fenced("orders", "out", 2, Some(&row(0, false)));
        assert!(text.contains("epoch 3 > this instance's 2"), "{text}");
    }

    #[test]
    fn lock_keys_differ_by_every_part() {
        let a = lock_keys("shop", "orders", "out");
        assert_ne!(a, lock_keys("shop", "orders", "out2"));
        assert_ne!(a, lock_keys("shop2", "orders", "out"));
        assert_ne!(a, lock_keys("shop", "ordersout", ""));
        assert_ne!(a.0, a.1);
        let name = lock_name("shop", "orders", "out");
        assert!(
            name.len() <= 64 && name.starts_with("zipline-fence-"),
            "{name}"
        );
    }
}
