//! The dispatcher: the source's events in, through each route's transform, out to the sink
//! lanes in parcels; lane acks in, the durable frontier out.
//!
//! Ordering: events are handled strictly in the order the source emitted them. A change goes
//! to every route that takes its table; each output (the change itself, or what the route's
//! transform made of it) goes to each of the route's sinks, to the lane its key hashes to, and
//! is counted against its transaction in the [`AckTracker`]. Lanes get their changes in
//! parcels: one hand-over per lane per source parcel, not per change. A change that touches
//! more than one lane's keys (a truncate, a TOAST move across lanes) is a barrier: everything
//! before it becomes durable first, it goes alone, and it becomes durable before anything
//! after it is handed over.
//!
//! Transforms see changes in batches that may span transactions: parcels are gathered until
//! the largest route batch size is reached or no more parcel is waiting. While more is
//! waiting, a batch's outputs are replayed only after the next batch has been handed to the
//! transforms, so a transform's thread and the dispatcher work at the same time; the order of
//! what reaches the lanes is unchanged. While a transform runs, or a lane has no room, acks
//! keep being taken, so the frontier keeps moving.
//!
//! The frontier only grows; a [`Event::Rewind`] is answered (its count in the frontier
//! incremented) once nothing is in flight and the open transaction is forgotten.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::{mpsc, watch};

use super::route::{RouteStage, TransformCall};
use crate::change::{Change, Op, Table, now_micros_since_2000};
use crate::lane::{
    Ack, AckTracker, Parcel, Queued, Router, Split, TableHash, lane_of, needs_barrier, plan,
};
use crate::source::emitter::{Event, Events, Frontier};
use crate::source::{SourceStats, StopMode};
use crate::transform::TransformError;

/// Most changes handed to a lane at once. A parcel holds its changes inline (128 bytes each)
/// and its buffer comes back from the lane to be filled again (see [`crate::parcel`]):
/// bounded, the buffers a lane keeps stay medium-sized blocks rather than ones of up to
/// `queue_capacity` changes.
const LANE_PARCEL: usize = 512;

/// Item buffers kept for reuse: a batch's, and the next one's while the first's replay waits.
const SPARE_ITEMS: usize = 2;

/// Why the dispatcher stopped the pipeline.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    /// A route's transform failed (its policy was to halt).
    #[error("{error}")]
    Transform {
        /// The route.
        route: String,
        /// What the transform said (it names the route and the module).
        error: TransformError,
    },
    /// Every lane of a sink has stopped (the lanes report why).
    #[error("the lanes of sink #{sink} stopped")]
    LanesGone {
        /// Index of the sink.
        sink: usize,
    },
}

/// Why a wait ended early.
enum Halt {
    /// The pipeline aborts.
    Abort,
    Failed(DispatchError),
}

impl From<DispatchError> for Halt {
    fn from(e: DispatchError) -> Self {
        Halt::Failed(e)
    }
}

/// Everything the dispatcher runs with.
pub struct Dispatcher {
    routes: Vec<RouteStage>,
    routers: Vec<Router>,
    events: Events,
    acks: mpsc::UnboundedReceiver<Ack>,
    frontier: watch::Sender<Frontier>,
    stop: watch::Receiver<StopMode>,
    stats: Arc<SourceStats>,
    tracker: AckTracker,
    /// Per sink, per lane: changes waiting to be handed over.
    out: Vec<Vec<Parcel>>,
    /// Changes to gather before calling transforms (0: no route transforms).
    gather: usize,
    /// A batch whose replay waits for the next batch's transforms to have been called.
    transforming: Option<Transforming>,
    /// The last routed change's table and its hash state: a source's changes come in runs of
    /// one table, so one entry spares hashing the table's names for nearly every change.
    last_table: Option<(Arc<Table>, TableHash)>,
    /// (sink, lane) of the parcels the last [`Dispatcher::spread`] filled.
    full: Vec<(usize, u32)>,
    /// Emptied item buffers: a batch's and, while its replay is put off, the next one's.
    /// Only this task fills and empties them, so they need no shared store.
    spare_items: Vec<Vec<Item>>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("routes", &self.routes)
            .field("sinks", &self.routers.len())
            .finish_non_exhaustive()
    }
}

