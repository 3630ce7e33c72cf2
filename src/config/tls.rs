//! TLS fields of the connectors: libpq's vocabulary for PostgreSQL and SQL Server (`sslmode`,
//! `sslrootcert`, `sslcert`, `sslkey`), MySQL's for MySQL (`ssl_mode`, `ssl_ca`, `ssl_cert`,
//! `ssl_key`). Both read into one [`Tls`]; the modes mean the same on both sides.
//! Operator reference: `docs/connectors/*.md`, "TLS".

use std::path::PathBuf;

use super::ConfigError;

/// The four raw values as written (`mode`, CA, client certificate, client key), and a way to
/// report an error located at one of the keys.
pub(crate) struct Raw<'a> {
    pub mode: Option<&'a str>,
    pub roots: Option<&'a str>,
    pub cert: Option<&'a str>,
    pub key: Option<&'a str>,
    pub err: &'a dyn Fn(&str, String) -> ConfigError,
}

type Result<T> = std::result::Result<T, ConfigError>;

/// How much TLS a connection insists on, and what it checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    /// `disable` / `DISABLED`: plaintext only.
    Disable,
    /// `prefer` / `PREFERRED` (the default): TLS when the server offers it, without checking
    /// its certificate; plaintext when it does not.
    #[default]
    Prefer,
    /// `require` / `REQUIRED`: TLS or fail; the certificate is not checked.
    Require,
    /// `verify-ca` / `VERIFY_CA`: TLS, and the certificate chain must lead to a trusted CA
    /// (any host name).
    VerifyCa,
    /// `verify-full` / `VERIFY_IDENTITY`: as `VerifyCa`, and the certificate must name the host.
    VerifyFull,
}

impl SslMode {
    /// Whether the server's certificate chain is checked.
    pub fn verifies(self) -> bool {
        matches!(self, SslMode::VerifyCa | SslMode::VerifyFull)
    }

    /// libpq's spelling, for messages.
    pub fn libpq_name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// Where trusted CA certificates come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCerts {
    /// A PEM file of one or more CA certificates.
    File(PathBuf),
    /// The platform's trust store (`sslrootcert: system`).
    System,
}

/// A client certificate and its private key (PEM files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    /// Certificate chain, leaf first.
    pub cert: PathBuf,
    /// Private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// A connector's TLS settings. The default is `prefer` with nothing else set.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tls {
    /// The mode, after the implications (`system` roots mean `verify-full`, and so on).
    pub mode: SslMode,
    /// Trusted CAs; always set when `mode` verifies.
    pub roots: Option<RootCerts>,
    /// Client certificate authentication.
    pub client: Option<ClientCert>,
}

/// Reads `sslmode`, `sslrootcert`, `sslcert`, `sslkey` with libpq's meanings: `sslrootcert:
/// system` implies `verify-full` and refuses weaker modes (PostgreSQL 16); `require` with a
/// CA file verifies the chain as `verify-ca` does (libpq does the same).
pub(crate) fn postgres(raw: &Raw<'_>) -> Result<Tls> {
    let mode = raw.mode.map(|m| pg_mode(m, raw.err)).transpose()?;
    let roots = raw.roots.map(|s| {
        if s == "system" {
            RootCerts::System
        } else {
            RootCerts::File(PathBuf::from(s))
        }
    });
    let mode = match (mode, &roots) {
        (None, Some(RootCerts::System)) => SslMode::VerifyFull,
        (Some(m), Some(RootCerts::System)) if m != SslMode::VerifyFull => {
            return Err((raw.err)(
                "sslmode",
                format!(
                    "sslmode `{}` cannot be used with `sslrootcert: system`: the platform's \
                     roots only make sense when the host name is checked too; use \
                     `verify-full` or leave sslmode out",
                    m.libpq_name()
                ),
            ));
        }
        (Some(SslMode::Require), Some(RootCerts::File(_))) => SslMode::VerifyCa,
        (m, _) => m.unwrap_or_default(),
    };
    let client = client_cert(raw, "sslcert", "sslkey")?;
    finish(raw, mode, roots, client, "sslmode", "sslrootcert")
}

