//! Certificate revocation (CRL_PATH): real TLS 1.3 handshakes between two certificate stores, with a CA and CRLs made
//! by rcgen (an independent issuer: not the dataplane's own CA code). A revoked peer certificate is refused both ways;
//! a certificate the lists do not name, or whose issuer no list covers, is accepted; a list that does not parse is
//! refused whole and the lists in force stay.

use std::sync::Arc;

use dataplane::identity::{CertStore, Identity};
use dataplane::tls::{self, ExpectedIdentities};
use rcgen::{
    date_time_ymd, BasicConstraints, CertificateParams, CertificateRevocationListParams,
    CertificateSigningRequestParams, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose, RevokedCertParams,
    SerialNumber,
};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

struct Ca {
    issuer: Issuer<'static, KeyPair>,
    root_pem: String,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let root = p.self_signed(&key).unwrap();
        Ca { root_pem: root.pem(), issuer: Issuer::new(p, key) }
    }

    /// A certificate for `identity` in `store`, from the store's own CSR, with the given serial number.
    fn issue(&self, store: &CertStore, identity: &Identity, serial: u64) {
        let csr = store.create_csr(identity).unwrap();
        let mut req = CertificateSigningRequestParams::from_pem(&csr).unwrap();
        req.params.serial_number = Some(SerialNumber::from(serial));
        req.params.not_before = date_time_ymd(2020, 1, 1);
        req.params.not_after = date_time_ymd(2100, 1, 1);
        let cert = req.signed_by(&self.issuer).unwrap();
        store.install(identity, &cert.pem(), &self.root_pem).unwrap();
    }

    /// A CRL revoking `serials`, signed by this CA.
    fn crl(&self, serials: &[u64]) -> String {
        CertificateRevocationListParams {
            this_update: date_time_ymd(2024, 1, 1),
            next_update: date_time_ymd(2099, 1, 1),
            crl_number: SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: serials
                .iter()
                .map(|s| RevokedCertParams {
                    serial_number: SerialNumber::from(*s),
                    revocation_time: date_time_ymd(2024, 1, 1),
                    reason_code: None,
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        }
        .signed_by(&self.issuer)
        .unwrap()
        .pem()
        .unwrap()
    }
}

fn id(sa: &str) -> Identity {
    Identity::new("cluster.local", "default", sa)
}

/// One handshake: `client` (as sleep) to `server` (as echo), each store with its own lists. Ok when both sides
/// accepted and a byte went through.
async fn handshake(client: &CertStore, server: Arc<CertStore>) -> Result<(), String> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(tls::server_config(server, id("echo")).unwrap()));
    let served = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut tls = acceptor.accept(tcp).await.map_err(|e| format!("server: {e}"))?;
        tls.write_all(b"x").await.map_err(|e| format!("server write: {e}"))?;
        tls.flush().await.map_err(|e| format!("server flush: {e}"))?;
        Ok::<_, String>(())
    });
    let cert = client.get(&id("sleep")).unwrap();
    let cfg = tls::client_config(
        &cert,
        ExpectedIdentities::new(vec![id("echo")]),
        client.provider().clone(),
        client.crls().current(),
    )
    .unwrap();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::IpAddress(std::net::IpAddr::from([127, 0, 0, 1]).into());
    let outcome = async {
        let mut tls = TlsConnector::from(Arc::new(cfg)).connect(name, tcp).await.map_err(|e| format!("client: {e}"))?;
        let mut b = [0u8; 1];
        tls.read_exact(&mut b).await.map_err(|e| format!("client read: {e}"))?;
        Ok::<_, String>(())
    }
    .await;
    let server_side = served.await.unwrap();
    outcome.and(server_side)
}

struct Pair {
    ca: Ca,
    client: CertStore,
    server: Arc<CertStore>,
}

/// sleep holds serial 10, echo serial 20, both from one CA.
fn pair() -> Pair {
    let ca = Ca::new("mesh root");
    let client = CertStore::new(tls::provider());
    let server = Arc::new(CertStore::new(tls::provider()));
    ca.issue(&client, &id("sleep"), 10);
    ca.issue(&server, &id("echo"), 20);
    Pair { ca, client, server }
}

#[tokio::test]
async fn without_lists_both_sides_accept() {
    let p = pair();
    handshake(&p.client, p.server.clone()).await.unwrap();
}

#[tokio::test]
async fn a_revoked_server_certificate_is_refused_by_the_client() {
    let p = pair();
    assert_eq!(p.client.crls().set(&p.ca.crl(&[20])).unwrap(), 1);
    let err = handshake(&p.client, p.server.clone()).await.unwrap_err();
    assert_eq!(err, "client: invalid peer certificate: Revoked");
    // A list that names another serial: accepted.
    p.client.crls().set(&p.ca.crl(&[99])).unwrap();
    handshake(&p.client, p.server.clone()).await.unwrap();
}

#[tokio::test]
async fn a_revoked_client_certificate_is_refused_by_the_server() {
    let p = pair();
    p.server.crls().set(&p.ca.crl(&[10])).unwrap();
    // TLS 1.3: the client has finished its handshake when the server judges its certificate; it reads the alert.
    let err = handshake(&p.client, p.server.clone()).await.unwrap_err();
    assert!(err.contains("fatal alert: CertificateRevoked"), "{err}");
    // Cleared: accepted again (lists apply to each new handshake).
    assert_eq!(p.server.crls().set("").unwrap(), 0);
    handshake(&p.client, p.server.clone()).await.unwrap();
}

#[tokio::test]
async fn a_list_of_another_issuer_does_not_block_unrelated_certificates() {
    let p = pair();
    let other = Ca::new("other root");
    p.client.crls().set(&other.crl(&[20])).unwrap();
    p.server.crls().set(&other.crl(&[10])).unwrap();
    handshake(&p.client, p.server.clone()).await.unwrap();
}

#[tokio::test]
async fn a_list_that_does_not_parse_is_refused_and_the_lists_in_force_stay() {
    let p = pair();
    p.client.crls().set(&p.ca.crl(&[20])).unwrap();
    for bad in [
        "-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n",
        "not a list at all",
        &p.ca.root_pem, // a certificate, not a CRL
    ] {
        assert!(p.client.crls().set(bad).is_err(), "{bad}");
    }
    assert_eq!(p.client.crls().current().len(), 1);
    assert!(handshake(&p.client, p.server.clone()).await.is_err(), "the revocation still applies");
}