/// One gathered event, a change possibly moved into a transform's input.
enum Item {
    Begin {
        commit_lsn: crate::change::Lsn,
        commit_time: i64,
    },
    Change(Option<Change>),
    Commit {
        end_lsn: crate::change::Lsn,
    },
    Idle {
        at: crate::change::Lsn,
    },
    Rewind,
}

/// A gathered batch whose route transforms have been called and may still be running.
struct Transforming {
    items: Vec<Item>,
    /// Per route: `None` without a transform.
    calls: Vec<Option<Call>>,
}

/// One route's transform call over a batch.
struct Call {
    /// The index (among the batch's changes) of each input.
    index: Vec<usize>,
    /// The answer; `None` when the route took none of the batch's changes.
    reply: Option<TransformCall>,
}

impl Dispatcher {
    /// A dispatcher over `routers` (one per sink, indexed as the routes' `sinks`), taking
    /// `events` and `acks`, publishing `frontier` (whose current value is where it starts).
    pub fn new(
        routes: Vec<RouteStage>,
        routers: Vec<Router>,
        events: Events,
        acks: mpsc::UnboundedReceiver<Ack>,
        frontier: watch::Sender<Frontier>,
        stop: watch::Receiver<StopMode>,
        stats: Arc<SourceStats>,
    ) -> Self {
        let start = frontier.borrow().lsn;
        let out = routers
            .iter()
            .map(|r| (0..r.lanes()).map(|_| Vec::new()).collect())
            .collect();
        let gather = routes
            .iter()
            .filter_map(|r| r.transform.as_ref().map(|t| t.batch_size().max(1)))
            .max()
            .unwrap_or(0);
        Dispatcher {
            routes,
            routers,
            events,
            acks,
            frontier,
            stop,
            stats,
            tracker: AckTracker::new(start),
            out,
            gather,
            transforming: None,
            last_table: None,
            full: Vec::new(),
            spare_items: Vec::with_capacity(SPARE_ITEMS),
        }
    }

    /// Runs until the source closes its stream (then lets every lane commit what it holds,
    /// publishes the last frontier and returns) or the pipeline aborts.
    pub async fn run(mut self) -> Result<(), DispatchError> {
        match self.serve().await {
            Ok(()) | Err(Halt::Abort) => Ok(()),
            Err(Halt::Failed(e)) => Err(e),
        }
    }

    async fn serve(&mut self) -> Result<(), Halt> {
        loop {
            tokio::select! {
                biased;
                changed = self.stop.changed() => self.on_stop(changed.is_err())?,
                Some(ack) = self.acks.recv() => self.on_ack(&ack),
                parcel = self.events.recv() => match parcel {
                    Some(parcel) => self.take(parcel).await?,
                    None => return self.drain().await,
                },
            }
        }
    }

    fn on_stop(&mut self, gone: bool) -> Result<(), Halt> {
        if gone || *self.stop.borrow_and_update() == StopMode::Abort {
            return Err(Halt::Abort);
        }
        Ok(())
    }

    fn on_ack(&mut self, ack: &Ack) {
        self.tracker.ack(ack);
        while let Ok(more) = self.acks.try_recv() {
            self.tracker.ack(&more);
        }
        self.publish();
    }

    /// The frontier (when it moved) and the lag.
    fn publish(&mut self) {
        let lag = self
            .tracker
            .oldest_pending_commit_time()
            .map_or(0, |t| (now_micros_since_2000() - t).max(0));
        self.stats.lag_micros.store(lag, Ordering::Relaxed);
        let durable = self.tracker.frontier();
        self.frontier.send_if_modified(|f| {
            let moved = durable > f.lsn;
            if moved {
                f.lsn = durable;
            }
            moved
        });
    }

    /// One parcel, with the parcels waiting behind it when a transform wants more changes.
    /// The batch's transforms are called at once; the previous batch, if its replay was put
    /// off, is replayed while they run.
    async fn take(&mut self, parcel: Vec<Event>) -> Result<(), Halt> {
        let mut items = self.spare_items.pop().unwrap_or_default();
        items.reserve(parcel.len());
        let mut changes = push_items(&mut items, parcel, &self.events);
        while changes < self.gather {
            match self.events.try_recv() {
                Some(more) => changes += push_items(&mut items, more, &self.events),
                None => break,
            }
        }
        let calls = self.call_transforms(&mut items);
        let batch = Transforming { items, calls };
        if let Some(previous) = self.transforming.take() {
            self.finish(previous).await?;
        }
        // More is waiting: gather it and hand it to the transforms before replaying this
        // batch, so the transforms' threads and the dispatcher work at the same time. Nothing
        // waiting: replay now, so a quiet stream's last changes are not held back.
        if self.gather > 0 && !self.events.is_empty() {
            self.transforming = Some(batch);
            return Ok(());
        }
        self.finish(batch).await
    }

