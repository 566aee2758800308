//! Revocation of live HBONE connections (CRL_PATH), as ztunnel's `tls/revocation.rs` does it: each HBONE TLS
//! connection, inbound and outbound, keeps its peer's chain from the handshake; when the lists change, the
//! connections whose chain a new list revokes are closed (their streams end with the flag `CERT_REVOKED`).
//!
//! Invariants:
//! - webpki is the only judge: a connection is closed only when its chain, verified again as at its handshake (same
//!   roots, same key usage, at the time it was established so expiry cannot count), fails with "revoked" against the
//!   lists now in force. A list that merely names a serial (an unsigned or foreign list) closes nothing.
//! - A connection is registered right after its handshake and checked once then against the lists in force, so a
//!   list that arrived during the handshake is not missed; the pass after a change sees every connection registered
//!   before the lists were replaced.
//! - Each pass pre-filters by (issuer, serial) of every certificate of the chain, so only the connections a list names
//!   are verified again; a pass never holds the registry's lock while it verifies.
//! - Counted per reporter (`istio_crl_policy_rejections_total`): each connection closed for revocation once, and each
//!   handshake refused because a peer certificate is revoked; a chain that cannot be read for tracking counts in
//!   `istio_crl_untracked_connections_total` (it keeps working: the handshake accepted it).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::RootCertStore;
use tokio_util::sync::CancellationToken;

use super::crl::CrlSet;

/// The error of a stream ended because its connection's peer certificate was revoked (flagged `CERT_REVOKED`).
pub const REVOKED: &str = "the peer's certificate was revoked";

/// A connection's peer chain (DER, leaf first) and the Unix time its handshake verified it (carried with a connection
/// handed to a successor daemon, whose revocation checks go on from it).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct PeerChain {
    pub chain: Vec<Vec<u8>>,
    pub verified_at: u64,
}

impl PeerChain {
    pub fn is_empty(&self) -> bool {
        self.chain.is_empty()
    }
}

/// Which end the peer is, and so which key usage its chain was verified for and which reporter counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// An inbound connection's client (reporter `destination`).
    Client,
    /// An outbound connection's server (reporter `source`).
    Server,
}

impl Peer {
    fn usage(self) -> webpki::KeyUsage {
        match self {
            Peer::Client => webpki::KeyUsage::client_auth(),
            Peer::Server => webpki::KeyUsage::server_auth(),
        }
    }
}

/// Counters by reporter: [source (outbound), destination (inbound)].
#[derive(Debug, Default)]
pub struct ByReporter([AtomicU64; 2]);

