//! Certificate revocation (CRL_PATH): real TLS 1.3 handshakes between two certificate stores, with a CA and CRLs made
//! by rcgen (an independent issuer: not the dataplane's own CA code). A revoked peer certificate is refused both ways;
//! a certificate the lists do not name, or whose issuer no list covers, is accepted; a list that does not parse is
//! refused whole and the lists in force stay.

use std::sync::Arc;

use dataplane::identity::{CertStore, Identity};
use dataplane::tls::revocation::Peer;
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
    let cfg = tls::client_config(&cert, ExpectedIdentities::new(vec![id("echo")]), client).unwrap();
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
    assert_eq!(p.client.crls().set(&p.ca.crl(&[20])).unwrap().len(), 1);
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
    assert_eq!(p.server.crls().set("").unwrap().len(), 0);
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

/// What a live connection's peer presented: `store`'s certificate chain for `who`.
fn chain_of(store: &CertStore, who: &str) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    store.get(&id(who)).unwrap().certified.cert.clone()
}

#[test]
fn a_live_connection_is_closed_when_a_new_list_revokes_its_peer_and_counted_once() {
    let p = pair();
    let algs = p.server.provider().signature_verification_algorithms.all;
    let roots = Some(p.server.get(&id("echo")).unwrap().roots.clone());
    // The server follows its client (sleep, serial 10); the client its server (echo, serial 20).
    let inbound = p.server.watch_revocation(Some(&chain_of(&p.client, "sleep")), roots.clone(), Peer::Client);
    let outbound = p.client.watch_revocation(
        Some(&chain_of(&p.server, "echo")),
        Some(p.client.get(&id("sleep")).unwrap().roots.clone()),
        Peer::Server,
    );
    assert_eq!(p.server.revocations().len(), 1);
    // A list naming another serial closes nothing.
    let other = p.server.crls().set(&p.ca.crl(&[99])).unwrap();
    assert_eq!(p.server.revocations().sweep(&other, algs), 0);
    assert!(!inbound.revoked.is_cancelled());
    // The list revoking serial 10: the inbound connection is closed, and counted once however often it is swept.
    let set = p.server.crls().set(&p.ca.crl(&[10])).unwrap();
    assert_eq!(p.server.revocations().sweep(&set, algs), 1);
    assert!(inbound.revoked.is_cancelled());
    assert_eq!(p.server.revocations().sweep(&set, algs), 0);
    let c = &p.server.revocations().counters;
    assert_eq!((c.rejections.destination(), c.rejections.source()), (1, 0));
    // The client side, revoking serial 20: reporter source.
    let set = p.client.crls().set(&p.ca.crl(&[20])).unwrap();
    assert_eq!(p.client.revocations().sweep(&set, algs), 1);
    assert!(outbound.revoked.is_cancelled());
    assert_eq!(p.client.revocations().counters.rejections.source(), 1);
    drop(inbound);
    assert!(p.server.revocations().is_empty(), "a closed connection's registration goes with it");
}

#[test]
fn a_list_that_only_names_the_serial_closes_nothing_webpki_judges() {
    let p = pair();
    let algs = p.server.provider().signature_verification_algorithms.all;
    let roots = Some(p.server.get(&id("echo")).unwrap().roots.clone());
    let watch = p.server.watch_revocation(Some(&chain_of(&p.client, "sleep")), roots, Peer::Client);
    // Same issuer name, another key: the list names serial 10 under the mesh root's name but is not its list.
    let impostor = Ca::new("mesh root");
    let set = p.server.crls().set(&impostor.crl(&[10])).unwrap();
    assert_eq!(p.server.revocations().sweep(&set, algs), 0);
    assert!(!watch.revoked.is_cancelled());
    assert_eq!(p.server.revocations().counters.rejections.destination(), 0);
}

#[test]
fn a_connection_registered_after_the_list_changed_is_checked_at_once() {
    let p = pair();
    p.server.crls().set(&p.ca.crl(&[10])).unwrap();
    let roots = Some(p.server.get(&id("echo")).unwrap().roots.clone());
    let watch = p.server.watch_revocation(Some(&chain_of(&p.client, "sleep")), roots, Peer::Client);
    assert!(watch.revoked.is_cancelled(), "a list that arrived during the handshake still applies");
    assert_eq!(p.server.revocations().counters.rejections.destination(), 1);
}

#[test]
fn a_chain_that_cannot_be_followed_is_counted_untracked() {
    let p = pair();
    let garbage = vec![rustls::pki_types::CertificateDer::from(vec![1u8, 2, 3])];
    let a =
        p.server.watch_revocation(Some(&garbage), Some(p.server.get(&id("echo")).unwrap().roots.clone()), Peer::Client);
    let b = p.server.watch_revocation(Some(&chain_of(&p.client, "sleep")), None, Peer::Server);
    let c = p.server.watch_revocation(None, None, Peer::Client);
    let counters = &p.server.revocations().counters;
    assert_eq!((counters.untracked.destination(), counters.untracked.source()), (2, 1));
    assert!(p.server.revocations().is_empty());
    drop((a, b, c));
}
