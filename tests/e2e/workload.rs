//! The randomized workload: concurrent writers on the source's `orders` table.
//!
//! Each writer owns a connection and an RNG seeded from the workload seed, and commits
//! transactions of 1–`max_stmts` statements: upserts (`INSERT … ON CONFLICT DO UPDATE`),
//! partial updates (different column subsets, so some columns arrive unchanged), deletes,
//! multi-row updates, and key changes (`UPDATE … SET id = new`, guarded so `new` is free).
//! Keys are picked at random from a shared key space, so transactions of different writers
//! touch the same rows in different orders: deadlocks, and unique violations from racing key
//! changes, are expected; such a transaction is rolled back and retried as it was.
//!
//! `changes` counts rows actually changed by committed transactions.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_postgres::error::SqlState;

/// What to run.
#[derive(Debug, Clone)]
pub struct Config {
    pub seed: u64,
    pub writers: usize,
    /// Keys are drawn from `1..=key_space`.
    pub key_space: i64,
    /// Stop once this many changes are committed (across writers).
    pub target_changes: u64,
    pub max_stmts: usize,
    /// Sleep between a writer's transactions (paces long-running workloads).
    pub pause: Duration,
    /// Percentage of statements that change a key.
    pub rekey_pct: u32,
    /// Percentage of notes that are large (several kB of incompressible text, stored
    /// out of line as TOAST).
    pub toast_pct: u32,
    /// Per mille of transactions that touch every row of the key space (large enough to be
    /// streamed before commit under a small `logical_decoding_work_mem`).
    pub big_txn_permille: u32,
    /// Reconnect (and retry the transaction) when the connection is lost: for workloads
    /// that run across source restarts. A transaction whose COMMIT was cut may have
    /// committed; retrying it is harmless for the final comparison, which reads the source.
    pub reconnect: bool,
}

impl Config {
    /// Defaults: 4 writers, 2,500 keys, 1–20 statements per transaction.
    pub fn new(seed: u64, target_changes: u64) -> Config {
        Config {
            seed,
            writers: 4,
            key_space: 2_500,
            target_changes,
            max_stmts: 20,
            pause: Duration::ZERO,
            rekey_pct: 8,
            toast_pct: 0,
            big_txn_permille: 0,
            reconnect: false,
        }
    }
}

/// What was done.
#[derive(Debug, Default)]
pub struct Report {
    pub txns: u64,
    pub changes: u64,
    pub retries: u64,
    pub deletes: u64,
    pub rekeys: u64,
    /// Every key a committed statement changed (including both ends of a key change).
    pub keys: HashSet<i64>,
    pub elapsed: Duration,
}

/// The seed: `ZIPLINE_E2E_SEED` if set (to replay a failure), otherwise random; printed.
pub fn seed() -> u64 {
    let seed = std::env::var("ZIPLINE_E2E_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("e2e: workload seed {seed} (replay with ZIPLINE_E2E_SEED={seed})");
    seed
}

/// A running workload.
pub struct Handle {
    stop: Arc<AtomicBool>,
    changes: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<Report>,
}

impl Handle {
    /// Changes committed so far.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Relaxed)
    }

    /// Asks the writers to stop after their current transaction.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Waits for the writers to finish (target reached or [`Handle::stop`]).
    pub async fn join(self) -> Report {
        let report = self.task.await.expect("workload task panicked");
        eprintln!(
            "e2e: workload done: {} txns, {} changes ({} deletes, {} key changes) over {} keys, \
             {} retried txns, in {:.1?}",
            report.txns,
            report.changes,
            report.deletes,
            report.rekeys,
            report.keys.len(),
            report.retries,
            report.elapsed
        );
        report
    }
}

/// Starts the writers against `conn_str` (libpq style, the source database).
pub fn start(conn_str: String, cfg: Config) -> Handle {
    let stop = Arc::new(AtomicBool::new(false));
    let changes = Arc::new(AtomicU64::new(0));
    let (stop2, changes2) = (stop.clone(), changes.clone());
    let task = tokio::spawn(async move {
        let started = Instant::now();
        let mut writers = tokio::task::JoinSet::new();
        for w in 0..cfg.writers {
            let cfg = cfg.clone();
            let conn_str = conn_str.clone();
            let (stop, changes) = (stop2.clone(), changes2.clone());
            writers.spawn(async move { writer(w, &conn_str, &cfg, &stop, &changes).await });
        }
        let mut total = Report::default();
        while let Some(done) = writers.join_next().await {
            let r = done.expect("a workload writer panicked");
            total.txns += r.txns;
            total.changes += r.changes;
            total.retries += r.retries;
            total.deletes += r.deletes;
            total.rekeys += r.rekeys;
            total.keys.extend(r.keys);
        }
        total.elapsed = started.elapsed();
        total
    });
    Handle {
        stop,
        changes,
        task,
    }
}

