//! The per-identity certificate store.
//!
//! Invariants:
//! - A certificate is installed only for the key this store generated for that identity (`CERT_MISMATCH`).
//! - The leaf's single SPIFFE identity must equal the identity it is installed for, and the chain must verify
//!   against the roots handed with it.
//! - Installing replaces the certificate new handshakes use; live connections keep the one they used.
//! - Certificates on demand: a handshake that finds no certificate waits for one (`wait_for`, with a deadline)
//!   and asks the control side for it (`next_wants`, a queue the control side long-polls); prefetch by the
//!   control side is only an optimisation. `forget` frees an identity's key and certificate.

use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::RootCertStore;

use super::{create_csr, spiffe_identity, Identity, PendingKey};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{code}: {0}", code = crate::ErrorCode::CsrFailed)]
    Csr(String),
    #[error("{code}: {0}", code = crate::ErrorCode::CertMismatch)]
    Mismatch(String),
    #[error("{code}: {0}", code = crate::ErrorCode::CertInvalid)]
    Invalid(String),
    #[error("{code}: no certificate for {0}", code = crate::ErrorCode::NoCertificate)]
    Missing(String),
}

/// A certificate ready for handshakes, with what the admin API shows of it.
pub struct InstalledCert {
    pub identity: Identity,
    pub certified: Arc<CertifiedKey>,
    pub roots: Arc<RootCertStore>,
    pub chain_pem: String,
    pub roots_pem: String,
    pub not_before: i64,
    pub not_after: i64,
    pub serial: String,
}

#[derive(Default)]
struct Entry {
    pending: Option<PendingKey>,
    current: Option<Arc<InstalledCert>>,
}

pub struct CertStore {
    entries: RwLock<HashMap<Identity, Entry>>,
    provider: Arc<CryptoProvider>,
    /// Woken on every install: handshakes waiting for a certificate look again.
    installed: Notify,
    /// Identities a handshake is waiting for, not yet handed to the control side.
    wants: Mutex<Vec<Identity>>,
    wanted: Notify,
    /// The revocation lists every handshake checks peers against (CRL_PATH).
    crls: crate::tls::crl::Crls,
    /// The live HBONE connections those lists may revoke.
    revocations: Arc<crate::tls::revocation::Revocations>,
    /// The trust domains accepted as aliases of each workload's own (TRUST_DOMAINS).
    trust_domains: super::TrustDomains,
}

fn parse_pem_certs(what: &str, pem: &str) -> Result<Vec<CertificateDer<'static>>, StoreError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| StoreError::Invalid(format!("{what} is not PEM: {e}")))?;
    if certs.is_empty() {
        return Err(StoreError::Invalid(format!("{what} holds no certificate")));
    }
    Ok(certs)
}

impl CertStore {
    pub fn new(provider: Arc<CryptoProvider>) -> CertStore {
        CertStore {
            entries: RwLock::new(HashMap::new()),
            provider,
            installed: Notify::new(),
            wants: Mutex::new(Vec::new()),
            wanted: Notify::new(),
            crls: Default::default(),
            revocations: Default::default(),
            trust_domains: Default::default(),
        }
    }

    /// With `trust_domains` accepted as aliases of each workload's own, in every handshake and policy match.
    pub fn with_trust_domains(mut self, trust_domains: super::TrustDomains) -> CertStore {
        self.trust_domains = trust_domains;
        self
    }

    pub fn trust_domains(&self) -> &super::TrustDomains {
        &self.trust_domains
    }

    /// The certificate of `identity`, waiting up to `deadline` for one to be installed, and asking the control side
    /// for it meanwhile. None when the deadline passes first.
    pub async fn wait_for(&self, identity: &Identity, deadline: Duration) -> Option<Arc<InstalledCert>> {
        let wait = async {
            loop {
                // Armed before the check, so an install between the check and the wait is not missed.
                let installed = self.installed.notified();
                tokio::pin!(installed);
                installed.as_mut().enable();
                if let Some(c) = self.get(identity) {
                    return c;
                }
                self.want(identity);
                installed.await;
            }
        };
        tokio::time::timeout(deadline, wait).await.ok()
    }

