//! Sources of changes.
pub mod postgres;