impl ByReporter {
    fn add(&self, peer: Peer) {
        self.0[(peer == Peer::Client) as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn source(&self) -> u64 {
        self.0[0].load(Ordering::Relaxed)
    }

    pub fn destination(&self) -> u64 {
        self.0[1].load(Ordering::Relaxed)
    }
}

struct Live {
    chain: Vec<CertificateDer<'static>>,
    /// (issuer, serial) of each certificate of the chain, leaf first, in webpki's encodings.
    ids: Vec<(Vec<u8>, Vec<u8>)>,
    roots: Arc<RootCertStore>,
    peer: Peer,
    established: UnixTime,
    revoked: CancellationToken,
}

/// ztunnel's two CRL counters, by reporter (shared with the metrics).
#[derive(Debug, Default)]
pub struct CrlCounters {
    /// Handshakes refused for a revoked certificate, and live connections closed for one.
    pub rejections: ByReporter,
    /// Connections whose chain could not be read for tracking.
    pub untracked: ByReporter,
}

/// The live HBONE connections whose peers a list may revoke.
#[derive(Default)]
pub struct Revocations {
    next: AtomicU64,
    live: Mutex<HashMap<u64, Arc<Live>>>,
    pub counters: Arc<CrlCounters>,
}

/// One connection's registration; unregisters when dropped. `revoked` fires when a list revokes its peer.
pub struct Watch {
    registry: Option<(Arc<Revocations>, u64, Arc<Live>)>,
    pub revoked: CancellationToken,
}

impl Watch {
    /// A watch that never fires (no chain to follow).
    pub fn none() -> Watch {
        Watch { registry: None, revoked: CancellationToken::new() }
    }

    /// The chain followed and when it was verified, as a hand-over carries it (empty when none is followed).
    pub fn peer_chain(&self) -> PeerChain {
        match &self.registry {
            Some((_, _, live)) => PeerChain {
                chain: live.chain.iter().map(|c| c.to_vec()).collect(),
                verified_at: live.established.as_secs(),
            },
            None => Default::default(),
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some((r, id, _)) = self.registry.take() {
            r.live.lock().remove(&id);
        }
    }
}

/// Whether `e` (a handshake's error) is rustls refusing a revoked certificate.
pub fn is_revoked_error(e: &std::io::Error) -> bool {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .is_some_and(|e| matches!(e, rustls::Error::InvalidCertificate(rustls::CertificateError::Revoked)))
}

impl Revocations {
    /// Count a handshake refused because `peer`'s certificate is revoked.
    pub fn refused(&self, peer: Peer) {
        self.counters.rejections.add(peer);
    }

    /// Follow a connection whose `peer` presented `chain` (leaf first), verified against `roots` at `established`
    /// (None: now); checked at once against `crls` (the lists in force now). Without a readable chain, or the roots,
    /// it is counted untracked.
    pub fn register(
        self: &Arc<Self>,
        chain: &[CertificateDer<'_>],
        roots: Option<Arc<RootCertStore>>,
        peer: Peer,
        established: Option<UnixTime>,
        crls: &CrlSet,
        algs: &[&dyn rustls::pki_types::SignatureVerificationAlgorithm],
    ) -> Watch {
        let ids: Option<Vec<(Vec<u8>, Vec<u8>)>> = chain
            .iter()
            .map(|der| webpki::EndEntityCert::try_from(der).ok().map(|c| (c.issuer().to_vec(), c.serial().to_vec())))
            .collect();
        let (Some(ids), Some(roots)) = (ids.filter(|ids| !ids.is_empty()), roots) else {
            self.counters.untracked.add(peer);
            return Watch::none();
        };
        let live = Arc::new(Live {
            chain: chain.iter().map(|c| c.clone().into_owned()).collect(),
            ids,
            roots,
            peer,
            established: established.unwrap_or_else(UnixTime::now),
            revoked: CancellationToken::new(),
        });
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.live.lock().insert(id, live.clone());
        if !crls.is_empty() && is_revoked(&live, crls, algs) {
            self.close(&live);
        }
        Watch { revoked: live.revoked.clone(), registry: Some((self.clone(), id, live)) }
    }

    /// After the lists changed to `crls`: close every live connection they revoke. Returns how many.
    pub fn sweep(&self, crls: &CrlSet, algs: &[&dyn rustls::pki_types::SignatureVerificationAlgorithm]) -> usize {
        if crls.is_empty() {
            return 0;
        }
        // The candidates are copied under the lock; the verification runs without it.
        let named: Vec<Arc<Live>> = self
            .live
            .lock()
            .values()
            .filter(|l| !l.revoked.is_cancelled() && l.ids.iter().any(|(issuer, serial)| crls.names(issuer, serial)))
            .cloned()
            .collect();
        let mut closed = 0;
        for live in named {
            if is_revoked(&live, crls, algs) && self.close(&live) {
                closed += 1;
            }
        }
        closed
    }

    /// Fires a connection's `revoked` and counts it, once.
    fn close(&self, live: &Live) -> bool {
        if live.revoked.is_cancelled() {
            return false;
        }
        live.revoked.cancel();
        self.counters.rejections.add(live.peer);
        true
    }

    pub fn len(&self) -> usize {
        self.live.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The chain verified again as at its handshake, with the lists: revoked, and nothing else, counts.
fn is_revoked(live: &Live, crls: &CrlSet, algs: &[&dyn rustls::pki_types::SignatureVerificationAlgorithm]) -> bool {
    let Some((leaf, intermediates)) = live.chain.split_first() else { return false };
    let Ok(ee) = webpki::EndEntityCert::try_from(leaf) else { return false };
    crls.with_options(|revocation| {
        matches!(
            ee.verify_for_usage(
                algs,
                &live.roots.roots,
                intermediates,
                live.established,
                live.peer.usage(),
                revocation,
                None
            ),
            Err(webpki::Error::CertRevoked)
        )
    })
}
