//! The built-in CA of local mode (`LOCAL_CA_DIR`), and of `FAKE_CA=true` in any mode.
//!
//! Its root key and certificate live in a directory the operator names; nothing is embedded in the code or the
//! repository. Two daemons given the same directory share the root and so trust each other. Creation is
//! serialized with an exclusive file lock so two daemons starting together end up with one root. Without a
//! directory (`FAKE_CA=true` alone) the root is made in memory for the process's life and never written anywhere:
//! only this daemon's own workloads trust it.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber, PKCS_ECDSA_P256_SHA256,
};
use time::OffsetDateTime;

pub const ROOT_CERT_FILE: &str = "root-cert.pem";
pub const ROOT_KEY_FILE: &str = "root-key.pem";
const LOCK_FILE: &str = ".lock";
/// Ten years: the root outlives any local experiment; workload certificates are short-lived.
const ROOT_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Backdating absorbs small clock differences between daemons.
const BACKDATE: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("{code}: {path}: {source}", code = crate::ErrorCode::CaError)]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{code}: {0}", code = crate::ErrorCode::CaError)]
    Crypto(String),
    #[error("{code}: {0}", code = crate::ErrorCode::CsrInvalid)]
    Csr(String),
}

pub struct LocalCa {
    root_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CaError + '_ {
    move |source| CaError::Io { path: path.to_path_buf(), source }
}

fn crypto(e: rcgen::Error) -> CaError {
    CaError::Crypto(e.to_string())
}

impl LocalCa {
    /// Load the root from `dir`, creating it (directory 0700, key 0600) if it does not exist yet.
    pub fn open(dir: &Path, trust_domain: &str) -> Result<LocalCa, CaError> {
        fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io_err(dir))?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(io_err(&lock_path))?;
        lock.lock().map_err(io_err(&lock_path))?;
        let result = Self::load_or_create(dir, trust_domain);
        let _ = lock.unlock();
        result
    }

    fn load_or_create(dir: &Path, trust_domain: &str) -> Result<LocalCa, CaError> {
        let cert_path = dir.join(ROOT_CERT_FILE);
        let key_path = dir.join(ROOT_KEY_FILE);
        if !cert_path.exists() || !key_path.exists() {
            Self::create(&cert_path, &key_path, trust_domain)?;
        }
        let key_mode = fs::metadata(&key_path).map_err(io_err(&key_path))?.permissions().mode();
        if key_mode & 0o077 != 0 {
            return Err(CaError::Crypto(format!(
                "{}: root key is readable by others (mode {:o}); chmod 600 it",
                key_path.display(),
                key_mode & 0o777
            )));
        }
        let root_pem = fs::read_to_string(&cert_path).map_err(io_err(&cert_path))?;
        let key_pem = fs::read_to_string(&key_path).map_err(io_err(&key_path))?;
        let key = KeyPair::from_pem(&key_pem).map_err(crypto)?;
        let issuer = Issuer::from_ca_cert_pem(&root_pem, key).map_err(crypto)?;
        Ok(LocalCa { root_pem, issuer })
    }

    /// A root made in memory, for this process only (its key is never written).
    pub fn ephemeral(trust_domain: &str) -> Result<LocalCa, CaError> {
        let (root_pem, key) = Self::new_root(trust_domain)?;
        let issuer = Issuer::from_ca_cert_pem(&root_pem, key).map_err(crypto)?;
        Ok(LocalCa { root_pem, issuer })
    }

    fn create(cert_path: &Path, key_path: &Path, trust_domain: &str) -> Result<(), CaError> {
        let (cert_pem, key) = Self::new_root(trust_domain)?;
        write_new(key_path, key.serialize_pem().as_bytes(), 0o600)?;
        write_new(cert_path, cert_pem.as_bytes(), 0o644)?;
        Ok(())
    }

    /// A new self-signed root: its certificate's PEM and its key.
    fn new_root(trust_domain: &str) -> Result<(String, KeyPair), CaError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(crypto)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, trust_domain);
        dn.push(DnType::CommonName, "ztunnel-node local CA");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let now = OffsetDateTime::now_utc();
        params.not_before = now - BACKDATE;
        params.not_after = now + ROOT_VALIDITY;
        params.serial_number = Some(random_serial());
        let cert = params.self_signed(&key).map_err(crypto)?;
        Ok((cert.pem(), key))
    }

    pub fn root_pem(&self) -> &str {
        &self.root_pem
    }

    /// Sign a workload CSR. The CSR's signature must verify and its only SAN must be the URI `identity`.
    /// Returns the chain PEM, leaf first then the root.
    pub fn sign(&self, csr_pem: &str, identity: &str, ttl: Duration) -> Result<String, CaError> {
        let _: crate::identity::Identity = identity.parse().map_err(|e| CaError::Csr(format!("{e}")))?;
        let csr = CertificateSigningRequestParams::from_pem(csr_pem).map_err(|e| CaError::Csr(e.to_string()))?;
        let want = SanType::URI(identity.try_into().map_err(|e: rcgen::Error| CaError::Csr(e.to_string()))?);
        if csr.params.subject_alt_names != [want] {
            return Err(CaError::Csr(format!(
                "the CSR must carry exactly one SAN, the URI {identity}; it has {:?}",
                csr.params.subject_alt_names
            )));
        }
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.subject_alt_names = csr.params.subject_alt_names.clone();
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        let now = OffsetDateTime::now_utc();
        params.not_before = now - BACKDATE;
        params.not_after = now + ttl;
        params.serial_number = Some(random_serial());
        let cert = params.signed_by(&csr.public_key, &self.issuer).map_err(crypto)?;
        Ok(format!("{}{}", cert.pem(), self.root_pem))
    }
}

fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f; // positive INTEGER
    SerialNumber::from_slice(&bytes)
}

fn write_new(path: &Path, contents: &[u8], mode: u32) -> Result<(), CaError> {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let mut f: File =
        OpenOptions::new().create(true).truncate(true).write(true).mode(mode).open(&tmp).map_err(io_err(&tmp))?;
    f.write_all(contents).map_err(io_err(&tmp))?;
    f.sync_all().map_err(io_err(&tmp))?;
    fs::rename(&tmp, path).map_err(io_err(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{spiffe_identity, CertStore, Identity};
    use std::sync::Arc;

    fn tempdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ztn-ca-{name}-{}-{}", std::process::id(), rand::random::<u32>()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn creates_root_with_private_key_mode_and_reuses_it() {
        let dir = tempdir("create");
        let a = LocalCa::open(&dir, "cluster.local").unwrap();
        let mode = fs::metadata(dir.join(ROOT_KEY_FILE)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let b = LocalCa::open(&dir, "cluster.local").unwrap();
        assert_eq!(a.root_pem(), b.root_pem());
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn concurrent_opens_agree_on_one_root() {
        let dir = tempdir("race");
        let roots: Vec<String> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| s.spawn(|| LocalCa::open(&dir, "cluster.local").unwrap().root_pem().to_string()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(roots.windows(2).all(|w| w[0] == w[1]));
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn signs_a_csr_that_installs_in_the_store() {
        let dir = tempdir("sign");
        let ca = LocalCa::open(&dir, "cluster.local").unwrap();
        let store = CertStore::new(crate::tls::provider());
        let id = Identity::new("cluster.local", "default", "sleep");
        let csr = store.create_csr(&id).unwrap();
        let chain = ca.sign(&csr, &id.to_string(), Duration::from_secs(3600)).unwrap();
        store.install(&id, &chain, ca.root_pem()).unwrap();
        let cert = store.get(&id).unwrap();
        assert_eq!(spiffe_identity(&cert.certified.cert[0]).unwrap(), id);
        assert!(cert.not_after - cert.not_before >= 3600);
        let _ = Arc::clone(&cert);
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_ephemeral_root_signs_and_is_new_each_time() {
        let ca = LocalCa::ephemeral("cluster.local").unwrap();
        let store = CertStore::new(crate::tls::provider());
        let id = Identity::new("cluster.local", "default", "sleep");
        let csr = store.create_csr(&id).unwrap();
        let chain = ca.sign(&csr, &id.to_string(), Duration::from_secs(600)).unwrap();
        store.install(&id, &chain, ca.root_pem()).unwrap();
        assert_ne!(ca.root_pem(), LocalCa::ephemeral("cluster.local").unwrap().root_pem());
    }

    #[test]
    fn refuses_a_csr_for_another_identity() {
        let dir = tempdir("wrongid");
        let ca = LocalCa::open(&dir, "cluster.local").unwrap();
        let store = CertStore::new(crate::tls::provider());
        let id = Identity::new("cluster.local", "default", "sleep");
        let csr = store.create_csr(&id).unwrap();
        let err = ca.sign(&csr, "spiffe://cluster.local/ns/default/sa/admin", Duration::from_secs(60)).unwrap_err();
        assert!(err.to_string().starts_with("CSR_INVALID"), "{err}");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn store_refuses_a_certificate_for_another_key() {
        let dir = tempdir("mismatch");
        let ca = LocalCa::open(&dir, "cluster.local").unwrap();
        let store = CertStore::new(crate::tls::provider());
        let id = Identity::new("cluster.local", "default", "sleep");
        let csr1 = store.create_csr(&id).unwrap();
        let chain1 = ca.sign(&csr1, &id.to_string(), Duration::from_secs(60)).unwrap();
        let _csr2 = store.create_csr(&id).unwrap(); // replaces the pending key
        let err = store.install(&id, &chain1, ca.root_pem()).unwrap_err();
        assert!(err.to_string().starts_with("CERT_MISMATCH"), "{err}");
        fs::remove_dir_all(dir).unwrap();
    }
}
