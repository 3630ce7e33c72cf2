//! Protocol tests of the SQL Server source against a mock TDS server (`mssql-mock-tds`).
//!
//! No SQL Server can run on these machines, so these tests pin what can be pinned without
//! one: the exact SQL the source sends (the mock answers only registered statement texts),
//! how it reads the result sets tiberius decodes, and the source's behaviour around them —
//! preflight errors, streaming a window in commit order with ordinals, the durable frontier
//! following the lanes' acks and idle windows, draining, reconnecting after a cut connection
//! (through the test proxy), a retention window that has moved past the frontier, the initial
//! snapshot, and a route's transform. The source runs with the real runtime dispatcher; the
//! test plays the sink's one lane.
//!
//! Limits of the mock (see /work/shared/TESTING.md): it speaks no TLS (so `encrypt: false`),
//! and returns only int types, nvarchar, (n)varchar(max) and varbinary(max) columns, so LSNs
//! arrive as `varbinary(max)` instead of `binary(10)` (tiberius decodes both as bytes) and
//! only int and nvarchar(max) table columns are exercised here. The change model's type
//! mapping of the other types is unit-tested in `src/source/sqlserver/types.rs`; the real
//! server behaviour is covered by `tests/sqlserver/live.rs` when `ZIPLINE_MSSQL_URL` is set.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use mssql_mock_tds::{
    ColumnDefinition, ColumnValue, MockTdsServer, QueryRegistry, QueryResponse, Row, SqlDataType,
};
use tokio::sync::{mpsc, watch};

use zipline::change::{Change, Lsn, Op, Position, Table, Value};
use zipline::config::{self, ConnectorKind, LoadOptions, SqlServerSnapshot};
use zipline::error::ErrorClass;
use zipline::lane::{Ack, LaneReceiver, Router};
use zipline::runtime::{Dispatcher, RouteStage, Tables, Transformer};
use zipline::source::sqlserver::SqlServerSource;
use zipline::source::{Frontier, Source, SourceError, SourceIo, SourceStats, StopMode};

const WHOLE: u32 = u32::MAX;
const CT_ID: i64 = 1001;

const DATABASE_STATE: &str = "SELECT DB_NAME() AS database_name, \
     CAST(is_cdc_enabled AS int) AS cdc_enabled, \
     CAST(snapshot_isolation_state AS int) AS snapshot_isolation \
     FROM sys.databases WHERE database_id = DB_ID()";
const CAPTURE_JOB: &str = "SELECT COUNT(*) AS jobs FROM msdb.dbo.cdc_jobs \
     WHERE database_id = DB_ID() AND job_type = N'capture'";
const TABLES_STATE: &str = "SELECT s.name AS schema_name, t.name AS table_name, \
     CAST(t.is_tracked_by_cdc AS int) AS tracked \
     FROM sys.tables t JOIN sys.schemas s ON s.schema_id = t.schema_id \
     WHERE (s.name = N'dbo' AND t.name = N'orders')";
const CAPTURE_INSTANCES: &str = "SELECT s.name AS schema_name, t.name AS table_name, \
     ct.capture_instance, ct.start_lsn, ct.object_id \
     FROM cdc.change_tables ct \
     JOIN sys.tables t ON t.object_id = ct.source_object_id \
     JOIN sys.schemas s ON s.schema_id = t.schema_id \
     ORDER BY ct.create_date, ct.object_id";
const CAPTURED_COLUMNS: &str = "SELECT cc.column_name, cc.column_ordinal, \
     TYPE_NAME(c.system_type_id) AS type_name, \
     CAST(c.max_length AS int) AS max_length, \
     CAST(CASE WHEN ic.column_name IS NULL THEN 0 ELSE 1 END AS int) AS is_key \
     FROM cdc.captured_columns cc \
     JOIN sys.columns c ON c.object_id = cc.object_id AND c.name = cc.column_name \
     LEFT JOIN cdc.index_columns ic ON ic.object_id = cc.object_id AND ic.column_name = cc.column_name \
     WHERE cc.object_id = 1001 AND cc.is_computed = 0 ORDER BY cc.column_ordinal";
const MAX_LSN: &str = "SELECT sys.fn_cdc_get_max_lsn() AS max_lsn";

fn hex(lsn: u128) -> String {
    format!("0x{lsn:020X}")
}

fn lsn_bytes(lsn: u128) -> Vec<u8> {
    lsn.to_be_bytes()[6..].to_vec()
}

