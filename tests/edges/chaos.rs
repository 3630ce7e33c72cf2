//! The chaos suite: a random mixed workload (upserts, partial updates, key changes, deletes,
//! multi-row and large, streamed transactions, TOASTed values) runs while, at random moments,
//! Zipline is SIGKILLed and restarted, the sink server is SIGKILLed and restarted, the source
//! server restarts, replication and sink connections are cut or silently stalled through
//! proxies, and poison rows (which the sink's CHECK constraint refuses) arrive.
//!
//! After the run the sink must equal the source less the poisoned keys, the dead-letter table
//! must hold every change of the poisoned keys exactly once (the source keeps its own count of
//! them, in a table the pipeline does not publish), and once the constraint is dropped,
//! `zipline dlq replay --all` must leave the sink equal to the source, poisoned keys included.
//!
//! Faults come in shuffled blocks of 16 (10 SIGKILLs of Zipline, 1 sink crash, 1 source
//! restart, 2 cuts, 2 stalls), so the counts stay in proportion: `ZIPLINE_CHAOS_ROUNDS`
//! (default 16, one block) sets how many; 80 gives 50 SIGKILLs, 5 sink crashes, 5 source
//! restarts and 20 cuts or stalls. The seed is printed; `ZIPLINE_E2E_SEED` replays a run.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::common::{Postgres, Proxy};
use crate::e2e::workload::{self, Config};
use crate::e2e::{
    CONVERGE_TIMEOUT, Fixture, MY_DB, MY_ORDERS, PG_DB, PG_ORDERS, PipelineOpts, Zipline,
    diff_rows, my_rows, pg_rows, pipeline_yaml, wait_converged, wait_streaming,
};

/// Keys of poisoned rows: far above the workload's key space.
const POISON_BASE: i64 = 9_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    KillZipline,
    CrashSink,
    RestartSource,
    CutSource,
    CutSink,
    StallSource,
    StallSink,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Fault::KillZipline => "Zipline SIGKILLed",
            Fault::CrashSink => "sink server SIGKILLed",
            Fault::RestartSource => "source server restarted",
            Fault::CutSource => "replication connections cut",
            Fault::CutSink => "sink connections cut",
            Fault::StallSource => "replication connections stalled",
            Fault::StallSink => "sink connections stalled",
        };
        f.write_str(name)
    }
}

/// `n` faults in shuffled blocks of 16 (see the module docs).
fn schedule(rng: &mut StdRng, n: usize) -> Vec<Fault> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let mut block = vec![Fault::KillZipline; 10];
        block.extend([
            Fault::CrashSink,
            Fault::RestartSource,
            Fault::CutSource,
            Fault::CutSink,
            Fault::StallSource,
            Fault::StallSink,
        ]);
        block.shuffle(rng);
        out.extend(block);
    }
    out.truncate(n);
    out
}

