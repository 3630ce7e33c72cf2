//! The dispatcher against in-memory doubles: the test plays the source (an emitter) and the
//! lanes (queue receivers that ack what they take).

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::{mpsc, watch};

use super::*;
use crate::change::{Change, Lsn, Op, Position, Table, Value};
use crate::lane::{Ack, LaneConfig, LaneReceiver, LaneStats, Queued, queue, run_lane};
use crate::runtime::{RouteStage, Tables, Transformer};
use crate::sink::{Batch, LaneSink, ParkedKey, SinkError};
use crate::source::emitter::{Emitter, channel};

fn table(name: &str) -> Arc<Table> {
    Arc::new(Table::new(
        "public".into(),
        name.into(),
        vec![crate::change::Column {
            name: "id".into(),
            type_oid: 20,
            type_modifier: -1,
            is_key: true,
        }],
    ))
}

fn change(t: &Arc<Table>, lsn: u64, ordinal: u32, id: i64, op: Op) -> Change {
    Change {
        position: Position::new(Lsn(u128::from(lsn)), ordinal),
        op,
        table: t.clone(),
        key: if op == Op::Truncate {
            smallvec::smallvec![]
        } else {
            smallvec::smallvec![Value::Int8(id)]
        },
        old_key: None,
        values: vec![Value::Int8(id)],
    }
}

/// A transaction's events: Begin, its changes, Commit (end = lsn + 1).
fn tx(lsn: u64, changes: Vec<Change>) -> Vec<Event> {
    let mut events = vec![Event::Begin {
        commit_lsn: Lsn(u128::from(lsn)),
        commit_time: 0,
    }];
    events.extend(changes.into_iter().map(Event::Change));
    events.push(Event::Commit {
        end_lsn: Lsn(u128::from(lsn + 1)),
    });
    events
}

struct Harness {
    emitter: Emitter,
    /// Per sink, per lane.
    lanes: Vec<Vec<LaneReceiver>>,
    acks: mpsc::UnboundedSender<Ack>,
    frontier: watch::Receiver<Frontier>,
    stop: watch::Sender<StopMode>,
    task: tokio::task::JoinHandle<Result<(), DispatchError>>,
}

/// `routes` over sinks of `lanes[s]` lanes each, queues of `capacity` changes.
fn start(routes: Vec<RouteStage>, lanes: &[u32], capacity: usize) -> Harness {
    let mut routers = Vec::new();
    let mut receivers = Vec::new();
    for &n in lanes {
        let (senders, rx): (Vec<_>, Vec<_>) = (0..n).map(|_| queue(capacity)).unzip();
        routers.push(Router::new(senders));
        receivers.push(rx);
    }
    let (emitter, events, frontier_tx) = channel(2, Lsn(0));
    let frontier = emitter.watch();
    let (ack_tx, ack_rx) = mpsc::unbounded_channel();
    let (stop_tx, stop_rx) = watch::channel(StopMode::Run);
    let dispatcher = Dispatcher::new(
        routes,
        routers,
        events,
        ack_rx,
        frontier_tx,
        stop_rx,
        Arc::new(SourceStats::default()),
    );
    Harness {
        emitter,
        lanes: receivers,
        acks: ack_tx,
        frontier,
        stop: stop_tx,
        task: tokio::spawn(dispatcher.run()),
    }
}

fn all_tables(sinks: Vec<usize>) -> RouteStage {
    RouteStage {
        name: "route 1".into(),
        tables: Tables::All,
        transform: None,
        sinks,
    }
}

impl Harness {
    async fn send(&mut self, events: Vec<Event>) {
        for e in events {
            self.emitter.push(e);
        }
        self.emitter
            .flush()
            .await
            .expect("the dispatcher takes events");
    }

    /// The next change on a lane, within a second.
    async fn take(&mut self, sink: usize, lane: usize) -> Queued {
        tokio::time::timeout(Duration::from_secs(1), self.lanes[sink][lane].recv())
            .await
            .expect("a change within a second")
            .expect("the lane queue is open")
    }