/// One statement of a transaction.
#[derive(Debug, Clone)]
enum Stmt {
    Upsert(Row),
    SetStatusAmount {
        id: i64,
        status: &'static str,
        amount: String,
    },
    SetNoteFlag {
        id: i64,
        note: Option<String>,
        flag: Option<bool>,
    },
    SetCustomerTime {
        id: i64,
        customer: Option<String>,
        created_at: Option<String>,
    },
    Delete(i64),
    Rekey {
        old: i64,
        new: i64,
    },
    RekeyAndStatus {
        old: i64,
        new: i64,
        status: &'static str,
    },
    BumpRange {
        lo: i64,
    },
    /// Every row of the key space.
    BumpAll {
        key_space: i64,
    },
}

#[derive(Debug, Clone)]
struct Row {
    id: i64,
    customer: Option<String>,
    amount: Option<String>,
    status: Option<&'static str>,
    created_at: Option<String>,
    flag: Option<bool>,
    note: Option<String>,
}

const STATUSES: &[&str] = &[
    "new",
    "paid",
    "packed",
    "shipped",
    "delivered",
    "returned",
    "cancelled",
];
const CUSTOMERS: &[&str] = &[
    "Ada Lovelace",
    "O'Brien & Sons",
    "Zoë Ångström",
    "山田太郎",
    "emoji 🚀 customer",
    "back\\slash",
    "comma, \"quoted\"",
    "",
    "tab\there",
];

fn amount(rng: &mut StdRng) -> String {
    let cents: i64 = rng.random_range(0..10_000_000);
    let sign = if rng.random_ratio(1, 20) { "-" } else { "" };
    format!("{sign}{}.{:02}", cents / 100, cents % 100)
}

fn timestamp(rng: &mut StdRng) -> Option<String> {
    if rng.random_ratio(1, 15) {
        return None;
    }
    let secs: i64 = rng.random_range(946_684_800..1_893_456_000); // 2000-01-01 .. 2030-01-01
    let micros: u32 = rng.random_range(0..1_000_000);
    // `seconds.micros` since the epoch; see [`ts`].
    Some(format!("{secs}.{micros:06}"))
}

fn note(rng: &mut StdRng, toast_pct: u32) -> Option<String> {
    if rng.random_ratio(1, 10) {
        return None;
    }
    let len = if toast_pct > 0 && rng.random_ratio(toast_pct, 100) {
        rng.random_range(3_000..6_000)
    } else {
        rng.random_range(0..80)
    };
    const ALPHABET: &[char] = &[
        'a', 'b', 'c', 'x', 'y', 'z', 'Q', '0', '7', ' ', '\'', '"', '\\', '%', '_', 'é', 'ß',
        '中', '✓', '\n',
    ];
    Some(
        (0..len)
            .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())])
            .collect(),
    )
}

fn gen_row(rng: &mut StdRng, id: i64, toast_pct: u32) -> Row {
    Row {
        id,
        customer: (!rng.random_ratio(1, 20))
            .then(|| CUSTOMERS[rng.random_range(0..CUSTOMERS.len())].to_owned()),
        amount: (!rng.random_ratio(1, 20)).then(|| amount(rng)),
        status: (!rng.random_ratio(1, 30)).then(|| STATUSES[rng.random_range(0..STATUSES.len())]),
        created_at: timestamp(rng),
        flag: (!rng.random_ratio(1, 10)).then(|| rng.random_bool(0.5)),
        note: note(rng, toast_pct),
    }
}

fn gen_stmt(rng: &mut StdRng, cfg: &Config) -> Stmt {
    if cfg.big_txn_permille > 0 && rng.random_ratio(cfg.big_txn_permille, 1000) {
        return Stmt::BumpAll {
            key_space: cfg.key_space,
        };
    }
    let id = rng.random_range(1..=cfg.key_space);
    let roll = rng.random_range(0..100u32);
    if roll < cfg.rekey_pct {
        let new = rng.random_range(1..=cfg.key_space);
        return if rng.random_bool(0.5) {
            Stmt::Rekey { old: id, new }
        } else {
            Stmt::RekeyAndStatus {
                old: id,
                new,
                status: STATUSES[rng.random_range(0..STATUSES.len())],
            }
        };
    }
    match rng.random_range(0..100u32) {
        0..40 => Stmt::Upsert(gen_row(rng, id, cfg.toast_pct)),
        40..55 => Stmt::SetStatusAmount {
            id,
            status: STATUSES[rng.random_range(0..STATUSES.len())],
            amount: amount(rng),
        },
        55..65 => Stmt::SetNoteFlag {
            id,
            note: note(rng, cfg.toast_pct),
            flag: rng.random_bool(0.5).then(|| rng.random_bool(0.5)),
        },
        65..75 => Stmt::SetCustomerTime {
            id,
            customer: Some(CUSTOMERS[rng.random_range(0..CUSTOMERS.len())].to_owned()),
            created_at: timestamp(rng),
        },
        75..95 => Stmt::Delete(id),
        _ => Stmt::BumpRange { lo: id },
    }
}

