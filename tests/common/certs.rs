//! Test certificates made with rcgen: a CA, server certificates for chosen names, and client
//! certificates, written as PEM files PostgreSQL and MariaDB can read (keys owned by the
//! `postgres` OS user, mode 0600, as PostgreSQL insists).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};

/// A certificate authority whose certificate is in `ca.pem` under `dir`.
pub struct TestCa {
    pub dir: PathBuf,
    issuer: CertifiedIssuer<'static, KeyPair>,
    name: String,
}

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCa {
    /// A new CA named `name`; its files go to `dir` (created, chowned to `postgres`).
    pub fn new(dir: &Path, name: &str) -> TestCa {
        std::fs::create_dir_all(dir).expect("creating the certificate directory");
        let (uid, gid) = super::os_user("postgres");
        std::os::unix::fs::chown(dir, Some(uid), Some(gid)).expect("chown certificate dir");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("CA key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("self-signing the CA");
        let ca = TestCa {
            dir: dir.to_owned(),
            issuer,
            name: name.to_owned(),
        };
        ca.write(&ca.ca_file(), &ca.issuer.pem(), false);
        ca
    }

    /// The CA certificate (PEM).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.pem", self.name))
    }

    /// A server certificate for `names` (DNS names or IP addresses), files `<stem>.crt/.key`.
    pub fn server(&self, stem: &str, names: &[&str]) -> CertFiles {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        for name in names {
            params.subject_alt_names.push(match name.parse() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*name).try_into().expect("DNS name")),
            });
        }
        params.distinguished_name.push(DnType::CommonName, names[0]);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(stem, params)
    }

    /// A client certificate whose CN is `user` (PostgreSQL's `cert` method maps CN to role).
    pub fn client(&self, stem: &str, user: &str) -> CertFiles {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, user);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(stem, params)
    }

    fn issue(&self, stem: &str, params: CertificateParams) -> CertFiles {
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("signing");
        let files = CertFiles {
            cert: self.dir.join(format!("{stem}.crt")),
            key: self.dir.join(format!("{stem}.key")),
        };
        self.write(&files.cert, &cert.pem(), false);
        self.write(&files.key, &key.serialize_pem(), true);
        files
    }

    fn write(&self, path: &Path, pem: &str, secret: bool) {
        std::fs::write(path, pem).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        let (uid, gid) = super::os_user("postgres");
        std::os::unix::fs::chown(path, Some(uid), Some(gid)).expect("chown certificate file");
        let mode = if secret { 0o600 } else { 0o644 };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .expect("chmod certificate file");
    }
}