    /// Nothing arrives on the lane for a while.
    async fn nothing(&mut self, sink: usize, lane: usize) {
        let got =
            tokio::time::timeout(Duration::from_millis(150), self.lanes[sink][lane].recv()).await;
        assert!(got.is_err(), "expected nothing yet, got {got:?}");
    }

    fn ack(&self, changes: &[&Queued]) {
        let mut ack = Ack::default();
        for c in changes {
            ack.add(c.change.position.lsn, 1);
        }
        self.acks.send(ack).expect("the dispatcher takes acks");
    }

    /// Waits until the frontier is `lsn` (fails after a second).
    async fn frontier_at(&mut self, lsn: u64) {
        let want = Lsn(u128::from(lsn));
        tokio::time::timeout(Duration::from_secs(1), async {
            while self.frontier.borrow_and_update().lsn != want {
                self.frontier.changed().await.expect("the dispatcher runs");
            }
        })
        .await
        .unwrap_or_else(|_| panic!("frontier {} instead of {want}", self.frontier.borrow().lsn));
    }

    fn frontier_now(&self) -> Lsn {
        self.frontier.borrow().lsn
    }
}

#[tokio::test]
async fn the_frontier_never_passes_an_unapplied_change_nor_goes_back() {
    let t = table("orders");
    let mut h = start(vec![all_tables(vec![0])], &[1], 100);
    let mut events = tx(10, vec![change(&t, 10, 1, 1, Op::Insert)]);
    events.extend(tx(20, vec![change(&t, 20, 1, 2, Op::Insert)]));
    h.send(events).await;
    let first = h.take(0, 0).await;
    let second = h.take(0, 0).await;
    // The later transaction durable first: the frontier must wait for the earlier one.
    h.ack(&[&second]);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(h.frontier_now(), Lsn(0));
    h.ack(&[&first]);
    h.frontier_at(21).await;
    // An idle point below the frontier does not move it back.
    h.send(vec![Event::Idle { at: Lsn(15) }]).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(h.frontier_now(), Lsn(21));
    h.send(vec![Event::Idle { at: Lsn(40) }]).await;
    h.frontier_at(40).await;
}

#[tokio::test]
async fn a_truncate_waits_for_every_lane_and_nothing_overtakes_it() {
    let t = table("orders");
    let mut h = start(vec![all_tables(vec![0])], &[4], 100);
    // Keys 1..=8 spread over the four lanes.
    let before: Vec<Change> = (1..=8)
        .map(|k| change(&t, 10, k as u32, k, Op::Insert))
        .collect();
    let mut events = tx(10, before);
    events.extend(tx(20, vec![change(&t, 20, 1, 0, Op::Truncate)]));
    events.extend(tx(30, vec![change(&t, 30, 1, 1, Op::Insert)]));
    h.send(events).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut taken = Vec::new();
    for lane in 0..4 {
        while let Ok(c) = h.lanes[0][lane].try_recv() {
            taken.push(c);
        }
    }
    assert_eq!(taken.len(), 8, "the earlier changes arrive");
    // The truncate waits for them to be durable.
    h.nothing(0, 0).await;
    h.ack(&taken.iter().collect::<Vec<_>>());
    let truncate = h.take(0, 0).await;
    assert_eq!(truncate.change.op, Op::Truncate);
    // The change after it waits for the truncate to be durable.
    for lane in 0..4 {
        h.nothing(0, lane).await;
    }
    h.ack(&[&truncate]);
    let lane = crate::lane::lane_of("public", "orders", &[Value::Int8(1)], 4) as usize;
    let after = h.take(0, lane).await;
    assert_eq!(after.change.position.lsn, Lsn(30));
}

