//! The server-certificate verifier for the modes rustls has no built-in verifier for.
//!
//! It always checks the handshake signatures with the provider's algorithms, so the server
//! proves it holds the key of the certificate it sent; the modes differ only in what they
//! accept as that certificate.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{DigitallySignedStruct, Error, RootCertStore, SignatureScheme};

/// `verify-ca` (with `roots`) or `prefer`/`require` (without).
#[derive(Debug)]
pub(super) struct Verifier {
    /// `verify-ca`: the chain must lead to one of these and be valid now, for server
    /// authentication; the host name is not compared (libpq's meaning). `None`: any
    /// certificate (libpq encrypts without authenticating the server in these modes).
    roots: Option<Arc<RootCertStore>>,
    provider: Arc<CryptoProvider>,
}

impl Verifier {
    /// `verify-ca`: the chain is checked against `roots`, the name is not.
    pub(super) fn chain_only(roots: Arc<RootCertStore>, provider: Arc<CryptoProvider>) -> Self {
        Verifier {
            roots: Some(roots),
            provider,
        }
    }

    /// `prefer` and `require`: any certificate.
    pub(super) fn unchecked(provider: Arc<CryptoProvider>) -> Self {
        Verifier {
            roots: None,
            provider,
        }
    }
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        if let Some(roots) = &self.roots {
            let cert = ParsedCertificate::try_from(end_entity)?;
            rustls::client::verify_server_cert_signed_by_trust_anchor(
                &cert,
                roots,
                intermediates,
                now,
                self.provider.signature_verification_algorithms.all,
            )?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
