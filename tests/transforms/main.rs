//! WebAssembly transforms: the guests the host loads and refuses (`guests`), the example
//! guests in every language (`examples`), the `zipline transform` commands (`cli`,
//! `new_project`), and
//! transforms on running pipelines (`pipelines`).

#[path = "../common/mod.rs"]
pub mod common;
#[path = "../e2e/mod.rs"]
pub mod e2e;

mod cli;
mod examples;
mod guests;
mod new_project;
mod pipelines;
