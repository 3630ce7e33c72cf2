//! Where a run starts from: resuming the source's cursor (a replication slot), creating it on a
//! first start, or starting over with a new cursor and a whole new snapshot.
//!
//! Starting over silently loses rows, so it happens only when asked: the `--resnapshot` flag,
//! or `snapshot: when_needed` on the source. Otherwise each case that needs it is a stop that
//! says what happened and how to go on:
//!
//! | cursor upstream | sinks | without permission | with it |
//! |---|---|---|---|
//! | missing | none applied anything | create (first start) | create |
//! | missing | one applied rows | stop: the slot disappeared, its changes are gone | start over |
//! | unusable (invalidated, publication dropped) | any | stop, naming the cause | start over |
//! | present | one holds nothing of the pipeline | stop: that sink lost its state (or is new) | start over |
//! | present | every one set up | resume | resume (start over with `--resnapshot`) |

use std::sync::Arc;

use super::PipelineError;
use crate::change::Table;
use crate::sink::{SinkConnector, SinkHistory};
use crate::source::{Source, Upstream};

/// How the run starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// Stream from the existing cursor (or, for a source without one, from the sinks).
    Resume,
    /// No cursor yet: create it (with the initial snapshot when the source takes one).
    Create,
    /// Drop the cursor, forget what the sinks hold and copy every table again.
    Recreate,
}

/// What the decision needs besides the states.
#[derive(Debug, Clone)]
pub(crate) struct Context<'a> {
    /// The pipeline file, for the commands in messages.
    pub(crate) file: &'a str,
    /// The source connector's name.
    pub(crate) source: &'a str,
    /// The cursor's name (the slot), for messages.
    pub(crate) cursor: &'a str,
    /// `--resnapshot`: start over whatever the states.
    pub(crate) forced: bool,
    /// `snapshot: when_needed`: start over where the states need it.
    pub(crate) when_needed: bool,
}

/// Decides how to start (see the module docs); `Err` is the stop's message.
pub(crate) fn decide(
    cx: &Context<'_>,
    upstream: &Upstream,
    sinks: &[(String, SinkHistory)],
) -> Result<Start, String> {
    let any_applied = sinks.iter().any(|(_, h)| *h == SinkHistory::Applied);
    let any_state = sinks.iter().any(|(_, h)| *h != SinkHistory::Empty);
    if matches!(upstream, Upstream::NoCursor) {
        // The sinks' checkpoints are the cursor: forgetting them starts over.
        return Ok(if cx.forced && any_state {
            Start::Recreate
        } else {
            Start::Resume
        });
    }
    if cx.forced {
        let exists = !matches!(upstream, Upstream::Missing);
        return Ok(if exists || any_state {
            Start::Recreate
        } else {
            Start::Create
        });
    }
    let problem = match upstream {
        Upstream::NoCursor => unreachable!("handled above"),
        Upstream::Missing if !any_applied => return Ok(Start::Create),
        Upstream::Missing => format!(
            "replication slot {} does not exist, but the sinks hold rows this pipeline \
             applied from it ({}): it was dropped, or lost with its server (a failover, a \
             restore), and the changes made since are gone from the source",
            cx.cursor,
            applied_sinks(sinks)
        ),
        Upstream::Unusable { reason } => reason.clone(),
        Upstream::Resumable { position } => {
            match sinks.iter().find(|(_, h)| *h == SinkHistory::Empty) {
                None => return Ok(Start::Resume),
                Some((sink, _)) => format!(
                    "sink {sink} holds nothing of this pipeline (no lane checkpoints, no snapshot \
                 record), while replication slot {} has moved on to {position}: the sink lost \
                 its state (its database was re-created?) or was added to the pipeline since, \
                 and the rows applied before are not there",
                    cx.cursor
                ),
            }
        }
    };
    if cx.when_needed {
        tracing::warn!(source = cx.source, reason = %problem, "starting over with a new slot and a whole new snapshot (snapshot: when_needed)");
        return Ok(Start::Recreate);
    }
    Err(format!(
        "{problem}. To copy every table again from a new slot (the sinks' tables are emptied \
         first), run `zipline pipeline apply -f {} --resnapshot`, or set `snapshot: \
         when_needed` on source {} to do so by itself",
        cx.file, cx.source
    ))
}

