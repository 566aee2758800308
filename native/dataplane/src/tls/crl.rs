//! Certificate revocation lists (CRL_PATH, Istio's `peerCaCrl`): the peers' certificates are checked against them in
//! every HBONE handshake, both ways. The control side reads the file and hands its PEM over (at start and whenever it
//! changes); a list that does not parse is refused whole and the previous one stays. A certificate whose issuer no
//! list covers is accepted (the lists are the mesh CA's, not every issuer's), as ztunnel does.

use parking_lot::RwLock;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateRevocationListDer;
use webpki::{CertRevocationList, OwnedCertRevocationList, RevocationOptionsBuilder, UnknownStatusPolicy};

/// One parsed set of lists, as both verifiers need them.
#[derive(Debug, Default)]
pub struct CrlSet {
    /// For rustls' client-certificate verifier (inbound).
    pub der: Vec<CertificateRevocationListDer<'static>>,
    /// For the server-certificate check (outbound), which calls webpki itself (no DNS name to check).
    owned: Vec<CertRevocationList<'static>>,
}

impl CrlSet {
    /// Parses every `X509 CRL` block of `pem`. Refused whole if any block is not a CRL webpki can use.
    pub fn parse(pem: &str) -> Result<CrlSet, String> {
        let der = CertificateRevocationListDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("not PEM: {e}"))?;
        if der.is_empty() && !pem.trim().is_empty() {
            return Err("holds no X509 CRL block".into());
        }
        let owned = der
            .iter()
            .enumerate()
            .map(|(i, d)| {
                OwnedCertRevocationList::from_der(d.as_ref())
                    .map(CertRevocationList::from)
                    .map_err(|e| format!("CRL {} of {}: {e:?}", i + 1, der.len()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(CrlSet { der, owned })
    }

    pub fn is_empty(&self) -> bool {
        self.der.is_empty()
    }

    pub fn len(&self) -> usize {
        self.der.len()
    }

    /// Whether a list issued by `issuer` names `serial` (webpki's encodings); only a pre-filter: the list's
    /// signature is checked when a chain is verified with it.
    pub fn names(&self, issuer: &[u8], serial: &[u8]) -> bool {
        self.owned.iter().any(|l| l.issuer() == issuer && matches!(l.find_serial(serial), Ok(Some(_))))
    }

    /// Runs `f` with webpki's revocation options over these lists (None when there are none).
    pub fn with_options<R>(&self, f: impl FnOnce(Option<webpki::RevocationOptions<'_>>) -> R) -> R {
        if self.owned.is_empty() {
            return f(None);
        }
        let refs: Vec<&CertRevocationList<'_>> = self.owned.iter().collect();
        match RevocationOptionsBuilder::new(&refs) {
            Ok(b) => f(Some(b.with_status_policy(UnknownStatusPolicy::Allow).build())),
            Err(_) => f(None),
        }
    }
}

/// The lists in force, replaced whole.
#[derive(Debug, Default)]
pub struct Crls(RwLock<Arc<CrlSet>>);

impl Crls {
    pub fn current(&self) -> Arc<CrlSet> {
        self.0.read().clone()
    }

    /// Replaces the lists with those of `pem` (empty: none) and returns them; a refused `pem` changes nothing.
    pub fn set(&self, pem: &str) -> Result<Arc<CrlSet>, String> {
        let set = Arc::new(CrlSet::parse(pem)?);
        *self.0.write() = set.clone();
        Ok(set)
    }
}
