//! What the streaming loop's failures become: each a [`SourceError`] classed by what the
//! runtime does next (reconnect, or stop with the operator's next step), naming the connector.

use super::State;
use crate::config;
use crate::error::Cause;
use crate::source::SourceError;
use crate::source::postgres::conn::ConnError;
use crate::source::postgres::pgoutput;

pub(super) fn conn_error(opts: &config::PostgresSource, e: ConnError) -> SourceError {
    let what = format!("{} ({}:{})", opts.name, opts.host, opts.port);
    let start_over = "To copy every table again from a new slot, run `zipline pipeline apply` \
                      with `--resnapshot`, or set `snapshot: when_needed` on the source";
    match e.code() {
        Some("55006") => SourceError::transient(format!(
            "{what}: replication slot {} is active for another connection (a walsender whose \
             client vanished without closing it, or another pipeline with the same slot_name); \
             waiting for the server to end it (wal_sender_timeout): {e}",
            opts.slot_name
        )),
        Some("28P01" | "28000") => SourceError::fatal(format!("{what}: cannot log in: {e}")),
        Some("57P01" | "57P02" | "57P03" | "53300") => {
            SourceError::transient(format!("{what}: {e}"))
        }
        Some("42704") if e.to_string().contains("publication") => SourceError::fatal(format!(
            "{what}: {e}: publication {} was dropped while its slot {} kept its position, and \
             PostgreSQL reads the slot's changes with the catalog as of that position, so \
             re-creating the publication alone does not help. {start_over}",
            opts.publication, opts.slot_name
        )),
        Some("55000") if e.to_string().contains("can no longer get changes") => {
            SourceError::fatal(format!(
                "{what}: {e}: PostgreSQL invalidated replication slot {} (the WAL it still \
                 needed was removed); the changes since its confirmed position are gone from \
                 the source. {start_over}",
                opts.slot_name
            ))
        }
        Some(_) => SourceError::fatal(format!("{what}: {e}")),
        None => match e {
            ConnError::Io(_) => SourceError::transient(format!("{what}: {e}")),
            ConnError::Tls(ref t) if t.is_broken_connection() => {
                SourceError::transient(format!("{what}: {e}"))
            }
            _ => SourceError::fatal(format!("{what}: {e}")),
        },
    }
}

pub(super) fn undecodable(opts: &config::PostgresSource, e: &pgoutput::DecodeError) -> SourceError {
    SourceError::fatal(format!("{}: undecodable pgoutput message: {e}", opts.name))
}

pub(super) fn spill_error(opts: &config::PostgresSource, e: &std::io::Error) -> SourceError {
    SourceError::fatal(format!(
        "{}: spill directory {} (streamed transactions are kept there until they commit; \
         check free space and permissions, or set spill_dir)",
        opts.name,
        opts.spill_dir.display()
    ))
    .caused_by(Cause::io(e))
}

pub(super) fn change_error(st: &State<'_>, e: &pgoutput::ChangeError) -> SourceError {
    // Each is a row the source cannot read, or a table the operator must fix first.
    SourceError::fatal(format!("{}: {e}", st.opts.name))
}