/// Reads the sinks' histories, decides how to start, and prepares that start: on a start
/// over, drops the cursor and empties what the sinks hold (per sink, `tables`: the source
/// tables it takes, `None` where its route's transform decides the sink tables); on a first
/// start without a snapshot, records in each sink that the pipeline starts here (so a later
/// start can tell lost sink state from a first one).
pub(crate) async fn establish(
    cx: &Context<'_>,
    source: &mut dyn Source,
    sinks: &[Arc<dyn SinkConnector>],
    tables: &[Option<Vec<Arc<Table>>>],
) -> Result<Start, PipelineError> {
    let sink_err = |sink: &Arc<dyn SinkConnector>| {
        let connector = sink.name().to_owned();
        move |error| PipelineError::Sink { connector, error }
    };
    let mut histories = Vec::with_capacity(sinks.len());
    for sink in sinks {
        histories.push((
            sink.name().to_owned(),
            sink.checkpoints().history().await.map_err(sink_err(sink))?,
        ));
    }
    let upstream = source.upstream();
    let start = decide(cx, &upstream, &histories).map_err(|message| PipelineError::Source {
        connector: cx.source.to_owned(),
        error: Box::new(crate::source::SourceError::fatal(message)),
    })?;
    match start {
        Start::Resume => {}
        Start::Create if source.takes_snapshot() => {}
        Start::Create => {
            for sink in sinks {
                let target = super::snapshot_target(sink)?;
                target.begin(&[]).await.map_err(sink_err(sink))?;
                target.finish().await.map_err(sink_err(sink))?;
            }
        }
        Start::Recreate => {
            if !source.takes_snapshot() {
                return Err(PipelineError::Source {
                    connector: cx.source.to_owned(),
                    error: Box::new(crate::source::SourceError::fatal(format!(
                        "starting over copies every table again, which `snapshot: never` \
                         forbids; set `snapshot: initial` (or `when_needed`) on source {}",
                        cx.source
                    ))),
                });
            }
            tracing::warn!(
                source = cx.source,
                cursor = cx.cursor,
                "starting over: a new cursor, and every table copied again into emptied sink tables"
            );
            source
                .reset()
                .await
                .map_err(|error| PipelineError::Source {
                    connector: cx.source.to_owned(),
                    error: Box::new(error),
                })?;
            for ((sink, (_, history)), tables) in sinks.iter().zip(&histories).zip(tables) {
                if *history == SinkHistory::Applied {
                    match tables {
                        None => tracing::warn!(
                            sink = sink.name(),
                            "the route's transform decides the sink tables, so Zipline cannot empty them: rows the source deleted since may remain"
                        ),
                        Some(tables) => {
                            super::snapshot_target(sink)?
                                .clear(tables)
                                .await
                                .map_err(sink_err(sink))?;
                        }
                    }
                }
                sink.checkpoints()
                    .reset_checkpoints()
                    .await
                    .map_err(sink_err(sink))?;
                super::snapshot_target(sink)?
                    .begin(&[])
                    .await
                    .map_err(sink_err(sink))?;
            }
        }
    }
    Ok(start)
}

fn applied_sinks(sinks: &[(String, SinkHistory)]) -> String {
    sinks
        .iter()
        .filter(|(_, h)| *h == SinkHistory::Applied)
        .map(|(n, _)| n.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use SinkHistory::{Applied, Empty, Prepared};

    fn cx(forced: bool, when_needed: bool) -> Context<'static> {
        Context {
            file: "orders.yaml",
            source: "pg",
            cursor: "zipline_orders",
            forced,
            when_needed,
        }
    }

    fn sinks(h: &[SinkHistory]) -> Vec<(String, SinkHistory)> {
        h.iter()
            .enumerate()
            .map(|(i, h)| (format!("out{i}"), *h))
            .collect()
    }

    fn resumable() -> Upstream {
        Upstream::Resumable {
            position: "0/16B3748".into(),
        }
    }

    #[test]
    fn first_start_creates_and_a_healthy_one_resumes() {
        let plain = cx(false, false);
        assert_eq!(
            decide(&plain, &Upstream::Missing, &sinks(&[Empty, Prepared])),
            Ok(Start::Create)
        );
        assert_eq!(
            decide(&plain, &resumable(), &sinks(&[Applied, Prepared])),
            Ok(Start::Resume)
        );
        assert_eq!(
            decide(&plain, &Upstream::NoCursor, &sinks(&[Empty])),
            Ok(Start::Resume)
        );
    }

    #[test]
    fn a_vanished_slot_stops_unless_allowed() {
        let err = decide(
            &cx(false, false),
            &Upstream::Missing,
            &sinks(&[Prepared, Applied]),
        )
        .unwrap_err();
        assert!(
            err.starts_with(
                "replication slot zipline_orders does not exist, but the sinks hold rows this \
                 pipeline applied from it (out1)"
            ),
            "{err}"
        );
        assert!(err.ends_with(
            "run `zipline pipeline apply -f orders.yaml --resnapshot`, or set `snapshot: \
             when_needed` on source pg to do so by itself"
        ));
        assert_eq!(
            decide(&cx(false, true), &Upstream::Missing, &sinks(&[Applied])),
            Ok(Start::Recreate)
        );
    }

    #[test]
    fn a_sink_without_state_stops_unless_allowed() {
        let err = decide(&cx(false, false), &resumable(), &sinks(&[Applied, Empty])).unwrap_err();
        assert!(
            err.starts_with("sink out1 holds nothing of this pipeline"),
            "{err}"
        );
        assert!(err.contains("has moved on to 0/16B3748"), "{err}");
        assert_eq!(
            decide(&cx(false, true), &resumable(), &sinks(&[Empty])),
            Ok(Start::Recreate)
        );
    }

    #[test]
    fn an_unusable_slot_stops_with_its_reason() {
        let lost = Upstream::Unusable {
            reason: "replication slot s was invalidated".into(),
        };
        let err = decide(&cx(false, false), &lost, &sinks(&[Applied])).unwrap_err();
        assert!(
            err.starts_with("replication slot s was invalidated. To copy"),
            "{err}"
        );
        assert_eq!(
            decide(&cx(false, true), &lost, &sinks(&[Applied])),
            Ok(Start::Recreate)
        );
    }

    #[test]
    fn resnapshot_starts_over_unless_there_is_nothing() {
        let forced = cx(true, false);
        assert_eq!(
            decide(&forced, &resumable(), &sinks(&[Applied])),
            Ok(Start::Recreate)
        );
        assert_eq!(
            decide(&forced, &Upstream::Missing, &sinks(&[Prepared])),
            Ok(Start::Recreate)
        );
        assert_eq!(
            decide(&forced, &Upstream::Missing, &sinks(&[Empty])),
            Ok(Start::Create)
        );
        // Where the sinks keep the positions, forgetting them starts over.
        assert_eq!(
            decide(&forced, &Upstream::NoCursor, &sinks(&[Applied])),
            Ok(Start::Recreate)
        );
        assert_eq!(
            decide(&forced, &Upstream::NoCursor, &sinks(&[Empty])),
            Ok(Start::Resume)
        );
    }
}
