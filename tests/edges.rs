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

mod common;
mod e2e;

#[path = "edges/dead_letters.rs"]
mod dead_letters;
#[path = "edges/instances.rs"]
mod instances;
#[path = "edges/slots.rs"]
mod slots;
