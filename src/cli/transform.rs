//! `zipline transform`: run a transform over sample changes, start a transform project.

use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use zipline::config;
use zipline::transform::project;

use super::EXIT_AND_ENV;

const TRANSFORM_TEST_HELP: &str = r#"Examples:
  zipline transform test --module mask.wasm --config columns=email --input changes.jsonl
  echo '{"table":"public.users","op":"insert","columns":[{"name":"id","type":"int8","key":true},{"name":"email","type":"text"}],"key":[42],"values":[42,"a@example.com"]}' | zipline transform test --module mask.wasm --config columns=email --input -
"#;

const TRANSFORM_NEW_HELP: &str = "\
Examples:
  zipline transform new --lang rust drop-test-orders
  cd drop-test-orders && ./build.sh && ./test.sh
  zipline transform new --lang python --dir transforms/mask mask
";

#[derive(Debug, Subcommand)]
pub(super) enum TransformCommand {
    /// Run a transform over sample changes (JSON lines) and print what comes out.
    #[command(after_help = format!("{TRANSFORM_TEST_HELP}\n{EXIT_AND_ENV}"))]
    Test(TransformTestArgs),
    /// Start a transform project in one of the SDKs' languages: the transform (a row filter
    /// to edit), one build command, a sample and its expected output.
    #[command(after_help = format!("{TRANSFORM_NEW_HELP}\n{EXIT_AND_ENV}"))]
    New(TransformNewArgs),
}

#[derive(Debug, clap::Args)]
pub(super) struct TransformNewArgs {
    /// The SDK's language.
    #[arg(long, value_enum)]
    lang: Lang,
    /// The transform's name: lowercase letters, digits and dashes. It names the project's
    /// directory, its package and `target/NAME.wasm`.
    name: String,
    /// Where to create the project (default: ./NAME). It must not exist.
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// [`project::Language`] on the command line.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Lang {
    Rust,
    Python,
    Js,
    Go,
    C,
}

impl From<Lang> for project::Language {
    fn from(lang: Lang) -> Self {
        match lang {
            Lang::Rust => project::Language::Rust,
            Lang::Python => project::Language::Python,
            Lang::Js => project::Language::Js,
            Lang::Go => project::Language::Go,
            Lang::C => project::Language::C,
        }
    }
}

#[derive(Debug, clap::Args)]
pub(super) struct TransformTestArgs {
    /// The component (.wasm).
    #[arg(long)]
    module: PathBuf,
    /// Changes, one JSON object per line (`-` for stdin); the format is in the README.
    #[arg(long)]
    input: PathBuf,
    /// A `config:` entry for the transform's `init`, as KEY=VALUE (repeatable).
    #[arg(long = "config", value_name = "KEY=VALUE")]
    config: Vec<String>,
    /// Memory limit per instance, in MiB.
    #[arg(long, default_value_t = 64)]
    memory_mib: u64,
    /// Time limit per call, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    timeout_ms: u64,
    /// Output limit per call, in MiB (at most 4096, as `limits.output`).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=4096))]
    output_mib: u64,
    /// Changes per call.
    #[arg(long, default_value_t = 1000)]
    batch_size: usize,
}

/// Runs one `zipline transform` command.
pub(super) fn run(command: TransformCommand) -> anyhow::Result<()> {
    match command {
        TransformCommand::Test(args) => test(&args),
        TransformCommand::New(args) => new(&args),
    }
}

/// Whether `err` is a bad `transform` command line (exit status 2).
pub(super) fn is_usage_error(err: &anyhow::Error) -> bool {
    matches!(
        err.downcast_ref::<project::ProjectError>(),
        Some(project::ProjectError::Name(_) | project::ProjectError::Exists(_))
    )
}

/// `zipline transform new`: writes the project and says how to build and test it.
fn new(args: &TransformNewArgs) -> anyhow::Result<()> {
    let language = project::Language::from(args.lang);
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(&args.name));
    let written = project::create(language, &args.name, &dir)?;
    let shown = dir.display();
    println!(
        "created {shown}: a {} transform ({} files; the SDK and the contract are under {shown}/zipline/)",
        language.name(),
        written.len()
    );
    println!(
        "  build: {shown}/build.sh       (writes {shown}/target/{}.wasm)",
        args.name
    );
    println!(
        "  test:  {shown}/test.sh        (builds, then `zipline transform test` on the sample)"
    );
    println!("  edit:  {shown}/{}", project::source_file(language));
    Ok(())
}

/// `zipline transform test`: outputs go to stdout as JSON lines; failed changes (every one of
/// them: the policy is `dead_letter` into a scratch file) are listed on stderr and make the
/// exit status 1.
fn test(args: &TransformTestArgs) -> anyhow::Result<()> {
    use std::io::{BufRead, Write};
    use zipline::transform::json;

    let config = args
        .config
        .iter()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .with_context(|| format!("--config {kv}: expected KEY=VALUE"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let scratch = tempfile_dir()?;
    let spec = config::TransformSpec {
        module: args.module.clone(),
        module_label: args.module.display().to_string(),
        config,
        limits: config::TransformLimits {
            memory: args.memory_mib << 20,
            timeout: std::time::Duration::from_millis(args.timeout_ms.max(1)),
            output: args.output_mib << 20,
        },
        on_error: config::OnError::DeadLetter,
        dead_letter: scratch.join("failed.jsonl"),
        batch_size: args.batch_size.max(1),
        row_filter: false,
    };
    let mut transformer = zipline::transform::Transformer::new("test", &spec)?;
    let reader: Box<dyn BufRead> = if args.input.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        let f = std::fs::File::open(&args.input)
            .with_context(|| format!("cannot read {}", args.input.display()))?;
        Box::new(std::io::BufReader::new(f))
    };
    let mut tables = Vec::new();
    let mut changes = Vec::new();
    for (n, line) in reader.lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", args.input.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let number = u32::try_from(n + 1).unwrap_or(u32::MAX);
        let change = json::change_from_json(&line, number, &mut tables)
            .map_err(|e| anyhow::anyhow!("{}:{number}: {e}", args.input.display()))?;
        changes.push(change);
    }
    let total = changes.len();
    let mut out = std::io::stdout().lock();
    let mut produced = 0;
    let mut rest = changes.into_iter().peekable();
    while rest.peek().is_some() {
        let chunk: Vec<_> = rest.by_ref().take(spec.batch_size).collect();
        for (_, change) in transformer.transform(chunk)? {
            writeln!(out, "{}", json::change_to_json(&change))?;
            produced += 1;
        }
    }
    out.flush()?;
    let failed = std::fs::read_to_string(&spec.dead_letter).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&scratch);
    for record in failed.lines() {
        let v: serde_json::Value = serde_json::from_str(record)?;
        let c = &v["change"];
        eprintln!(
            "failed: change {} ({} on {}): {}",
            c["position"].as_str().unwrap_or("?"),
            c["op"].as_str().unwrap_or("?"),
            c["table"].as_str().unwrap_or("?"),
            v["reason"].as_str().unwrap_or("?")
        );
    }
    let failures = failed.lines().count();
    eprintln!("{total} changes in, {produced} out, {failures} failed");
    if failures > 0 {
        anyhow::bail!("the transform failed on {failures} of {total} changes");
    }
    Ok(())
}

/// A private scratch directory for one command.
fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("zipline-transform-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}
