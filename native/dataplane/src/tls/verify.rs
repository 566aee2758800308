//! SPIFFE certificate verification for HBONE.
//!
//! Server side (inbound): the client certificate must chain to the local workload's trust bundle, carry exactly
//! one SPIFFE URI SAN, and that identity must be in the local workload's trust domain (or, with TRUST_DOMAINS, one
//! of its aliases). The identity used for authorization and metrics is that same SAN (re-read from the verified
//! certificate after the handshake).
//!
//! Client side (outbound): the server certificate must chain to our trust bundle and its single SPIFFE identity
//! must be one of the expected identities (the destination workload ∪ the service's subjectAltNames), or, with
//! TRUST_DOMAINS, one of them in an alias of its trust domain. The DNS server name is ignored (we send no SNI). A
//! mismatch fails the handshake; the caller never falls back to TCP.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, Error, RootCertStore, SignatureScheme};

use super::crl::CrlSet;
use crate::identity::{spiffe_identity, CertStore, Identity, TrustDomains};

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

/// Checks the SPIFFE SAN rule of an already chain-verified client certificate against the local trust domain and
/// its aliases.
pub fn check_client_identity(
    end_entity: &[u8],
    trust_domain: &str,
    aliases: &TrustDomains,
) -> Result<Identity, String> {
    let id = spiffe_identity(end_entity)?;
    if !aliases.accepts(trust_domain, &id.trust_domain) {
        return Err(if aliases.is_empty() {
            format!("peer identity {id} is not in the trust domain {trust_domain:?}")
        } else {
            format!(
                "peer identity {id} is not in the trust domain {trust_domain:?} nor its aliases {:?}",
                aliases.aliases()
            )
        });
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
        check_client_identity(end_entity, &self.local.trust_domain, self.store.trust_domains())
            .map_err(identity_error)?;
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
        self.check_aliased(end_entity, &TrustDomains::default(), "")
    }

    /// The SAN rule with trust-domain aliases: an expected identity, or (aliases set) one with an expected
    /// identity's namespace and service account where both trust domains are `own` or its aliases.
    pub fn check_aliased(&self, end_entity: &[u8], aliases: &TrustDomains, own: &str) -> Result<Identity, String> {
        let id = spiffe_identity(end_entity)?;
        let aliased = || {
            aliases.accepts(own, &id.trust_domain)
                && self.0.iter().any(|e| {
                    e.namespace == id.namespace
                        && e.service_account == id.service_account
                        && aliases.accepts(own, &e.trust_domain)
                })
        };
        if self.0.contains(&id) || (!aliases.is_empty() && aliased()) {
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
    /// TRUST_DOMAINS, and the trust domain they alias: the client's own.
    aliases: TrustDomains,
    own_trust_domain: String,
}

impl SpiffeServerVerifier {
    pub fn new(
        roots: Arc<RootCertStore>,
        expected: ExpectedIdentities,
        provider: Arc<CryptoProvider>,
        crls: Arc<CrlSet>,
        aliases: TrustDomains,
        own_trust_domain: String,
    ) -> Self {
        SpiffeServerVerifier { roots, expected, provider, crls, aliases, own_trust_domain }
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
        self.expected.check_aliased(end_entity, &self.aliases, &self.own_trust_domain).map_err(identity_error)?;
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
        assert!(check_client_identity(&two, "cluster.local", &TrustDomains::default()).is_err());
        // A non-SPIFFE URI beside one SPIFFE SAN is fine: only SPIFFE SANs count.
        let mixed = cert_with_sans(&["https://example.com/", "spiffe://cluster.local/ns/default/sa/echo"]);
        assert_eq!(expected.check(&mixed).unwrap(), id("default", "echo"));
    }

    #[test]
    fn client_identity_must_be_in_the_local_trust_domain() {
        let none = TrustDomains::default();
        let c = cert_with_sans(&["spiffe://cluster.local/ns/a/sa/b"]);
        assert_eq!(check_client_identity(&c, "cluster.local", &none).unwrap(), id("a", "b"));
        let foreign = cert_with_sans(&["spiffe://other.domain/ns/a/sa/b"]);
        assert!(check_client_identity(&foreign, "cluster.local", &none).unwrap_err().contains("trust domain"));
    }

    #[test]
    fn trust_domain_aliases_admit_their_peers_both_ways_and_nothing_else() {
        let aliases = TrustDomains::new(vec!["old.domain".into(), "partner.domain".into()]);
        let from = |td: &str| cert_with_sans(&[&format!("spiffe://{td}/ns/a/sa/b")]);
        // Inbound: the local trust domain and each alias; not another domain.
        for td in ["cluster.local", "old.domain", "partner.domain"] {
            assert_eq!(check_client_identity(&from(td), "cluster.local", &aliases).unwrap().trust_domain, td);
        }
        let err = check_client_identity(&from("evil.domain"), "cluster.local", &aliases).unwrap_err();
        assert!(err.contains("nor its aliases"), "{err}");
        // Outbound: the expected namespace and service account in an aliased domain; never another identity.
        let expected = ExpectedIdentities::new(vec![id("a", "b")]);
        assert!(expected.check_aliased(&from("old.domain"), &aliases, "cluster.local").is_ok());
        assert!(expected.check_aliased(&from("evil.domain"), &aliases, "cluster.local").is_err());
        let other = cert_with_sans(&["spiffe://old.domain/ns/a/sa/admin"]);
        assert!(expected.check_aliased(&other, &aliases, "cluster.local").is_err());
        // Without aliases, exactly as ever.
        assert!(expected.check_aliased(&from("old.domain"), &TrustDomains::default(), "cluster.local").is_err());
        // An expected identity outside the alias set is not widened (only domains of the set stand for each other).
        let foreign = ExpectedIdentities::new(vec![Identity::new("far.domain", "a", "b")]);
        assert!(foreign.check_aliased(&from("old.domain"), &aliases, "cluster.local").is_err());
    }
}
