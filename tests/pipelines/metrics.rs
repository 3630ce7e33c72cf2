//! `settings.metrics`: the real binary between a throwaway PostgreSQL and MariaDB, scraped
//! over HTTP and read with a Prometheus text-format parser.
//!
//! - A workload of known size with key-moving updates: `zipline_changes_applied_total`
//!   counts each source change once, and `zipline_lag_bytes` returns to 0 once caught up.
//! - `/readyz` is 503 while the source server is down and 200 once it is back; `/healthz`
//!   stays 200.
//! - An address that cannot be listened on stops `pipeline apply` before any slot exists.

use crate::e2e;

use std::time::{Duration, Instant};

use prometheus_parse::{Scrape, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use e2e::{CONVERGE_TIMEOUT, Fixture, PipelineOpts, pipeline_yaml, wait_converged};

/// A port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// The standard pipeline serving its metrics on `port`.
fn yaml_with_metrics(port: u16) -> String {
    let yaml = pipeline_yaml(&PipelineOpts::default());
    let with = yaml.replace(
        "settings:\n",
        &format!("settings:\n  metrics: 127.0.0.1:{port}\n"),
    );
    assert_ne!(yaml, with, "the standard pipeline has a settings map");
    with
}

/// `GET path` on the metrics port: status and body (`None` while nothing answers).
async fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .ok()?
        .ok()?;
    let answer = String::from_utf8(answer).expect("a text answer");
    let (head, body) = answer.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// Polls `GET path` until `done(status, body)`; fails after `timeout` with the last answer.
async fn wait_for(
    port: u16,
    path: &str,
    timeout: Duration,
    z: &mut e2e::Zipline,
    done: impl Fn(u16, &str) -> bool,
) -> (u16, String) {
    let deadline = Instant::now() + timeout;
    loop {
        z.assert_running();
        let answer = get(port, path).await;
        if let Some((status, body)) = &answer
            && done(*status, body)
        {
            return (*status, body.clone());
        }
        assert!(
            Instant::now() < deadline,
            "GET {path} never answered as expected within {timeout:?}; last: {answer:?}\nzipline log:\n{}",
            z.tail(40)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn parse(body: &str) -> Scrape {
    Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).expect("Prometheus text format")
}

/// The value of a counter, gauge or untyped sample.
fn number(value: &Value) -> Option<f64> {
    match value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => Some(*v),
        _ => None,
    }
}

/// The sum of every sample named `name`, and how many there were.
fn sum(scrape: &Scrape, name: &str) -> (f64, usize) {
    let values: Vec<f64> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .filter_map(|s| number(&s.value))
        .collect();
    (values.iter().sum(), values.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_count_each_change_once_and_lag_returns_to_zero() {
    let mut fx = Fixture::start();
    let port = free_port();
    fx.write_pipeline(&yaml_with_metrics(port));
    let pg = fx.pg_client().await;
    let mut my = fx.my_checker().await;
    let mut z = fx.apply();
    e2e::wait_streaming(&pg, &mut z, Duration::from_secs(30)).await;
    wait_for(port, "/readyz", Duration::from_secs(30), &mut z, |s, _| {
        s == 200
    })
    .await;

    // 200 inserts, 50 updates that move their row to a new key, 30 plain updates, 20
    // deletes, then 10 one-row transactions: 310 source changes.
    for sql in [
        "INSERT INTO orders (id, customer, amount, status, created_at, flag, note) \
         SELECT g, 'c' || g, g, 'new', now(), true, 'n' FROM generate_series(1, 200) g",
        "UPDATE orders SET id = id + 1000 WHERE id <= 50",
        "UPDATE orders SET status = 'paid' WHERE id BETWEEN 51 AND 80",
        "DELETE FROM orders WHERE id BETWEEN 181 AND 200",
    ] {
        pg.batch_execute(sql).await.expect(sql);
    }
    for id in 301..=310 {
        pg.batch_execute(&format!(
            "INSERT INTO orders (id, customer, status) VALUES ({id}, 'one', 'new')"
        ))
        .await
        .expect("insert");
    }
    const WRITTEN: f64 = 310.0;
    // With 4 lanes some moved keys change lanes: each is then a delete on one lane and an
    // insert on another, and must still count once.
    let lane = |id: i64| {
        zipline::lane::lane_of("public", "orders", &[zipline::change::Value::Int8(id)], 4)
    };
    let crossing = (1..=50).filter(|&id| lane(id) != lane(id + 1000)).count();
    assert!(crossing > 0, "no moved key changes lanes");
    wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;

    let (_, body) = wait_for(port, "/metrics", Duration::from_secs(30), &mut z, |s, b| {
        s == 200 && sum(&parse(b), "zipline_changes_applied_total").0 >= WRITTEN
    })
    .await;
    let scrape = parse(&body);
    let (applied, series) = sum(&scrape, "zipline_changes_applied_total");
    assert_eq!(series, 4, "one series per lane");
    assert_eq!(
        applied, WRITTEN,
        "{crossing} moved keys changed lanes; every source change counts once"
    );
    assert_eq!(sum(&scrape, "zipline_changes_read_total").0, WRITTEN);
    let (batches, _) = sum(&scrape, "zipline_batches_applied_total");
    assert!(batches >= 1.0, "batches {batches}");
    assert_eq!(
        sum(&scrape, "zipline_batch_size_count").0,
        batches,
        "one batch size observed per batch"
    );
    assert_eq!(
        sum(&scrape, "zipline_apply_duration_seconds_count").0,
        batches
    );
    for sample in scrape
        .samples
        .iter()
        .filter(|s| s.metric.starts_with("zipline_"))
    {
        assert_eq!(sample.labels.get("pipeline"), Some("orders"), "{sample:?}");
    }
    let fatal: Vec<_> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "zipline_errors_total" && s.labels.get("class") == Some("fatal"))
        .filter_map(|s| number(&s.value))
        .collect();
    assert_eq!(fatal.len(), 5, "the source's and each lane's: {fatal:?}");
    assert!(fatal.iter().all(|&n| n == 0.0), "{fatal:?}");
    // Caught up: the server's end is confirmed, and nothing waits.
    let (_, body) = wait_for(port, "/metrics", Duration::from_secs(30), &mut z, |s, b| {
        let scrape = parse(b);
        s == 200
            && sum(&scrape, "zipline_lag_bytes") == (0.0, 1)
            && sum(&scrape, "zipline_lag_seconds") == (0.0, 1)
    })
    .await;
    assert!(body.ends_with("# EOF\n"), "a complete exposition");
    // Real lines, for the README.
    for line in body.lines().filter(|l| {
        [
            "zipline_changes_applied_total{",
            "zipline_changes_read_total{",
            "zipline_lag_bytes{",
            "zipline_lag_seconds{",
            "zipline_slot_retained_bytes{",
            "zipline_batches_applied_total{",
            "zipline_errors_total{pipeline=\"orders\",connector=\"orders-db\"",
        ]
        .iter()
        .any(|p| l.starts_with(p))
    }) {
        eprintln!("e2e: metric: {line}");
    }

    assert_eq!(get(port, "/healthz").await, Some((200, "ok\n".to_owned())));
    assert_eq!(
        get(port, "/readyz").await,
        Some((200, "ready\n".to_owned()))
    );
    assert_eq!(get(port, "/nope").await.map(|(s, _)| s), Some(404));
    z.terminate_cleanly(Duration::from_secs(15));
    assert!(
        get(port, "/healthz").await.is_none(),
        "the endpoint ends with the process"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readyz_is_503_while_the_source_is_down_and_200_once_it_is_back() {
    let mut fx = Fixture::start();
    let port = free_port();
    fx.write_pipeline(&yaml_with_metrics(port));
    let mut z = fx.apply();
    {
        let pg = fx.pg_client().await;
        e2e::wait_streaming(&pg, &mut z, Duration::from_secs(30)).await;
    }
    wait_for(port, "/readyz", Duration::from_secs(30), &mut z, |s, _| {
        s == 200
    })
    .await;

    fx.pg.stop();
    eprintln!("e2e: source server stopped");
    let (_, why) = wait_for(port, "/readyz", Duration::from_secs(30), &mut z, |s, _| {
        s == 503
    })
    .await;
    assert!(why.starts_with("source orders-db: "), "{why}");
    assert!(!why.contains("sink"), "the sink is fine: {why}");
    assert_eq!(get(port, "/healthz").await, Some((200, "ok\n".to_owned())));
    let (_, body) = wait_for(port, "/metrics", Duration::from_secs(10), &mut z, |s, _| {
        s == 200
    })
    .await;
    assert_eq!(sum(&parse(&body), "zipline_ready"), (0.0, 1));

    fx.pg.restart();
    eprintln!("e2e: source server back");
    wait_for(port, "/readyz", Duration::from_secs(90), &mut z, |s, _| {
        s == 200
    })
    .await;
    // It is streaming again: a change written now arrives.
    let pg = fx.pg_client().await;
    pg.batch_execute("INSERT INTO orders (id, status) VALUES (1, 'after')")
        .await
        .expect("insert");
    let mut my = fx.my_checker().await;
    wait_converged(&pg, &mut my, Some(&mut z), CONVERGE_TIMEOUT).await;
    let (_, body) = wait_for(port, "/metrics", Duration::from_secs(10), &mut z, |s, _| {
        s == 200
    })
    .await;
    let scrape = parse(&body);
    assert_eq!(sum(&scrape, "zipline_ready"), (1.0, 1));
    let reconnects = scrape
        .samples
        .iter()
        .find(|s| {
            s.metric == "zipline_errors_total"
                && s.labels.get("connector") == Some("orders-db")
                && s.labels.get("class") == Some("transient")
        })
        .and_then(|s| number(&s.value));
    assert!(
        reconnects.is_some_and(|n| n >= 1.0),
        "the lost stream counted as a transient error: {reconnects:?}"
    );
    z.terminate_cleanly(Duration::from_secs(15));
}

#[tokio::test]
async fn an_address_in_use_stops_apply_before_any_slot_exists() {
    let mut fx = Fixture::start();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port to hold");
    let port = taken.local_addr().expect("its address").port();
    fx.write_pipeline(&yaml_with_metrics(port));
    let (args, env) = (fx.args("apply"), fx.env());
    let (code, output, _) = fx.run_to_exit(&args, &env, Duration::from_secs(60));
    assert_eq!(code, 1, "{output}");
    assert!(
        output.contains(&format!(
            "error: pipeline orders: settings.metrics: cannot listen on 127.0.0.1:{port}: "
        )),
        "{output}"
    );
    assert_eq!(
        fx.slots_and_publications(),
        (String::new(), String::new()),
        "nothing created upstream"
    );
    drop(taken);
}