const UPSERT: &str = "INSERT INTO orders (id, customer, amount, status, created_at, flag, note) \
     VALUES ($1, $2, $3::text::numeric, $4, ts($5), $6, $7) \
     ON CONFLICT (id) DO UPDATE SET customer = EXCLUDED.customer, amount = EXCLUDED.amount, \
     status = EXCLUDED.status, created_at = EXCLUDED.created_at, flag = EXCLUDED.flag, note = EXCLUDED.note";

/// `ts($n)` in the SQL below: an exact timestamptz from `seconds.micros` text (going through
/// `double precision` would round the microseconds).
fn ts(param: &str) -> String {
    format!(
        "(to_timestamp(split_part({param}::text, '.', 1)::bigint) \
         + split_part({param}::text, '.', 2)::int * interval '1 microsecond')"
    )
}

struct Prepared {
    upsert: tokio_postgres::Statement,
    set_status_amount: tokio_postgres::Statement,
    set_note_flag: tokio_postgres::Statement,
    set_customer_time: tokio_postgres::Statement,
    delete: tokio_postgres::Statement,
    rekey: tokio_postgres::Statement,
    rekey_status: tokio_postgres::Statement,
    bump: tokio_postgres::Statement,
    bump_all: tokio_postgres::Statement,
}

async fn prepare(c: &tokio_postgres::Client) -> Prepared {
    try_prepare(c)
        .await
        .unwrap_or_else(|e| panic!("preparing the workload's statements: {e}"))
}

async fn try_prepare(c: &tokio_postgres::Client) -> Result<Prepared, tokio_postgres::Error> {
    let p = |sql: &'static str| async move {
        let sql = (1..=9).fold(sql.to_owned(), |s, n| {
            s.replace(&format!("ts(${n})"), &ts(&format!("${n}")))
        });
        c.prepare(&sql).await
    };
    Ok(Prepared {
        upsert: p(UPSERT).await?,
        set_status_amount: p("UPDATE orders SET status = $2, amount = $3::text::numeric WHERE id = $1").await?,
        set_note_flag: p("UPDATE orders SET note = $2, flag = $3 WHERE id = $1").await?,
        set_customer_time: p(
            "UPDATE orders SET customer = $2, created_at = ts($3) WHERE id = $1",
        )
        .await?,
        delete: p("DELETE FROM orders WHERE id = $1").await?,
        rekey: p(
            "UPDATE orders SET id = $2 WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM orders WHERE id = $2)",
        )
        .await?,
        rekey_status: p(
            "UPDATE orders SET id = $2, status = $3 WHERE id = $1 \
             AND NOT EXISTS (SELECT 1 FROM orders WHERE id = $2)",
        )
        .await?,
        bump: p("UPDATE orders SET amount = amount + 1 WHERE id BETWEEN $1 AND $1 + 4").await?,
        bump_all: p("UPDATE orders SET amount = amount + 1, note = repeat(md5(id::text), 4) \
                     WHERE id <= $1")
        .await?,
    })
}

/// The server went away (or is going away): reconnect, then retry.
fn connection_lost(e: &tokio_postgres::Error) -> bool {
    e.is_closed()
        || e.as_db_error().is_none()
        || e.code()
            .is_some_and(|c| c.code().starts_with("57P") || c.code().starts_with("08"))
}

/// Errors after which the whole transaction is retried as it was.
fn retryable(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(c) if *c == SqlState::T_R_DEADLOCK_DETECTED
            || *c == SqlState::T_R_SERIALIZATION_FAILURE
            || *c == SqlState::UNIQUE_VIOLATION
    )
}

