//! The SQL Server CDC source: against a TDS mock (`mock`, runs everywhere) and against a
//! live server when one is configured (`live`).

#[path = "../common/mod.rs"]
pub mod common;
#[path = "../e2e/mod.rs"]
pub mod e2e;

mod live;
mod mock;
