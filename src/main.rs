//! The `zipline` command.

mod cli;

// Zipline allocates small, short-lived buffers per change on several threads (values, SQL
// text, WIT batches); mimalloc's thread-local free lists cost less per change than glibc's
// arenas (benches/replication.rs and benches/transform.rs measure with it).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    cli::main()
}