#[tokio::test]
async fn a_full_lane_holds_the_source_back() {
    let t = table("orders");
    // One lane holding two changes, and room for two parcels ahead.
    let mut h = start(vec![all_tables(vec![0])], &[1], 2);
    let mut accepted = 0;
    for i in 0..50u32 {
        h.emitter.push(Event::Change(change(
            &t,
            10,
            i + 1,
            i64::from(i),
            Op::Insert,
        )));
        match h.emitter.try_flush() {
            Ok(true) => accepted += 1,
            Ok(false) => break,
            Err(e) => panic!("{e}"),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        accepted < 10,
        "the dispatcher kept taking parcels ({accepted}) while the lane was full"
    );
    // Taking changes out frees room, and everything arrives in order.
    let mut last = 0;
    for _ in 0..accepted {
        let c = h.take(0, 0).await;
        assert!(c.change.position.ordinal > last);
        last = c.change.position.ordinal;
    }
}

#[tokio::test]
async fn closing_the_stream_drains_every_lane_and_publishes_the_last_frontier() {
    let t = table("orders");
    let mut h = start(vec![all_tables(vec![0])], &[2], 100);
    h.send(tx(
        10,
        vec![
            change(&t, 10, 1, 1, Op::Insert),
            change(&t, 10, 2, 2, Op::Insert),
        ],
    ))
    .await;
    h.emitter.close().await.expect("closed");
    let mut taken = Vec::new();
    for lane in 0..2 {
        // Each queue ends once what it holds is taken: the lanes commit and end.
        while let Some(c) = h.lanes[0][lane].recv().await {
            taken.push(c);
        }
    }
    assert_eq!(taken.len(), 2);
    h.ack(&taken.iter().collect::<Vec<_>>());
    // The lanes are gone: their ack senders close.
    let Harness {
        acks,
        task,
        mut frontier,
        ..
    } = h;
    drop(acks);
    task.await.expect("joined").expect("a clean drain");
    assert_eq!(frontier.borrow_and_update().lsn, Lsn(11));
}

struct Double;

impl Transformer for Double {
    fn batch_size(&self) -> usize {
        100
    }
    /// Every change twice, the copy under a `_copy` table with sub 1.
    fn transform(
        &self,
        changes: Vec<Change>,
    ) -> BoxFuture<'static, Result<Vec<(usize, Change)>, crate::transform::TransformError>> {
        Box::pin(async move {
            let copy = table("audit");
            Ok(changes
                .into_iter()
                .enumerate()
                .flat_map(|(i, c)| {
                    let mut other = c.clone();
                    other.table = copy.clone();
                    other.position.sub = 1;
                    [(i, c), (i, other)]
                })
                .collect())
        })
    }
}

#[tokio::test]
async fn routes_take_their_tables_through_their_own_transform() {
    let orders = table("orders");
    let customers = table("customers");
    let routes = vec![
        RouteStage {
            name: "route 1".into(),
            tables: Tables::Only(Tables::names(["public.orders"])),
            transform: Some(Arc::new(Double)),
            sinks: vec![0],
        },
        RouteStage {
            name: "route 2".into(),
            tables: Tables::Rest(Tables::names(["public.orders"])),
            transform: None,
            sinks: vec![1],
        },
    ];
    let mut h = start(routes, &[1, 1], 100);
    h.send(tx(
        10,
        vec![
            change(&orders, 10, 1, 1, Op::Insert),
            change(&customers, 10, 2, 7, Op::Insert),
        ],
    ))
    .await;
    let a = h.take(0, 0).await;
    let b = h.take(0, 0).await;
    assert_eq!(
        (a.change.table.name.as_str(), b.change.table.name.as_str()),
        ("orders", "audit")
    );
    let c = h.take(1, 0).await;
    assert_eq!(c.change.table.name, "customers");
    h.nothing(0, 0).await;
    h.nothing(1, 0).await;
    // The transaction is durable once every output of every route is.
    h.ack(&[&a, &c]);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(h.frontier_now(), Lsn(0));
    h.ack(&[&b]);
    h.frontier_at(11).await;
}

/// A pass-through whose first call answers only once a second call has been made: a
/// dispatcher that waits for a batch's outputs before handing the next batch over never gets
/// an answer.
struct Gate {
    calls: Arc<std::sync::atomic::AtomicUsize>,
}