fn rounds() -> usize {
    std::env::var("ZIPLINE_CHAOS_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16)
}

/// Writes poison rows now and then, each change in a transaction that also counts it in
/// `poison_log` (on the source, not published): the truth the dead letters are checked
/// against. A poisoned key lives insert (refused by the sink) → updates → maybe a delete.
fn poison_writer(conn: String, seed: u64, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5EED);
        let mut next = POISON_BASE;
        let mut live: Vec<i64> = Vec::new();
        let mut client = None;
        while !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(rng.random_range(100..600))).await;
            if client
                .as_ref()
                .is_none_or(tokio_postgres::Client::is_closed)
            {
                client = match tokio_postgres::connect(&conn, tokio_postgres::NoTls).await {
                    Ok((c, connection)) => {
                        tokio::spawn(connection);
                        Some(c)
                    }
                    Err(_) => continue,
                };
            }
            let Some(c) = client.as_ref() else { continue };
            let (key, sql) = match rng.random_range(0..10) {
                0..4 => {
                    next += 1;
                    (
                        next,
                        format!(
                            "INSERT INTO orders VALUES ({next}, 'poisoned', 1.00, 'poison', \
                             now(), false, 'refused by the sink')"
                        ),
                    )
                }
                4..8 if !live.is_empty() => {
                    let key = live[rng.random_range(0..live.len())];
                    let note = rng.random_range(0..1_000_000);
                    (
                        key,
                        format!("UPDATE orders SET note = 'then {note}' WHERE id = {key}"),
                    )
                }
                8.. if !live.is_empty() => {
                    let key = live.swap_remove(rng.random_range(0..live.len()));
                    (key, format!("DELETE FROM orders WHERE id = {key}"))
                }
                _ => continue,
            };
            // In doubt (the server went away mid-commit): the count in the same transaction
            // says what happened, and it counts only a change that touched a row (an update
            // of a key deleted in doubt changes nothing and is no change to replicate).
            let op = sql.split_whitespace().next().unwrap_or("?");
            let tx = format!(
                "WITH c AS ({sql} RETURNING id) INSERT INTO poison_log (id, op) \
                 SELECT id, '{op}' FROM c"
            );
            let inserted = op == "INSERT";
            if c.batch_execute(&tx).await.is_ok() && inserted {
                live.push(key);
            }
        }
    })
}

/// Sink rows of keys below the poison range, and source rows likewise.
async fn unpoisoned_equal(
    pg: &tokio_postgres::Client,
    my: &mut mysql_async::Conn,
) -> Option<String> {
    let keep = |rows: Vec<Vec<Option<String>>>| {
        rows.into_iter()
            .filter(|r| {
                r[0].as_deref()
                    .and_then(|id| id.parse::<i64>().ok())
                    .is_some_and(|id| id < POISON_BASE)
            })
            .collect::<Vec<_>>()
    };
    diff_rows(&keep(pg_rows(pg).await), &keep(my_rows(my).await))
}

struct Chaos {
    fx: Fixture,
    source_proxy: Proxy,
    sink_proxy: Proxy,
    z: Zipline,
    counts: BTreeMap<Fault, u32>,
}

impl Chaos {
    fn start_zipline(fx: &mut Fixture, source_port: u16) -> Zipline {
        let args = fx.args("apply");
        let mut env = fx.env();
        for (k, v) in &mut env {
            if k == "POSTGRES_PORT" {
                *v = source_port.to_string();
            }
        }
        fx.spawn(&args, &env)
    }

    fn restart_zipline(&mut self) {
        self.z = Self::start_zipline(&mut self.fx, self.source_proxy.port);
    }