fn window_sql(after: u128, upto: u128) -> String {
    format!(
        "SELECT TOP (1000) start_lsn, \
         ISNULL(DATEDIFF_BIG(MICROSECOND, tran_end_time, SYSDATETIME()), 0) AS age_us \
         FROM cdc.lsn_time_mapping WHERE start_lsn > {} AND start_lsn <= {} ORDER BY start_lsn",
        hex(after),
        hex(upto)
    )
}

fn changes_sql(from: u128, to: u128) -> String {
    format!(
        "SELECT __$start_lsn, __$seqval, __$operation, __$update_mask, [id], [note] \
         FROM cdc.[fn_cdc_get_all_changes_dbo_orders]({}, {}, N'all update old') \
         ORDER BY __$start_lsn, __$seqval, __$operation",
        hex(from),
        hex(to)
    )
}

fn changes_at_sql(at: u128) -> String {
    format!(
        "SELECT COUNT_BIG(*) AS changes FROM cdc.[fn_cdc_get_all_changes_dbo_orders]({}, {}, N'all')",
        hex(at),
        hex(at)
    )
}

/// A change row as the mock returns it: `(__$start_lsn, __$seqval, __$operation,
/// __$update_mask, id, note)`.
type ChangeRow<'a> = (u128, u128, i32, u8, i32, Option<&'a str>);

const SNAPSHOT_ROWS: &str = "SELECT [id], [note] FROM [dbo].[orders]";

fn col(name: &str, ty: SqlDataType) -> ColumnDefinition {
    ColumnDefinition::new(name, ty)
}

fn lsn_value(lsn: u128) -> ColumnValue {
    ColumnValue::VarBinaryMax(vec![lsn_bytes(lsn)])
}

fn text(s: &str) -> ColumnValue {
    ColumnValue::NVarCharMax(vec![s.encode_utf16().collect()])
}

/// A mock SQL Server with the catalog of one CDC-enabled table `dbo.orders (id int primary
/// key, note nvarchar(max))` whose capture instance `dbo_orders` starts at `start`.
struct Mock {
    registry: Arc<tokio::sync::Mutex<QueryRegistry>>,
    port: u16,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

impl Mock {
    async fn start(start: u128) -> Mock {
        let server = MockTdsServer::new("127.0.0.1:0")
            .await
            .expect("mock server");
        let port = server.local_addr().port();
        let registry = server.query_registry();
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(server.run_with_shutdown(rx));
        let mock = Mock {
            registry,
            port,
            _shutdown: tx,
        };
        mock.database_state(1, 1).await;
        mock.register(
            CAPTURE_JOB,
            vec![col("jobs", SqlDataType::Int)],
            vec![vec![ColumnValue::Int(1)]],
        )
        .await;
        mock.register(
            TABLES_STATE,
            vec![
                col("schema_name", SqlDataType::NVarChar),
                col("table_name", SqlDataType::NVarChar),
                col("tracked", SqlDataType::Int),
            ],
            vec![vec![
                ColumnValue::NVarChar("dbo".into()),
                ColumnValue::NVarChar("orders".into()),
                ColumnValue::Int(1),
            ]],
        )
        .await;
        mock.instance_start(start).await;
        mock.columns(&[("id", "int", 4, 1), ("note", "nvarchar", -1, 0)])
            .await;
        mock
    }

    async fn register(
        &self,
        sql: &str,
        columns: Vec<ColumnDefinition>,
        rows: Vec<Vec<ColumnValue>>,
    ) {
        let rows = rows.into_iter().map(Row::new).collect();
        self.registry
            .lock()
            .await
            .register(sql, QueryResponse::new(columns, rows));
    }

    async fn database_state(&self, cdc: i32, snapshot_isolation: i32) {
        self.register(
            DATABASE_STATE,
            vec![
                col("database_name", SqlDataType::NVarChar),
                col("cdc_enabled", SqlDataType::Int),
                col("snapshot_isolation", SqlDataType::Int),
            ],
            vec![vec![
                ColumnValue::NVarChar("shop".into()),
                ColumnValue::Int(cdc),
                ColumnValue::Int(snapshot_isolation),
            ]],
        )
        .await;
    }

    async fn instance_start(&self, start: u128) {
        self.register(
            CAPTURE_INSTANCES,
            vec![
                col("schema_name", SqlDataType::NVarChar),
                col("table_name", SqlDataType::NVarChar),
                col("capture_instance", SqlDataType::NVarChar),
                col("start_lsn", SqlDataType::VarBinaryMax),
                col("object_id", SqlDataType::Int),
            ],
            vec![vec![
                ColumnValue::NVarChar("dbo".into()),
                ColumnValue::NVarChar("orders".into()),
                ColumnValue::NVarChar("dbo_orders".into()),
                lsn_value(start),
                ColumnValue::Int(CT_ID as i32),
            ]],
        )
        .await;
    }

