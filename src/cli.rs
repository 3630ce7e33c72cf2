//! Command-line edge: argument parsing, logging setup, signals, exit codes. The only place
//! that uses `anyhow`.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use zipline::config::{self, LoadOptions};

mod status;
mod transform;

use transform::TransformCommand;

/// What every command's help ends with: exit codes and the environment it reads.
const EXIT_AND_ENV: &str = "\
Exit codes:
  0  done; for `pipeline apply`: stopped by Ctrl-C or SIGTERM after draining (every committed
     change confirmed)
  1  a failure at run time: a database refused or failed, a transform halted, another instance
     holds the pipeline; the message says what happened and what to do
  2  a bad command line or pipeline file; the message names the file, line and field

Environment:
  ZIPLINE_LOG              log filter, default `info` (e.g. `debug`, `zipline=debug,info`);
                           logs go to stderr
  ZIPLINE_LOG_FORMAT       `text` or `json`, as --log-format (which wins)
  ZIPLINE_SECRET_<REF>     the value of secret ref <REF> (upper case, `-` as `_`): the
                           ref `pg-password` is read from ZIPLINE_SECRET_PG_PASSWORD, then
                           from <secrets-dir>/pg-password
  ZIPLINE_TRANSFORM_CACHE  where compiled transforms are cached (default
                           $XDG_CACHE_HOME/zipline/transforms or ~/.cache/zipline/transforms;
                           `off` disables it)
  ${VAR}, ${VAR:-default}  any variable a pipeline file names";

const MAIN_HELP: &str = "\
Examples:
  zipline pipeline validate -f pipeline.yaml
  zipline pipeline apply -f pipeline.yaml
  zipline pipeline status -f pipeline.yaml
  zipline transform test --module mask.wasm --config columns=email --input changes.jsonl
  zipline dlq list -f pipeline.yaml
  zipline completions bash > zipline.bash
";

const APPLY_HELP: &str = "\
Examples:
  zipline pipeline apply -f pipeline.yaml
  ZIPLINE_SECRET_PG_PASSWORD=... zipline pipeline apply -f pipeline.yaml --secrets-dir /run/secrets
  zipline pipeline apply -f pipeline.yaml --resnapshot
  zipline pipeline apply -f pipeline.yaml --log-format json
";

const COMPLETIONS_HELP: &str = "\
Examples:
  zipline completions bash > zipline.bash
  zipline completions zsh > _zipline
  zipline completions fish > zipline.fish

Install: bash: into ~/.local/share/bash-completion/completions/zipline; zsh: `_zipline` into a
directory of $fpath; fish: into ~/.config/fish/completions/zipline.fish.
";

const VALIDATE_HELP: &str = "\
Examples:
  zipline pipeline validate -f pipeline.yaml
  POSTGRES_HOST=db.internal zipline pipeline validate -f pipeline.yaml
";

const STATUS_HELP: &str = "\
Examples:
  zipline pipeline status -f pipeline.yaml
  zipline pipeline status -f pipeline.yaml --watch
  zipline pipeline status -f pipeline.yaml --json > status.json
";

const DROP_HELP: &str = "\
Examples:
  zipline pipeline drop -f pipeline.yaml
  zipline pipeline drop -f pipeline.yaml --yes
";

const DLQ_LIST_HELP: &str = "\
Examples:
  zipline dlq list -f pipeline.yaml
  zipline dlq list -f pipeline.yaml --json
";

const DLQ_REPLAY_HELP: &str = "\
Examples:
  zipline dlq replay -f pipeline.yaml --id 3 --id 7
  zipline dlq replay -f pipeline.yaml --all
";

/// Zipline streams every insert, update and delete from PostgreSQL (or SQL Server) into
/// MySQL/MariaDB or PostgreSQL, in commit order per key.
#[derive(Debug, Parser)]
#[command(name = "zipline", version, about, after_help = format!("{MAIN_HELP}\n{EXIT_AND_ENV}"))]
struct Cli {
    /// Log lines as `text` (for people) or `json` (one object per line, for log collectors).
    /// Default: text when stderr is a terminal, json otherwise.
    #[arg(long, global = true, value_enum, value_name = "FORMAT")]
    log_format: Option<LogFormat>,
    #[command(subcommand)]
    command: Command,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines, coloured on a terminal.
    Text,
    /// One JSON object per line: timestamp, level, message and every field.
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Work with pipeline files.
    #[command(subcommand)]
    Pipeline(PipelineCommand),
    /// Work with WebAssembly transforms.
    #[command(subcommand)]
    Transform(TransformCommand),
    /// Work with the changes sinks set aside (`on_error: dead_letter`).
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Print a completion script for a shell to stdout.
    #[command(after_help = format!("{COMPLETIONS_HELP}\n{EXIT_AND_ENV}"))]
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Subcommand)]
enum DlqCommand {
    /// List every dead letter in the pipeline's sinks (works while the pipeline runs).
    #[command(after_help = format!("{DLQ_LIST_HELP}\n{EXIT_AND_ENV}"))]
    List(DlqListArgs),
    /// Apply dead letters again once the sink is fixed, and remove those that applied. Each
    /// key's dead letters replay together, in order. Refused while the pipeline runs.
    #[command(after_help = format!("{DLQ_REPLAY_HELP}\n{EXIT_AND_ENV}"))]
    Replay(DlqReplayArgs),
}

