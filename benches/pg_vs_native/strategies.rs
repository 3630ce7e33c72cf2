//! Three ways to write a batch of upserts and deletes into PostgreSQL, measured on the same
//! ops (one connection per lane, ops split by key, each batch coalesced to the last op per key
//! and written as one transaction, as Zipline's sink does):
//!
//! - `literal`: one simple-query string: `BEGIN; DELETE … WHERE id IN (…); INSERT … VALUES
//!   (…),(…) ON CONFLICT (id) DO UPDATE …; COMMIT` (the server parses every value).
//! - `unnest`: prepared `DELETE … USING unnest($1)` and `INSERT … SELECT … FROM unnest($1,
//!   $2, …) ON CONFLICT …` with one binary array parameter per column, pipelined with
//!   `BEGIN`/`COMMIT` in one round trip (what `sink/postgres` does).
//! - `copy`: `COPY` (text) into a per-session temporary table `ON COMMIT DELETE ROWS`, then
//!   `INSERT … SELECT * FROM stage ON CONFLICT …`, deletes by `= ANY($1)`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::SinkExt;
use tokio_postgres::Client;

use crate::common_backlog::{Op, Row};

const UPSERT_TAIL: &str = "ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, \
    qty = EXCLUDED.qty, price = EXCLUDED.price, updated_at = EXCLUDED.updated_at";

/// 2024-01-01 00:00:00 UTC.
const BASE_SECS: u64 = 1_704_067_200;

#[derive(Debug, Clone, Copy)]
pub enum Strategy {
    Literal,
    Unnest,
    Copy,
}

impl Strategy {
    pub const ALL: [Strategy; 3] = [Strategy::Literal, Strategy::Unnest, Strategy::Copy];

    pub fn name(self) -> &'static str {
        match self {
            Strategy::Literal => "literal",
            Strategy::Unnest => "unnest",
            Strategy::Copy => "copy",
        }
    }
}

/// The last op per key of one batch: deleted ids and upserted rows.
fn coalesce(chunk: &[Op]) -> (Vec<i64>, Vec<&Row>) {
    let mut last: HashMap<i64, &Op> = HashMap::with_capacity(chunk.len());
    for op in chunk {
        last.insert(op.id(), op);
    }
    let mut deletes = Vec::new();
    let mut upserts = Vec::new();
    for op in last.values() {
        match op {
            Op::Delete(id) => deletes.push(*id),
            Op::Upsert(r) => upserts.push(r),
        }
    }
    (deletes, upserts)
}

fn timestamp_text(secs: i64) -> String {
    let secs = secs.max(0);
    format!(
        "2024-01-{:02} {:02}:{:02}:{:02}+00",
        1 + secs / 86_400,
        secs / 3600 % 24,
        secs / 60 % 60,
        secs % 60
    )
}

/// Applies one lane's `ops` in batches of `batch` with `strategy`; returns ops applied.
pub async fn apply(client: Client, strategy: Strategy, ops: Vec<Op>, batch: usize) -> u64 {
    match strategy {
        Strategy::Literal => literal(&client, &ops, batch).await,
        Strategy::Unnest => unnest(&client, &ops, batch).await,
        Strategy::Copy => copy(&client, &ops, batch).await,
    }
    ops.len() as u64
}

async fn literal(client: &Client, ops: &[Op], batch: usize) {
    for chunk in ops.chunks(batch) {
        let (deletes, upserts) = coalesce(chunk);
        let mut sql = String::from("BEGIN;");
        if !deletes.is_empty() {
            let ids: Vec<String> = deletes.iter().map(i64::to_string).collect();
            let _ = write!(sql, "DELETE FROM items WHERE id IN ({});", ids.join(","));
        }
        if !upserts.is_empty() {
            sql.push_str("INSERT INTO items (id, name, qty, price, updated_at) VALUES ");
            for (n, r) in upserts.iter().enumerate() {
                if n > 0 {
                    sql.push(',');
                }
                let _ = write!(
                    sql,
                    "({}, '{}', {}, {}, '{}')",
                    r.id,
                    r.name,
                    r.qty,
                    r.price,
                    timestamp_text(r.updated_at)
                );
            }
            sql.push(' ');
            sql.push_str(UPSERT_TAIL);
            sql.push(';');
        }
        sql.push_str("COMMIT;");
        client.batch_execute(&sql).await.expect("literal batch");
    }
}