    async fn inject(&mut self, fault: Fault, rng: &mut StdRng) {
        *self.counts.entry(fault).or_default() += 1;
        match fault {
            Fault::KillZipline => {
                self.z.kill();
                self.restart_zipline();
            }
            Fault::CrashSink => {
                self.fx.my.kill();
                tokio::time::sleep(Duration::from_millis(rng.random_range(200..2_000))).await;
                self.fx.my.restart();
            }
            Fault::RestartSource => {
                self.fx.pg.kill();
                tokio::time::sleep(Duration::from_millis(rng.random_range(200..1_500))).await;
                self.fx.pg.restart();
            }
            Fault::CutSource => self.source_proxy.cut_all(),
            Fault::CutSink => self.sink_proxy.cut_all(),
            Fault::StallSource | Fault::StallSink => {
                let proxy = if fault == Fault::StallSource {
                    &self.source_proxy
                } else {
                    &self.sink_proxy
                };
                proxy.set_stall(true);
                tokio::time::sleep(Duration::from_millis(rng.random_range(1_000..5_000))).await;
                proxy.set_stall(false);
                // Stalled connections are dead for both ends; new ones start clean.
                proxy.cut_all();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_converges_with_every_fault_and_accounts_every_dead_letter() {
    let seed = workload::seed();
    let mut rng = StdRng::seed_from_u64(seed);
    // Large transactions are streamed before they commit (and spilled by Zipline).
    let pg = Postgres::start_with(&[("logical_decoding_work_mem", "64kB")]);
    let mut fx = Fixture::with_postgres(pg);
    fx.pg.psql(PG_DB, PG_ORDERS);
    fx.pg.psql(
        PG_DB,
        "CREATE TABLE poison_log (n bigserial PRIMARY KEY, id bigint NOT NULL, op text, \
             at pg_lsn DEFAULT pg_current_wal_insert_lsn())",
    );
    fx.my.sql(MY_DB, MY_ORDERS);
    fx.my.sql(
        MY_DB,
        "ALTER TABLE orders ADD CONSTRAINT no_poison CHECK (status IS NULL OR status <> 'poison')",
    );
    let source_proxy = Proxy::start(fx.pg.port).await;
    let sink_proxy = Proxy::start(fx.my.port).await;
    fx.mysql_port = sink_proxy.port;
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts {
        lanes: 4,
        sink_extra: vec![
            "max_wait: 20ms".into(),
            "on_error: dead_letter".into(),
            "statement_timeout: 3s".into(),
            "connect_timeout: 3s".into(),
        ],
        source_extra: vec![
            "tables: [orders]".into(),
            "receive_timeout: 4s".into(),
            "status_interval: 1s".into(),
            "connect_timeout: 3s".into(),
            "connect_retries: 30".into(),
        ],
    }));
    let pg_client = fx.pg_client().await;
    let z = Chaos::start_zipline(&mut fx, source_proxy.port);
    let mut chaos = Chaos {
        fx,
        source_proxy,
        sink_proxy,
        z,
        counts: BTreeMap::new(),
    };
    wait_streaming(&pg_client, &mut chaos.z, Duration::from_secs(60)).await;

    let mut cfg = Config::new(seed, u64::MAX);
    cfg.key_space = 3_000;
    cfg.toast_pct = 2;
    cfg.big_txn_permille = 3;
    cfg.pause = Duration::from_millis(5);
    cfg.reconnect = true;
    let w = workload::start(chaos.fx.pg.conn_str(PG_DB), cfg);
    let stop_poison = Arc::new(AtomicBool::new(false));
    let poison = poison_writer(chaos.fx.pg.conn_str(PG_DB), seed, Arc::clone(&stop_poison));

    let faults = schedule(&mut rng, rounds());
    let started = Instant::now();
    for (round, fault) in faults.iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(rng.random_range(500..2_500))).await;
        chaos.z.assert_running();
        eprintln!(
            "chaos: round {}: {fault} at {} changes",
            round + 1,
            w.changes()
        );
        chaos.inject(*fault, &mut rng).await;
    }
    w.stop();
    stop_poison.store(true, Ordering::Relaxed);
    let report = w.join().await;
    poison.await.expect("the poison writer");

