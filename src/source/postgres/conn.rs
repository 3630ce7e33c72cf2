//! A PostgreSQL connection in logical replication mode, on `postgres-protocol`'s framing.
//!
//! tokio-postgres cannot speak the replication sub-protocol, so this module drives the wire
//! itself: StartupMessage with `replication=database` → authentication (cleartext, MD5 or
//! SCRAM-SHA-256) → ReadyForQuery; then replication commands as simple queries
//! (`IDENTIFY_SYSTEM`, `CREATE_REPLICATION_SLOT`), and finally `START_REPLICATION`, which
//! switches the connection into CopyBoth mode. From then on the server sends CopyData frames
//! holding XLogData (`w`) or primary keepalives (`k`), and we send standby status updates (`r`).
//! See <https://www.postgresql.org/docs/15/protocol-replication.html>.
//!
//! Quirks:
//! - `postgres-protocol`'s backend parser has no CopyBothResponse (`W`), so that one frame is
//!   consumed by hand.
//! - Startup parameters fix how the walsender prints values, because pgoutput sends them in
//!   text form: `DateStyle=ISO`, `TimeZone=UTC`, `extra_float_digits=3` (floats round-trip),
//!   `IntervalStyle=postgres`, `client_encoding=UTF8`
//!   (<https://www.postgresql.org/docs/15/protocol-flow.html#PROTOCOL-FLOW-START-UP>).
//! - Timestamps in the replication protocol count microseconds from 2000-01-01.
//! - A walsender for a cut connection keeps the slot "active for PID" until
//!   `wal_sender_timeout` passes; `START_REPLICATION` then fails with SQLSTATE 55006, which the
//!   caller retries.

use std::io;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use fallible_iterator::FallibleIterator;
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{ChannelBinding, SCRAM_SHA_256, ScramSha256};
use postgres_protocol::message::backend::{self, ErrorResponseBody, Message};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};

use crate::change::Lsn;

/// Microseconds between the Unix epoch and PostgreSQL's epoch (2000-01-01).
const PG_EPOCH_OFFSET_MICROS: i64 = 946_684_800_000_000;

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Where and as whom to connect. The password is held only here and never printed.
#[derive(Clone)]
pub(crate) struct ConnectParams {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub database: String,
    pub password: Option<crate::config::Secret>,
    pub connect_timeout: Duration,
    /// `sslmode` and friends; they apply to every connection of the source.
    pub tls: crate::config::Tls,
}

impl std::fmt::Debug for ConnectParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectParams")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("database", &self.database)
            .field("password", &self.password)
            .field("tls", &self.tls)
            .finish()
    }
}

/// An error on the replication connection.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnError {
    /// Socket-level failure: the peer is unreachable or the connection was cut.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The server answered with an ErrorResponse.
    #[error("{message}{}{}", detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default(), hint.as_deref().map(|h| format!("; hint: {h}")).unwrap_or_default())]
    Server {
        code: String,
        message: String,
        detail: Option<String>,
        hint: Option<String>,
    },
    /// The server said something the protocol does not allow here.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The server asked for a password and none was configured.
    #[error(
        "the server asked for a password but none is configured (add secret_refs: [{{field: password, ref: ...}}])"
    )]
    NoPassword,
    /// TLS could not be set up as `sslmode` asks.
    #[error("{0}")]
    Tls(#[from] crate::tls::TlsError),
}

impl ConnError {
    /// SQLSTATE of a server error.
    pub(crate) fn code(&self) -> Option<&str> {
        match self {
            ConnError::Server { code, .. } => Some(code),
            _ => None,
        }
    }

    fn from_error_body(body: &ErrorResponseBody) -> ConnError {
        let mut code = String::new();
        let mut message = String::new();
        let mut detail = None;
        let mut hint = None;
        let mut fields = body.fields();
        while let Ok(Some(field)) = fields.next() {
            let value = String::from_utf8_lossy(field.value_bytes()).into_owned();
            match field.type_() {
                b'C' => code = value,
                b'M' => message = value,
                b'D' => detail = Some(value),
                b'H' => hint = Some(value),
                _ => {}
            }
        }
        ConnError::Server {
            code,
            message,
            detail,
            hint,
        }
    }
}

