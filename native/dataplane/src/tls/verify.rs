//! SPIFFE certificate verification for HBONE.
//!
//! Server side (inbound): the client certificate must chain to the local workload's trust bundle, carry exactly
//! one SPIFFE URI SAN, and that identity must be in the local workload's trust domain. The identity used for
//! authorization and metrics is that same SAN (re-read from the verified certificate after the handshake).
//!
//! Client side (outbound): the server certificate must chain to our trust bundle and its single SPIFFE identity
//! must be one of the expected identities (the destination workload ∪ the service's subjectAltNames). The DNS
//! server name is ignored (we send no SNI). A mismatch fails the handshake; the caller never falls back to TCP.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, Error, RootCertStore, SignatureScheme};

use super::crl::CrlSet;
use crate::identity::{spiffe_identity, CertStore, Identity};

fn identity_error(msg: String) -> Error {
    Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(Arc::new(IdentityRejected(msg)))))
}

#[derive(Debug)]
struct IdentityRejected(String);

impl std::fmt::Display for IdentityRejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for IdentityRejected {}

/// Verifies inbound clients for one local workload. The trust bundle is read from the store at each handshake,
/// so a rotated bundle applies to new connections.
#[derive(Debug)]
pub struct SpiffeClientVerifier {
    store: Arc<CertStore>,
    local: Identity,
}

impl SpiffeClientVerifier {
    pub fn new(store: Arc<CertStore>, local: Identity) -> SpiffeClientVerifier {
        SpiffeClientVerifier { store, local }
    }

    fn webpki(&self) -> Result<Arc<dyn ClientCertVerifier>, Error> {
        let cert =
            self.store.get(&self.local).ok_or_else(|| Error::General(format!("no certificate for {}", self.local)))?;
        let builder = WebPkiClientVerifier::builder_with_provider(cert.roots.clone(), self.store.provider().clone());
        let crls = self.store.crls().current();
        let builder = if crls.is_empty() {
            builder
        } else {
            builder.with_crls(crls.der.iter().cloned()).allow_unknown_revocation_status()
        };
        builder.build().map_err(|e| Error::General(format!("client verifier: {e}")))
    }
}

/// Checks the SPIFFE SAN rule of an already chain-verified client certificate against the local trust domain.
pub fn check_client_identity(end_entity: &[u8], trust_domain: &str) -> Result<Identity, String> {
    let id = spiffe_identity(end_entity)?;
    if id.trust_domain != trust_domain {
        return Err(format!("peer identity {id} is not in the trust domain {trust_domain:?}"));
    }
    Ok(id)
}

impl ClientCertVerifier for SpiffeClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // Hints are optional (RFC 8446 §4.2.4); sending none avoids leaking the bundle and keeps this lock-free.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        self.webpki()?.verify_client_cert(end_entity, intermediates, now)?;
        check_client_identity(end_entity, &self.local.trust_domain).map_err(identity_error)?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls12_signature(message, cert, dss, &self.store.provider().signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls13_signature(message, cert, dss, &self.store.provider().signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.store.provider().signature_verification_algorithms.supported_schemes()
    }
}

/// The identities an outbound connection accepts from the server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExpectedIdentities(pub Vec<Identity>);

impl ExpectedIdentities {
    /// Sorted and deduplicated, so equal sets make equal pool keys.
    pub fn new(mut ids: Vec<Identity>) -> ExpectedIdentities {
        ids.sort();
        ids.dedup();
        ExpectedIdentities(ids)
    }

    /// The SAN rule on its own, for table tests: exactly one SPIFFE SAN, and it must be expected.
    pub fn check(&self, end_entity: &[u8]) -> Result<Identity, String> {
        let id = spiffe_identity(end_entity)?;
        if self.0.contains(&id) {
            Ok(id)
        } else {
            let want: Vec<String> = self.0.iter().map(|i| i.to_string()).collect();
            Err(format!("server identity {id} is not one of the expected [{}]", want.join(", ")))
        }
    }
}

#[derive(Debug)]
pub struct SpiffeServerVerifier {
    roots: Arc<RootCertStore>,
    expected: ExpectedIdentities,
    provider: Arc<CryptoProvider>,
    crls: Arc<CrlSet>,
}

impl SpiffeServerVerifier {
    pub fn new(
        roots: Arc<RootCertStore>,
        expected: ExpectedIdentities,
        provider: Arc<CryptoProvider>,
        crls: Arc<CrlSet>,
    ) -> Self {
        SpiffeServerVerifier { roots, expected, provider, crls }
    }

