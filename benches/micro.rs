//! Micro-benchmarks of the hot paths every change takes, on in-memory data, so a change to one
//! of them shows its gain or loss apart from the servers' noise:
//! - `decode`: pgoutput row messages into [`Change`]s (the source's share), values in text and
//!   in binary format (pgoutput's `binary` option);
//! - `route`: the key hash choosing each change's lane;
//! - `handoff`: the dispatcher taking transactions from the source's channel and handing them to
//!   four lane queues, the lanes taking them and acking, the frontier following;
//! - `coalesce`: a lane batch to the last effect per key;
//! - `mysql_statements`, `postgres_statements`: the sinks' statements of a lane batch, built and
//!   (PostgreSQL) encoded as sent; `mysql_bulk_statements`: the MariaDB sink's bulk statements
//!   and their parameters (before the driver encodes them).
//!
//! Every benchmark works on the same 1,000 changes, the backlog benchmarks' mix on their
//! `items` table (`benches/common_backlog`): transactions of 100 changes, 60 inserts, 30
//! updates and 10 deletes, updates and deletes on rows the sink already holds. Times are per
//! batch of 1,000; divan also prints changes per second.
//!
//! `cargo bench --features bench --bench micro` (the `bench` feature opens `zipline::bench`,
//! the crate-private entry points; divan's own options follow `--`, e.g. `-- decode`).

use std::sync::{Arc, LazyLock};

use bytes::{BufMut, Bytes, BytesMut};
use divan::counter::ItemsCount;
use divan::{Bencher, black_box};
use tokio::sync::{mpsc, watch};

use zipline::bench::{self, PgoutputDecoder};
use zipline::change::{Change, Lsn, Position, Table};
use zipline::lane::{Ack, LaneReceiver, Router, TableHash, lane_of, queue};
use zipline::runtime::{Dispatcher, RouteStage, Tables};
use zipline::source::emitter::{Emitter, channel};
use zipline::source::{Event, SourceStats, StopMode};

// The allocator the `zipline` binary runs with (`src/main.rs`): allocation is a large share of
// these paths, and glibc's costs differ.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    divan::main();
}

const CHANGES: usize = 1_000;
const PER_TX: usize = 100;
const REL_ID: u32 = 16_384;
/// Rows the sink holds before the batch: updates and deletes pick among them.
const HELD: u64 = 100_000;

/// `items` as in the backlog benchmarks: (name, type OID, type modifier, key).
const COLUMNS: [(&str, u32, i32, bool); 5] = [
    ("id", 20, -1, true),
    ("name", 25, -1, false),
    ("qty", 23, -1, false),
    ("price", 1700, (12 << 16 | 2) + 4, false),
    ("updated_at", 1184, -1, false),
];

/// The sink table's columns and their cast types, for the PostgreSQL sink.
const SINK_COLUMNS: [(&str, &str); 5] = [
    ("id", "bigint"),
    ("name", "text"),
    ("qty", "integer"),
    ("price", "numeric"),
    ("updated_at", "timestamptz"),
];

fn relation_message() -> Bytes {
    let mut m = BytesMut::new();
    m.put_u8(b'R');
    m.put_u32(REL_ID);
    m.put_slice(b"public\0items\0");
    m.put_u8(b'd');
    m.put_i16(COLUMNS.len() as i16);
    for (name, oid, typmod, key) in COLUMNS {
        m.put_u8(u8::from(key));
        m.put_slice(name.as_bytes());
        m.put_u8(0);
        m.put_u32(oid);
        m.put_i32(typmod);
    }
    m.freeze()
}

fn put_text(m: &mut BytesMut, text: &str) {
    m.put_u8(b't');
    m.put_i32(text.len() as i32);
    m.put_slice(text.as_bytes());
}

fn put_binary(m: &mut BytesMut, bytes: &[u8]) {
    m.put_u8(b'b');
    m.put_i32(bytes.len() as i32);
    m.put_slice(bytes);
}

/// The id: as text, or as `int8send` sends it.
fn put_id(m: &mut BytesMut, id: u64, binary: bool) {
    if binary {
        put_binary(m, &id.to_be_bytes());
    } else {
        put_text(m, &id.to_string());
    }
}

/// Microseconds from 2000-01-01 to 2024-01-01 (8,766 days).
const MICROS_TO_2024: u64 = 8_766 * 86_400 * 1_000_000;

/// A whole row as pgoutput sends it, in text format or with its `binary` option.
fn put_row(m: &mut BytesMut, id: u64, rng: &mut u64, binary: bool) {
    let name = format!("item-{id}-{}", next(rng) % 1000);
    let qty = next(rng) % 10_000;
    let (units, cents) = (next(rng) % 100_000, next(rng) % 100);
    let (secs, micros) = (next(rng) % 86_400, next(rng) % 1_000_000);
    m.put_i16(COLUMNS.len() as i16);
    put_id(m, id, binary);
    if binary {
        put_binary(m, name.as_bytes());
        put_binary(m, &(qty as u32).to_be_bytes());
        put_binary(m, &numeric_send(units, cents));
        put_binary(
            m,
            &(MICROS_TO_2024 + secs * 1_000_000 + micros).to_be_bytes(),
        );
        return;
    }
    put_text(m, &name);
    put_text(m, &qty.to_string());
    put_text(m, &format!("{units}.{cents:02}"));
    put_text(
        m,
        &format!(
            "2024-01-01 {:02}:{:02}:{:02}.{micros:06}+00",
            secs / 3600,
            secs / 60 % 60,
            secs % 60,
        ),
    );
}