/// A message received while streaming.
#[derive(Debug)]
pub(crate) enum ReplMessage {
    /// A chunk of decoded WAL (one pgoutput message).
    XLogData { wal_end: Lsn, data: Bytes },
    /// The server's heartbeat; `reply` asks for a status update right away.
    Keepalive { wal_end: Lsn, reply: bool },
}

/// A replication-mode connection before `START_REPLICATION`.
pub(crate) struct ReplicationConn {
    reader: ReadHalf<Box<dyn Io>>,
    writer: WriteHalf<Box<dyn Io>>,
    rbuf: BytesMut,
    wbuf: BytesMut,
}

impl ReplicationConn {
    /// Connect, authenticate and wait for ReadyForQuery.
    pub(crate) async fn connect(params: &ConnectParams) -> Result<Self, ConnError> {
        let io: Box<dyn Io> = if params.host.starts_with('/') {
            let path = format!("{}/.s.PGSQL.{}", params.host, params.port);
            Box::new(
                timeout(
                    params.connect_timeout,
                    tokio::net::UnixStream::connect(path),
                )
                .await?,
            )
        } else {
            let stream = timeout(
                params.connect_timeout,
                tokio::net::TcpStream::connect((params.host.as_str(), params.port)),
            )
            .await?;
            stream.set_nodelay(true)?;
            let negotiated = timeout_conn(params.connect_timeout, async {
                Ok(crate::tls::postgres::negotiate(stream, &params.host, &params.tls).await?)
            })
            .await?;
            match negotiated {
                crate::tls::postgres::Negotiated::Plain(stream) => Box::new(stream),
                crate::tls::postgres::Negotiated::Tls(stream) => Box::new(stream),
            }
        };
        let (reader, writer) = tokio::io::split(io);
        let mut conn = ReplicationConn {
            reader,
            writer,
            rbuf: BytesMut::with_capacity(64 * 1024),
            wbuf: BytesMut::with_capacity(1024),
        };
        let startup = [
            ("user", params.user.as_str()),
            ("database", params.database.as_str()),
            ("replication", "database"),
            ("application_name", "zipline"),
            ("client_encoding", "UTF8"),
            ("DateStyle", "ISO"),
            ("TimeZone", "UTC"),
            ("IntervalStyle", "postgres"),
            ("extra_float_digits", "3"),
        ];
        frontend::startup_message(startup.iter().copied(), &mut conn.wbuf)?;
        conn.flush().await?;
        let io_deadline = params.connect_timeout;
        timeout_conn(io_deadline, conn.authenticate(params)).await?;
        timeout_conn(io_deadline, conn.wait_ready()).await?;
        Ok(conn)
    }

    async fn authenticate(&mut self, params: &ConnectParams) -> Result<(), ConnError> {
        // The secret leaves its wrapper only here, into the authentication messages.
        let password = || {
            params
                .password
                .as_ref()
                .map(crate::config::Secret::expose)
                .ok_or(ConnError::NoPassword)
        };
        loop {
            match self.read_message().await? {
                Message::AuthenticationOk => return Ok(()),
                Message::AuthenticationCleartextPassword => {
                    frontend::password_message(password()?.as_bytes(), &mut self.wbuf)?;
                    self.flush().await?;
                }
                Message::AuthenticationMd5Password(body) => {
                    let hash =
                        md5_hash(params.user.as_bytes(), password()?.as_bytes(), body.salt());
                    frontend::password_message(hash.as_bytes(), &mut self.wbuf)?;
                    self.flush().await?;
                }
                Message::AuthenticationSasl(body) => {
                    let mut mechanisms = body.mechanisms();
                    let mut scram = false;
                    while let Some(m) = mechanisms.next()? {
                        scram |= m == SCRAM_SHA_256;
                    }
                    if !scram {
                        return Err(ConnError::Protocol(
                            "the server offers no SASL mechanism Zipline supports (SCRAM-SHA-256)"
                                .into(),
                        ));
                    }
                    self.scram(password()?).await?;
                }
                Message::ErrorResponse(body) => return Err(ConnError::from_error_body(&body)),
                _ => {
                    return Err(ConnError::Protocol(
                        "unsupported authentication method (Zipline speaks password, md5 and SCRAM-SHA-256)".into(),
                    ));
                }
            }
        }
    }

