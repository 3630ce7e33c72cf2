//! TLS settings for mysql_async (its rustls backend), with MySQL's `ssl_mode` meanings.
//!
//! mysql_async builds its own rustls configuration from [`SslOpts`]; Zipline sets:
//! - `PREFERRED`, `REQUIRED`: encryption, any certificate (`accept_invalid_certs`);
//!   `PREFERRED` falls back to plaintext when the server has no TLS (the caller retries);
//! - `VERIFY_CA`: only the configured CA (built-in roots off), any host name (see
//!   [`certificate_name`]);
//! - `VERIFY_IDENTITY`: only the configured CA, and the host name.

use mysql_async::{ClientIdentity, SslOpts};

use super::TlsError;
use crate::config::{RootCerts, SslMode, Tls};

/// The SslOpts for `tls`; `None` for `DISABLED`.
pub(crate) fn ssl_opts(tls: &Tls) -> Option<SslOpts> {
    if tls.mode == SslMode::Disable {
        return None;
    }
    // mysql_async builds its rustls configuration with the process-wide default provider.
    let _ = super::provider();
    let mut opts = SslOpts::default();
    if let Some(client) = &tls.client {
        opts = opts.with_client_identity(Some(ClientIdentity::new(
            client.cert.clone().into(),
            client.key.clone().into(),
        )));
    }
    match tls.mode {
        SslMode::Disable | SslMode::Prefer | SslMode::Require => {
            opts = opts.with_danger_accept_invalid_certs(true);
        }
        SslMode::VerifyCa | SslMode::VerifyFull => {
            if let Some(RootCerts::File(path)) = &tls.roots {
                opts = opts.with_root_certs(vec![path.clone().into()]);
            }
            // VERIFY_CA gets its host name from the certificate (`certificate_name`).
            opts = opts.with_disable_built_in_roots(matches!(tls.roots, Some(RootCerts::File(_))));
        }
    }
    Some(opts)
}

/// Whether `err` says the server has no TLS at all (`PREFERRED` then goes plaintext).
pub(crate) fn server_without_tls(err: &mysql_async::Error) -> bool {
    matches!(
        err,
        mysql_async::Error::Driver(mysql_async::DriverError::NoClientSslFlagFromServer)
    )
}

/// `VERIFY_CA` on mysql_async: its "skip the host name" switch recognises rustls' old error
/// text only, so with this rustls it still compares the name. Zipline instead probes the
/// server once: it opens the MySQL handshake, upgrades to TLS with its own chain-only
/// verifier (so the chain is checked against `ssl_ca` here), and reads a name the
/// certificate does carry. mysql_async then connects with that name as the TLS host name
/// (`tls_hostname_override`) and checks the chain again itself. The result is `VERIFY_CA`:
/// any certificate from a trusted CA, whatever host it names.
pub(crate) async fn certificate_name(host: &str, port: u16, tls: &Tls) -> Result<String, TlsError> {
    use rustls::pki_types::ServerName;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use x509_cert::der::Decode;

    let broken = |source: std::io::Error| TlsError::Handshake { source };
    let mut stream = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(broken)?;
    // The server's greeting: a 4-byte header (length, sequence) and the HandshakeV10 body.
    let mut header = [0u8; 4];
    stream.read_exact(&mut header).await.map_err(broken)?;
    let len = usize::from(header[0]) | usize::from(header[1]) << 8 | usize::from(header[2]) << 16;
    let mut greeting = vec![0u8; len];
    stream.read_exact(&mut greeting).await.map_err(broken)?;
    let invalid = |what: &str| {
        broken(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("unexpected server greeting: {what}"),
        ))
    };
    if greeting.first() != Some(&10) {
        return Err(invalid("not protocol version 10 (or an error packet)"));
    }
    // version (NUL-terminated), connection id (4), auth data (8), filler (1), capabilities.
    let version_end = greeting[1..]
        .iter()
        .position(|b| *b == 0)
        .ok_or_else(|| invalid("no server version"))?;
    let caps_at = 1 + version_end + 1 + 4 + 8 + 1;
    let caps = greeting
        .get(caps_at..caps_at + 2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .ok_or_else(|| invalid("too short"))?;
    const CLIENT_SSL: u32 = 0x0800;
    if u32::from(caps) & CLIENT_SSL == 0 {
        return Err(TlsError::NotOffered {
            mode: super::mode_name(tls.mode, true),
        });
    }
    // SSLRequest: capabilities, max packet size, character set, 23 reserved bytes.
    const CLIENT_LONG_PASSWORD: u32 = 0x0001;
    const CLIENT_PROTOCOL_41: u32 = 0x0200;
    const CLIENT_SECURE_CONNECTION: u32 = 0x8000;
    let mut request = vec![32, 0, 0, 1];
    request.extend_from_slice(
        &(CLIENT_LONG_PASSWORD | CLIENT_PROTOCOL_41 | CLIENT_SECURE_CONNECTION | CLIENT_SSL)
            .to_le_bytes(),
    );
    request.extend_from_slice(&(16u32 << 20).to_le_bytes());
    request.push(45); // utf8mb4_general_ci
    request.extend_from_slice(&[0u8; 23]);
    stream.write_all(&request).await.map_err(broken)?;
    let chain_only = Tls {
        mode: SslMode::VerifyCa,
        roots: tls.roots.clone(),
        client: None,
    };
    let connector = tokio_rustls::TlsConnector::from(super::client_config(&chain_only)?);
    let name = ServerName::try_from(host.to_owned()).map_err(|e| {
        TlsError::Settings(rustls::Error::General(format!(
            "`{host}` is not a valid TLS server name: {e}"
        )))
    })?;
    let secured = connector.connect(name, stream).await.map_err(broken)?;
    let leaf = secured
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or_else(|| invalid("no certificate"))?;
    let cert = x509_cert::Certificate::from_der(leaf)
        .map_err(|e| invalid(&format!("unreadable certificate: {e}")))?;
    let names = cert
        .tbs_certificate
        .get::<x509_cert::ext::pkix::SubjectAltName>()
        .ok()
        .flatten()
        .map(|(_, san)| san.0)
        .unwrap_or_default();
    names
        .iter()
        .find_map(|n| match n {
            x509_cert::ext::pkix::name::GeneralName::DnsName(dns) => {
                Some(dns.as_str().replacen('*', "zipline-verify-ca", 1))
            }
            x509_cert::ext::pkix::name::GeneralName::IpAddress(ip) => {
                let b = ip.as_bytes();
                let addr: Option<std::net::IpAddr> = match b.len() {
                    4 => <[u8; 4]>::try_from(b).ok().map(Into::into),
                    16 => <[u8; 16]>::try_from(b).ok().map(Into::into),
                    _ => None,
                };
                addr.map(|a| a.to_string())
            }
            _ => None,
        })
        .ok_or_else(|| {
            invalid("the server's certificate names no host (no subjectAltName DNS name or IP)")
        })
}