    /// Replays a batch once its transforms have answered, and hands its parcels over.
    async fn finish(&mut self, batch: Transforming) -> Result<(), Halt> {
        let outputs = self.outputs(batch.calls).await?;
        self.replay(batch.items, outputs).await?;
        self.flush_all().await?;
        self.publish();
        Ok(())
    }

    /// Calls every route's transform with the changes it takes (moving them out of `items`
    /// when no other route wants them). `None` for a route without a transform.
    fn call_transforms(&self, items: &mut [Item]) -> Vec<Option<Call>> {
        let mut calls = Vec::with_capacity(self.routes.len());
        for route in &self.routes {
            let Some(transform) = &route.transform else {
                calls.push(None);
                continue;
            };
            let mut inputs = Vec::new();
            let mut index = Vec::new();
            let mut n = 0usize;
            for item in items.iter_mut() {
                let Item::Change(slot) = item else { continue };
                if let Some(change) = slot.as_ref()
                    && route.tables.takes_table(&change.table)
                {
                    index.push(n);
                    if self.takers(change) == 1 {
                        inputs.push(slot.take().unwrap_or_else(|| unreachable!()));
                    } else {
                        inputs.push(change.clone());
                    }
                }
                n += 1;
            }
            let reply = (!inputs.is_empty()).then(|| transform.transform(inputs));
            calls.push(Some(Call { index, reply }));
        }
        calls
    }

    /// Per route, the outputs of its call with the index (among the items' changes) of their
    /// input, awaited while taking acks. `None` for a route without a transform.
    async fn outputs(
        &mut self,
        calls: Vec<Option<Call>>,
    ) -> Result<Vec<Option<Vec<(usize, Change)>>>, Halt> {
        let mut outputs = Vec::with_capacity(calls.len());
        for (r, call) in calls.into_iter().enumerate() {
            let Some(Call { index, reply }) = call else {
                outputs.push(None);
                continue;
            };
            let result = match reply {
                None => Vec::new(),
                Some(reply) => self.await_serving(reply).await?.map_err(|error| {
                    Halt::Failed(DispatchError::Transform {
                        route: self.routes[r].name.clone(),
                        error,
                    })
                })?,
            };
            outputs.push(Some(
                result.into_iter().map(|(i, c)| (index[i], c)).collect(),
            ));
        }
        Ok(outputs)
    }

    /// How many routes take `change`'s table.
    fn takers(&self, change: &Change) -> usize {
        self.routes
            .iter()
            .filter(|r| r.tables.takes_table(&change.table))
            .count()
    }

    /// The items in order: markers to the tracker, changes (or their outputs) to the lanes.
    async fn replay(
        &mut self,
        mut items: Vec<Item>,
        outputs: Vec<Option<Vec<(usize, Change)>>>,
    ) -> Result<(), Halt> {
        let mut outputs: Vec<_> = outputs
            .into_iter()
            .map(|o| o.map(|v| v.into_iter().peekable()))
            .collect();
        let mut n = 0usize;
        for item in items.drain(..) {
            match item {
                Item::Begin {
                    commit_lsn,
                    commit_time,
                } => self.tracker.begin(commit_lsn, commit_time),
                Item::Commit { end_lsn } => self.tracker.commit(end_lsn),
                Item::Idle { at } => self.tracker.idle_advance(at),
                Item::Rewind => self.rewind().await?,
                Item::Change(mut slot) => {
                    for (r, out) in outputs.iter_mut().enumerate() {
                        match out.as_mut() {
                            Some(out) => {
                                while let Some((_, change)) = out.next_if(|(i, _)| *i == n) {
                                    if let Some(change) = self.spread(r, change) {
                                        self.barrier_of(r, change).await?;
                                    }
                                    self.flush_full().await?;
                                }
                            }
                            None => {
                                let Some(change) = slot.as_ref() else {
                                    continue;
                                };
                                if !self.routes[r].tables.takes_table(&change.table) {
                                    continue;
                                }
                                let last = !self.routes[r + 1..].iter().any(|later| {
                                    later.transform.is_none()
                                        && later.tables.takes_table(&change.table)
                                });
                                let change = if last {
                                    slot.take().unwrap_or_else(|| unreachable!())
                                } else {
                                    change.clone()
                                };
                                if let Some(change) = self.spread(r, change) {
                                    self.barrier_of(r, change).await?;
                                }
                                self.flush_full().await?;
                            }
                        }
                    }
                    n += 1;
                }
            }
        }
        if self.spare_items.len() < SPARE_ITEMS {
            items.clear();
            self.spare_items.push(items);
        }
        Ok(())
    }

