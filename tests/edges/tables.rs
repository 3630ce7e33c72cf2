//! Tables that change under the pipeline: a column type changed while Zipline was stopped is
//! noticed before its first row (with the statement in the sink's own SQL), and a table
//! dropped and created again, while running or while stopped and no longer published, stops
//! the pipeline, or with `on_table_recreate: resnapshot` is copied again and followed.

use std::time::Duration;

use crate::e2e::{
    CONVERGE_TIMEOUT, Fixture, MY_DB, MY_ORDERS, PG_ORDERS, PipelineOpts, Zipline, pipeline_yaml,
    wait_converged, wait_streaming,
};
use crate::steps::{burst, converge_with, run_once};

fn expect_exit(z: &mut Zipline, needle: &str) -> String {
    z.expect_failure(Duration::from_secs(90), needle)
}

/// Drops `orders` and creates it again with other rows.
async fn recreate_orders(pg: &tokio_postgres::Client) {
    pg.batch_execute(&format!(
        "DROP TABLE orders; {PG_ORDERS}; \
         INSERT INTO orders SELECT i, 'new-' || i, i, 'fresh', now(), true, NULL \
         FROM generate_series(100000, 100200) i;"
    ))
    .await
    .expect("re-creating orders");
}

#[tokio::test]
async fn a_type_change_while_stopped_stops_before_its_first_row_naming_the_sink_statement() {
    let mut fx = Fixture::start();
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts::default()));
    run_once(&mut fx).await;
    let pg = fx.pg_client().await;
    pg.batch_execute(
        "ALTER TABLE orders ALTER COLUMN status TYPE varchar(40); \
         INSERT INTO orders VALUES (777777, 'x', 1, 'a status longer than twenty', now(), true, NULL);",
    )
    .await
    .expect("changing the type");
    let mut z = fx.apply();
    expect_exit(
        &mut z,
        "source orders-db: column public.orders.status changed type from character \
         varying(20) to character varying(40) on the source; Zipline stopped before applying any row written after the change. Alter the \
         sink column to the new type, then start Zipline again: it resumes right at the change. \
         in sink mysql-out: ALTER TABLE `shop`.`orders` MODIFY `status` VARCHAR(40)",
    );
    fx.my
        .sql(MY_DB, "ALTER TABLE orders MODIFY status VARCHAR(40)");
    converge_with(&mut fx, &[]).await;
}

#[tokio::test]
async fn a_table_recreated_while_running_stops_and_resnapshot_copies_it_again() {
    let mut fx = Fixture::start();
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts::default()));
    let pg = fx.pg_client().await;
    let mut z = fx.apply();
    wait_streaming(&pg, &mut z, Duration::from_secs(60)).await;
    burst(&fx, 800).await;
    let mut my = fx.my_checker().await;
    wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;
    recreate_orders(&pg).await;
    expect_exit(
        &mut z,
        "table public.orders was dropped and created again on the source",
    );
    assert!(
        z.output()
            .contains("set `on_table_recreate: resnapshot` on source orders-db"),
        "{}",
        z.tail(10)
    );
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts {
        source_extra: vec!["on_table_recreate: resnapshot".into()],
        ..PipelineOpts::default()
    }));
    converge_with(&mut fx, &[]).await;
}

#[tokio::test]
async fn a_table_recreated_while_stopped_and_unpublished_is_noticed_from_the_catalog() {
    let mut fx = Fixture::start();
    // A publication of listed tables: a dropped table leaves it, the new one is not in it.
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts {
        source_extra: vec!["tables: [orders]".into()],
        ..PipelineOpts::default()
    }));
    run_once(&mut fx).await;
    let pg = fx.pg_client().await;
    recreate_orders(&pg).await;
    let mut z = fx.apply();
    expect_exit(
        &mut z,
        "table public.orders was dropped and created again on the source",
    );
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts {
        source_extra: vec![
            "tables: [orders]".into(),
            "on_table_recreate: resnapshot".into(),
        ],
        ..PipelineOpts::default()
    }));
    converge_with(&mut fx, &[]).await;
}

#[tokio::test]
async fn a_sink_table_created_again_empty_stops_and_resnapshot_copies_it_again() {
    let mut fx = Fixture::start();
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts::default()));
    run_once(&mut fx).await;
    // Rebuilt by an ALTER (another creation time), its rows kept: Zipline goes on.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    fx.my.sql(MY_DB, "ALTER TABLE orders FORCE");
    burst(&fx, 300).await;
    converge_with(&mut fx, &[]).await;
    // Dropped and created again empty at the sink (MariaDB tells creation times to the
    // second).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    fx.my.sql(MY_DB, &format!("DROP TABLE orders; {MY_ORDERS}"));
    let mut z = fx.apply();
    let out = expect_exit(
        &mut z,
        "sink mysql-out: the sink table of public.orders was dropped and created again since \
         Zipline last wrote to it, and is empty: the rows applied before are gone",
    );
    assert!(
        out.contains("set `on_table_recreate: resnapshot` on source orders-db"),
        "{out}"
    );
    assert!(
        !out.contains("lane open"),
        "stopped before streaming:\n{out}"
    );
    fx.write_pipeline(&pipeline_yaml(&PipelineOpts {
        source_extra: vec!["on_table_recreate: resnapshot".into()],
        ..PipelineOpts::default()
    }));
    converge_with(&mut fx, &[]).await;
}
