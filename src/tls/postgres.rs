//! TLS on PostgreSQL connections: the SSLRequest negotiation of the replication connection
//! (which Zipline drives itself), and the same settings for tokio-postgres.
//!
//! PostgreSQL starts every TCP connection in plaintext; the client sends SSLRequest and the
//! server answers one byte, `S` (go ahead with the TLS handshake) or `N` (no TLS here).
//! <https://www.postgresql.org/docs/15/protocol-flow.html#id-1.10.6.7.12>. As in libpq, TLS
//! settings do not apply to Unix-domain sockets.

use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_postgres::config::SslMode as DriverMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::{TlsError, client_config, mode_name};
use crate::config::{SslMode, Tls};

/// The replication connection's socket after negotiation.
pub(crate) enum Negotiated {
    /// The server said no under `prefer`, or TLS is disabled.
    Plain(TcpStream),
    /// TLS is up.
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

/// Negotiates TLS on a fresh TCP connection to `host`, as `tls` says.
pub(crate) async fn negotiate(
    mut stream: TcpStream,
    host: &str,
    tls: &Tls,
) -> Result<Negotiated, TlsError> {
    if tls.mode == SslMode::Disable {
        return Ok(Negotiated::Plain(stream));
    }
    // Build (and read the files) before talking, so a bad file is named as such.
    let config = client_config(tls)?;
    let name = server_name(host)?;
    let mut request = bytes::BytesMut::new();
    postgres_protocol::message::frontend::ssl_request(&mut request);
    let handshake = |source| TlsError::Handshake { source };
    stream.write_all(&request).await.map_err(handshake)?;
    // Exactly one byte: anything the server sent after it must not be read as if it came
    // through TLS (CVE-2021-23222).
    let mut answer = [0u8; 1];
    stream.read_exact(&mut answer).await.map_err(handshake)?;
    match answer[0] {
        b'S' => {}
        b'N' if tls.mode == SslMode::Prefer => return Ok(Negotiated::Plain(stream)),
        b'N' => {
            return Err(TlsError::NotOffered {
                mode: mode_name(tls.mode, false),
            });
        }
        other => {
            return Err(handshake(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("unexpected answer {other:#04x} to SSLRequest"),
            )));
        }
    }
    let connector = tokio_rustls::TlsConnector::from(config);
    let stream = connector.connect(name, stream).await.map_err(handshake)?;
    Ok(Negotiated::Tls(Box::new(stream)))
}

/// What tokio-postgres needs for `tls` towards `host`: its own mode (it knows only disable,
/// prefer and require; the checks of verify-ca and verify-full live in the rustls verifier)
/// and the connector.
pub(crate) fn for_driver(
    host: &str,
    tls: &Tls,
) -> Result<(DriverMode, MakeRustlsConnect), TlsError> {
    let unix = host.starts_with('/');
    let mode = match tls.mode {
        _ if unix => DriverMode::Disable,
        SslMode::Disable => DriverMode::Disable,
        SslMode::Prefer => DriverMode::Prefer,
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => DriverMode::Require,
    };
    let config = if mode == DriverMode::Disable {
        client_config(&Tls::default())?
    } else {
        client_config(tls)?
    };
    Ok((mode, MakeRustlsConnect::new((*config).clone())))
}

/// The name the certificate is checked against (`verify-full`), also sent as SNI.
fn server_name(host: &str) -> Result<ServerName<'static>, TlsError> {
    ServerName::try_from(host.to_owned()).map_err(|e| {
        TlsError::Settings(rustls::Error::General(format!(
            "`{host}` is not a valid TLS server name: {e}"
        )))
    })
}