    fn want(&self, identity: &Identity) {
        let mut wants = self.wants.lock();
        if !wants.contains(identity) {
            wants.push(identity.clone());
        }
        drop(wants);
        self.wanted.notify_one();
    }

    /// The identities handshakes are waiting for, once there is at least one (the control side's long poll).
    pub async fn next_wants(&self) -> Vec<Identity> {
        loop {
            let wanted = self.wanted.notified();
            tokio::pin!(wanted);
            wanted.as_mut().enable();
            let wants = std::mem::take(&mut *self.wants.lock());
            if !wants.is_empty() {
                return wants;
            }
            wanted.await;
        }
    }

    /// Generate a fresh key for `identity` and return its CSR. A previous pending key is replaced; the current
    /// certificate keeps serving until a new one is installed.
    pub fn create_csr(&self, identity: &Identity) -> Result<String, StoreError> {
        let (pending, csr) = create_csr(identity).map_err(|e| StoreError::Csr(e.to_string()))?;
        let mut entries = self.entries.write();
        entries.entry(identity.clone()).or_default().pending = Some(pending);
        Ok(csr)
    }

    pub fn install(&self, identity: &Identity, chain_pem: &str, roots_pem: &str) -> Result<(), StoreError> {
        let chain = parse_pem_certs("certificate chain", chain_pem)?;
        let root_certs = parse_pem_certs("root certificates", roots_pem)?;
        let leaf = &chain[0];
        let leaf_id = spiffe_identity(leaf).map_err(StoreError::Invalid)?;
        if &leaf_id != identity {
            return Err(StoreError::Mismatch(format!("certificate is for {leaf_id}, not {identity}")));
        }
        let mut roots = RootCertStore::empty();
        for root in &root_certs {
            roots.add(root.clone()).map_err(|e| StoreError::Invalid(format!("root certificate rejected: {e}")))?;
        }
        let parsed = rustls::server::ParsedCertificate::try_from(leaf)
            .map_err(|e| StoreError::Invalid(format!("leaf certificate: {e}")))?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &parsed,
            &roots,
            &chain[1..],
            UnixTime::now(),
            self.provider.signature_verification_algorithms.all,
        )
        .map_err(|e| StoreError::Invalid(format!("chain does not verify against the roots: {e}")))?;
        let (not_before, not_after, serial) = validity(leaf)?;