/// `units.cents` (units below 100,000) as `numeric_send` sends a `numeric(12,2)`: base-10000
/// digits without leading or trailing zero digits.
fn numeric_send(units: u64, cents: u64) -> Vec<u8> {
    let mut digits = vec![units / 10_000, units % 10_000, cents * 100];
    let mut weight: i16 = 1;
    while digits.first() == Some(&0) {
        digits.remove(0);
        weight -= 1;
    }
    while digits.last() == Some(&0) {
        digits.pop();
    }
    if digits.is_empty() {
        weight = 0;
    }
    let mut out = Vec::with_capacity(8 + 2 * digits.len());
    out.extend((digits.len() as u16).to_be_bytes());
    out.extend(weight.to_be_bytes());
    out.extend([0, 0, 0, 2]);
    for d in digits {
        out.extend((d as u16).to_be_bytes());
    }
    out
}

fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// The batch's row messages, in order: per 100, 60 inserts of new rows, 30 updates and 10
/// deletes of rows the sink holds; values in text or binary format.
fn row_messages(binary: bool) -> Vec<Bytes> {
    let mut rng = 0x5EED_2210_4471_u64;
    let mut next_id = HELD + 1;
    (0..CHANGES)
        .map(|i| {
            let mut m = BytesMut::new();
            match i % PER_TX {
                0..60 => {
                    m.put_u8(b'I');
                    m.put_u32(REL_ID);
                    m.put_u8(b'N');
                    put_row(&mut m, next_id, &mut rng, binary);
                    next_id += 1;
                }
                60..90 => {
                    m.put_u8(b'U');
                    m.put_u32(REL_ID);
                    m.put_u8(b'N');
                    let id = 1 + next(&mut rng) % HELD;
                    put_row(&mut m, id, &mut rng, binary);
                }
                _ => {
                    m.put_u8(b'D');
                    m.put_u32(REL_ID);
                    m.put_u8(b'K');
                    m.put_i16(COLUMNS.len() as i16);
                    put_id(&mut m, 1 + next(&mut rng) % HELD, binary);
                    for _ in 1..COLUMNS.len() {
                        m.put_u8(b'n');
                    }
                }
            }
            m.freeze()
        })
        .collect()
}

struct Batch {
    decoder: PgoutputDecoder,
    messages: Vec<Bytes>,
    /// The same rows with pgoutput's `binary` option.
    binary: Vec<Bytes>,
    changes: Vec<Change>,
    shared: Vec<Change>,
}

fn position(i: usize) -> Position {
    let tx = (i / PER_TX) as u64;
    Position::new(Lsn::from(0x1000 + tx * 0x100), (i % PER_TX) as u32 + 1)
}

static BATCH: LazyLock<Batch> = LazyLock::new(|| {
    let mut decoder = PgoutputDecoder::default();
    decoder.relation(relation_message()).expect("relation");
    let messages = row_messages(false);
    let binary = row_messages(true);
    let changes: Vec<Change> = messages
        .iter()
        .enumerate()
        .map(|(i, m)| decoder.change(m.clone(), position(i)).expect("row"))
        .collect();
    for (i, m) in binary.iter().enumerate() {
        let change = decoder.change(m.clone(), position(i)).expect("binary row");
        assert_eq!(
            format!("{change:?}"),
            format!("{:?}", changes[i]),
            "binary and text rows decode alike"
        );
    }
    let shared = changes.clone();
    Batch {
        decoder,
        messages,
        binary,
        changes,
        shared,
    }
});

#[divan::bench(args = ["text", "binary"])]
fn decode(bencher: Bencher, format: &str) {
    let batch = &*BATCH;
    let messages = match format {
        "binary" => &batch.binary,
        _ => &batch.messages,
    };
    bencher.counter(ItemsCount::new(CHANGES)).bench(|| {
        for (i, m) in messages.iter().enumerate() {
            let change = batch.decoder.change(m.clone(), position(i));
            black_box(change.expect("row"));
        }
    });
}

#[divan::bench]
fn route(bencher: Bencher) {
    let batch = &*BATCH;
    bencher.counter(ItemsCount::new(CHANGES)).bench(|| {
        let mut lanes = [0u32; 4];
        for c in &batch.changes {
            lanes[lane_of(&c.table.schema, &c.table.name, &c.key, 4) as usize] += 1;
        }
        black_box(lanes)
    });
}

