//! What a transform instance's store holds: its limits, its (empty) WASI context, and where
//! its log lines and stdout/stderr go.
//!
//! The sandbox is the WASI context built here: no preopened directories, no environment
//! variables, no arguments, stdin closed, TCP, UDP and name lookup refused, the wall clock
//! frozen at the Unix epoch and the monotonic clock a counter (a transform must be
//! deterministic: it runs again over the same changes after a restart, and the host's time
//! would make its output differ). Randomness stays
//! available (WASI requires it; guests' hash maps seed from it) but grants no authority.
//! Guests that import no WASI never see any of this. See
//! <https://docs.rs/wasmtime-wasi/48.0.8/wasmtime_wasi/struct.WasiCtxBuilder.html>.
//!
//! Guest log lines and stdout/stderr go to Zipline's log (tagged with route and module),
//! never to Zipline's own stdout: at most [`MAX_LINES_PER_CALL`] lines of at most
//! [`MAX_LINE`] bytes per call, so a chatty or hostile guest cannot flood the log.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxView, WasiView};

use super::bindings::Host;
use super::bindings::Level;

/// Most log lines (host `log` calls plus stdout/stderr lines) kept per call.
pub(crate) const MAX_LINES_PER_CALL: usize = 100;
/// Longest log line kept, in bytes; longer ones are cut.
pub(crate) const MAX_LINE: usize = 4096;
/// Most stdout or stderr bytes buffered per call.
const MAX_PIPE_BYTES: usize = 64 << 10;

/// Names attached to every log line of an instance.
#[derive(Debug, Clone)]
pub(crate) struct LogTags {
    pub(crate) route: Arc<str>,
    pub(crate) module: Arc<str>,
}

/// The `T` of `Store<T>`.
pub(crate) struct HostState {
    pub(crate) limiter: Limiter,
    wasi: WasiCtx,
    table: ResourceTable,
    tags: LogTags,
    lines: usize,
    suppressed: usize,
    /// The last `error` line of the current call: a panic hook's message, typically.
    last_error: Option<String>,
    stdout: Pipe,
    stderr: Pipe,
}

impl HostState {
    pub(crate) fn new(tags: LogTags, memory: u64) -> Self {
        let stdout = Pipe::default();
        let stderr = Pipe::default();
        let mut b = WasiCtx::builder();
        b.stdout(stdout.clone())
            .stderr(stderr.clone())
            .wall_clock(Frozen)
            .monotonic_clock(Counter::default())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .socket_addr_check(|_, _| Box::pin(async { false }));
        HostState {
            limiter: Limiter {
                memory,
                denied: None,
            },
            wasi: b.build(),
            table: ResourceTable::new(),
            tags,
            lines: 0,
            suppressed: 0,
            last_error: None,
            stdout,
            stderr,
        }
    }

    /// After a call: emit buffered stdout/stderr, report suppressed lines, reset budgets.
    pub(crate) fn end_call(&mut self) {
        for (pipe, stream) in [
            (self.stdout.clone(), "stdout"),
            (self.stderr.clone(), "stderr"),
        ] {
            let bytes = std::mem::take(&mut *pipe.0.lock().unwrap_or_else(|e| e.into_inner()));
            let text = String::from_utf8_lossy(&bytes);
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                self.emit(
                    if stream == "stderr" {
                        Level::Warn
                    } else {
                        Level::Info
                    },
                    stream,
                    line,
                );
            }
        }
        if self.suppressed > 0 {
            tracing::warn!(route = %self.tags.route, module = %self.tags.module, suppressed = self.suppressed, "guest log lines over the per-call budget were dropped");
        }
        self.lines = 0;
        self.suppressed = 0;
    }

    /// The last `error`-level guest log line since the previous call to this.
    pub(crate) fn take_last_error_log(&mut self) -> Option<String> {
        self.last_error.take()
    }

    fn emit(&mut self, level: Level, stream: &str, message: &str) {
        if level == Level::Error {
            self.last_error = Some(cut(message, 512).to_owned());
        }
        if self.lines >= MAX_LINES_PER_CALL {
            self.suppressed += 1;
            return;
        }
        self.lines += 1;
        let message = cut(message, MAX_LINE);
        let (route, module) = (&*self.tags.route, &*self.tags.module);
        match level {
            Level::Trace => tracing::trace!(route, module, stream, "guest: {message}"),
            Level::Debug => tracing::debug!(route, module, stream, "guest: {message}"),
            Level::Info => tracing::info!(route, module, stream, "guest: {message}"),
            Level::Warn => tracing::warn!(route, module, stream, "guest: {message}"),
            Level::Error => tracing::error!(route, module, stream, "guest: {message}"),
        }
    }
}