/// Reads `ssl_mode`, `ssl_ca`, `ssl_cert`, `ssl_key` with MySQL's meanings: `ssl_ca` without
/// `ssl_mode` means `VERIFY_CA` (as the `mysql` client does).
pub(crate) fn mysql(raw: &Raw<'_>) -> Result<Tls> {
    let mode = raw.mode.map(|m| mysql_mode(m, raw.err)).transpose()?;
    let roots = raw.roots.map(|s| RootCerts::File(PathBuf::from(s)));
    let mode = match (mode, &roots) {
        (Some(m), _) => m,
        (None, Some(_)) => SslMode::VerifyCa,
        (None, None) => SslMode::Prefer,
    };
    let client = client_cert(raw, "ssl_cert", "ssl_key")?;
    finish(raw, mode, roots, client, "ssl_mode", "ssl_ca")
}

fn finish(
    raw: &Raw<'_>,
    mode: SslMode,
    roots: Option<RootCerts>,
    client: Option<ClientCert>,
    mode_key: &str,
    roots_key: &str,
) -> Result<Tls> {
    if mode.verifies() && roots.is_none() {
        return Err((raw.err)(
            mode_key,
            format!(
                "this mode checks the server's certificate and needs `{roots_key}` (a PEM file \
                 of trusted CA certificates{})",
                if roots_key == "sslrootcert" {
                    ", or `system` for the platform's roots"
                } else {
                    ""
                }
            ),
        ));
    }
    if mode == SslMode::Disable && (roots.is_some() || client.is_some()) {
        return Err((raw.err)(
            mode_key,
            "TLS is disabled, so certificate files would be ignored; remove them or choose \
             another mode"
                .into(),
        ));
    }
    Ok(Tls {
        mode,
        roots,
        client,
    })
}

fn client_cert(raw: &Raw<'_>, cert_key: &str, key_key: &str) -> Result<Option<ClientCert>> {
    match (raw.cert, raw.key) {
        (Some(cert), Some(key)) => Ok(Some(ClientCert {
            cert: cert.into(),
            key: key.into(),
        })),
        (None, None) => Ok(None),
        (Some(_), None) => Err((raw.err)(
            cert_key,
            format!("a client certificate needs its private key in `{key_key}` too"),
        )),
        (None, Some(_)) => Err((raw.err)(
            key_key,
            format!("a private key needs its client certificate in `{cert_key}` too"),
        )),
    }
}

fn pg_mode(text: &str, err: &dyn Fn(&str, String) -> ConfigError) -> Result<SslMode> {
    match text {
        "disable" => Ok(SslMode::Disable),
        "prefer" => Ok(SslMode::Prefer),
        "require" => Ok(SslMode::Require),
        "verify-ca" => Ok(SslMode::VerifyCa),
        "verify-full" => Ok(SslMode::VerifyFull),
        "allow" => Err(err(
            "sslmode",
            "`allow` (plaintext first, TLS only if the server insists) is not supported; use \
             `prefer`"
                .into(),
        )),
        other => Err(err(
            "sslmode",
            format!(
                "unknown sslmode `{other}`; expected disable, prefer, require, verify-ca or \
                 verify-full"
            ),
        )),
    }
}

fn mysql_mode(text: &str, err: &dyn Fn(&str, String) -> ConfigError) -> Result<SslMode> {
    match text.to_ascii_uppercase().as_str() {
        "DISABLED" => Ok(SslMode::Disable),
        "PREFERRED" => Ok(SslMode::Prefer),
        "REQUIRED" => Ok(SslMode::Require),
        "VERIFY_CA" => Ok(SslMode::VerifyCa),
        "VERIFY_IDENTITY" => Ok(SslMode::VerifyFull),
        _ => Err(err(
            "ssl_mode",
            format!(
                "unknown ssl_mode `{text}`; expected DISABLED, PREFERRED, REQUIRED, VERIFY_CA or \
                 VERIFY_IDENTITY"
            ),
        )),
    }
}