    async fn columns(&self, columns: &[(&str, &str, i32, i32)]) {
        self.register(
            CAPTURED_COLUMNS,
            vec![
                col("column_name", SqlDataType::NVarChar),
                col("column_ordinal", SqlDataType::Int),
                col("type_name", SqlDataType::NVarChar),
                col("max_length", SqlDataType::Int),
                col("is_key", SqlDataType::Int),
            ],
            columns
                .iter()
                .enumerate()
                .map(|(i, (name, ty, len, key))| {
                    vec![
                        ColumnValue::NVarChar((*name).into()),
                        ColumnValue::Int(i as i32 + 1),
                        ColumnValue::NVarChar((*ty).into()),
                        ColumnValue::Int(*len),
                        ColumnValue::Int(*key),
                    ]
                })
                .collect(),
        )
        .await;
    }

    async fn max_lsn(&self, lsn: u128) {
        self.register(
            MAX_LSN,
            vec![col("max_lsn", SqlDataType::VarBinaryMax)],
            vec![vec![lsn_value(lsn)]],
        )
        .await;
    }

    /// The window `(after, upto]` holds these commits.
    async fn window(&self, after: u128, upto: u128, commits: &[u128]) {
        self.register(
            &window_sql(after, upto),
            vec![
                col("start_lsn", SqlDataType::VarBinaryMax),
                col("age_us", SqlDataType::BigInt),
            ],
            commits
                .iter()
                .map(|c| vec![lsn_value(*c), ColumnValue::BigInt(1_000)])
                .collect(),
        )
        .await;
    }

    /// Change rows `(start_lsn, seqval, operation, mask, id, note)` for `[from, to]`.
    async fn changes(&self, from: u128, to: u128, rows: &[ChangeRow<'_>]) {
        self.register(
            &changes_sql(from, to),
            vec![
                col("__$start_lsn", SqlDataType::VarBinaryMax),
                col("__$seqval", SqlDataType::VarBinaryMax),
                col("__$operation", SqlDataType::Int),
                col("__$update_mask", SqlDataType::VarBinaryMax),
                col("id", SqlDataType::Int),
                col("note", SqlDataType::NVarCharMax),
            ],
            rows.iter()
                .map(|(start, seq, op, mask, id, note)| {
                    vec![
                        lsn_value(*start),
                        lsn_value(*seq),
                        ColumnValue::Int(*op),
                        ColumnValue::VarBinaryMax(vec![vec![*mask]]),
                        ColumnValue::Int(*id),
                        note.map_or(ColumnValue::NVarCharMaxNull, text),
                    ]
                })
                .collect(),
        )
        .await;
    }

    async fn count(&self, sql: &str, n: i64) {
        self.register(
            sql,
            vec![col("n", SqlDataType::BigInt)],
            vec![vec![ColumnValue::BigInt(n)]],
        )
        .await;
    }
}

fn options(port: u16, snapshot: SqlServerSnapshot) -> config::SqlServerSource {
    let snapshot = match snapshot {
        SqlServerSnapshot::Initial => "initial",
        SqlServerSnapshot::Never => "never",
    };
    let entry = format!(
        "name: mssql\ntype: source/sqlserver\nhost: 127.0.0.1\nport: {port}\ndatabase: shop\n\
         user: sa\npassword: mock-password\ntables: [orders]\npoll_interval: 50ms\n\
         encrypt: false\nsnapshot: {snapshot}\nconnect_timeout: 5s\nconnect_retries: 0\n"
    );
    let opts = LoadOptions {
        secrets_dir: None,
        env: Box::new(|_| None),
    };
    match config::load_connector("test.yaml", &entry, "p", &opts)
        .expect("the source's settings load")
        .kind
    {
        ConnectorKind::SqlServerSource(source) => source,
        other => panic!("not a SQL Server source: {}", other.type_name()),
    }
}

/// A running source and dispatcher with one sink of one lane, the test playing the lane.
struct Running {
    lane: LaneReceiver,
    acks: mpsc::UnboundedSender<Ack>,
    stop: watch::Sender<StopMode>,
    task: tokio::task::JoinHandle<Result<(), SourceError>>,
    dispatcher: tokio::task::JoinHandle<Result<(), zipline::runtime::DispatchError>>,
    frontier: watch::Receiver<Frontier>,
}

/// Starts the source resuming at `resume` (what the sinks' checkpoints would say), its one
/// route through `transform`.
async fn start_with(
    opts: config::SqlServerSource,
    resume: Option<Position>,
    transform: Option<Arc<dyn Transformer>>,
) -> Result<Running, SourceError> {
    let source = SqlServerSource::preflight(opts).await?;
    assert_eq!(source.tables().len(), 1);
    assert_eq!(source.tables()[0].qualified_name(), "dbo.orders");
    let (tx, lane) = zipline::lane::queue(64);
    let (ack_tx, ack_rx) = mpsc::unbounded_channel();
    let (stop_tx, stop_rx) = watch::channel(StopMode::Run);
    let stats = Arc::new(SourceStats::default());
    let (emitter, events, frontier_tx) =
        zipline::source::emitter::channel(4, resume.map_or(Lsn(0), |p| p.lsn));
    let frontier = emitter.watch();
    let dispatcher = Dispatcher::new(
        vec![RouteStage {
            name: "route 1".into(),
            tables: Tables::All,
            transform,
            sinks: vec![0],
        }],
        vec![Router::new(vec![tx])],
        events,
        ack_rx,
        frontier_tx,
        stop_rx.clone(),
        stats.clone(),
    );
    let dispatcher = tokio::spawn(dispatcher.run());
    let task = tokio::spawn(Box::new(source).run(
        SourceIo {
            emitter,
            ledger: zipline::source::Ledger {
                known: Vec::new(),
                record: mpsc::unbounded_channel().0,
            },
            resume,
        },
        stop_rx,
        stats,
    ));
    Ok(Running {
        lane,
        acks: ack_tx,
        stop: stop_tx,
        task,
        dispatcher,
        frontier,
    })
}

async fn start(
    opts: config::SqlServerSource,
    resume: Option<Position>,
) -> Result<Running, SourceError> {
    start_with(opts, resume, None).await
}

impl Running {
    /// The next `n` changes, acknowledged as a lane would after committing them.
    async fn take(&mut self, n: usize) -> Vec<Change> {
        let mut out = Vec::new();
        let mut ack = Ack::default();
        while out.len() < n {
            let c = tokio::time::timeout(Duration::from_secs(20), self.lane.recv())
                .await
                .expect("a change within 20 s")
                .expect("the source is running")
                .change;
            ack.add(c.position.lsn, 1);
            out.push(c);
        }
        self.acks.send(ack).unwrap();
        out
    }