    // The sink equals the source, less the poisoned keys.
    let mut my = chaos.fx.my_checker().await;
    let pg = chaos.fx.pg_client().await;
    let deadline = Instant::now() + CONVERGE_TIMEOUT * 2;
    while let Some(diff) = unpoisoned_equal(&pg, &mut my).await {
        chaos.z.assert_running();
        assert!(
            Instant::now() < deadline,
            "the sink did not converge after the chaos:\n{diff}\nlog:\n{}",
            chaos.z.tail(40)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Every change of a poisoned key is a dead letter, exactly once and in order; except a
    // key inserted and deleted within one batch: the batch coalesces to a delete of a row the
    // sink never had, which the sink takes, and nothing is refused.
    let made = ops_by_key(
        pg.query("SELECT id, lower(op) FROM poison_log ORDER BY n", &[])
            .await
            .expect("reading poison_log")
            .iter()
            .map(|r| (r.get(0), r.get(1))),
    );
    let dead_deadline = Instant::now() + CONVERGE_TIMEOUT;
    let (recorded, wrong) = loop {
        let rows: Vec<(String, String)> = my
            .query(format!(
                "SELECT key_json, op FROM {MY_DB}._zipline_dead_letters ORDER BY lsn, ordinal, sub"
            ))
            .await
            .expect("reading the dead letters");
        let recorded = ops_by_key(rows.into_iter().map(|(key, op)| {
            let key: i64 = key.trim_matches(['[', ']']).parse().expect("a numeric key");
            (key, op)
        }));
        let wrong: Vec<i64> = made
            .keys()
            .chain(recorded.keys())
            .copied()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .filter(|key| {
                let made = made.get(key).map_or(&[][..], Vec::as_slice);
                match recorded.get(key) {
                    Some(recorded) => recorded != made,
                    None => made.last().is_none_or(|op| op != "delete"),
                }
            })
            .collect();
        if wrong.is_empty() || Instant::now() > dead_deadline {
            break (recorded, wrong);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    if !wrong.is_empty() {
        let mut detail = String::new();
        for key in wrong {
            let rows: Vec<(String, String, String)> = my
                .query(format!(
                    "SELECT position, op, LEFT(reason, 120) FROM {MY_DB}._zipline_dead_letters \
                     WHERE key_json = '[{key}]' ORDER BY lsn, ordinal, sub"
                ))
                .await
                .expect("reading the dead letters");
            let made: Vec<String> = pg
                .query(
                    "SELECT op || ' at ' || at FROM poison_log WHERE id = $1 ORDER BY n",
                    &[&key],
                )
                .await
                .expect("reading poison_log")
                .iter()
                .map(|r| r.get(0))
                .collect();
            detail.push_str(&format!("key {key}: made {made:?}\n  recorded {rows:?}\n"));
            for entry in std::fs::read_dir(chaos.fx.dir.path()).expect("the test dir") {
                let path = entry.expect("an entry").path();
                if path.extension().is_some_and(|e| e == "log") {
                    let log = std::fs::read_to_string(&path).unwrap_or_default();
                    for line in log.lines().filter(|l| l.contains(&key.to_string())) {
                        detail.push_str(&format!("  {}: {line}\n", path.display()));
                    }
                }
            }
        }
        panic!(
            "dead letters per poisoned key (sink) differ from the changes made (source):\n{detail}"
        );
    }
    let total: usize = recorded.values().map(Vec::len).sum();
    let coalesced = made.len() - recorded.len();

    // Fixed sink: the dead letters replay, and the sink equals the source everywhere.
    chaos.z.terminate_cleanly(Duration::from_secs(30));
    chaos
        .fx
        .my
        .sql(MY_DB, "ALTER TABLE orders DROP CONSTRAINT no_poison");
    let mut args = vec!["dlq".to_owned(), "replay".to_owned(), "-f".to_owned()];
    args.push(
        chaos
            .fx
            .dir
            .path()
            .join("orders.yaml")
            .display()
            .to_string(),
    );
    args.push("--all".to_owned());
    let env = chaos.fx.env();
    let (code, out, _) = chaos.fx.run_to_exit(&args, &env, Duration::from_secs(120));
    assert_eq!(code, 0, "{out}");
    chaos.restart_zipline();
    wait_converged(&pg, &mut my, Some(&mut chaos.z), CONVERGE_TIMEOUT).await;
    chaos.z.terminate_cleanly(Duration::from_secs(30));

    let summary: Vec<String> = chaos
        .counts
        .iter()
        .map(|(fault, n)| format!("{n} × {fault}"))
        .collect();
    eprintln!(
        "chaos: seed {seed}, {} rounds in {:.0?}: {}; workload {} changes in {} transactions; \
         {total} dead letters over {} poisoned keys ({coalesced} more inserted and deleted within \
         one batch), all accounted for and replayed; sink equals source",
        faults.len(),
        started.elapsed(),
        summary.join(", "),
        report.changes,
        report.txns,
        recorded.len()
    );
}

/// Each key's ops in order.
fn ops_by_key(rows: impl Iterator<Item = (i64, String)>) -> BTreeMap<i64, Vec<String>> {
    let mut by_key: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for (key, op) in rows {
        by_key.entry(key).or_default().push(op);
    }
    by_key
}