    /// The chain check with revocation: what rustls' chain check does, plus the CRLs (webpki, as rustls does).
    fn verify_chain_with_crls(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<(), Error> {
        let ee = webpki::EndEntityCert::try_from(end_entity).map_err(pki_error)?;
        self.crls
            .with_options(|revocation| {
                ee.verify_for_usage(
                    self.provider.signature_verification_algorithms.all,
                    &self.roots.roots,
                    intermediates,
                    now,
                    webpki::KeyUsage::server_auth(),
                    revocation,
                    None,
                )
                .map(|_| ())
            })
            .map_err(pki_error)
    }
}

/// webpki's verdict as rustls' error (the common cases by name; the rest carried as they are).
fn pki_error(e: webpki::Error) -> Error {
    use webpki::Error as E;
    let cert = match e {
        E::CertRevoked => CertificateError::Revoked,
        E::UnknownIssuer => CertificateError::UnknownIssuer,
        E::CertExpired { .. } => CertificateError::Expired,
        E::CertNotValidYet { .. } => CertificateError::NotValidYet,
        E::BadDer | E::BadDerTime => CertificateError::BadEncoding,
        E::InvalidSignatureForPublicKey => CertificateError::BadSignature,
        other => CertificateError::Other(rustls::OtherError(Arc::new(other))),
    };
    Error::InvalidCertificate(cert)
}

impl ServerCertVerifier for SpiffeServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        if self.crls.is_empty() {
            let parsed = ParsedCertificate::try_from(end_entity)?;
            rustls::client::verify_server_cert_signed_by_trust_anchor(
                &parsed,
                &self.roots,
                intermediates,
                now,
                self.provider.signature_verification_algorithms.all,
            )?;
        } else {
            self.verify_chain_with_crls(end_entity, intermediates, now)?;
        }
        self.expected.check(end_entity).map_err(identity_error)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, KeyPair, SanType};

    fn cert_with_sans(sans: &[&str]) -> Vec<u8> {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::default();
        p.subject_alt_names = sans.iter().map(|s| SanType::URI((*s).try_into().unwrap())).collect();
        p.self_signed(&key).unwrap().der().to_vec()
    }

    fn id(ns: &str, sa: &str) -> Identity {
        Identity::new("cluster.local", ns, sa)
    }

    #[test]
    fn server_san_must_be_one_of_the_expected_identities() {
        let expected = ExpectedIdentities::new(vec![id("default", "echo"), id("default", "echo-canary")]);
        let ok = cert_with_sans(&["spiffe://cluster.local/ns/default/sa/echo"]);
        assert_eq!(expected.check(&ok).unwrap(), id("default", "echo"));
        let wrong = cert_with_sans(&["spiffe://cluster.local/ns/default/sa/evil"]);
        assert!(expected.check(&wrong).unwrap_err().contains("not one of the expected"));
        let other_td = cert_with_sans(&["spiffe://evil.local/ns/default/sa/echo"]);
        assert!(expected.check(&other_td).is_err());
        let none = cert_with_sans(&["https://example.com/"]);
        assert!(expected.check(&none).unwrap_err().contains("no SPIFFE"));
    }

    #[test]
    fn certificates_with_two_spiffe_sans_are_refused_both_ways() {
        // A trusted CA issuing two SANs must not let verification and authorization look at different identities.
        let two = cert_with_sans(&[
            "spiffe://cluster.local/ns/default/sa/echo",
            "spiffe://cluster.local/ns/default/sa/admin",
        ]);
        let expected = ExpectedIdentities::new(vec![id("default", "echo")]);
        assert!(expected.check(&two).unwrap_err().contains("2 SPIFFE URI SANs"));
        assert!(check_client_identity(&two, "cluster.local").is_err());
        // A non-SPIFFE URI beside one SPIFFE SAN is fine: only SPIFFE SANs count.
        let mixed = cert_with_sans(&["https://example.com/", "spiffe://cluster.local/ns/default/sa/echo"]);
        assert_eq!(expected.check(&mixed).unwrap(), id("default", "echo"));
    }

    #[test]
    fn client_identity_must_be_in_the_local_trust_domain() {
        let c = cert_with_sans(&["spiffe://cluster.local/ns/a/sa/b"]);
        assert_eq!(check_client_identity(&c, "cluster.local").unwrap(), id("a", "b"));
        let foreign = cert_with_sans(&["spiffe://other.domain/ns/a/sa/b"]);
        assert!(check_client_identity(&foreign, "cluster.local").unwrap_err().contains("trust domain"));
    }
}
