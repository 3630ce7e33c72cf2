//! Slot safety and lost sink state: a slot that vanished or was invalidated, a dropped
//! publication, and a sink that lost its state each stop with the way on, never a silent
//! start from nothing; `--resnapshot` (or `snapshot: when_needed`) starts over and converges.
//! An idle publication pins no WAL while another database writes.

use std::time::{Duration, Instant};

use crate::e2e::{
    Fixture, MY_DB, MY_ORDERS, PG_DB, PipelineOpts, SLOT, pipeline_yaml, wait_streaming,
};
use crate::steps::{burst, converge_with, run_once};

/// A start that must stop at once with exit 1 and `needle` in its output, before touching
/// the slot or the publication.
fn assert_stops(fx: &mut Fixture, needle: &str) -> String {
    let out = fx.apply().expect_failure(Duration::from_secs(60), needle);
    assert!(
        out.contains("--resnapshot`, or set `snapshot: when_needed` on source orders-db"),
        "{out}"
    );
    assert!(
        !out.contains("configuring publication") && !out.contains("created replication slot"),
        "{out}"
    );
    out
}

#[tokio::test]
async fn a_vanished_slot_stops_until_resnapshot_and_then_loses_nothing() {
    let mut fx = Fixture::start();
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts::default()));
    run_once(&mut fx).await;
    fx.pg
        .psql(PG_DB, &format!("SELECT pg_drop_replication_slot('{SLOT}')"));
    // Changes while no slot exists, deletes included: no stream will ever carry them.
    burst(&fx, 1_500).await;
    assert_stops(
        &mut fx,
        "replication slot zipline_e2e does not exist, but the sinks hold rows this pipeline \
         applied from it (mysql-out)",
    );
    converge_with(&mut fx, &["--resnapshot"]).await;
}

#[tokio::test]
async fn a_sink_that_lost_its_state_stops_until_a_new_snapshot() {
    let mut fx = Fixture::start();
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts::default()));
    run_once(&mut fx).await;
    // The sink database re-created, the slot intact.
    fx.my.sql("", &format!("DROP DATABASE {MY_DB}"));
    fx.my.create_database(MY_DB);
    fx.my.sql(MY_DB, MY_ORDERS);
    burst(&fx, 500).await;
    assert_stops(
        &mut fx,
        "sink mysql-out holds nothing of this pipeline (no lane checkpoints, no snapshot \
         record), while replication slot zipline_e2e has moved on to ",
    );
    // snapshot: when_needed starts over by itself.
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts {
        source_extra: vec!["snapshot: when_needed".into()],
        ..PipelineOpts::default()
    }));
    converge_with(&mut fx, &[]).await;
}

#[tokio::test]
async fn a_dropped_publication_stops_with_the_remedy() {
    let mut fx = Fixture::start();
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts::default()));
    let pg = fx.pg_client().await;
    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(60)).await;
    pg.batch_execute("DROP PUBLICATION zipline_e2e_pub")
        .await
        .expect("dropping the publication");
    burst(&fx, 200).await;
    z.expect_failure(
        Duration::from_secs(60),
        "publication zipline_e2e_pub was dropped while its slot",
    );
    assert_stops(
        &mut fx,
        "publication zipline_e2e_pub does not exist, but replication slot zipline_e2e does",
    );
    converge_with(&mut fx, &["--resnapshot"]).await;
}

#[tokio::test]
async fn an_invalidated_slot_stops_with_the_remedy() {
    let pg_server = crate::common::Postgres::start_with(&[("max_slot_wal_keep_size", "1MB")]);
    let mut fx = Fixture::with_postgres(pg_server);
    fx.pg.psql(PG_DB, crate::e2e::PG_ORDERS);
    fx.my.sql(MY_DB, MY_ORDERS);
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts::default()));
    run_once(&mut fx).await;
    // Past max_slot_wal_keep_size while stopped: the next checkpoint invalidates the slot.
    // (WAL written in another database: a published table would need a sink table.)
    let pg = fx.pg_client().await;
    fx.pg.create_database("busy");
    let busy = fx.pg.client("busy").await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        busy.batch_execute(
            "CREATE TABLE IF NOT EXISTS filler (id bigserial PRIMARY KEY, v text); \
             INSERT INTO filler (v) SELECT repeat('x', 1000) FROM generate_series(1, 5000); \
             SELECT pg_switch_wal(); CHECKPOINT;",
        )
        .await
        .expect("writing WAL");
        let status: Option<String> = pg
            .query_one(
                "SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1",
                &[&SLOT],
            )
            .await
            .expect("reading the slot")
            .get(0);
        if status.as_deref() == Some("lost") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slot was not invalidated: {status:?}"
        );
    }
    assert_stops(
        &mut fx,
        "replication slot zipline_e2e was invalidated by PostgreSQL (wal_status = 'lost'",
    );
    converge_with(&mut fx, &["--resnapshot"]).await;
}

#[tokio::test]
async fn an_idle_publication_pins_no_wal_while_another_database_writes() {
    let mut fx = Fixture::start();
    fx.pg.create_database("busy");
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts {
        source_extra: vec![
            "heartbeat_interval: 1s".into(),
            "slot_warn_bytes: 4MiB".into(),
        ],
        ..PipelineOpts::default()
    }));
    let pg = fx.pg_client().await;
    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(60)).await;
    let busy = fx.pg.client("busy").await;
    busy.batch_execute("CREATE TABLE filler (v text)")
        .await
        .expect("filler table");
    // About 100 MB of WAL, none of it for the published tables.
    for _ in 0..10 {
        busy.batch_execute(
            "INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 10000)",
        )
        .await
        .expect("writing WAL elsewhere");
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    let retained = loop {
        z.assert_running();
        let bytes: i64 = pg
            .query_one(
                "SELECT (pg_current_wal_lsn() - restart_lsn)::int8 FROM pg_replication_slots \
                 WHERE slot_name = $1",
                &[&SLOT],
            )
            .await
            .expect("reading the slot")
            .get(0);
        if bytes < 16 << 20 {
            break bytes;
        }
        assert!(
            Instant::now() < deadline,
            "the idle slot still retains {bytes} bytes of WAL\n{}",
            z.tail(20)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!("edges: idle slot retains {retained} bytes after ~100 MB written elsewhere");
    assert!(
        z.output()
            .contains("the replication slot retains more WAL than slot_warn_bytes"),
        "{}",
        z.tail(30)
    );
    z.terminate_cleanly(Duration::from_secs(20));
}
