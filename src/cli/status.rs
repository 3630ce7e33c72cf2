//! `zipline pipeline status` and `zipline pipeline drop` at the command line: text and JSON
//! rendering, the watch loop, and drop's confirmation.

use std::fmt::Write as _;
use std::io::{BufRead as _, IsTerminal as _, Write as _};

use anyhow::Context as _;
use zipline::config;
use zipline::pipeline::lifecycle::{self, PipelineStatus};

use super::{UsageError, runtime};

/// Prints the status once, or once a second with `watch` until Ctrl-C.
pub(super) fn show(pipeline: &config::Pipeline, watch: bool, json: bool) -> anyhow::Result<()> {
    let rt = runtime()?;
    rt.block_on(async {
        loop {
            let status = lifecycle::status(pipeline).await?;
            let text = if json {
                let mut line = serde_json::to_string(&status)?;
                line.push('\n');
                line
            } else {
                render(&status)
            };
            let mut out = std::io::stdout().lock();
            if watch && !json && std::io::stdout().is_terminal() {
                // Clear the screen and home the cursor before each redraw.
                out.write_all(b"\x1b[2J\x1b[H")?;
            }
            out.write_all(text.as_bytes())?;
            out.flush()?;
            drop(out);
            if !watch {
                return Ok(());
            }
            tokio::select! {
                _ = tokio::signal::ctrl_c() => return Ok(()),
                () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
            }
        }
    })
}

