//! Every row, even at the edges: the situations where rows used to be lost silently, each
//! reproduced against real servers and the real binary.
//!
//! - `instances`: a second `pipeline apply` of a running pipeline (during its initial
//!   snapshot, and later) is refused at once naming the holder; a frozen instance is taken
//!   over once its heartbeat is a lease old, and when it wakes up it stops without writing.
//! - `dead_letters`: a row the sink rejects follows `on_error`: dead-lettered with its key
//!   parked and replayed in order by `zipline dlq replay` (a conflict on the sink's extra
//!   unique key included), skipped, or halting with the row named.
//! - `slots`: a vanished or invalidated slot, a dropped publication, and a sink that lost its
//!   state stop with the way on (`--resnapshot`, `snapshot: when_needed`), which converges; an
//!   idle publication pins no WAL while another database writes.
//! - `tables`: a column type changed while stopped, a table dropped and created again while
//!   running or while stopped (and gone from the publication): stops naming the change and
//!   the way on, or `on_table_recreate: resnapshot` copies the table again and follows it.
//! - `chaos`: a random mixed workload under random SIGKILLs, sink crashes, source restarts,
//!   cut and stalled connections and poison rows; everything converges and every dead letter
//!   is accounted for (`ZIPLINE_CHAOS_ROUNDS` sets the number of faults).
//! - `timeouts`: a source that never answers its handshake, a stalled sink connection, a
//!   SIGTERM while the sink stalls, a sink outage ridden out and one that lasts too long.

pub mod common;
pub mod e2e;

#[path = "edges/chaos.rs"]
mod chaos;
#[path = "edges/dead_letters.rs"]
mod dead_letters;
#[path = "edges/instances.rs"]
mod instances;
#[path = "edges/slots.rs"]
mod slots;
#[path = "edges/steps.rs"]
mod steps;
#[path = "edges/tables.rs"]
mod tables;
#[path = "edges/timeouts.rs"]
mod timeouts;
