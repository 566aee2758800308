//! The DNS proxy's answer to one message from a workload (`dns::Server::answer`), as any bytes, over UDP and over
//! TCP, against a small mesh: a client, a headless service with two pods, services with VIPs (one only visible in
//! its own namespace, one a wildcard). No upstream resolver is configured, so what the mesh does not answer is
//! SERVFAIL at once, with no network. An answer, when there is one, is a well-formed DNS response with the
//! question's id and question, and over UDP fits the size the client allows (512 bytes, or its EDNS payload up to
//! ours), truncated (TC) when it must be, a SERVFAIL header alone when even the questions do not fit.

#![no_main]

use std::sync::{Arc, LazyLock};

use dataplane::config::Config;
use dataplane::dns::{Server, Transport};
use dataplane::drain::Drain;
use dataplane::events::Events;
use dataplane::identity::CertStore;
use dataplane::metrics::Metrics;
use dataplane::proxy::pool::Pool;
use dataplane::proxy::{LocalRef, ProxyInputs};
use dataplane::state::{State, StateDelta};
use hickory_proto::op::{Message, MessageType, ResponseCode};
use libfuzzer_sys::fuzz_target;

/// The server's UDP payload (dns/mod.rs `OUR_UDP_PAYLOAD`).
const OUR_UDP_PAYLOAD: usize = 1232;

struct Env {
    rt: tokio::runtime::Runtime,
    server: Arc<Server>,
}

static ENV: LazyLock<Env> = LazyLock::new(|| {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let server = rt.block_on(async {
        let mut cfg = Config::default();
        cfg.dns.upstreams.clear();
        let cfg = Arc::new(cfg);
        let certs = Arc::new(CertStore::new(dataplane::tls::provider()));
        let metrics = Arc::new(Metrics::default());
        // Every level reported (the default): the log lines are built too. The queue is bounded.
        let events = Arc::new(Events::default());
        let pool = Pool::new(cfg.clone(), certs.clone(), metrics.clone(), events.clone(), Drain::new());
        let pi = Arc::new(ProxyInputs {
            cfg,
            state: Arc::new(parking_lot::RwLock::new(mesh())),
            state_changed: Arc::default(),
            certs,
            metrics,
            events,
            pool,
            tracker: Arc::default(),
            denials: Arc::default(),
            sockets: Arc::new(dataplane::socket::DefaultSockets),
            preserve_source: false,
            silos: dataplane::silo::Silos::inline(),
            handover: Arc::default(),
            outliers: Arc::default(),
            resets: Arc::default(),
        });
        let sockets = pi.sockets.clone();
        Server::new(pi, LocalRef::Uid("c".into()), sockets, false).unwrap()
    });
    Env { rt, server }
});

fn mesh() -> State {
    let delta = serde_json::json!({
        "workloads": [
            {"uid": "c", "name": "client", "namespace": "default", "workloadIps": ["10.0.0.1"]},
            {"uid": "w0", "name": "web-0", "namespace": "default", "workloadIps": ["10.0.1.10", "fd00::10"],
             "services": {"default/web.default.svc.cluster.local": {"80": 8080}}},
            {"uid": "w1", "name": "Web-1", "namespace": "default", "workloadIps": ["10.0.1.11"],
             "services": {"default/web.default.svc.cluster.local": {"80": 8081}}}
        ],
        "services": [
            {"name": "web", "namespace": "default", "hostname": "web.default.svc.cluster.local", "ports": {"80": 8080}},
            {"name": "api", "namespace": "default", "hostname": "api.default.svc.cluster.local",
             "vips": ["/10.96.0.5", "/fd00::5"], "ports": {"443": 8443, "80": 8080}},
            {"name": "db", "namespace": "other", "hostname": "db.other.svc.cluster.local",
             "vips": ["/10.96.0.6"], "ports": {"5432": 5432}, "visibility": "Namespace"},
            {"name": "ext", "namespace": "default", "hostname": "*.example.com", "vips": ["/10.96.0.7"],
             "ports": {"443": 443}}
        ]
    });
    let mut st = State::default();
    st.apply(serde_json::from_value::<StateDelta>(delta).unwrap()).unwrap();
    st
}

fuzz_target!(|data: &[u8]| {
    let env = &*ENV;
    let request = Message::from_vec(data).ok();
    for transport in [Transport::Udp, Transport::Tcp] {
        let Some(bytes) = env.rt.block_on(env.server.answer(data, transport)) else { continue };
        let m = Message::from_vec(&bytes).unwrap_or_else(|e| panic!("answer {bytes:?} does not decode: {e}"));
        assert_eq!(m.metadata.id, u16::from_be_bytes([data[0], data[1]]), "the question's id");
        assert_eq!(m.metadata.message_type, MessageType::Response);
        if let Some(req) = &request {
            // Echoed, unless even the questions would not fit a UDP answer (many of them, in a FORMERR): then a
            // SERVFAIL header alone, as hickory-server answers.
            let header_only = transport == Transport::Udp
                && m.metadata.response_code == ResponseCode::ServFail
                && m.queries.is_empty()
                && m.answers.is_empty();
            assert!(header_only || m.queries == req.queries, "the question, echoed: {m:?}");
        }
        if transport == Transport::Udp {
            let limit = match request.as_ref().and_then(|r| r.edns.as_ref()) {
                Some(e) => (e.max_payload() as usize).clamp(512, OUR_UDP_PAYLOAD),
                None => 512,
            };
            assert!(bytes.len() <= limit, "{} bytes over UDP, {limit} allowed", bytes.len());
        }
    }
});