    /// Waits until the durable frontier (what the runtime records in the sinks as the whole
    /// transaction at that LSN) reaches `to`.
    async fn wait_frontier(&mut self, to: u128) {
        let want = Lsn(to);
        tokio::time::timeout(Duration::from_secs(20), async {
            while self.frontier.borrow_and_update().lsn < want {
                self.frontier.changed().await.expect("the runtime runs");
            }
        })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "frontier {want} never reached; it is {}",
                self.frontier.borrow().lsn
            )
        });
        assert_eq!(
            self.frontier.borrow().lsn,
            want,
            "the frontier went past {want}"
        );
    }

    /// Asks for a drain and, as the lane, takes what remains and ends: the source returns
    /// once the runtime has ended.
    async fn drain(self) -> Result<(), SourceError> {
        let Running {
            mut lane,
            acks,
            stop,
            task,
            dispatcher,
            ..
        } = self;
        stop.send(StopMode::Drain).unwrap();
        let lane = tokio::spawn(async move {
            let mut ack = Ack::default();
            while let Some(c) = lane.recv().await {
                ack.add(c.change.position.lsn, 1);
            }
            let _ = acks.send(ack);
        });
        let result = tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("the source stops within 20 s")
            .expect("source task");
        lane.await.expect("the lane");
        dispatcher
            .await
            .expect("dispatcher task")
            .expect("the dispatcher drains");
        result
    }
}

fn summary(c: &Change) -> (u128, u32, Op, Vec<Value>, Option<Vec<Value>>) {
    (
        c.position.lsn.0,
        c.position.ordinal,
        c.op,
        c.key.to_vec(),
        c.old_key.as_deref().map(|k| k.to_vec()),
    )
}