    async fn scram(&mut self, password: &str) -> Result<(), ConnError> {
        let mut scram = ScramSha256::new(password.as_bytes(), ChannelBinding::unsupported());
        frontend::sasl_initial_response(SCRAM_SHA_256, scram.message(), &mut self.wbuf)?;
        self.flush().await?;
        match self.read_message().await? {
            Message::AuthenticationSaslContinue(body) => scram.update(body.data())?,
            Message::ErrorResponse(body) => return Err(ConnError::from_error_body(&body)),
            _ => return Err(ConnError::Protocol("expected SASL continue".into())),
        }
        frontend::sasl_response(scram.message(), &mut self.wbuf)?;
        self.flush().await?;
        match self.read_message().await? {
            Message::AuthenticationSaslFinal(body) => scram.finish(body.data())?,
            Message::ErrorResponse(body) => return Err(ConnError::from_error_body(&body)),
            _ => return Err(ConnError::Protocol("expected SASL final".into())),
        }
        Ok(())
    }

    async fn wait_ready(&mut self) -> Result<(), ConnError> {
        let mut error = None;
        loop {
            match self.read_message().await? {
                Message::ReadyForQuery(_) => return error.map_or(Ok(()), Err),
                Message::ErrorResponse(body) => error = Some(ConnError::from_error_body(&body)),
                _ => {}
            }
        }
    }

    /// Run one replication command and collect its rows as text.
    pub(crate) async fn simple_query(
        &mut self,
        sql: &str,
    ) -> Result<Vec<Vec<Option<String>>>, ConnError> {
        frontend::query(sql, &mut self.wbuf)?;
        self.flush().await?;
        let mut rows = Vec::new();
        let mut error = None;
        loop {
            match self.read_message().await? {
                Message::DataRow(body) => {
                    let buf = body.buffer();
                    let mut row = Vec::new();
                    let mut ranges = body.ranges();
                    while let Some(range) = ranges.next()? {
                        row.push(range.map(|r| String::from_utf8_lossy(&buf[r]).into_owned()));
                    }
                    rows.push(row);
                }
                Message::ErrorResponse(body) => error = Some(ConnError::from_error_body(&body)),
                Message::ReadyForQuery(_) => return error.map_or(Ok(rows), Err),
                _ => {}
            }
        }
    }

    /// Say goodbye (Terminate) and close, ignoring errors: the socket closes either way.
    pub(crate) async fn close(mut self) {
        frontend::terminate(&mut self.wbuf);
        let _ = tokio::time::timeout(Duration::from_secs(2), self.flush()).await;
    }

    /// Send `START_REPLICATION` and switch to streaming.
    pub(crate) async fn start_replication(
        mut self,
        command: &str,
    ) -> Result<ReplicationStream, ConnError> {
        frontend::query(command, &mut self.wbuf)?;
        self.flush().await?;
        loop {
            self.fill_frame().await?;
            let (tag, len) = frame_header(&self.rbuf)
                .ok_or_else(|| ConnError::Protocol("short frame".into()))?;
            if tag == b'W' {
                self.rbuf.advance(len + 1);
                return Ok(ReplicationStream { conn: self });
            }
            match self.parse_one()? {
                Message::ErrorResponse(body) => {
                    let err = ConnError::from_error_body(&body);
                    // Drain to ReadyForQuery so the connection is left in a known state.
                    let _ = self.wait_ready().await;
                    return Err(err);
                }
                Message::NoticeResponse(_) | Message::ParameterStatus(_) => {}
                _ => {
                    return Err(ConnError::Protocol(
                        "unexpected reply to START_REPLICATION".into(),
                    ));
                }
            }
        }
    }

    async fn flush(&mut self) -> io::Result<()> {
        self.writer.write_all(&self.wbuf).await?;
        self.wbuf.clear();
        self.writer.flush().await
    }

    /// `rbuf` holds one whole frame.
    fn has_frame(&self) -> bool {
        frame_header(&self.rbuf).is_some_and(|(_, len)| self.rbuf.len() > len)
    }