/// Routing as the dispatcher does it: the table's part of the hash kept while the table
/// stays the same, so only the key is hashed per change.
#[divan::bench]
fn route_table_hash(bencher: Bencher) {
    let batch = &*BATCH;
    bencher.counter(ItemsCount::new(CHANGES)).bench(|| {
        let mut lanes = [0u32; 4];
        let mut last: Option<(&Arc<Table>, TableHash)> = None;
        for c in &batch.changes {
            let hash = match last {
                Some((table, hash)) if Arc::ptr_eq(table, &c.table) => hash,
                _ => {
                    let hash = TableHash::new(&c.table.schema, &c.table.name);
                    last = Some((&c.table, hash));
                    hash
                }
            };
            lanes[hash.lane_of(&c.key, 4) as usize] += 1;
        }
        black_box(lanes)
    });
}

#[divan::bench]
fn coalesce(bencher: Bencher) {
    let batch = &*BATCH;
    bencher
        .counter(ItemsCount::new(CHANGES))
        .bench(|| black_box(bench::coalesced(&batch.shared).expect("coalesced")));
}

#[divan::bench]
fn mysql_statements(bencher: Bencher) {
    let batch = &*BATCH;
    let mut buf = String::new();
    bencher.counter(ItemsCount::new(CHANGES)).bench_local(|| {
        buf.clear();
        black_box(bench::mysql::statements(&batch.shared, &mut buf).expect("statements"));
    });
}

#[divan::bench]
fn mysql_bulk_statements(bencher: Bencher) {
    let batch = &*BATCH;
    let mut buf = String::new();
    bencher.counter(ItemsCount::new(CHANGES)).bench_local(|| {
        buf.clear();
        black_box(bench::mysql::bulk_statements(&batch.shared, &mut buf).expect("statements"));
    });
}

#[divan::bench]
fn postgres_statements(bencher: Bencher) {
    let batch = &*BATCH;
    let mut out = BytesMut::new();
    bencher.counter(ItemsCount::new(CHANGES)).bench_local(|| {
        out.clear();
        let n = bench::postgres::statements(&batch.shared, &SINK_COLUMNS, &mut out);
        black_box(n.expect("statements"));
    });
}

/// A dispatcher over four lanes, run on a single-threaded runtime so the time measured is the
/// work of handing changes over, not of threads waking each other.
struct Handoff {
    runtime: tokio::runtime::Runtime,
    emitter: Emitter,
    lanes: Vec<LaneReceiver>,
    acks: mpsc::UnboundedSender<Ack>,
    _stop: watch::Sender<StopMode>,
}

impl Handoff {
    fn start() -> Handoff {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let (senders, lanes): (Vec<_>, Vec<_>) = (0..4).map(|_| queue(CHANGES)).unzip();
        let (emitter, events, frontier) = channel(2, Lsn(0));
        let (acks, ack_rx) = mpsc::unbounded_channel();
        let (stop, stop_rx) = watch::channel(StopMode::Run);
        let route = RouteStage {
            name: "route 1".into(),
            tables: Tables::All,
            transform: None,
            sinks: vec![0],
        };
        let dispatcher = Dispatcher::new(
            vec![route],
            vec![Router::new(senders)],
            events,
            ack_rx,
            frontier,
            stop_rx,
            Arc::new(SourceStats::default()),
        );
        runtime.spawn(dispatcher.run());
        Handoff {
            runtime,
            emitter,
            lanes,
            acks,
            _stop: stop,
        }
    }

    /// Emits the events, then takes every change off the lanes, acking each lane's take.
    fn pass(&mut self, events: Vec<Event>, changes: usize) {
        let Handoff {
            runtime,
            emitter,
            lanes,
            acks,
            ..
        } = self;
        runtime.block_on(async {
            for e in events {
                emitter.push(e);
            }
            emitter.flush().await.expect("the dispatcher takes events");
            let mut taken = 0;
            while taken < changes {
                for lane in lanes.iter_mut() {
                    let mut ack = Ack::default();
                    while let Ok(q) = lane.try_recv() {
                        ack.add(q.change.position.lsn, 1);
                        taken += 1;
                    }
                    if !ack.is_empty() {
                        acks.send(ack).expect("the dispatcher takes acks");
                    }
                }
                tokio::task::yield_now().await;
            }
        });
    }
}

#[divan::bench]
fn handoff(bencher: Bencher) {
    let batch = &*BATCH;
    let mut handoff = Handoff::start();
    let mut round = 0u64;
    bencher
        .counter(ItemsCount::new(CHANGES))
        .with_inputs(|| {
            // Every round commits later than the last, as a source's transactions do.
            round += 1;
            let mut events = Vec::with_capacity(CHANGES + 2 * CHANGES / PER_TX);
            for (t, tx) in batch.changes.chunks(PER_TX).enumerate() {
                let lsn = Lsn::from(round << 32 | (t as u64) << 8);
                events.push(Event::Begin {
                    commit_lsn: lsn,
                    commit_time: 0,
                });
                events.extend(tx.iter().map(|c| {
                    let mut c = c.clone();
                    c.position.lsn = lsn;
                    Event::Change(c)
                }));
                events.push(Event::Commit {
                    end_lsn: Lsn(lsn.0 + 1),
                });
            }
            events
        })
        .bench_local_values(|events| handoff.pass(events, CHANGES));
}