    /// One change of route `r` to each of its sinks. Not async, so the change is moved into
    /// its lanes' parcels without first being moved into a future's state: the parcels it
    /// filled are left in `self.full` for [`Dispatcher::flush_full`]. A change that must be a
    /// barrier is given back untouched (`Some`).
    fn spread(&mut self, r: usize, change: Change) -> Option<Change> {
        let count = self.routes[r].sinks.len();
        let barrier = self.routes[r]
            .sinks
            .iter()
            .any(|&s| needs_barrier(&change, self.routers[s].lanes()));
        if barrier {
            return Some(change);
        }
        let mut change = Some(change);
        for i in 0..count {
            let s = self.routes[r].sinks[i];
            // Cloned for every sink but the last, which takes the original.
            let copy = if i + 1 == count {
                change.take()
            } else {
                change.clone()
            };
            let Some(mut copy) = copy else { break };
            let table = self.table_hash(&copy.table);
            let Split { lane, moved } = plan(&mut copy, table, self.routers[s].lanes());
            if let Some((old_lane, delete)) = moved
                && self.push(s, old_lane, delete, false)
            {
                self.full.push((s, old_lane));
            }
            if self.push(s, lane, copy, true) {
                self.full.push((s, lane));
            }
        }
        None
    }

    /// A change of route `r` that [`Dispatcher::spread`] gave back: a barrier to its sinks.
    async fn barrier_of(&mut self, r: usize, change: Change) -> Result<(), Halt> {
        let sinks = self.routes[r].sinks.clone();
        self.barrier(&sinks, change).await
    }

    /// Hands over the parcels [`Dispatcher::spread`] filled.
    async fn flush_full(&mut self) -> Result<(), Halt> {
        for i in 0..self.full.len() {
            let (sink, lane) = self.full[i];
            self.flush(sink, lane).await?;
        }
        self.full.clear();
        Ok(())
    }

    /// The hash state of `table` (see [`TableHash`]).
    fn table_hash(&mut self, table: &Arc<Table>) -> TableHash {
        match &self.last_table {
            Some((last, hash)) if Arc::ptr_eq(last, table) => *hash,
            _ => {
                let hash = TableHash::new(&table.schema, &table.name);
                self.last_table = Some((Arc::clone(table), hash));
                hash
            }
        }
    }

    /// Adds a change to a lane's parcel, handing the parcel over once it is full; `counts`:
    /// whether applying it counts as a change applied (see [`plan`]).
    async fn queue(
        &mut self,
        sink: usize,
        lane: u32,
        change: Change,
        counts: bool,
    ) -> Result<(), Halt> {
        if self.push(sink, lane, change, counts) {
            self.flush(sink, lane).await?;
        }
        Ok(())
    }

    /// Adds a change to a lane's parcel; true when the parcel is full. Not async, so the
    /// change is moved once, into the parcel, rather than into a future's state first.
    fn push(&mut self, sink: usize, lane: u32, change: Change, counts: bool) -> bool {
        let parcel = &mut self.out[sink][lane as usize];
        parcel.push(Queued { change, counts });
        self.tracker.dispatched(1);
        parcel.len() >= self.routers[sink].sender(lane).capacity().min(LANE_PARCEL)
    }

    /// A change that must be ordered against every lane: alone, between two idle points (a
    /// truncate to lane 0, a TOAST move to its new key's lane).
    async fn barrier(&mut self, sinks: &[usize], change: Change) -> Result<(), Halt> {
        self.wait_idle().await?;
        for &s in sinks {
            let lane = if change.op == Op::Truncate {
                0
            } else {
                lane_of(
                    &change.table.schema,
                    &change.table.name,
                    &change.key,
                    self.routers[s].lanes(),
                )
            };
            self.queue(s, lane, change.clone(), true).await?;
        }
        self.wait_idle().await
    }