#[tokio::test]
async fn preflight_names_the_statements_that_enable_cdc() {
    let mock = Mock::start(0x10).await;
    mock.database_state(0, 1).await;
    let err = start(options(mock.port, SqlServerSnapshot::Never), None)
        .await
        .err()
        .unwrap();
    assert_eq!(err.class, ErrorClass::Fatal);
    assert!(
        err.report().contains("not enabled on database shop")
            && err
                .message
                .contains("USE [shop]; EXEC sys.sp_cdc_enable_db;"),
        "{}",
        err.report()
    );

    mock.database_state(1, 0).await;
    let err = start(options(mock.port, SqlServerSnapshot::Initial), None)
        .await
        .err()
        .unwrap();
    assert!(
        err.report()
            .contains("ALTER DATABASE [shop] SET ALLOW_SNAPSHOT_ISOLATION ON;"),
        "{}",
        err.report()
    );

    mock.database_state(1, 1).await;
    mock.register(
        TABLES_STATE,
        vec![
            col("schema_name", SqlDataType::NVarChar),
            col("table_name", SqlDataType::NVarChar),
            col("tracked", SqlDataType::Int),
        ],
        vec![vec![
            ColumnValue::NVarChar("dbo".into()),
            ColumnValue::NVarChar("orders".into()),
            ColumnValue::Int(0),
        ]],
    )
    .await;
    let err = start(options(mock.port, SqlServerSnapshot::Never), None)
        .await
        .err()
        .unwrap();
    assert!(
        err.report().contains(
            "EXEC sys.sp_cdc_enable_table @source_schema = N'dbo', @source_name = N'orders', @role_name = NULL;"
        ),
        "{}",
        err.report()
    );
}

#[tokio::test]
async fn preflight_rejects_unsupported_types_by_table_and_column() {
    let mock = Mock::start(0x10).await;
    mock.columns(&[("id", "int", 4, 1), ("shape", "geography", -1, 0)])
        .await;
    let err = start(options(mock.port, SqlServerSnapshot::Never), None)
        .await
        .err()
        .unwrap();
    assert!(
        err.report()
            .contains("column dbo.orders.shape has type geography"),
        "{}",
        err.report()
    );
    // And a table without a key.
    mock.columns(&[("id", "int", 4, 0)]).await;
    let err = start(options(mock.port, SqlServerSnapshot::Never), None)
        .await
        .err()
        .unwrap();
    assert!(err.report().contains("no primary key"), "{}", err.report());
}

#[tokio::test]
async fn streams_windows_in_commit_order_and_records_the_frontier() {
    let mock = Mock::start(0x10).await;
    mock.max_lsn(0x300).await;
    mock.window(0x100, 0x300, &[0x200, 0x300]).await;
    mock.changes(
        0x101,
        0x300,
        &[
            // Transaction 0x200: insert 1, insert 2; transaction 0x300: update 1 → 3 (key
            // change, note untouched), delete 2.
            (0x200, 0x1A0, 2, 0x03, 1, Some("first")),
            (0x200, 0x1A1, 2, 0x03, 2, Some("second")),
            (0x300, 0x2A0, 3, 0x01, 1, None),
            (0x300, 0x2A0, 4, 0x01, 3, None),
            (0x300, 0x2A5, 1, 0x03, 2, Some("second")),
        ],
    )
    .await;
    let mut run = start(
        options(mock.port, SqlServerSnapshot::Initial),
        Some(Position::new(Lsn(0x100), WHOLE)),
    )
    .await
    .unwrap();
    let got = run.take(4).await;
    let int = |i| vec![Value::Int4(i)];
    assert_eq!(
        got.iter().map(summary).collect::<Vec<_>>(),
        vec![
            (0x200, 1, Op::Insert, int(1), None),
            (0x200, 2, Op::Insert, int(2), None),
            (0x300, 1, Op::Update, int(3), Some(int(1))),
            (0x300, 2, Op::Delete, int(2), None),
        ]
    );
    assert_eq!(
        got[0].values,
        vec![Value::Int4(1), Value::Text("first".into())]
    );
    // The untouched nvarchar(max) column is NULL in CDC's after-image: kept, not nulled.
    assert_eq!(got[2].values, vec![Value::Int4(3), Value::Unchanged]);
    assert!(got[3].values.is_empty());
    run.wait_frontier(0x300).await;

    // An idle marker moves the maximum LSN without changes: the frontier follows it.
    mock.max_lsn(0x380).await;
    mock.window(0x300, 0x380, &[0x380]).await;
    mock.changes(0x301, 0x380, &[]).await;
    run.wait_frontier(0x380).await;

    // A second window.
    mock.max_lsn(0x400).await;
    mock.window(0x380, 0x400, &[0x400]).await;
    mock.changes(0x381, 0x400, &[(0x400, 0x3F0, 2, 0x03, 9, Some("late"))])
        .await;
    let got = run.take(1).await;
    assert_eq!(summary(&got[0]), (0x400, 1, Op::Insert, int(9), None));
    run.wait_frontier(0x400).await;
    run.drain().await.unwrap();
}

