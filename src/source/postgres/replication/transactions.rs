//! A transaction's bounds: Begin and Commit, and a streamed transaction replayed whole from its
//! spill file once it commits.

use super::feedback::emit;
use super::{Flow, OpenTx, State, on_data, spill_error, undecodable};
use crate::change::Lsn;
use crate::source::SourceError;
use crate::source::emitter::Event;
use crate::source::postgres::conn::ReplicationStream;
use crate::source::postgres::pgoutput;

pub(super) async fn begin_tx(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
    commit_lsn: Lsn,
    commit_time: i64,
) -> Result<Flow, SourceError> {
    st.tx = Some(OpenTx {
        lsn: commit_lsn,
        ordinal: 0,
    });
    emit(
        st,
        stream,
        Event::Begin {
            commit_lsn,
            commit_time,
        },
    )
    .await
}

pub(super) async fn commit_tx(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
    end_lsn: Lsn,
) -> Result<Flow, SourceError> {
    st.tx = None;
    st.committed = st.committed.max(end_lsn);
    emit(st, stream, Event::Commit { end_lsn }).await
}

/// A streamed transaction committed: replay its spilled messages as one ordinary transaction,
/// with the table shapes its own Relation messages announced.
pub(super) async fn replay_streamed(
    st: &mut State<'_>,
    stream: &mut ReplicationStream,
    xid: u32,
    commit_lsn: Lsn,
    end_lsn: Lsn,
    commit_time: i64,
) -> Result<Flow, SourceError> {
    let mut reader = st.spill.finish(xid).map_err(|e| spill_error(st.opts, &e))?;
    if let Flow::Stopped = begin_tx(st, stream, commit_lsn, commit_time).await? {
        return Ok(Flow::Stopped);
    }
    let mut relations = std::mem::take(&mut st.relations);
    let mut flow = Flow::Continue;
    loop {
        let next = match reader.next_message() {
            Ok(Some(data)) => data,
            Ok(None) => break,
            Err(e) => {
                st.relations = relations;
                return Err(spill_error(st.opts, &e));
            }
        };
        std::mem::swap(&mut st.relations, &mut relations);
        let result = match pgoutput::decode(next, true) {
            Ok(msg) => on_data(st, stream, msg).await,
            Err(e) => Err(undecodable(st.opts, &e)),
        };
        std::mem::swap(&mut st.relations, &mut relations);
        flow = result.inspect_err(|_| st.relations = std::mem::take(&mut relations))?;
        if let Flow::Stopped = flow {
            break;
        }
    }
    st.relations = relations;
    if let Flow::Continue = flow {
        return commit_tx(st, stream, end_lsn).await;
    }
    Ok(flow)
}