async fn unnest(client: &Client, ops: &[Op], batch: usize) {
    let delete = client
        .prepare("DELETE FROM items AS t USING unnest($1::int8[]) AS u(id) WHERE t.id = u.id")
        .await
        .expect("prepare delete");
    let upsert = client
        .prepare(&format!(
            "INSERT INTO items (id, name, qty, price, updated_at) \
             SELECT u.id, u.name, u.qty, u.price::numeric, u.at FROM unnest($1::int8[], \
             $2::text[], $3::int4[], $4::text[], $5::timestamptz[]) AS u(id, name, qty, price, at) \
             {UPSERT_TAIL}"
        ))
        .await
        .expect("prepare upsert");
    for chunk in ops.chunks(batch) {
        let (deletes, upserts) = coalesce(chunk);
        let ids: Vec<i64> = upserts.iter().map(|r| r.id).collect();
        let names: Vec<&str> = upserts.iter().map(|r| r.name.as_str()).collect();
        let qtys: Vec<i32> = upserts.iter().map(|r| r.qty).collect();
        let prices: Vec<&str> = upserts.iter().map(|r| r.price.as_str()).collect();
        let ats: Vec<SystemTime> = upserts
            .iter()
            .map(|r| UNIX_EPOCH + Duration::from_secs(BASE_SECS + r.updated_at as u64))
            .collect();
        // Polled in order on the first poll: one round trip for the whole transaction.
        let (a, b, c, d) = futures_util::future::join4(
            client.batch_execute("BEGIN"),
            client.execute(&delete, &[&deletes]),
            client.execute(&upsert, &[&ids, &names, &qtys, &prices, &ats]),
            client.batch_execute("COMMIT"),
        )
        .await;
        a.and(b.map(drop))
            .and(c.map(drop))
            .and(d)
            .expect("unnest batch");
    }
}

async fn copy(client: &Client, ops: &[Op], batch: usize) {
    client
        .batch_execute("CREATE TEMP TABLE stage (LIKE items) ON COMMIT DELETE ROWS")
        .await
        .expect("create stage");
    let delete = client
        .prepare("DELETE FROM items WHERE id = ANY($1)")
        .await
        .expect("prepare delete");
    let copy = client
        .prepare("COPY stage (id, name, qty, price, updated_at) FROM STDIN")
        .await
        .expect("prepare copy");
    let merge = client
        .prepare(&format!(
            "INSERT INTO items SELECT * FROM stage {UPSERT_TAIL}"
        ))
        .await
        .expect("prepare merge");
    for chunk in ops.chunks(batch) {
        let (deletes, upserts) = coalesce(chunk);
        let mut data = String::new();
        for r in &upserts {
            let _ = writeln!(
                data,
                "{}\t{}\t{}\t{}\t{}",
                r.id,
                r.name,
                r.qty,
                r.price,
                timestamp_text(r.updated_at)
            );
        }
        let (a, b) = futures_util::future::join(
            client.batch_execute("BEGIN"),
            client.execute(&delete, &[&deletes]),
        )
        .await;
        a.and(b.map(drop)).expect("copy batch: delete");
        let sink = client
            .copy_in::<_, Bytes>(&copy)
            .await
            .expect("copy batch: start");
        futures_util::pin_mut!(sink);
        sink.send(Bytes::from(data))
            .await
            .expect("copy batch: data");
        sink.finish().await.expect("copy batch: finish");
        let (c, d) =
            futures_util::future::join(client.execute(&merge, &[]), client.batch_execute("COMMIT"))
                .await;
        c.map(drop).and(d).expect("copy batch: merge");
    }
}

/// Runs `strategy` on `lanes` connections (ops split by `id % lanes`); returns changes/s.
pub async fn measure(
    dst: &crate::common::Postgres,
    db: &str,
    strategy: Strategy,
    ops: &[Op],
    lanes: usize,
    batch: usize,
) -> f64 {
    let mut per_lane: Vec<Vec<Op>> = vec![Vec::new(); lanes];
    for op in ops {
        per_lane[(op.id() as u64 % lanes as u64) as usize].push(op.clone());
    }
    let mut clients = Vec::new();
    for _ in 0..lanes {
        clients.push(dst.client(db).await);
    }
    let started = Instant::now();
    let tasks: Vec<_> = clients
        .into_iter()
        .zip(per_lane)
        .map(|(client, lane_ops)| tokio::spawn(apply(client, strategy, lane_ops, batch)))
        .collect();
    let mut applied = 0;
    for t in tasks {
        applied += t.await.expect("strategy lane");
    }
    applied as f64 / started.elapsed().as_secs_f64()
}
