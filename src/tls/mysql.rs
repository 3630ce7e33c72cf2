//! TLS settings for mysql_async (its rustls backend), with MySQL's `ssl_mode` meanings.
//!
//! mysql_async builds its own rustls configuration from [`SslOpts`]; Zipline sets:
//! - `PREFERRED`, `REQUIRED`: encryption, any certificate (`accept_invalid_certs`);
//!   `PREFERRED` falls back to plaintext when the server has no TLS (the caller retries);
//! - `VERIFY_CA`: only the configured CA (built-in roots off), host name not compared;
//! - `VERIFY_IDENTITY`: only the configured CA, and the host name.

use mysql_async::{ClientIdentity, SslOpts};

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
            opts = opts
                .with_disable_built_in_roots(matches!(tls.roots, Some(RootCerts::File(_))))
                .with_danger_skip_domain_validation(tls.mode == SslMode::VerifyCa);
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
