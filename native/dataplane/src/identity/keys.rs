//! Key generation and CSRs. ECDSA P-256, like Istio's workload certificates.

use rcgen::{CertificateParams, DistinguishedName, KeyPair, SanType, PKCS_ECDSA_P256_SHA256};

use super::Identity;

/// A key generated for an identity whose certificate has not arrived yet.
pub struct PendingKey {
    pub key: KeyPair,
}

/// Generate a key and a CSR for `identity`: empty subject, one URI SAN (what istiod's CA expects).
pub fn create_csr(identity: &Identity) -> Result<(PendingKey, String), rcgen::Error> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.subject_alt_names = vec![SanType::URI(identity.to_string().try_into()?)];
    let csr = params.serialize_request(&key)?;
    Ok((PendingKey { key }, csr.pem()?))
}