#[tokio::test]
async fn resumes_after_a_cut_connection_without_gaps_or_repeats() {
    let mock = Mock::start(0x10).await;
    let proxy = common::Proxy::start(mock.port).await;
    mock.max_lsn(0x200).await;
    mock.window(0x100, 0x200, &[0x200]).await;
    mock.changes(0x101, 0x200, &[(0x200, 0x1A0, 2, 0x03, 1, Some("a"))])
        .await;
    let mut opts = options(proxy.port, SqlServerSnapshot::Never);
    opts.connect_retries = 3;
    let mut run = start(opts, Some(Position::new(Lsn(0x100), WHOLE)))
        .await
        .unwrap();
    let first = run.take(1).await;
    assert_eq!(first[0].position, Position::new(Lsn(0x200), 1));
    run.wait_frontier(0x200).await;

    // Cut the connection, then commit more while the source is away.
    let cuts_before = proxy.connections();
    assert!(cuts_before >= 1);
    // The proxy runs on its own thread, so blocking here until the cut lands is fine.
    proxy.cut_all();
    mock.max_lsn(0x300).await;
    mock.window(0x200, 0x300, &[0x300]).await;
    mock.changes(0x201, 0x300, &[(0x300, 0x2A0, 2, 0x03, 2, Some("b"))])
        .await;
    let second = run.take(1).await;
    assert_eq!(
        second[0].position,
        Position::new(Lsn(0x300), 1),
        "resumed after the last dispatched window: nothing repeated, nothing skipped"
    );
    assert_eq!(second[0].key[..], [Value::Int4(2)]);
    assert!(
        proxy.wait_for_connections(1, Duration::from_secs(5)).await,
        "the source reconnected"
    );
    run.wait_frontier(0x300).await;
    run.drain().await.unwrap();
}

#[tokio::test]
async fn a_retention_window_past_the_frontier_stops_with_a_clear_error() {
    // The capture instance now starts at 0x500 (cleanup ran); the sinks are at 0x100.
    let mock = Mock::start(0x500).await;
    mock.max_lsn(0x600).await;
    mock.window(0x100, 0x600, &[0x600]).await;
    let mut run = start(
        options(mock.port, SqlServerSnapshot::Initial),
        Some(Position::new(Lsn(0x100), WHOLE)),
    )
    .await
    .unwrap();
    let task = std::mem::replace(&mut run.task, tokio::spawn(async { Ok(()) }));
    let err = tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("the source stops")
        .unwrap()
        .unwrap_err();
    assert_eq!(err.class, ErrorClass::Fatal);
    assert!(
        err.report()
            .contains("no longer reaches back to LSN 0x00000000000000000100")
            && err
                .message
                .contains("dbo_orders starts at 0x00000000000000000500")
            && err.report().contains("may be lost"),
        "{}",
        err.report()
    );
    assert_eq!(
        run.frontier.borrow().lsn,
        Lsn(0x100),
        "the frontier did not move"
    );
}

#[tokio::test]
async fn initial_snapshot_then_stream_after_its_lsn() {
    let mock = Mock::start(0x10).await;
    mock.max_lsn(0x200).await;
    // One change at exactly 0x200: snapshot ordinals start after it.
    mock.count(&changes_at_sql(0x200), 1).await;
    mock.register(
        SNAPSHOT_ROWS,
        vec![
            col("id", SqlDataType::Int),
            col("note", SqlDataType::NVarCharMax),
        ],
        vec![
            vec![ColumnValue::Int(1), text("one")],
            vec![ColumnValue::Int(2), ColumnValue::NVarCharMaxNull],
        ],
    )
    .await;
    let mut run = start(options(mock.port, SqlServerSnapshot::Initial), None)
        .await
        .unwrap();
    let rows = run.take(2).await;
    assert_eq!(
        rows.iter().map(summary).collect::<Vec<_>>(),
        vec![
            (0x200, 2, Op::Insert, vec![Value::Int4(1)], None),
            (0x200, 3, Op::Insert, vec![Value::Int4(2)], None),
        ]
    );
    assert_eq!(rows[1].values, vec![Value::Int4(2), Value::Null]);
    run.wait_frontier(0x200).await;

    mock.max_lsn(0x300).await;
    mock.window(0x200, 0x300, &[0x300]).await;
    mock.changes(0x201, 0x300, &[(0x300, 0x2A0, 1, 0x03, 1, Some("one"))])
        .await;
    let got = run.take(1).await;
    assert_eq!(
        summary(&got[0]),
        (0x300, 1, Op::Delete, vec![Value::Int4(1)], None)
    );
    run.drain().await.unwrap();
}