#[derive(Debug, clap::Args)]
struct DlqListArgs {
    #[command(flatten)]
    file: FileArgs,
    /// One JSON object per dead letter instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false, id = "which")]
struct DlqReplayArgs {
    #[command(flatten)]
    file: FileArgs,
    /// Replay these dead letters (ids from `dlq list`), with the other dead letters of their
    /// keys.
    #[arg(long = "id", value_name = "N", group = "which")]
    ids: Vec<u64>,
    /// Replay every dead letter.
    #[arg(long, group = "which")]
    all: bool,
}

#[derive(Debug, Subcommand)]
enum PipelineCommand {
    /// Validate, then run a pipeline until Ctrl-C or SIGTERM (then drain and exit 0).
    #[command(after_help = format!("{APPLY_HELP}\n{EXIT_AND_ENV}"))]
    Apply(ApplyArgs),
    /// Check a pipeline file (and load its transforms) without touching any database.
    #[command(after_help = format!("{VALIDATE_HELP}\n{EXIT_AND_ENV}"))]
    Validate(FileArgs),
    /// Show how far the pipeline is: each source's slot (active, WAL retained, lag behind
    /// the server), each sink's lane checkpoints, the last fatal error. Works whether or not
    /// the pipeline runs.
    #[command(after_help = format!("{STATUS_HELP}\n{EXIT_AND_ENV}"))]
    Status(StatusArgs),
    /// Remove what the pipeline owns: the replication slot, the publication if Zipline
    /// created it, and Zipline's checkpoint, snapshot, table-record and claim rows in each
    /// sink. Sink tables and dead letters are kept. Refused while the pipeline runs. The next
    /// `apply` starts from scratch (a new slot, a new initial snapshot).
    #[command(after_help = format!("{DROP_HELP}\n{EXIT_AND_ENV}"))]
    Drop(DropArgs),
}

#[derive(Debug, clap::Args)]
struct StatusArgs {
    #[command(flatten)]
    file: FileArgs,
    /// Redraw once a second until Ctrl-C (with --json: one JSON object per second).
    #[arg(long)]
    watch: bool,
    /// One JSON object (the schema is in the README) instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct DropArgs {
    #[command(flatten)]
    file: FileArgs,
    /// Do not ask for confirmation (required when stdin is not a terminal).
    #[arg(long)]
    yes: bool,
}

#[derive(Debug, clap::Args)]
struct ApplyArgs {
    #[command(flatten)]
    file: FileArgs,
    /// Start over: drop the replication slot, empty the sinks' tables, forget their
    /// checkpoints, and copy every table again from a new slot. For a slot that was lost or
    /// invalidated, or a sink that lost its state; Zipline says when it is needed.
    #[arg(long)]
    resnapshot: bool,
    /// Stop replicating a table the source no longer publishes: forget Zipline's record of
    /// it (`schema.table`; repeatable). Its sink table is left as it is.
    #[arg(long = "forget-table", value_name = "TABLE")]
    forget_tables: Vec<String>,
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
    if let Err(e) = init_logging(cli.log_format) {
        eprintln!("error: {e:#}");
        return ExitCode::from(2);
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // `{:#}` prints the chain on one line: the message already names file, line, field.
            eprintln!("error: {err:#}");
            if err.downcast_ref::<config::ConfigError>().is_some()
                || err.downcast_ref::<UsageError>().is_some()
                || transform::is_usage_error(&err)
            {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Logs to stderr as `format` says, else as ZIPLINE_LOG_FORMAT says, else text on a
/// terminal and JSON lines otherwise (a service manager or a collector reads them).
fn init_logging(format: Option<LogFormat>) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("ZIPLINE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let format = match (format, std::env::var("ZIPLINE_LOG_FORMAT")) {
        (Some(format), _) => format,
        (None, Ok(value)) => {
            <LogFormat as clap::ValueEnum>::from_str(value.trim(), true).map_err(|_| {
                anyhow::anyhow!(
                    "ZIPLINE_LOG_FORMAT={value:?}: expected `text` or `json` (or unset it)"
                )
            })?
        }
        (None, Err(_)) if terminal => LogFormat::Text,
        (None, Err(_)) => LogFormat::Json,
    };
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    match format {
        LogFormat::Text => logs.with_ansi(terminal).init(),
        // Fields at the top level next to `message`, so collectors need no unnesting.
        LogFormat::Json => logs.json().flatten_event(true).init(),
    }
    Ok(())
}

fn load(args: &FileArgs) -> anyhow::Result<config::Pipeline> {
    let opts = LoadOptions::from_process_env(args.secrets_dir.clone());
    Ok(config::load(&args.file, &opts)?)
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Pipeline(PipelineCommand::Validate(args)) => {
            let pipeline = load(&args)?;
            config::check_transforms(&pipeline.routes)?;
            let count =
                |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
            println!(
                "{}: pipeline {} is valid ({}, {})",
                args.file.display(),
                pipeline.name,
                count(pipeline.connectors.len(), "connector"),
                count(pipeline.routes.len(), "route")
            );
            Ok(())
        }
        Command::Pipeline(PipelineCommand::Status(args)) => {
            let pipeline = load(&args.file)?;
            status::show(&pipeline, args.watch, args.json)
        }
        Command::Pipeline(PipelineCommand::Drop(args)) => {
            let pipeline = load(&args.file)?;
            status::drop_pipeline(&pipeline, args.yes)
        }
        Command::Transform(command) => transform::run(command),
        Command::Dlq(command) => dlq(command),
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "zipline", &mut std::io::stdout());
            Ok(())
        }
        Command::Pipeline(PipelineCommand::Apply(args)) => {
            // Listen before anything else: a stop asked while the file loads or the
            // transforms compile then drains at once instead of killing the process.
            let rt = runtime()?;
            let stop = {
                let _entered = rt.enter();
                StopSignals::listen()
            };
            let pipeline = load(&args.file)?;
            config::check_transforms(&pipeline.routes)?;
            let options = zipline::pipeline::RunOptions {
                file: args.file.file.display().to_string(),
                resnapshot: args.resnapshot,
                forget_tables: args
                    .forget_tables
                    .iter()
                    .map(|t| {
                        if t.contains('.') {
                            t.clone()
                        } else {
                            format!("public.{t}")
                        }
                    })
                    .collect(),
            };
            rt.block_on(async move {
                zipline::pipeline::run(pipeline, options, stop.wait()).await?;
                Ok(())
            })
        }
    }
}

