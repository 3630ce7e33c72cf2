//! Command-line edge: argument parsing, logging setup, signals, exit codes. The only place
//! that uses `anyhow`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use zipline::config::{self, LoadOptions};

/// Zipline streams every insert, update and delete from PostgreSQL into MySQL/MariaDB, in
/// commit order per key.
#[derive(Debug, Parser)]
#[command(name = "zipline", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Work with pipeline files.
    #[command(subcommand)]
    Pipeline(PipelineCommand),
}

#[derive(Debug, Subcommand)]
enum PipelineCommand {
    /// Validate, then run a pipeline until Ctrl-C or SIGTERM (then drain and exit 0).
    Apply(FileArgs),
    /// Check a pipeline file without touching any database.
    Validate(FileArgs),
}

#[derive(Debug, clap::Args)]
struct FileArgs {
    /// The pipeline file.
    #[arg(short = 'f', long = "file")]
    file: PathBuf,
    /// Directory holding one file per secret ref (consulted after ZIPLINE_SECRET_<REF>).
    #[arg(long = "secrets-dir")]
    secrets_dir: Option<PathBuf>,
}

pub(crate) fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // `{:#}` prints the chain on one line: the message already names file, line, field.
            eprintln!("error: {err:#}");
            if err.downcast_ref::<config::ConfigError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("ZIPLINE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

fn load(args: &FileArgs) -> anyhow::Result<config::Pipeline> {
    let opts = LoadOptions::from_process_env(args.secrets_dir.clone());
    Ok(config::load(&args.file, &opts)?)
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Pipeline(PipelineCommand::Validate(args)) => {
            let pipeline = load(&args)?;
            println!(
                "{}: pipeline {} is valid ({} connectors, {} routes)",
                args.file.display(),
                pipeline.name,
                pipeline.connectors.len(),
                pipeline.routes.len()
            );
            Ok(())
        }
        Command::Pipeline(PipelineCommand::Apply(args)) => {
            let pipeline = load(&args)?;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            runtime.block_on(async move {
                zipline::pipeline::run(pipeline, shutdown_signal()).await?;
                Ok(())
            })
        }
    }
}

/// Resolves on the first Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C will stop the pipeline");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