    /// Read until `rbuf` holds one whole frame.
    async fn fill_frame(&mut self) -> io::Result<()> {
        loop {
            if self.has_frame() {
                return Ok(());
            }
            if self.rbuf.capacity() - self.rbuf.len() < 8192 {
                self.rbuf.reserve(64 * 1024);
            }
            if self.reader.read_buf(&mut self.rbuf).await? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                ));
            }
        }
    }

    fn parse_one(&mut self) -> Result<Message, ConnError> {
        Message::parse(&mut self.rbuf)?
            .ok_or_else(|| ConnError::Protocol("incomplete frame".into()))
    }

    async fn read_message(&mut self) -> Result<Message, ConnError> {
        self.fill_frame().await?;
        self.parse_one()
    }
}

/// Tag and total length (excluding the tag byte) of the frame at the head of `buf`.
fn frame_header(buf: &[u8]) -> Option<(u8, usize)> {
    let header = backend::Header::parse(buf).ok()??;
    Some((header.tag(), usize::try_from(header.len()).ok()?))
}

async fn timeout<T>(limit: Duration, fut: impl Future<Output = io::Result<T>>) -> io::Result<T> {
    tokio::time::timeout(limit, fut).await.unwrap_or_else(|_| {
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("timed out after {limit:?}"),
        ))
    })
}

async fn timeout_conn<T>(
    limit: Duration,
    fut: impl Future<Output = Result<T, ConnError>>,
) -> Result<T, ConnError> {
    tokio::time::timeout(limit, fut).await.unwrap_or_else(|_| {
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no answer within {limit:?}"),
        )
        .into())
    })
}

/// A connection in CopyBoth mode after `START_REPLICATION`.
pub(crate) struct ReplicationStream {
    conn: ReplicationConn,
}

impl ReplicationStream {
    /// The next XLogData or keepalive. Cancel-safe: a partly read frame stays buffered.
    pub(crate) async fn recv(&mut self) -> Result<ReplMessage, ConnError> {
        loop {
            self.conn.fill_frame().await?;
            if let Some(msg) = self.next_frame()? {
                return Ok(msg);
            }
        }
    }

    /// The next XLogData or keepalive whose frame is already buffered, without reading the
    /// socket; `None` when no whole one is.
    pub(crate) fn buffered(&mut self) -> Result<Option<ReplMessage>, ConnError> {
        while self.conn.has_frame() {
            if let Some(msg) = self.next_frame()? {
                return Ok(Some(msg));
            }
        }
        Ok(None)
    }

    /// Parses the buffered frame at the head; `None` for a message the stream skips.
    fn next_frame(&mut self) -> Result<Option<ReplMessage>, ConnError> {
        match self.conn.parse_one()? {
            Message::CopyData(body) => parse_copy_data(body.into_bytes()).map(Some),
            Message::ErrorResponse(body) => Err(ConnError::from_error_body(&body)),
            Message::CopyDone => Err(ConnError::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server ended the replication stream",
            ))),
            _ => Ok(None),
        }
    }

    /// Send a standby status update. `flush` must only ever be the durable frontier.
    pub(crate) async fn send_status(
        &mut self,
        written: Lsn,
        flushed: Lsn,
        reply: bool,
    ) -> Result<(), ConnError> {
        let mut body = BytesMut::with_capacity(34);
        body.put_u8(b'r');
        body.put_u64(written.as_pg());
        body.put_u64(flushed.as_pg());
        body.put_u64(flushed.as_pg());
        body.put_i64(now_pg_micros());
        body.put_u8(u8::from(reply));
        frontend::CopyData::new(body.freeze())?.write(&mut self.conn.wbuf);
        self.conn.flush().await?;
        Ok(())
    }

    /// End the stream politely (CopyDone + Terminate); errors are ignored, the socket closes.
    pub(crate) async fn close(mut self) {
        frontend::copy_done(&mut self.conn.wbuf);
        frontend::terminate(&mut self.conn.wbuf);
        let _ = tokio::time::timeout(Duration::from_secs(2), self.conn.flush()).await;
    }
}