/// A command line that cannot go on as given (exit status 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct UsageError(pub(crate) String);

pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// `zipline dlq list|replay`.
fn dlq(command: DlqCommand) -> anyhow::Result<()> {
    use zipline::pipeline::dlq;
    match command {
        DlqCommand::List(args) => {
            let pipeline = load(&args.file)?;
            let sinks = runtime()?.block_on(dlq::list(&pipeline))?;
            let mut out = std::io::stdout().lock();
            for sink in &sinks {
                for r in &sink.records {
                    if args.json {
                        let record = serde_json::json!({
                            "sink": sink.sink, "id": r.id, "position": r.position,
                            "table": r.table, "op": r.op, "key": r.key, "code": r.code,
                            "reason": r.reason, "created_at": r.created_at,
                            "change": serde_json::from_str::<serde_json::Value>(&r.change)
                                .unwrap_or(serde_json::Value::Null),
                        });
                        writeln!(out, "{record}")?;
                    } else {
                        writeln!(
                            out,
                            "{}\t#{}\t{}\t{} {} key {}\t{}{}",
                            sink.sink,
                            r.id,
                            r.position,
                            r.op,
                            r.table,
                            r.key,
                            r.code
                                .as_deref()
                                .map(|c| format!("[{c}] "))
                                .unwrap_or_default(),
                            r.reason
                        )?;
                    }
                }
            }
            let total: usize = sinks.iter().map(|s| s.records.len()).sum();
            eprintln!("{total} dead letters in {} sinks", sinks.len());
            Ok(())
        }
        DlqCommand::Replay(args) => {
            let pipeline = load(&args.file)?;
            let selection = if args.all {
                dlq::Selection::All
            } else {
                dlq::Selection::Ids(args.ids.clone())
            };
            let reports = runtime()?.block_on(dlq::replay(&pipeline, &selection))?;
            let mut failed = 0;
            for r in &reports {
                eprintln!("sink {}: {} dead letters replayed", r.sink, r.replayed);
                for (ids, reason) in &r.failed {
                    failed += ids.len();
                    eprintln!("sink {}: kept {ids:?}: {reason}", r.sink);
                }
            }
            if failed > 0 {
                anyhow::bail!(
                    "{failed} dead letters are still rejected by their sink and were kept"
                );
            }
            Ok(())
        }
    }
}

/// Resolves on the first Ctrl-C or SIGTERM.
/// SIGTERM and Ctrl-C (SIGINT), registered when created, so none is lost however early it
/// comes.
struct StopSignals {
    term: Option<tokio::signal::unix::Signal>,
    interrupt: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    /// Registers both handlers; must run inside the runtime.
    fn listen() -> Self {
        use tokio::signal::unix::{SignalKind, signal};
        let register = |kind: SignalKind, name: &str| match signal(kind) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for {name}; it will not stop the pipeline gracefully");
                None
            }
        };
        StopSignals {
            term: register(SignalKind::terminate(), "SIGTERM"),
            interrupt: register(SignalKind::interrupt(), "SIGINT"),
        }
    }

    /// Resolves at the first of them.
    async fn wait(mut self) {
        async fn next(s: &mut Option<tokio::signal::unix::Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            () = next(&mut self.term) => {}
            () = next(&mut self.interrupt) => {}
        }
    }
}
