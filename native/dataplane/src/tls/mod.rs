//! rustls configuration for HBONE: TLS 1.3 (and 1.2 with TLS12_ENABLED), AES-GCM suites, ALPN h2, SPIFFE
//! verification both ways.

pub mod crl;
pub mod keylog;
pub mod revocation;
mod verify;

pub use verify::{ExpectedIdentities, SpiffeClientVerifier, SpiffeServerVerifier};

use std::sync::Arc;

use rustls::client::Resumption;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, ServerConfig};

use crate::identity::{CertStore, Identity, InstalledCert};

pub const ALPN_H2: &[u8] = b"h2";

/// rustls pulls ciphertext from the socket 4 KiB at a time, so a 16 KiB record costs four `recvfrom`s. A read buffer
/// under the TLS session turns that into one read per two records (the extra copy out of the buffer is far cheaper
/// than the syscalls it saves; 64 KiB measured no better than 32 KiB). One per HBONE connection, not per stream.
pub const SOCKET_READ_BUFFER: usize = 32 * 1024;

/// Ciphertext a session may hold before writing (rustls' default is 64 KiB): with h2 handing over up to 256 KiB at
/// a time, a larger limit lets one `writev` carry ~16 records instead of ~4.
pub const TLS_SEND_BUFFER: usize = 256 * 1024;

mod socket;
pub use socket::TlsSocket;

/// The socket under an HBONE TLS session (client and server side): reads buffered, writes straight through.
pub fn tls_socket(tcp: tokio::net::TcpStream) -> TlsSocket {
    TlsSocket::new(tcp, SOCKET_READ_BUFFER)
}

#[cfg(feature = "fips")]
pub const CRYPTO_PROVIDER: &str = "aws-lc-rs-fips";
#[cfg(all(feature = "aws-lc-rs", not(feature = "fips")))]
pub const CRYPTO_PROVIDER: &str = "aws-lc-rs";
#[cfg(all(feature = "ring", not(feature = "aws-lc-rs")))]
pub const CRYPTO_PROVIDER: &str = "ring";

/// The FIPS build's provider: aws-lc-rs's validated module, whatever the policy (rustls' FIPS defaults).
#[cfg(feature = "fips")]
fn base_provider() -> CryptoProvider {
    rustls::crypto::default_fips_provider()
}
#[cfg(all(feature = "aws-lc-rs", not(feature = "fips")))]
fn base_provider() -> CryptoProvider {
    rustls::crypto::aws_lc_rs::default_provider()
}
#[cfg(all(feature = "ring", not(feature = "aws-lc-rs")))]
fn base_provider() -> CryptoProvider {
    rustls::crypto::ring::default_provider()
}

/// The provider HBONE uses by default: Istio's suite list (TLS 1.3 AES-256-GCM and AES-128-GCM; no ChaCha20).
pub fn provider() -> Arc<CryptoProvider> {
    provider_for(crate::config::TlsPolicy::default()).expect("the default policy needs nothing a build may lack")
}

/// The provider under TLS12_ENABLED and COMPLIANCE_POLICY, as ztunnel's `tls::lib::provider`: TLS 1.2 adds the
/// ECDHE AES-GCM suites (ECDSA and RSA); `pqc` leaves X25519MLKEM768 the one key exchange, in and out. What a
/// provider holds decides the protocol versions too (`versions`), so the policy lives in one value.
pub fn provider_for(policy: crate::config::TlsPolicy) -> Result<Arc<CryptoProvider>, String> {
    use rustls::CipherSuite as S;
    let mut p = base_provider();
    p.cipher_suites.retain(|s| match s.suite() {
        S::TLS13_AES_256_GCM_SHA384 | S::TLS13_AES_128_GCM_SHA256 => true,
        S::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
        | S::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
        | S::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384
        | S::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => policy.tls12,
        _ => false,
    });
    if policy.pqc {
        p.kx_groups = pqc_groups()?;
    }
    if policy.fips {
        p.kx_groups = fips_groups()?;
        if !p.fips() {
            return Err("COMPLIANCE_POLICY=fips-140-2: the crypto provider does not report FIPS mode".into());
        }
    }
    Ok(Arc::new(p))
}