    /// Hands one lane's parcel over, waiting for room while taking acks.
    async fn flush(&mut self, sink: usize, lane: u32) -> Result<(), Halt> {
        let out = &mut self.out[sink][lane as usize];
        if out.is_empty() {
            return Ok(());
        }
        // The next parcel sized like this one: grown by doubling, it would copy its changes
        // (128 bytes each) once or twice over and leave the smaller blocks behind.
        let sender = self.routers[sink].sender(lane).clone();
        let parcel = std::mem::replace(out, sender.parcel(out.len()));
        let parcel = match sender.try_send(parcel) {
            Ok(()) => return Ok(()),
            Err((_, Some(_))) => return Err(DispatchError::LanesGone { sink }.into()),
            Err((parcel, None)) => parcel,
        };
        let reserved = self.await_serving(sender.reserve(parcel.len())).await?;
        reserved
            .and_then(|room| room.send(parcel))
            .map_err(|_| Halt::Failed(DispatchError::LanesGone { sink }))
    }

    /// Hands every waiting parcel over.
    async fn flush_all(&mut self) -> Result<(), Halt> {
        for sink in 0..self.out.len() {
            for lane in 0..self.out[sink].len() {
                self.flush(sink, lane as u32).await?;
            }
        }
        Ok(())
    }

    /// Waits until everything handed over is durable.
    async fn wait_idle(&mut self) -> Result<(), Halt> {
        self.flush_all().await?;
        while self.tracker.in_flight() > 0 {
            tokio::select! {
                biased;
                changed = self.stop.changed() => self.on_stop(changed.is_err())?,
                ack = self.acks.recv() => match ack {
                    Some(ack) => self.on_ack(&ack),
                    None => return Err(DispatchError::LanesGone { sink: 0 }.into()),
                },
            }
        }
        Ok(())
    }

    /// The source lost its stream: settle what is in flight, forget the open transaction,
    /// answer.
    async fn rewind(&mut self) -> Result<(), Halt> {
        self.wait_idle().await?;
        self.tracker.abandon_open();
        let durable = self.tracker.frontier();
        self.frontier.send_modify(|f| {
            f.lsn = f.lsn.max(durable);
            f.rewinds += 1;
        });
        Ok(())
    }

    /// Awaits `fut` while taking acks (and noticing an abort).
    async fn await_serving<T>(&mut self, fut: impl Future<Output = T>) -> Result<T, Halt> {
        tokio::pin!(fut);
        loop {
            tokio::select! {
                biased;
                changed = self.stop.changed() => self.on_stop(changed.is_err())?,
                Some(ack) = self.acks.recv() => self.on_ack(&ack),
                out = &mut fut => return Ok(out),
            }
        }
    }

    /// The stream ended (a graceful stop): hand everything over, close the lane queues so each
    /// lane commits what it holds and ends, and take acks until the last lane has ended.
    async fn drain(&mut self) -> Result<(), Halt> {
        if let Some(batch) = self.transforming.take() {
            self.finish(batch).await?;
        }
        self.flush_all().await?;
        self.routers.clear();
        loop {
            tokio::select! {
                biased;
                changed = self.stop.changed() => self.on_stop(changed.is_err())?,
                ack = self.acks.recv() => match ack {
                    Some(ack) => self.on_ack(&ack),
                    None => break,
                },
            }
        }
        self.publish();
        Ok(())
    }
}

/// Appends a parcel's events as items, handing the emptied parcel back; returns how many
/// changes it held.
fn push_items(items: &mut Vec<Item>, mut parcel: Vec<Event>, events: &Events) -> usize {
    let mut changes = 0;
    for event in parcel.drain(..) {
        items.push(match event {
            Event::Begin {
                commit_lsn,
                commit_time,
            } => Item::Begin {
                commit_lsn,
                commit_time,
            },
            Event::Change(change) => {
                changes += 1;
                Item::Change(Some(change))
            }
            Event::Commit { end_lsn } => Item::Commit { end_lsn },
            Event::Idle { at } => Item::Idle { at },
            Event::Rewind => Item::Rewind,
        });
    }
    events.give(parcel);
    changes
}

#[cfg(test)]
#[path = "dispatcher_tests.rs"]
mod tests;
