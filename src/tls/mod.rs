//! TLS for the connections Zipline opens, on rustls (never OpenSSL).
//!
//! One [`config::Tls`](crate::config::Tls) (libpq's or MySQL's modes, trusted roots, a client
//! certificate) becomes one rustls `ClientConfig` here; [`postgres`] puts it on the replication
//! wire and on tokio-postgres, [`mysql`] hands the same settings to mysql_async. What each mode
//! checks is decided by the certificate verifier ([`verify`]):
//! - `prefer`, `require`: encryption only, any certificate (libpq's meaning);
//! - `verify-ca`: the chain must lead to a trusted root; the host name is not compared;
//! - `verify-full`: the chain and the host name (rustls' standard webpki verifier).
//!
//! Certificate files are read when a connection is opened, so replaced files take effect on
//! the next reconnect.

pub(crate) mod mysql;
pub(crate) mod postgres;
mod verify;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ClientConfig;
use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::{RootCerts, SslMode, Tls};

/// Why TLS could not be set up or completed. The caller adds the connector and host.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A certificate or key file is missing, unreadable or holds no PEM object of that kind.
    #[error("cannot load {what} from {}: {reason}", path.display())]
    File {
        /// `CA certificates`, `client certificate`, `client key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The platform's trust store could not be read or is empty.
    #[error("cannot load the platform's trusted CA certificates (sslrootcert: system): {0}")]
    SystemRoots(String),
    /// rustls refused the settings (e.g. a key that does not match the certificate).
    #[error("invalid TLS settings: {0}")]
    Settings(#[source] rustls::Error),
    /// The server answered the TLS request with "no".
    #[error("the server does not support TLS, and {mode} requires it")]
    NotOffered {
        /// The mode, as configured (`sslmode require`, `ssl_mode REQUIRED`).
        mode: String,
    },
    /// The handshake failed: a certificate was refused, or the connection broke.
    #[error("TLS handshake failed: {}", explain(source))]
    Handshake {
        /// The cause (a rustls error inside an I/O error, usually).
        #[source]
        source: std::io::Error,
    },
}

impl TlsError {
    /// True when the connection broke during the handshake with no certificate or protocol
    /// problem (a reset, an early end, a cut): a reason to retry, not to stop.
    pub(crate) fn is_broken_connection(&self) -> bool {
        matches!(self, TlsError::Handshake { source } if tls_problem(source).is_none())
    }
}

/// The one crypto provider Zipline uses. Also installed as the process default, because
/// mysql_async builds its rustls configuration with the default provider.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    // Fails only when a default is already installed, which is then this same provider.
    let _ = CryptoProvider::install_default(rustls::crypto::aws_lc_rs::default_provider());
    provider
}

/// A rustls client configuration for `tls` (whose mode is not `Disable`).
pub(crate) fn client_config(tls: &Tls) -> Result<Arc<ClientConfig>, TlsError> {
    let provider = provider();
    let verifier: Arc<dyn ServerCertVerifier> = match (tls.mode, &tls.roots) {
        (SslMode::VerifyFull, Some(roots)) => WebPkiServerVerifier::builder_with_provider(
            Arc::new(root_store(roots)?),
            provider.clone(),
        )
        .build()
        .map_err(|e| TlsError::Settings(rustls::Error::General(e.to_string())))?,
        (SslMode::VerifyCa, Some(roots)) => Arc::new(verify::Verifier::chain_only(
            Arc::new(root_store(roots)?),
            provider.clone(),
        )),
        // Config loading refuses verifying modes without roots; unverified modes ignore roots.
        _ => Arc::new(verify::Verifier::unchecked(provider.clone())),
    };
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Settings)?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match &tls.client {
        Some(client) => {
            let certs = load_certs(&client.cert, "client certificate")?;
            let key = PrivateKeyDer::from_pem_file(&client.key).map_err(|e| TlsError::File {
                what: "client key",
                path: client.key.clone(),
                reason: e.to_string(),
            })?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(TlsError::Settings)?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

fn root_store(roots: &RootCerts) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    match roots {
        RootCerts::File(path) => {
            for cert in load_certs(path, "CA certificates")? {
                store.add(cert).map_err(|e| TlsError::File {
                    what: "CA certificates",
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            }
        }
        RootCerts::System => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                let why = found
                    .errors
                    .first()
                    .map_or_else(|| "no certificates found".to_owned(), ToString::to_string);
                return Err(TlsError::SystemRoots(why));
            }
        }
    }
    Ok(store)
}

fn load_certs(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let fail = |reason: String| TlsError::File {
        what,
        path: path.to_owned(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| fail(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(e.to_string()))?;
    if certs.is_empty() {
        return Err(fail("no PEM certificate in the file".into()));
    }
    Ok(certs)
}

/// A readable reason for a failed handshake: the certificate problem when rustls names one.
pub(crate) fn explain(error: &(dyn std::error::Error + 'static)) -> String {
    tls_problem(error).unwrap_or_else(|| error.to_string())
}

/// The TLS problem somewhere in `error`'s chain, explained, if there is one.
pub(crate) fn tls_problem(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cur = Some(error);
    while let Some(e) = cur {
        // io::Error::source skips the error it wraps, so look inside it too.
        let inner = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|i| i.downcast_ref::<rustls::Error>());
        if let Some(rustls_error) = e.downcast_ref::<rustls::Error>().or(inner) {
            return Some(explain_rustls(rustls_error));
        }
        if let Some(tls) = e.downcast_ref::<TlsError>() {
            return Some(tls.to_string());
        }
        cur = e.source();
    }
    None
}

fn explain_rustls(e: &rustls::Error) -> String {
    use rustls::CertificateError as C;
    match e {
        rustls::Error::InvalidCertificate(cert) => match cert {
            C::UnknownIssuer => "the server's certificate is not signed by a trusted CA \
                                 (unknown CA; check the CA file)"
                .into(),
            C::NotValidForName | C::NotValidForNameContext { .. } => {
                format!("host name mismatch: {cert}")
            }
            C::Expired | C::ExpiredContext { .. } => {
                format!("the server's certificate has expired: {cert}")
            }
            C::NotValidYet | C::NotValidYetContext { .. } => {
                format!("the server's certificate is not valid yet: {cert}")
            }
            other => format!("the server's certificate was refused: {other}"),
        },
        rustls::Error::AlertReceived(alert) => format!(
            "the server refused the handshake ({alert:?}); a client certificate may be \
             missing, expired or not trusted by the server"
        ),
        other => other.to_string(),
    }
}

/// The mode as the operator wrote it, for messages.
pub(crate) fn mode_name(mode: SslMode, mysql: bool) -> String {
    if mysql {
        let name = match mode {
            SslMode::Disable => "DISABLED",
            SslMode::Prefer => "PREFERRED",
            SslMode::Require => "REQUIRED",
            SslMode::VerifyCa => "VERIFY_CA",
            SslMode::VerifyFull => "VERIFY_IDENTITY",
        };
        format!("ssl_mode {name}")
    } else {
        format!("sslmode {}", mode.libpq_name())
    }
}