        let mut entries = self.entries.write();
        let entry = entries
            .get_mut(identity)
            .ok_or_else(|| StoreError::Mismatch(format!("no key was generated for {identity}")))?;
        let pending =
            entry.pending.as_ref().ok_or_else(|| StoreError::Mismatch(format!("no pending key for {identity}")))?;
        let leaf_spki = x509_spki(leaf)?;
        if leaf_spki != pending.key.public_key_raw() {
            return Err(StoreError::Mismatch(format!(
                "certificate for {identity} does not match the key generated for it"
            )));
        }
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pending.key.serialize_der()));
        let signing_key = self
            .provider
            .key_provider
            .load_private_key(key_der)
            .map_err(|e| StoreError::Invalid(format!("key: {e}")))?;
        let certified = Arc::new(CertifiedKey::new(chain, signing_key));
        entry.pending = None;
        entry.current = Some(Arc::new(InstalledCert {
            identity: identity.clone(),
            certified,
            roots: Arc::new(roots),
            chain_pem: chain_pem.to_string(),
            roots_pem: roots_pem.to_string(),
            not_before,
            not_after,
            serial,
        }));
        drop(entries);
        self.installed.notify_waiters();
        Ok(())
    }

    pub fn get(&self, identity: &Identity) -> Option<Arc<InstalledCert>> {
        let entries = self.entries.read();
        entries.get(identity).and_then(|e| e.current.clone())
    }

    /// Free `identity`'s key and certificate (the control side forgot it: no local workload uses it). Live
    /// connections keep the certificate they hold; a new handshake asks for it again.
    pub fn forget(&self, identity: &Identity) -> bool {
        let removed = self.entries.write().remove(identity).is_some();
        self.wants.lock().retain(|w| w != identity);
        removed
    }

    pub fn all(&self) -> Vec<Arc<InstalledCert>> {
        let entries = self.entries.read();
        let mut out: Vec<_> = entries.values().filter_map(|e| e.current.clone()).collect();
        out.sort_by(|a, b| a.identity.cmp(&b.identity));
        out
    }

    pub fn provider(&self) -> &Arc<CryptoProvider> {
        &self.provider
    }

    pub fn crls(&self) -> &crate::tls::crl::Crls {
        &self.crls
    }

    pub fn revocations(&self) -> &Arc<crate::tls::revocation::Revocations> {
        &self.revocations
    }

    /// Follow a connection whose `peer` presented `chain`, verified against `roots`, for revocation.
    pub fn watch_revocation(
        &self,
        chain: Option<&[rustls::pki_types::CertificateDer<'_>]>,
        roots: Option<Arc<RootCertStore>>,
        peer: crate::tls::revocation::Peer,
    ) -> crate::tls::revocation::Watch {
        self.watch_revocation_since(chain, roots, peer, None)
    }

    /// `watch_revocation` for a chain verified at `established` (a connection taken in from a predecessor).
    pub fn watch_revocation_since(
        &self,
        chain: Option<&[rustls::pki_types::CertificateDer<'_>]>,
        roots: Option<Arc<RootCertStore>>,
        peer: crate::tls::revocation::Peer,
        established: Option<UnixTime>,
    ) -> crate::tls::revocation::Watch {
        let crls = self.crls.current();
        let algs = self.provider.signature_verification_algorithms.all;
        self.revocations.register(chain.unwrap_or(&[]), roots, peer, established, &crls, algs)
    }
}

fn x509_spki(der: &[u8]) -> Result<Vec<u8>, StoreError> {
    use x509_parser::prelude::*;
    let (_, cert) =
        X509Certificate::from_der(der).map_err(|e| StoreError::Invalid(format!("leaf does not parse: {e}")))?;
    Ok(cert.public_key().subject_public_key.data.to_vec())
}

fn validity(der: &[u8]) -> Result<(i64, i64, String), StoreError> {
    use x509_parser::prelude::*;
    let (_, cert) =
        X509Certificate::from_der(der).map_err(|e| StoreError::Invalid(format!("leaf does not parse: {e}")))?;
    let v = cert.validity();
    Ok((v.not_before.timestamp(), v.not_after.timestamp(), cert.raw_serial_as_string()))
}

#[cfg(test)]
mod on_demand_tests {
    use super::*;
    use crate::ca::LocalCa;

    fn issue(store: &CertStore, ca: &LocalCa, id: &Identity) {
        let csr = store.create_csr(id).unwrap();
        let chain = ca.sign(&csr, &id.to_string(), Duration::from_secs(3600)).unwrap();
        store.install(id, &chain, ca.root_pem()).unwrap();
    }

    #[tokio::test]
    async fn a_missing_certificate_is_asked_for_waited_for_and_forgotten() {
        let dir = std::env::temp_dir().join(format!("ztn-store-{}-{}", std::process::id(), rand::random::<u64>()));
        let ca = LocalCa::open(&dir, "cluster.local").unwrap();
        let store = Arc::new(CertStore::new(crate::tls::provider()));
        let id = Identity::new("cluster.local", "ns", "sleep");
        let waiter = tokio::spawn({
            let (store, id) = (store.clone(), id.clone());
            async move { store.wait_for(&id, Duration::from_secs(10)).await.map(|c| c.identity.clone()) }
        });
        // The control side's long poll hears of it, once.
        let asked = tokio::time::timeout(Duration::from_secs(5), store.next_wants()).await.unwrap();
        assert_eq!(asked, vec![id.clone()]);
        issue(&store, &ca, &id);
        assert_eq!(waiter.await.unwrap(), Some(id.clone()), "the handshake proceeds with the installed certificate");
        // Nothing arrives: the deadline answers None.
        let nobody = Identity::new("cluster.local", "ns", "nobody");
        assert!(store.wait_for(&nobody, Duration::from_millis(50)).await.is_none());
        // Forgotten: key and certificate are gone, and so is a pending ask.
        assert!(store.forget(&id));
        assert!(store.get(&id).is_none());
        assert!(!store.forget(&id));
        store.forget(&nobody);
        assert!(tokio::time::timeout(Duration::from_millis(50), store.next_wants()).await.is_err(), "no stale ask");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