async fn writer(
    w: usize,
    conn_str: &str,
    cfg: &Config,
    stop: &AtomicBool,
    changes: &AtomicU64,
) -> Report {
    let (mut client, mut ps) = connect(w, conn_str).await;
    let mut rng = StdRng::seed_from_u64(
        cfg.seed
            .wrapping_add((w as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
    );
    let mut report = Report::default();
    while !stop.load(Ordering::Relaxed) && changes.load(Ordering::Relaxed) < cfg.target_changes {
        let n = rng.random_range(1..=cfg.max_stmts);
        let stmts: Vec<Stmt> = (0..n).map(|_| gen_stmt(&mut rng, cfg)).collect();
        let mut attempt = 0u32;
        loop {
            match run_txn(&mut client, &ps, &stmts).await {
                Ok(done) => {
                    report.txns += 1;
                    report.changes += done.changes;
                    report.deletes += done.deletes;
                    report.rekeys += done.rekeys;
                    report.keys.extend(done.keys);
                    changes.fetch_add(done.changes, Ordering::Relaxed);
                    break;
                }
                Err(e) if retryable(&e) && attempt < 50 => {
                    attempt += 1;
                    report.retries += 1;
                    tokio::time::sleep(Duration::from_millis(rng.random_range(1..20))).await;
                }
                Err(e) if cfg.reconnect && connection_lost(&e) => {
                    report.retries += 1;
                    (client, ps) = reconnect(w, conn_str, stop).await;
                }
                Err(e) => {
                    panic!("workload writer {w}: transaction failed after {attempt} retries: {e:?}")
                }
            }
        }
        if !cfg.pause.is_zero() {
            tokio::time::sleep(cfg.pause).await;
        }
    }
    report
}

async fn connect(w: usize, conn_str: &str) -> (tokio_postgres::Client, Prepared) {
    let (client, conn) = tokio_postgres::connect(conn_str, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("workload writer {w}: connecting: {e}"));
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let ps = prepare(&client).await;
    (client, ps)
}

/// Connects again after the server went away, for up to two minutes.
async fn reconnect(
    w: usize,
    conn_str: &str,
    stop: &AtomicBool,
) -> (tokio_postgres::Client, Prepared) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok((client, conn)) = tokio_postgres::connect(conn_str, tokio_postgres::NoTls).await {
            tokio::spawn(async move {
                let _ = conn.await;
            });
            if let Ok(ps) = try_prepare(&client).await {
                return (client, ps);
            }
        }
        assert!(
            Instant::now() < deadline || stop.load(Ordering::Relaxed),
            "workload writer {w}: the source did not come back within two minutes"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[derive(Default)]
struct TxnResult {
    changes: u64,
    deletes: u64,
    rekeys: u64,
    keys: Vec<i64>,
}

async fn run_txn(
    client: &mut tokio_postgres::Client,
    ps: &Prepared,
    stmts: &[Stmt],
) -> Result<TxnResult, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    let mut out = TxnResult::default();
    for s in stmts {
        let n = match s {
            Stmt::Upsert(r) => {
                tx.execute(
                    &ps.upsert,
                    &[
                        &r.id,
                        &r.customer,
                        &r.amount,
                        &r.status,
                        &r.created_at,
                        &r.flag,
                        &r.note,
                    ],
                )
                .await?
            }
            Stmt::SetStatusAmount { id, status, amount } => {
                tx.execute(&ps.set_status_amount, &[id, status, amount])
                    .await?
            }
            Stmt::SetNoteFlag { id, note, flag } => {
                tx.execute(&ps.set_note_flag, &[id, note, flag]).await?
            }
            Stmt::SetCustomerTime {
                id,
                customer,
                created_at,
            } => {
                tx.execute(&ps.set_customer_time, &[id, customer, created_at])
                    .await?
            }
            Stmt::Delete(id) => {
                let n = tx.execute(&ps.delete, &[id]).await?;
                out.deletes += n;
                n
            }
            Stmt::Rekey { old, new } => {
                let n = tx.execute(&ps.rekey, &[old, new]).await?;
                out.rekeys += n;
                n
            }
            Stmt::RekeyAndStatus { old, new, status } => {
                let n = tx.execute(&ps.rekey_status, &[old, new, status]).await?;
                out.rekeys += n;
                n
            }
            Stmt::BumpRange { lo } => tx.execute(&ps.bump, &[lo]).await?,
            Stmt::BumpAll { key_space } => tx.execute(&ps.bump_all, &[key_space]).await?,
        };
        if n > 0 {
            out.changes += n;
            match s {
                Stmt::Rekey { old, new } | Stmt::RekeyAndStatus { old, new, .. } => {
                    out.keys.extend([*old, *new]);
                }
                Stmt::BumpRange { lo } => out.keys.extend(*lo..*lo + 5),
                Stmt::BumpAll { key_space } => out.keys.extend(1..=*key_space),
                Stmt::Upsert(r) => out.keys.push(r.id),
                Stmt::SetStatusAmount { id, .. }
                | Stmt::SetNoteFlag { id, .. }
                | Stmt::SetCustomerTime { id, .. }
                | Stmt::Delete(id) => out.keys.push(*id),
            }
        }
    }
    tx.commit().await?;
    Ok(out)
}