impl Transformer for Gate {
    fn batch_size(&self) -> usize {
        1
    }
    fn transform(
        &self,
        changes: Vec<Change>,
    ) -> BoxFuture<'static, Result<Vec<(usize, Change)>, crate::transform::TransformError>> {
        let calls = self.calls.clone();
        let call = calls.fetch_add(1, Ordering::SeqCst) + 1;
        Box::pin(async move {
            while call == 1 && calls.load(Ordering::SeqCst) < 2 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Ok(changes.into_iter().enumerate().collect())
        })
    }
}

#[tokio::test]
async fn the_next_batch_is_transformed_while_the_last_is_replayed_in_order() {
    let t = table("orders");
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let route = RouteStage {
        transform: Some(Arc::new(Gate {
            calls: calls.clone(),
        })),
        ..all_tables(vec![0])
    };
    let mut h = start(vec![route], &[1], 100);
    // Both parcels wait in the channel before the dispatcher runs (the test's runtime has one
    // thread and sending to a channel with room does not yield).
    h.send(tx(10, vec![change(&t, 10, 1, 1, Op::Insert)])).await;
    h.send(tx(20, vec![change(&t, 20, 1, 2, Op::Insert)])).await;
    let first = h.take(0, 0).await;
    let second = h.take(0, 0).await;
    assert_eq!(
        (first.change.key.clone(), second.change.key.clone()),
        (
            smallvec::smallvec![Value::Int8(1)],
            smallvec::smallvec![Value::Int8(2)]
        )
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    h.ack(&[&first]);
    h.frontier_at(11).await;
    h.ack(&[&second]);
    h.frontier_at(21).await;
}

#[tokio::test]
async fn a_rewind_is_answered_once_nothing_is_in_flight() {
    let t = table("orders");
    let mut h = start(vec![all_tables(vec![0])], &[1], 100);
    // A complete transaction, then an open one the stream lost.
    let mut events = tx(10, vec![change(&t, 10, 1, 1, Op::Insert)]);
    events.push(Event::Begin {
        commit_lsn: Lsn(20),
        commit_time: 0,
    });
    events.push(Event::Change(change(&t, 20, 1, 2, Op::Insert)));
    h.send(events).await;
    let first = h.take(0, 0).await;
    let partial = h.take(0, 0).await;
    let answered = {
        let mut emitter = std::mem::replace(&mut h.emitter, channel(1, Lsn(0)).0);
        tokio::spawn(async move {
            let at = emitter.rewind().await;
            (at, emitter)
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!answered.is_finished(), "answered with changes in flight");
    h.ack(&[&first, &partial]);
    let (at, emitter) = answered.await.expect("joined");
    h.emitter = emitter;
    // The partial transaction is forgotten: the frontier covers only the complete one.
    assert_eq!(at, Ok(Lsn(11)));
    // It comes again whole, and then counts.
    h.send(tx(20, vec![change(&t, 20, 1, 2, Op::Insert)])).await;
    let again = h.take(0, 0).await;
    h.ack(&[&again]);
    h.frontier_at(21).await;
}

#[tokio::test]
async fn an_abort_ends_the_dispatcher_at_once() {
    let t = table("orders");
    let mut h = start(vec![all_tables(vec![0])], &[1], 1);
    // A lane that never takes anything: the dispatcher waits for room.
    h.send(tx(
        10,
        vec![
            change(&t, 10, 1, 1, Op::Insert),
            change(&t, 10, 2, 2, Op::Insert),
        ],
    ))
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    h.stop.send(StopMode::Abort).expect("sent");
    tokio::time::timeout(Duration::from_secs(1), h.task)
        .await
        .expect("ended within a second")
        .expect("joined")
        .expect("an abort is not an error");
}

/// A sink lane in memory: keeps every change it commits.
struct MemoryLane {
    committed: Arc<std::sync::Mutex<Vec<Change>>>,
    checkpoint: Option<Position>,
}

impl LaneSink for MemoryLane {
    fn checkpoint(&self) -> Option<Position> {
        self.checkpoint
    }
    fn apply<'a>(&'a mut self, batch: &'a Batch) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let mut committed = self.committed.lock().expect("not poisoned");
            committed.extend(batch.changes.iter().cloned());
            self.checkpoint = self
                .checkpoint
                .max(batch.changes.last().map(|c| c.position));
            Ok(())
        })
    }
    fn truncate<'a>(
        &'a mut self,
        _table: &'a Table,
        position: Position,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        self.checkpoint = Some(position);
        Box::pin(async { Ok(()) })
    }
    fn reconnect(&mut self) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(async { Ok(()) })
    }
    fn parked(&self) -> Vec<ParkedKey> {
        Vec::new()
    }
    fn replay<'a>(
        &'a mut self,
        _changes: &'a [Change],
        _ids: &'a [u64],
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async { Ok(()) })
    }
}