/// COMPLIANCE_POLICY=fips-140-2's key exchange: P-256, as Istio's fips-140-2 policy has it for its proxies.
#[cfg(feature = "fips")]
fn fips_groups() -> Result<Vec<&'static dyn rustls::crypto::SupportedKxGroup>, String> {
    Ok(vec![rustls::crypto::aws_lc_rs::kx_group::SECP256R1])
}
#[cfg(not(feature = "fips"))]
fn fips_groups() -> Result<Vec<&'static dyn rustls::crypto::SupportedKxGroup>, String> {
    Err(format!(
        "COMPLIANCE_POLICY=fips-140-2 needs the FIPS build (cargo feature `fips`, the release's -fips image); this one's \
         crypto provider is {CRYPTO_PROVIDER}"
    ))
}

#[cfg(feature = "aws-lc-rs")]
fn pqc_groups() -> Result<Vec<&'static dyn rustls::crypto::SupportedKxGroup>, String> {
    Ok(vec![rustls::crypto::aws_lc_rs::kx_group::X25519MLKEM768])
}
#[cfg(all(feature = "ring", not(feature = "aws-lc-rs")))]
fn pqc_groups() -> Result<Vec<&'static dyn rustls::crypto::SupportedKxGroup>, String> {
    Err("COMPLIANCE_POLICY=pqc needs X25519MLKEM768, which this build's crypto provider (ring) lacks: use the aws-lc-rs build".into())
}

/// The protocol versions a provider's suites allow: TLS 1.3, and TLS 1.2 when it holds a TLS 1.2 suite.
pub fn versions(provider: &CryptoProvider) -> &'static [&'static rustls::SupportedProtocolVersion] {
    static TLS13: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];
    static TLS13_12: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13, &rustls::version::TLS12];
    if provider.cipher_suites.iter().any(|s| s.tls13().is_none()) {
        TLS13_12
    } else {
        TLS13
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{code}: {0}", code = crate::ErrorCode::TlsConfig)]
    Config(#[from] rustls::Error),
    #[error("{code}: {0}", code = crate::ErrorCode::NoCertificate)]
    NoCertificate(String),
}

/// Resolves the server certificate of one local workload at each handshake, so a rotated certificate is used
/// by the next handshake without rebuilding the config.
#[derive(Debug)]
struct WorkloadCertResolver {
    store: Arc<CertStore>,
    identity: Identity,
}

impl std::fmt::Debug for CertStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CertStore")
    }
}

impl ResolvesServerCert for WorkloadCertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.store.get(&self.identity).map(|c| c.certified.clone())
    }
}

/// An HBONE session can be handed to a successor daemon (`handover::tls13`): its handshake's first traffic secrets
/// are kept in memory for that one connection (only while `tls13::capture` polls it; never to a file), and rustls
/// lets its keys be exported.
fn handover_ready(key_log: &mut Arc<dyn rustls::KeyLog>, extraction: &mut bool) {
    *key_log = Arc::new(keylog::CaptureLog);
    *extraction = true;
}

/// The inbound (15008) server config of one local workload.
pub fn server_config(store: Arc<CertStore>, identity: Identity) -> Result<ServerConfig, TlsError> {
    let provider = store.provider().clone();
    let verifier = Arc::new(SpiffeClientVerifier::new(store.clone(), identity.clone()));
    let versions = versions(&provider);
    let mut cfg = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(WorkloadCertResolver { store, identity }));
    cfg.alpn_protocols = vec![ALPN_H2.to_vec()];
    // No tickets and no session cache: every connection authenticates with a full handshake (as ztunnel).
    cfg.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    cfg.send_tls13_tickets = 0;
    handover_ready(&mut cfg.key_log, &mut cfg.enable_secret_extraction);
    Ok(cfg)
}

/// The client certificate of one pooled connection: fixed for its lifetime (a rotated certificate is used by the
/// next connection).
#[derive(Debug)]
struct FixedClientCert(Arc<CertifiedKey>);