#[tokio::test]
async fn a_frontier_inside_a_transaction_resumes_or_retakes_the_snapshot() {
    let mock = Mock::start(0x10).await;
    // The change tables hold 2 changes at 0x200.
    mock.count(&changes_at_sql(0x200), 2).await;
    mock.max_lsn(0x200).await;
    mock.window(0x1FF, 0x200, &[0x200]).await;
    mock.changes(
        0x200,
        0x200,
        &[
            (0x200, 0x1A0, 2, 0x03, 1, Some("a")),
            (0x200, 0x1A1, 2, 0x03, 2, Some("b")),
        ],
    )
    .await;
    // Position #2 ≤ 2 changes: a partly applied transaction, re-read whole (the lane skips).
    let mut run = start(
        options(mock.port, SqlServerSnapshot::Initial),
        Some(Position::new(Lsn(0x200), 2)),
    )
    .await
    .unwrap();
    let got = run.take(2).await;
    assert_eq!(
        got.iter().map(|c| c.position).collect::<Vec<_>>(),
        vec![Position::new(Lsn(0x200), 1), Position::new(Lsn(0x200), 2)]
    );
    run.drain().await.unwrap();

    // Position #5 > 2 changes: an interrupted snapshot at 0x200. A new one must wait for a
    // higher LSN, so its positions lie above everything the old one wrote.
    mock.register(
        SNAPSHOT_ROWS,
        vec![
            col("id", SqlDataType::Int),
            col("note", SqlDataType::NVarCharMax),
        ],
        vec![vec![ColumnValue::Int(7), text("seven")]],
    )
    .await;
    mock.count(&changes_at_sql(0x280), 0).await;
    let mut run = start(
        options(mock.port, SqlServerSnapshot::Initial),
        Some(Position::new(Lsn(0x200), 5)),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(run.lane.try_recv().is_err(), "no snapshot at the old LSN");
    mock.max_lsn(0x280).await;
    let got = run.take(1).await;
    assert_eq!(
        summary(&got[0]),
        (0x280, 1, Op::Insert, vec![Value::Int4(7)], None)
    );
    run.drain().await.unwrap();
}

#[tokio::test]
async fn a_route_transform_runs_on_sql_server_changes() {
    use zipline::config::{OnError, TransformLimits, TransformSpec};
    let module =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/guests/rust-mask.wasm");
    assert!(
        module.exists(),
        "{} is missing: build the test guests first with tests/guests/build.sh (or `.ci/run guests`)",
        module.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let spec = TransformSpec {
        module,
        module_label: "rust-mask.wasm".into(),
        config: vec![("columns".into(), "note".into())],
        limits: TransformLimits {
            memory: 32 << 20,
            timeout: Duration::from_millis(500),
            output: 1 << 20,
        },
        on_error: OnError::Halt,
        dead_letter: dir.path().join("dl.jsonl"),
        batch_size: 100,
        row_filter: false,
    };
    let transform = zipline::transform::RouteTransform::start("mssql", &spec, Default::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mock = Mock::start(0x10).await;
    mock.max_lsn(0x200).await;
    mock.window(0x100, 0x200, &[0x200]).await;
    mock.changes(
        0x101,
        0x200,
        &[
            (0x200, 0x1A0, 2, 0x03, 1, Some("first@example.com")),
            (0x200, 0x1A1, 2, 0x03, 2, Some("second")),
        ],
    )
    .await;
    let mut run = start_with(
        options(mock.port, SqlServerSnapshot::Never),
        Some(Position::new(Lsn(0x100), WHOLE)),
        Some(Arc::new(transform)),
    )
    .await
    .unwrap();
    let got = run.take(2).await;
    assert_eq!(
        got.iter().map(|c| c.values.clone()).collect::<Vec<_>>(),
        vec![
            vec![Value::Int4(1), Value::Text("f***@example.com".into())],
            vec![Value::Int4(2), Value::Text("s***".into())],
        ]
    );
    assert_eq!(
        got.iter().map(|c| c.position).collect::<Vec<_>>(),
        vec![Position::new(Lsn(0x200), 1), Position::new(Lsn(0x200), 2)]
    );
    run.wait_frontier(0x200).await;
    run.drain().await.unwrap();
}

/// The contract the SQL Server source resumes by, on the real MySQL sink (a throwaway
/// MariaDB): the durable frontier is unknown until every lane has a checkpoint row, is the
/// lowest of them, and `advance_frontier` only ever raises rows.
#[tokio::test]
async fn mysql_sink_keeps_the_frontier_the_source_resumes_from() {
    use zipline::change::Column;
    use zipline::sink::mysql::MysqlConnector;
    use zipline::sink::{Batch, CheckpointStore, SinkConnector};

    let my = common::MariaDb::start();
    my.create_database("shop");
    my.sql("shop", "CREATE TABLE t (id INT PRIMARY KEY, v TEXT)");
    let entry = format!(
        "name: out\ntype: sink/mysql\nhost: {}\nport: {}\ndatabase: shop\nuser: root\n\
         connect_timeout: 5s\n",
        my.host(),
        my.port
    );
    let opts = LoadOptions {
        secrets_dir: None,
        env: Box::new(|_| None),
    };
    let ConnectorKind::MysqlSink(settings) =
        config::load_connector("test.yaml", &entry, "frontier", &opts)
            .expect("the sink's settings load")
            .kind
    else {
        panic!("not a MySQL sink");
    };
    let sink = MysqlConnector::new("frontier", settings);
    let table = Arc::new(Table::new(
        "dbo".into(),
        "t".into(),
        vec![
            Column {
                name: "id".into(),
                type_oid: 23,
                type_modifier: -1,
                is_key: true,
            },
            Column {
                name: "v".into(),
                type_oid: 25,
                type_modifier: -1,
                is_key: false,
            },
        ],
    ));
    sink.check_tables(std::slice::from_ref(&table))
        .await
        .unwrap();
    let _lease = sink
        .claim(
            &zipline::checkpoint::Holder::this_process(),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    let pos = |lsn: u128, ordinal: u32| Position::new(Lsn(lsn), ordinal);
    let insert = |id: i32, at: Position| Batch {
        lane: 0,
        changes: vec![Change {
            position: at,
            op: Op::Insert,
            table: table.clone(),
            key: vec![Value::Int4(id)].into(),
            old_key: None,
            values: vec![Value::Int4(id), Value::Text("x".into())],
        }],
        ..Batch::default()
    };
    assert_eq!(sink.durable_frontier(2).await.unwrap(), None, "nothing yet");
    let mut lane0 = sink.open_lane(0, 2).await.unwrap();
    lane0.apply(&insert(1, pos(0x10, 1))).await.unwrap();
    assert_eq!(
        sink.durable_frontier(2).await.unwrap(),
        None,
        "lane 1 never committed: its changes may be lost, so no frontier"
    );
    sink.advance_frontier(2, pos(0x10, WHOLE)).await.unwrap();
    assert_eq!(
        sink.durable_frontier(2).await.unwrap(),
        Some(pos(0x10, WHOLE))
    );
    let mut lane1 = sink.open_lane(1, 2).await.unwrap();
    assert_eq!(
        lane1.checkpoint(),
        Some(pos(0x10, WHOLE)),
        "the idle lane was raised"
    );
    lane1.apply(&insert(2, pos(0x12, 3))).await.unwrap();
    sink.advance_frontier(2, pos(0x11, WHOLE)).await.unwrap();
    // Lane 0 rises to 0x11; lane 1 stays at its own higher 0x12#3.
    assert_eq!(
        sink.durable_frontier(2).await.unwrap(),
        Some(pos(0x11, WHOLE))
    );
    let reopened = sink.open_lane(1, 2).await.unwrap();
    assert_eq!(reopened.checkpoint(), Some(pos(0x12, 3)), "never lowered");
    // A lower frontier changes nothing.
    sink.advance_frontier(2, pos(0x05, WHOLE)).await.unwrap();
    assert_eq!(
        sink.durable_frontier(2).await.unwrap(),
        Some(pos(0x11, WHOLE))
    );
    // The same LSN with a lower ordinal does not lower either.
    sink.advance_frontier(2, pos(0x12, 1)).await.unwrap();
    assert_eq!(sink.durable_frontier(2).await.unwrap(), Some(pos(0x12, 1)));
    let reopened = sink.open_lane(1, 2).await.unwrap();
    assert_eq!(reopened.checkpoint(), Some(pos(0x12, 3)));
}

#[tokio::test]
async fn encryption_required_against_a_server_without_tls_is_refused() {
    let mock = Mock::start(0x10).await;
    let mut opts = options(mock.port, SqlServerSnapshot::Never);
    opts.encrypt = true;
    let err = start(opts, None)
        .await
        .err()
        .expect("no plaintext fallback");
    assert_eq!(err.class, ErrorClass::Fatal, "{}", err.report());
    assert!(
        err.report().contains("SQL Server 127.0.0.1")
            && err
                .message
                .contains("with `encrypt: true` the server must offer TLS"),
        "{}",
        err.report()
    );
    assert!(!err.report().contains("mock-password"));
}
