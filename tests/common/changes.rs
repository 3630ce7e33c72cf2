//! Changes and lanes for the sink tests (`tests/sinks`), which drive a sink connector directly
//! with hand-built changes.

use std::sync::Arc;

use zipline::change::{Change, Lsn, Op, Position, Table, Value};
use zipline::sink::{Batch, LaneSink, SinkConnector};

pub fn pos(lsn: u64, ordinal: u32) -> Position {
    Position::new(Lsn::from(lsn), ordinal)
}

pub fn change(
    t: &Arc<Table>,
    at: Position,
    op: Op,
    key: Vec<Value>,
    old_key: Option<Vec<Value>>,
    values: Vec<Value>,
) -> Change {
    Change {
        position: at,
        op,
        table: Arc::clone(t),
        key: key.into(),
        old_key: old_key.map(|k| Box::new(k.into())),
        values,
    }
}

/// An update carrying the whole row (what a sink must upsert), keyed by the table's key.
pub fn upsert(t: &Arc<Table>, at: Position, values: Vec<Value>) -> Change {
    let key = t.key.iter().map(|&i| values[i].clone()).collect();
    change(t, at, Op::Update, key, None, values)
}

pub fn delete(t: &Arc<Table>, at: Position, key: Vec<Value>) -> Change {
    change(t, at, Op::Delete, key, None, Vec::new())
}

/// Lane `lane` of `lanes`, or a panic naming it.
pub async fn open(connector: &impl SinkConnector, lane: u32, lanes: u32) -> Box<dyn LaneSink> {
    connector
        .open_lane(lane, lanes)
        .await
        .unwrap_or_else(|e| panic!("opening lane {lane}/{lanes}: {}", e.report()))
}

/// `connector`, claimed for this test process (the claim's lease is kept for the whole test:
/// its fence session holds the pipeline's lock).
pub async fn claimed<C: SinkConnector>(connector: C) -> C {
    let holder = zipline::checkpoint::Holder::this_process();
    let lease = connector
        .claim(&holder, std::time::Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("claiming sink {}: {}", connector.name(), e.report()));
    std::mem::forget(lease);
    connector
}

/// Applies `changes` as one batch of lane 0, or panics with the sink's message.
pub async fn apply(lane: &mut Box<dyn LaneSink>, changes: Vec<Change>) {
    lane.apply(&Batch::new(0, changes))
        .await
        .unwrap_or_else(|e| panic!("{}", e.report()));
}