impl rustls::client::ResolvesClientCert for FixedClientCert {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[rustls::SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The outbound config for one pooled connection: our workload's certificate, and a verifier that accepts only the
/// expected SPIFFE identities. Built per new TLS connection (not per stream), like ztunnel.
pub fn client_config(
    cert: &InstalledCert,
    expected: ExpectedIdentities,
    certs: &CertStore,
) -> Result<ClientConfig, TlsError> {
    let provider = certs.provider().clone();
    let verifier = Arc::new(SpiffeServerVerifier::new(
        cert.roots.clone(),
        expected,
        provider.clone(),
        certs.crls().current(),
        certs.trust_domains().clone(),
        cert.identity.trust_domain.clone(),
    ));
    let versions = versions(&provider);
    let mut cfg = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_cert_resolver(Arc::new(FixedClientCert(cert.certified.clone())));
    cfg.alpn_protocols = vec![ALPN_H2.to_vec()];
    cfg.enable_sni = false;
    cfg.resumption = Resumption::disabled();
    handover_ready(&mut cfg.key_log, &mut cfg.enable_secret_extraction);
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TlsPolicy;
    use rustls::CipherSuite as S;
    use rustls::NamedGroup;

    fn suites(p: &CryptoProvider) -> Vec<S> {
        p.cipher_suites.iter().map(|s| s.suite()).collect()
    }

    #[test]
    fn the_policy_decides_suites_versions_and_key_exchange_as_ztunnel_s_provider() {
        let default = provider();
        assert_eq!(suites(&default), [S::TLS13_AES_256_GCM_SHA384, S::TLS13_AES_128_GCM_SHA256]);
        assert_eq!(versions(&default), &[&rustls::version::TLS13]);
        // X25519 is not a FIPS-approved group: a FIPS build keeps rustls' FIPS defaults (P-256 and P-384 among them),
        // which the default build also offers, so the two still meet.
        let x25519 = default.kx_groups.iter().any(|g| g.name() == NamedGroup::X25519);
        assert_eq!(x25519, !cfg!(feature = "fips"), "classical by default");
        assert!(default.kx_groups.iter().any(|g| g.name() == NamedGroup::secp256r1));

        let tls12 = provider_for(TlsPolicy { tls12: true, pqc: false, fips: false }).unwrap();
        assert_eq!(
            suites(&tls12),
            [
                S::TLS13_AES_256_GCM_SHA384,
                S::TLS13_AES_128_GCM_SHA256,
                S::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
                S::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
                S::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
                S::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
            ]
        );
        assert_eq!(versions(&tls12), &[&rustls::version::TLS13, &rustls::version::TLS12]);

        #[cfg(feature = "aws-lc-rs")]
        {
            let pqc = provider_for(TlsPolicy { tls12: false, pqc: true, fips: false }).unwrap();
            let groups: Vec<NamedGroup> = pqc.kx_groups.iter().map(|g| g.name()).collect();
            assert_eq!(groups, [NamedGroup::X25519MLKEM768]);
            assert_eq!(suites(&pqc), suites(&default));
        }
        #[cfg(not(feature = "aws-lc-rs"))]
        assert!(provider_for(TlsPolicy { tls12: false, pqc: true, fips: false })
            .unwrap_err()
            .contains("COMPLIANCE_POLICY=pqc"));
    }

    #[test]
    fn fips_140_2_needs_the_fips_build_and_keeps_p256_alone() {
        let fips = provider_for(TlsPolicy { tls12: false, pqc: false, fips: true });
        #[cfg(feature = "fips")]
        {
            let p = fips.unwrap();
            assert!(p.fips(), "the validated module, in FIPS mode");
            assert_eq!(p.kx_groups.iter().map(|g| g.name()).collect::<Vec<_>>(), [NamedGroup::secp256r1]);
            assert_eq!(suites(&p), suites(&provider()));
            assert!(provider().fips(), "a FIPS build's default provider is the validated module too");
        }
        #[cfg(not(feature = "fips"))]
        assert!(fips.unwrap_err().contains("needs the FIPS build"));
    }
}