fn parse_copy_data(mut data: Bytes) -> Result<ReplMessage, ConnError> {
    let short = || ConnError::Protocol("short replication message".into());
    if data.is_empty() {
        return Err(short());
    }
    match data.get_u8() {
        b'w' => {
            if data.len() < 24 {
                return Err(short());
            }
            let _wal_start = data.get_u64();
            let wal_end = Lsn::from(data.get_u64());
            let _send_time = data.get_i64();
            Ok(ReplMessage::XLogData { wal_end, data })
        }
        b'k' => {
            if data.len() < 17 {
                return Err(short());
            }
            let wal_end = Lsn::from(data.get_u64());
            let _send_time = data.get_i64();
            Ok(ReplMessage::Keepalive {
                wal_end,
                reply: data.get_u8() != 0,
            })
        }
        other => Err(ConnError::Protocol(format!(
            "unknown replication message type {:?}",
            char::from(other)
        ))),
    }
}

/// Now, in microseconds since 2000-01-01 (the replication protocol's clock).
pub(crate) fn now_pg_micros() -> i64 {
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    unix - PG_EPOCH_OFFSET_MICROS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_xlogdata_and_keepalive() {
        let mut w = BytesMut::new();
        w.put_u8(b'w');
        w.put_u64(1);
        w.put_u64(0x10);
        w.put_i64(0);
        w.put_slice(b"Bpayload");
        match parse_copy_data(w.freeze()).unwrap() {
            ReplMessage::XLogData { wal_end, data } => {
                assert_eq!(wal_end, Lsn(0x10));
                assert_eq!(&data[..], b"Bpayload");
            }
            other => panic!("unexpected {other:?}"),
        }
        let mut k = BytesMut::new();
        k.put_u8(b'k');
        k.put_u64(0x20);
        k.put_i64(0);
        k.put_u8(1);
        assert!(matches!(
            parse_copy_data(k.freeze()).unwrap(),
            ReplMessage::Keepalive {
                wal_end: Lsn(0x20),
                reply: true
            }
        ));
        assert!(parse_copy_data(Bytes::from_static(b"k\0")).is_err());
        assert!(parse_copy_data(Bytes::from_static(b"z")).is_err());
    }

    /// A CopyData frame holding a keepalive at `wal_end`.
    fn keepalive_frame(wal_end: u64) -> Vec<u8> {
        let mut f = vec![b'd'];
        f.extend_from_slice(&(4 + 18_i32).to_be_bytes());
        f.push(b'k');
        f.extend_from_slice(&wal_end.to_be_bytes());
        f.extend_from_slice(&0_i64.to_be_bytes());
        f.push(0);
        f
    }

    fn wal_end(msg: ReplMessage) -> u128 {
        match msg {
            ReplMessage::Keepalive { wal_end, .. } | ReplMessage::XLogData { wal_end, .. } => {
                wal_end.0
            }
        }
    }

    #[tokio::test]
    async fn buffered_takes_only_whole_frames_already_read() {
        use tokio::io::AsyncWriteExt;
        let (ours, mut server) = tokio::io::duplex(4096);
        let (reader, writer) = tokio::io::split(Box::new(ours) as Box<dyn Io>);
        let mut stream = ReplicationStream {
            conn: ReplicationConn {
                reader,
                writer,
                rbuf: BytesMut::with_capacity(1024),
                wbuf: BytesMut::new(),
            },
        };
        // Two whole frames, a notice (skipped) and the first half of a third, in one write.
        let third = keepalive_frame(3);
        let mut wire = keepalive_frame(1);
        wire.extend(keepalive_frame(2));
        wire.extend([b'N', 0, 0, 0, 5, 0]);
        wire.extend(&third[..10]);
        server.write_all(&wire).await.unwrap();
        assert_eq!(wal_end(stream.recv().await.unwrap()), 1);
        assert_eq!(wal_end(stream.buffered().unwrap().unwrap()), 2);
        // The notice is passed over; half a frame is not a message and is not waited for.
        assert!(stream.buffered().unwrap().is_none());
        server.write_all(&third[10..]).await.unwrap();
        assert_eq!(wal_end(stream.recv().await.unwrap()), 3);
        assert!(stream.buffered().unwrap().is_none());
    }

    #[test]
    fn debug_hides_password() {
        let p = ConnectParams {
            host: "h".into(),
            port: 1,
            user: "u".into(),
            database: "d".into(),
            password: Some(crate::config::Secret::new("hunter2")),
            connect_timeout: Duration::from_secs(1),
            tls: crate::config::Tls::default(),
        };
        assert!(!format!("{p:?}").contains("hunter2"));
    }
}