impl Host for HostState {
    fn log(&mut self, level: Level, message: String) {
        self.emit(level, "log", &message);
    }
}

/// `zipline:transform/types` has types only; the generated trait has no methods.
impl super::bindings::generated::zipline::transform::types::Host for HostState {}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Caps linear memory and tables, remembering a refused growth so the failure can be named.
pub(crate) struct Limiter {
    memory: u64,
    /// Bytes a refused `memory.grow` asked for.
    pub(crate) denied: Option<usize>,
}

impl Limiter {
    /// The memory limit, in bytes.
    pub(crate) fn limit(&self) -> u64 {
        self.memory
    }
}

/// Most table elements (function references) one table may hold.
const MAX_TABLE_ELEMENTS: usize = 1 << 20;

impl wasmtime::ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired as u64 > self.memory {
            self.denied = Some(desired);
            // Trapping (rather than failing the grow) stops the guest at the breach, instead
            // of letting its allocator turn the failure into some other trap later.
            return Err(wasmtime::format_err!(
                "memory limit exceeded: growing to {desired} bytes, over the limit of {} bytes",
                self.memory
            ));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }

    fn instances(&self) -> usize {
        // A component instantiates several core modules (an adapter adds a few).
        100
    }

    fn memories(&self) -> usize {
        16
    }

    fn tables(&self) -> usize {
        100
    }
}

/// A wall clock that always reads the Unix epoch.
struct Frozen;

impl HostWallClock for Frozen {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

/// A monotonic clock that reveals nothing of the host's time: it starts at one second and
/// moves one microsecond per reading. Runtimes refuse a clock that reads zero or never moves
/// (Go's scheduler aborts with "nanotime returning zero"), so "frozen" is not an option here.
#[derive(Default)]
struct Counter(std::sync::atomic::AtomicU64);

impl HostMonotonicClock for Counter {
    fn resolution(&self) -> u64 {
        1_000
    }
    fn now(&self) -> u64 {
        1_000_000_000
            + self
                .0
                .fetch_add(1_000, std::sync::atomic::Ordering::Relaxed)
    }
}

/// A guest's stdout or stderr: bytes collect here until the call ends.
#[derive(Clone, Default)]
struct Pipe(Arc<Mutex<Vec<u8>>>);

impl Pipe {
    fn push(&self, bytes: &[u8]) {
        let mut buf = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let room = MAX_PIPE_BYTES.saturating_sub(buf.len());
        // Beyond the budget output is dropped, not refused: a guest must not fail for printing.
        buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }
}

impl IsTerminal for Pipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Pipe {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }

    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
}

impl OutputStream for Pipe {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }
    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }
    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(MAX_PIPE_BYTES)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Pipe {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for Pipe {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.push(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(
        self: Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_respects_char_boundaries() {
        assert_eq!(cut("héllo", 2), "h");
        assert_eq!(cut("abc", 10), "abc");
    }

    #[test]
    fn pipe_keeps_at_most_its_budget() {
        let p = Pipe::default();
        p.push(&vec![b'a'; MAX_PIPE_BYTES - 1]);
        p.push(b"xyz");
        assert_eq!(p.0.lock().unwrap().len(), MAX_PIPE_BYTES);
    }

    #[test]
    fn limiter_refuses_growth_past_the_limit_and_remembers_it() {
        use wasmtime::ResourceLimiter;
        let mut l = Limiter {
            memory: 1 << 20,
            denied: None,
        };
        assert!(l.memory_growing(0, 1 << 20, None).unwrap());
        let e = l.memory_growing(1 << 20, 2 << 20, None).unwrap_err();
        assert!(e.to_string().contains("memory limit exceeded"), "{e}");
        assert_eq!(l.denied, Some(2 << 20));
    }
}