#[tokio::test]
async fn a_key_moved_to_another_lane_counts_as_one_change_applied() {
    let t = table("orders");
    let mut h = start(vec![all_tables(vec![0])], &[2], 100);
    let lane = |k: i64| crate::lane::lane_of("public", "orders", &[Value::Int8(k)], 2);
    let to = (2..100)
        .find(|&k| lane(k) != lane(1))
        .expect("a key on the other lane");
    // Real lanes over in-memory sinks, acking into the dispatcher.
    let committed = Arc::new(std::sync::Mutex::new(Vec::new()));
    let stats: Vec<Arc<LaneStats>> = (0..2).map(|_| Arc::default()).collect();
    for (n, rx) in std::mem::take(&mut h.lanes[0]).into_iter().enumerate() {
        let sink = MemoryLane {
            committed: committed.clone(),
            checkpoint: None,
        };
        let cfg = LaneConfig {
            sink: "memory".into(),
            batch_size: 100,
            max_wait: Duration::from_millis(5),
            statement_timeout: Duration::from_secs(5),
            outage_timeout: Duration::from_secs(5),
            on_error: crate::config::OnError::Halt,
        };
        tokio::spawn(run_lane(
            n as u32,
            Box::new(sink),
            rx,
            h.acks.clone(),
            cfg,
            stats[n].clone(),
        ));
    }
    let mut moved = change(&t, 20, 1, to, Op::Update);
    moved.old_key = Some(Box::new(smallvec::smallvec![Value::Int8(1)]));
    let mut events = tx(
        10,
        vec![
            change(&t, 10, 1, 1, Op::Insert),
            change(&t, 10, 2, to + 100, Op::Insert),
        ],
    );
    events.extend(tx(20, vec![moved]));
    events.extend(tx(30, vec![change(&t, 30, 1, to, Op::Delete)]));
    h.send(events).await;
    h.frontier_at(31).await;

    let committed = committed.lock().expect("not poisoned").clone();
    let at_20: Vec<_> = committed
        .iter()
        .filter(|c| c.position.lsn == Lsn(20))
        .map(|c| (c.op, c.key.clone()))
        .collect();
    assert_eq!(committed.len(), 5, "{committed:?}");
    assert_eq!(at_20.len(), 2, "the move reached the sink in two halves");
    assert!(
        at_20.contains(&(Op::Delete, smallvec::smallvec![Value::Int8(1)])),
        "{at_20:?}"
    );
    assert!(
        at_20.contains(&(Op::Update, smallvec::smallvec![Value::Int8(to)])),
        "{at_20:?}"
    );
    // Four source changes: two inserts, the move, a delete; the move counts once, on the
    // lane of its new key.
    let applied: Vec<u64> = stats
        .iter()
        .map(|s| s.applied.load(Ordering::Relaxed))
        .collect();
    assert_eq!(applied.iter().sum::<u64>(), 4, "{applied:?}");
    let batches: u64 = stats
        .iter()
        .map(|s| s.batches.load(Ordering::Relaxed))
        .sum();
    assert!(batches >= 2, "both lanes committed: {batches}");
}
