//! Entry points for the micro-benchmarks (`benches/micro.rs`): the crate-private hot paths of
//! a change's way through the runtime, driven on in-memory data. Compiled only with the
//! `bench` feature, and not a stable API: it follows the internals it measures.
//!
//! The rest of the way (routing by key hash, the dispatcher's handoff to lane queues, acks
//! and the frontier) is public already and benchmarked through [`crate::runtime::Dispatcher`].

pub use crate::sink::bench::coalesced;
pub use crate::source::postgres::bench::PgoutputDecoder;

/// Statement building of the MySQL/MariaDB sink.
pub mod mysql {
    pub use crate::sink::mysql::bench::{bulk_statements, statements};
}

/// Statement building of the PostgreSQL sink.
pub mod postgres {
    pub use crate::sink::postgres::bench::statements;
}