fn bytes(n: i64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n.abs() < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64;
    let mut unit = "B";
    for u in UNITS {
        if v.abs() < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{v:.1} {unit}")
}

/// The status as text, one block per connector.
pub(super) fn render(status: &PipelineStatus) -> String {
    let mut out = String::new();
    let state = match status.running_because() {
        Some(why) => format!("running ({why})"),
        None => "not running".to_owned(),
    };
    let _ = writeln!(out, "pipeline {}: {state}", status.pipeline);
    for s in &status.sources {
        let _ = write!(out, "source {}", s.name);
        match (&s.status, &s.error) {
            (_, Some(e)) => {
                let _ = writeln!(out, ": cannot read: {e}");
            }
            (Some(st), None) => {
                let _ = write!(out, " ({})", st.kind);
                if let Some(slot) = &st.slot {
                    if st.slot_exists {
                        let active = match st.active_pid {
                            Some(pid) => format!("active (walsender {pid})"),
                            None => "inactive".to_owned(),
                        };
                        let _ = write!(
                            out,
                            ": slot {slot} {active}, wal_status {}, confirmed {}, server at {}, \
                             lag {}, WAL retained {}",
                            st.wal_status.as_deref().unwrap_or("unknown"),
                            st.confirmed_lsn.as_deref().unwrap_or("none"),
                            st.server_lsn.as_deref().unwrap_or("?"),
                            st.lag_bytes.map_or("?".to_owned(), bytes),
                            st.retained_bytes.map_or("?".to_owned(), bytes),
                        );
                    } else {
                        let _ = write!(
                            out,
                            ": slot {slot} does not exist (the next apply creates it)"
                        );
                    }
                }
                if let Some(p) = &st.publication {
                    let made = match (st.publication_exists, st.publication_owned) {
                        (false, _) => "does not exist",
                        (true, true) => "created by Zipline",
                        (true, false) => "created by you",
                    };
                    let _ = write!(out, "; publication {p} ({made})");
                }
                if let Some(note) = &st.note {
                    let _ = write!(out, ": {note}");
                }
                out.push('\n');
            }
            (None, None) => out.push('\n'),
        }
    }
    for s in &status.sinks {
        let _ = write!(out, "sink {}", s.name);
        let Some(st) = &s.status else {
            let _ = writeln!(out, ": cannot read: {}", s.error.as_deref().unwrap_or("?"));
            continue;
        };
        match &st.claim {
            Some(c) if s.running => {
                let _ = write!(
                    out,
                    ": held by process {} on {} since {} (heartbeat {:.1}s ago)",
                    c.pid, c.host, c.started_at, c.heartbeat_age_seconds
                );
            }
            Some(c) => {
                let how = match (&c.stopped_at, &c.last_error) {
                    (Some(at), Some(_)) => format!("stopped on an error at {at}"),
                    (Some(at), None) => format!("stopped cleanly at {at}"),
                    (None, _) => format!(
                        "last held by process {} on {} (no heartbeat for {:.0}s)",
                        c.pid, c.host, c.heartbeat_age_seconds
                    ),
                };
                let _ = write!(out, ": {how}");
            }
            None => out.push_str(": the pipeline never ran here"),
        }
        let _ = writeln!(out, "; {} dead letters", st.dead_letters);
        if !st.lanes.is_empty() {
            let _ = writeln!(out, "  {:<6} {:<28} updated_at", "lane", "position");
            for l in &st.lanes {
                let _ = writeln!(out, "  {:<6} {:<28} {}", l.lane, l.position, l.updated_at);
            }
        }
    }
    if let Some(e) = &status.last_error {
        let _ = writeln!(out, "last fatal error: {e}");
    }
    out
}

/// Drops the pipeline after checking it does not run, and asking on a terminal.
pub(super) fn drop_pipeline(pipeline: &config::Pipeline, yes: bool) -> anyhow::Result<()> {
    let rt = runtime()?;
    let status = rt.block_on(lifecycle::status(pipeline))?;
    let unreadable: Vec<String> = status
        .sources
        .iter()
        .filter_map(|s| s.error.as_ref().map(|e| format!("source {}: {e}", s.name)))
        .chain(
            status
                .sinks
                .iter()
                .filter_map(|s| s.error.as_ref().map(|e| format!("sink {}: {e}", s.name))),
        )
        .collect();
    if !unreadable.is_empty() {
        anyhow::bail!(
            "cannot drop pipeline {}: not every connector could be checked ({})",
            pipeline.name,
            unreadable.join("; ")
        );
    }
    if let Some(why) = status.running_because() {
        anyhow::bail!(
            "pipeline {} is running: {why}; stop it (SIGTERM or Ctrl-C) and drop again",
            pipeline.name
        );
    }
    let mut plan = String::new();
    for s in status.sources.iter().filter_map(|s| s.status.as_ref()) {
        if let Some(slot) = s.slot.as_ref().filter(|_| s.slot_exists) {
            let _ = writeln!(
                plan,
                "  source {}: replication slot {slot} (retaining {})",
                s.name,
                s.retained_bytes.map_or("?".to_owned(), bytes)
            );
        }
        if let Some(p) = s.publication.as_ref().filter(|_| s.publication_exists) {
            let what = if s.publication_owned {
                "dropped (Zipline created it)"
            } else {
                "kept (not created by Zipline)"
            };
            let _ = writeln!(plan, "  source {}: publication {p}: {what}", s.name);
        }
    }
    for s in &status.sinks {
        let _ = writeln!(
            plan,
            "  sink {}: Zipline's checkpoint, table-record, snapshot and claim rows of pipeline {} \
             (its tables and dead letters stay)",
            s.name, pipeline.name
        );
    }
    eprint!(
        "pipeline {} is not running; dropping removes:\n{plan}",
        pipeline.name
    );
    if !yes {
        if !std::io::stdin().is_terminal() {
            return Err(UsageError(format!(
                "pipeline drop asks for confirmation and stdin is not a terminal; pass --yes to \
                 drop pipeline {}",
                pipeline.name
            ))
            .into());
        }
        eprint!("type the pipeline's name ({}) to drop it: ", pipeline.name);
        std::io::stderr().flush()?;
        let mut answer = String::new();
        std::io::stdin()
            .lock()
            .read_line(&mut answer)
            .context("reading the confirmation")?;
        if answer.trim() != pipeline.name {
            anyhow::bail!("not confirmed; nothing was dropped");
        }
    }
    let dropped = rt.block_on(lifecycle::drop(pipeline))?;
    for (name, d) in &dropped.sources {
        if let Some(slot) = &d.slot {
            eprintln!("source {name}: dropped replication slot {slot}");
        }
        if let Some(p) = &d.publication {
            eprintln!("source {name}: dropped publication {p}");
        }
        if let Some(kept) = &d.kept {
            eprintln!("source {name}: {kept}");
        }
    }
    for (name, f) in &dropped.sinks {
        eprintln!(
            "sink {name}: removed {} rows of Zipline's records{}{}",
            f.rows,
            if f.dropped_tables.is_empty() {
                String::new()
            } else {
                format!("; dropped {}", f.dropped_tables.join(", "))
            },
            if f.kept_tables.is_empty() {
                String::new()
            } else {
                format!(
                    "; kept {} (other pipelines use them)",
                    f.kept_tables.join(", ")
                )
            }
        );
    }
    eprintln!(
        "pipeline {} dropped; the next `zipline pipeline apply` starts from scratch (a new slot \
         and initial snapshot; rows the sink tables still hold are overwritten by the snapshot, \
         rows deleted at the source meanwhile stay unless you empty those tables first)",
        pipeline.name
    );
    Ok(())
}
