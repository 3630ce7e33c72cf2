//! The HTTP/1.1 endpoint of `settings.metrics`: `/metrics` (the registry in the OpenMetrics
//! text format, which Prometheus scrapes), `/healthz` (200 while the process runs),
//! `/readyz` (200 while the source streams and every lane is connected, else 503 saying what
//! is not ready), 404 elsewhere. Served by hyper on a tokio listener; each connection on a
//! task of its own, so a slow client holds up nobody.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::{PipelineMetrics, render};

/// A client that sends no complete request head within this is dropped.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// What `/metrics` answers with.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";

/// The metrics address could not be listened on.
#[derive(Debug, thiserror::Error)]
#[error("settings.metrics: cannot listen on {addr}")]
pub struct BindError {
    /// The address from the pipeline file.
    pub addr: SocketAddr,
    /// Why (in use, not an address of this host, no permission).
    #[source]
    pub source: std::io::Error,
}

/// The running endpoint; stops serving when dropped.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl MetricsServer {
    /// Listens on `addr` and serves `metrics` until dropped.
    pub async fn start(
        addr: SocketAddr,
        metrics: Arc<PipelineMetrics>,
    ) -> Result<MetricsServer, BindError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| BindError { addr, source })?;
        let bound = listener
            .local_addr()
            .map_err(|source| BindError { addr, source })?;
        let state = Arc::new(State {
            registry: metrics.registry(),
            metrics,
        });
        tracing::info!(address = %bound, "serving /metrics, /healthz and /readyz");
        Ok(MetricsServer {
            addr: bound,
            task: tokio::spawn(accept(listener, state)),
        })
    }

    /// The address it listens on (the port chosen, when the file said 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct State {
    metrics: Arc<PipelineMetrics>,
    registry: Registry,
}

async fn accept(listener: TcpListener, state: Arc<State>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors, say: the pipeline goes on, the endpoint retries.
                tracing::warn!(error = %e, "metrics endpoint: accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let state = Arc::clone(&state);
                async move { Ok::<_, Infallible>(answer(&state, &req)) }
            });
            let served = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(e) = served {
                tracing::debug!(error = %e, "metrics endpoint: connection ended with an error");
            }
        });
    }
}

fn answer(state: &State, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    let known = matches!(path, "/metrics" | "/healthz" | "/readyz");
    if !known {
        return reply(
            StatusCode::NOT_FOUND,
            TEXT,
            "not found: try /metrics, /healthz or /readyz\n",
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "only GET and HEAD\n");
    }
    match path {
        "/metrics" => match render(&state.registry) {
            Ok(text) => reply(StatusCode::OK, OPENMETRICS, text),
            Err(_) => reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                TEXT,
                "could not encode the metrics\n",
            ),
        },
        "/healthz" => reply(StatusCode::OK, TEXT, "ok\n"),
        _ => match state.metrics.readiness() {
            Ok(()) => reply(StatusCode::OK, TEXT, "ready\n"),
            Err(why) => reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, format!("{why}\n")),
        },
    }
}

fn reply(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::SinkShape;
    use crate::source::SourceState;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// One request over a fresh connection: status line, headers and body as text.
    async fn request(addr: SocketAddr, method: &str, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let head = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(head.as_bytes()).await.expect("send");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.expect("read");
        answer
    }

    #[tokio::test]
    async fn serves_metrics_health_and_readiness_and_nothing_else() {
        let metrics = Arc::new(PipelineMetrics::new(
            "orders",
            "pg",
            &[SinkShape {
                name: "out".into(),
                lanes: 1,
            }],
            &[false],
        ));
        let server = MetricsServer::start("127.0.0.1:0".parse().unwrap(), metrics.clone())
            .await
            .expect("listening");
        let addr = server.local_addr();
        assert_ne!(addr.port(), 0);

        let answer = request(addr, "GET", "/metrics").await;
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(
            answer.contains(&format!("content-type: {OPENMETRICS}")),
            "{answer}"
        );
        assert!(
            answer.contains("# TYPE zipline_changes_applied counter"),
            "{answer}"
        );
        assert!(answer.ends_with("# EOF\n"), "{answer}");

        let answer = request(addr, "GET", "/healthz").await;
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");

        let answer = request(addr, "GET", "/readyz").await;
        assert!(
            answer.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{answer}"
        );
        assert!(
            answer.ends_with("\r\n\r\nsource pg: starting (not streaming yet)\nsink out: 1 of 1 lanes not connected (lanes 0)\n"),
            "{answer}"
        );
        metrics.source().set_state(SourceState::Streaming);
        metrics
            .lane(0, 0)
            .connected
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let answer = request(addr, "GET", "/readyz").await;
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.ends_with("\r\n\r\nready\n"), "{answer}");

        let answer = request(addr, "GET", "/").await;
        assert!(answer.starts_with("HTTP/1.1 404 Not Found\r\n"), "{answer}");
        let answer = request(addr, "POST", "/metrics").await;
        assert!(
            answer.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"),
            "{answer}"
        );

        // Stopped with the pipeline.
        drop(server);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }

    #[tokio::test]
    async fn an_address_in_use_is_an_error_naming_the_setting_and_the_address() {
        let taken = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let addr = taken.local_addr().expect("its address");
        let metrics = Arc::new(PipelineMetrics::new("orders", "pg", &[], &[]));
        let err = MetricsServer::start(addr, metrics)
            .await
            .expect_err("the port is taken");
        assert!(
            crate::error::report(&err)
                .starts_with(&format!("settings.metrics: cannot listen on {addr}: ")),
            "{}",
            crate::error::report(&err)
        );
    }
}
