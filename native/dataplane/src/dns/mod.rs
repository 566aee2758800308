//! The DNS proxy (15053): ztunnel's ambient DNS, one server per local workload (a pod's namespace in shared mode,
//! the daemon's in dedicated mode, the workload's address in local mode), UDP and TCP.
//!
//! Invariants:
//! - The client is the workload the server belongs to (`LocalRef`), never looked up from the packet's source.
//! - A and AAAA questions for mesh names are answered from the state (`lookup`), authoritatively, TTL 30 s, and so
//!   (beyond ztunnel) are SRV questions for mesh services, with their targets' addresses as additional records; then the
//!   special-use names a resolver answers itself (RFC 6761: `localhost.` and the loopback reverse zones, `invalid.`),
//!   as ztunnel's forwarder (hickory's resolver) does; every other question is answered from the server's cache of
//!   forwarded answers (`cache`) or forwarded (`forward`), and a failed forward is SERVFAIL.
//! - hickory-proto decodes and encodes every message; this module only decides. An undecodable query with a readable
//!   header gets FORMERR; shorter garbage is dropped. Opcodes other than QUERY get NOTIMP; more or fewer than one
//!   question FORMERR; an EDNS version above 0 BADVERS (RFC 6891 §6.1.3).
//! - Answers over UDP fit the client's size: 512 bytes without EDNS, else its advertised payload (at least 512, at
//!   most ours); a larger answer goes out as the question alone with TC set, so the client asks again over TCP. A
//!   query with EDNS gets an OPT record back carrying our payload size (RFC 6891 §6.1.1).
//! - Bounded: each server answers at most `rate::QUESTIONS_PER_SECOND` (over it, the UDP question in hand is dropped
//!   and the socket left unread until the budget refills, so the kernel drops the excess at the full receive buffer; a
//!   TCP connection's next question waits), so a workload flooding its own proxy takes a bounded share of the control
//!   thread that serves every proxy; UDP questions in flight per server and TCP connections per server are
//!   capped (excess UDP is dropped);
//!   TCP connections are shared fairly (`slots`: a source's share, the oldest waiting connection closed first when
//!   full, as RFC 7766 allows); a TCP connection that sends no complete question for 5 s is closed; a forward gives up
//!   after its deadline.

pub mod cache;
pub mod forward;
pub mod lookup;
pub mod metrics;
mod rate;
mod slots;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;

use crate::drain::Drain;
use crate::events::Level;
use crate::fields;
use crate::proxy::{LocalRef, ProxyInputs};
use crate::socket::{self, ListenOptions, SocketFactory};

pub use forward::Forwarder;
pub use lookup::Domains;

pub const TTL: u32 = 30;
/// ztunnel's TCP request timeout.
const TCP_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The UDP payload we advertise and accept (DNS flag day 2020's 1232 avoids IP fragmentation).
const OUR_UDP_PAYLOAD: u16 = 1232;
const MAX_UDP_IN_FLIGHT: usize = 256;
const MAX_TCP_CONNECTIONS: usize = 128;
/// A whole forward, all upstreams and the TCP retry included.
const FORWARD_DEADLINE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

impl Transport {
    fn label(self) -> &'static str {
        match self {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
        }
    }
}

/// What a query needs: nothing (not a query), this reply, or an upstream's answer.
enum Decision {
    Drop,
    Reply(Vec<u8>),
    Forward(Box<Forward>),
}

/// A question for the upstreams, with what its reply needs.
struct Forward {
    request: Message,
    /// The SERVFAIL to send if no upstream answers.
    response: Message,
    limit: usize,
    labels: metrics::Labels,
    client: Arc<crate::state::Workload>,
}

/// One DNS server: whose it is, how it names things, where it forwards.
pub struct Server {
    pi: Arc<ProxyInputs>,
    client: LocalRef,
    domains: Domains,
    forwarder: Forwarder,
    cache: cache::Cache,
    /// Questions per second this server answers (`rate`): a workload flooding its own proxy is cut there.
    rate: rate::Rate,
}

impl Server {
    /// `dedicated`: the search domains are the daemon's resolv.conf's (ztunnel's dedicated mode), not the per-pod
    /// Kubernetes defaults.
    pub fn new(
        pi: Arc<ProxyInputs>,
        client: LocalRef,
        sockets: Arc<dyn SocketFactory>,
        dedicated: bool,
    ) -> Result<Arc<Server>, String> {
        let c = &pi.cfg.dns;
        let search = dedicated.then_some(c.search_domains.as_slice());
        let domains = Domains::new(&c.cluster_domain, search, &c.prefered_service_namespace, c.ipv6_enabled)?;
        let forwarder = Forwarder { upstreams: c.upstreams.clone().into(), sockets, deadline: FORWARD_DEADLINE };
        let cache = cache::Cache::new(pi.metrics.clone());
        let rate = rate::Rate::new(rate::QUESTIONS_PER_SECOND);
        Ok(Arc::new(Server { pi, client, domains, forwarder, cache, rate }))
    }

    /// Bind UDP and TCP on each address and serve them until `drain`. Returns the bound addresses (UDP and TCP share
    /// the port; with port 0 the TCP port follows the UDP one).
    pub fn start(
        self: &Arc<Self>,
        sockets: &dyn SocketFactory,
        addrs: &[SocketAddr],
        opts: ListenOptions,
        drain: &Drain,
    ) -> Result<Vec<SocketAddr>, String> {
        let me = self;
        let mut bound = Vec::new();
        let mut servers = Vec::new();
        for addr in addrs {
            let udp = socket::bind_udp(sockets, *addr, opts).map_err(|e| format!("DNS UDP {addr}: {e}"))?;
            let local = udp.local_addr().map_err(|e| e.to_string())?;
            let tcp = socket::listen_with(sockets, local, opts).map_err(|e| format!("DNS TCP {local}: {e}"))?;
            bound.push(local);
            servers.push((udp, tcp));
        }
        // Mesh answers are made inline by the receiving loop; one loop per dataplane thread (up to 4) shares the
        // socket, so they spread over the runtime like spawned tasks would, without a task per question.
        let loops = self.pi.cfg.worker_threads.clamp(1, 4);
        for (udp, tcp) in servers {
            let (udp, in_flight) = (Arc::new(udp), Arc::new(Semaphore::new(MAX_UDP_IN_FLIGHT)));
            for _ in 0..loops {
                drain.tasks.spawn(me.clone().serve_udp(udp.clone(), in_flight.clone(), drain.clone()));
            }
            drain.tasks.spawn(me.clone().serve_tcp(tcp, drain.clone()));
        }
        Ok(bound)
    }

    async fn serve_udp(self: Arc<Self>, sock: Arc<UdpSocket>, in_flight: Arc<Semaphore>, drain: Drain) {
        let mut buf = vec![0u8; 65_535];
        loop {
            let (n, peer) = tokio::select! {
                r = sock.recv_from(&mut buf) => match r {
                    Ok(x) => x,
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                },
                _ = drain.graceful.cancelled() => return,
            };
            if let Err(refill) = self.rate.take(Instant::now()) {
                // Over budget: this question is dropped and the socket is not read until the budget refills, so the
                // flood's excess is dropped by the kernel at the full receive buffer instead of costing a read here.
                self.pi.metrics.dns.dropped();
                tokio::select! {
                    _ = tokio::time::sleep(refill) => continue,
                    _ = drain.graceful.cancelled() => return,
                }
            }
            let f = match self.decide(&buf[..n], Transport::Udp) {
                Decision::Drop => continue,
                Decision::Reply(answer) => {
                    // A full send buffer drops the answer (the client retries), as a full receive buffer would.
                    let _ = sock.try_send_to(&answer, peer);
                    continue;
                }
                Decision::Forward(f) => f,
            };
            let Ok(permit) = in_flight.clone().try_acquire_owned() else {
                self.pi.metrics.dns.dropped();
                continue;
            };
            let (me, sock) = (self.clone(), sock.clone());
            tokio::spawn(async move {
                if let Some(answer) = me.forward(*f).await {
                    let _ = sock.send_to(&answer, peer).await;
                }
                drop(permit);
            });
        }
    }

    async fn serve_tcp(self: Arc<Self>, listener: TcpListener, drain: Drain) {
        let slots = slots::Slots::new(MAX_TCP_CONNECTIONS);
        loop {
            let (stream, peer) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(accepted) => accepted,
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = drain.graceful.cancelled() => return,
            };
            let mut evicted = 0;
            let held = slots.admit(peer.ip(), &mut evicted);
            for _ in 0..evicted {
                self.pi.metrics.dns.dropped();
            }
            let Some(held) = held else {
                self.pi.metrics.dns.dropped();
                continue;
            };
            let (me, force) = (self.clone(), drain.force.clone());
            drain.tasks.spawn(async move {
                tokio::select! {
                    _ = me.serve_connection(stream, &held) => {}
                    _ = held.closed.cancelled() => {}
                    _ = force.cancelled() => {}
                }
            });
        }
    }

    /// Length-prefixed questions (RFC 1035 §4.2.2), answered in order, until the client closes or idles out.
    async fn serve_connection(&self, mut stream: TcpStream, held: &slots::Held) {
        loop {
            let read = async {
                let len = stream.read_u16().await? as usize;
                let mut buf = vec![0u8; len];
                stream.read_exact(&mut buf).await?;
                Ok::<_, std::io::Error>(buf)
            };
            let query = match tokio::time::timeout(TCP_REQUEST_TIMEOUT, read).await {
                Ok(Ok(q)) => q,
                _ => return,
            };
            held.answering(true);
            self.rate.wait().await;
            let Some(answer) = self.answer(&query, Transport::Tcp).await else { return };
            let Ok(len) = u16::try_from(answer.len()) else { return };
            let mut framed = Vec::with_capacity(answer.len() + 2);
            framed.extend_from_slice(&len.to_be_bytes());
            framed.extend_from_slice(&answer);
            if stream.write_all(&framed).await.is_err() {
                return;
            }
            held.answering(false);
        }
    }

    /// The encoded answer to one query, or nothing (not a query at all).
    pub async fn answer(&self, bytes: &[u8], transport: Transport) -> Option<Vec<u8>> {
        match self.decide(bytes, transport) {
            Decision::Drop => None,
            Decision::Reply(bytes) => Some(bytes),
            Decision::Forward(f) => self.forward(*f).await,
        }
    }

    /// Everything but forwarding, without waiting: what the UDP loop does inline (a mesh answer costs no task).
    fn decide(&self, bytes: &[u8], transport: Transport) -> Decision {
        let request = match Message::from_vec(bytes) {
            Ok(m) => m,
            Err(_) => return format_error(bytes).map_or(Decision::Drop, Decision::Reply),
        };
        if request.metadata.message_type != MessageType::Query {
            return Decision::Drop;
        }
        let limit = match transport {
            Transport::Tcp => u16::MAX as usize,
            Transport::Udp => match &request.edns {
                Some(e) => e.max_payload().clamp(512, OUR_UDP_PAYLOAD) as usize,
                None => 512,
            },
        };
        let mut response = Message::response(request.metadata.id, request.metadata.op_code);
        response.metadata.recursion_desired = request.metadata.recursion_desired;
        response.metadata.checking_disabled = request.metadata.checking_disabled;
        response.metadata.recursion_available = true;
        response.queries = request.queries.clone();
        let reply = |response: Message| encode(response, &request, limit).map_or(Decision::Drop, Decision::Reply);
        if request.edns.as_ref().is_some_and(|e| e.version() > 0) {
            response.metadata.response_code = ResponseCode::BADVERS;
            return reply(response);
        }
        if request.metadata.op_code != OpCode::Query {
            response.metadata.response_code = ResponseCode::NotImp;
            return reply(response);
        }
        if request.queries.len() != 1 {
            response.metadata.response_code = ResponseCode::FormErr;
            return reply(response);
        }
        let query = &request.queries[0];
        let qtype = query.query_type();
        let (client, found, srv) = {
            let st = self.pi.state.read();
            let client = self.client.resolve(&st);
            let in_class = query.query_class() == hickory_proto::rr::DNSClass::IN;
            let found = match &client {
                Some(c) if matches!(qtype, RecordType::A | RecordType::AAAA) => {
                    Some(lookup::resolve(&st, &self.domains, c, query.name(), qtype))
                }
                _ => None,
            };
            let srv = match &client {
                Some(c) if in_class && qtype == RecordType::SRV => {
                    lookup::resolve_srv(&st, &self.domains, c, query.name())
                }
                _ => None,
            };
            (client, found, srv)
        };
        let labels = metrics::Labels::new(qtype, transport, client.as_deref());
        let metrics = &self.pi.metrics.dns;
        metrics.request(&labels);
        let Some(client) = client else {
            // ztunnel answers SERVFAIL while it does not know the pod's own workload.
            self.log(None, query.name(), qtype, "unknown source", 0);
            response.metadata.response_code = ResponseCode::ServFail;
            return reply(response);
        };
        if let Some(srv) = srv {
            self.log(
                Some(&client),
                query.name(),
                qtype,
                if srv.records.is_empty() { "no records" } else { "success" },
                srv.records.len(),
            );
            response.metadata.authoritative = true;
            let mut owner = query.name().clone();
            if let Some(target) = srv.cname {
                response.answers.push(Record::from_rdata(owner.clone(), TTL, RData::CNAME(CNAME(target.clone()))));
                owner = target;
            }
            // RFC 2782's weights: the records share 100 (CoreDNS's choice for Kubernetes services).
            let weight = u16::try_from(100 / srv.records.len().max(1)).unwrap_or(1).max(1);
            for (port, target) in srv.records {
                response.answers.push(Record::from_rdata(
                    owner.clone(),
                    TTL,
                    RData::SRV(SRV::new(0, weight, port, target)),
                ));
            }
            for (name, ip) in srv.additional {
                response.additionals.push(Record::from_rdata(name, TTL, address_rdata(ip)));
            }
            return reply(response);
        }
        let Some(lookup::Found::Answer { cname, addresses }) = found else {
            if let Some(special) = special_use(query, &mut response) {
                self.log(Some(&client), query.name(), qtype, special, response.answers.len());
                return reply(response);
            }
            if let Some(mut kept) = self.cache.get(&request, Instant::now()) {
                kept.metadata.id = request.metadata.id;
                kept.metadata.recursion_desired = request.metadata.recursion_desired;
                kept.queries = request.queries.clone();
                self.log(Some(&client), query.name(), qtype, "cached", kept.answers.len());
                return reply(kept);
            }
            return Decision::Forward(Box::new(Forward { request, response, limit, labels, client }));
        };
        response.metadata.authoritative = true;
        let mut owner = query.name().clone();
        if let Some(target) = cname {
            response.answers.push(Record::from_rdata(owner.clone(), TTL, RData::CNAME(CNAME(target.clone()))));
            owner = target;
        }
        let result = if addresses.is_empty() { "no records" } else { "success" };
        self.log(Some(&client), query.name(), qtype, result, addresses.len());
        for ip in addresses {
            response.answers.push(Record::from_rdata(owner.clone(), TTL, address_rdata(ip)));
        }
        reply(response)
    }

    /// Ask the upstreams; their answer (the client's header bits kept), or SERVFAIL.
    async fn forward(&self, f: Forward) -> Option<Vec<u8>> {
        let Forward { request, mut response, limit, labels, client } = f;
        let metrics = &self.pi.metrics.dns;
        let query = &request.queries[0];
        metrics.upstream_request(&labels);
        let start = Instant::now();
        let forwarded = self.forwarder.forward(&request).await;
        metrics.upstream_duration(&labels, start.elapsed());
        let out = match forwarded {
            Ok(mut upstream) => {
                self.log(Some(&client), query.name(), query.query_type(), "forwarded", upstream.answers.len());
                self.cache.put(&request, &upstream, Instant::now());
                upstream.metadata.recursion_desired = request.metadata.recursion_desired;
                upstream
            }
            Err(e) => {
                metrics.upstream_failure(&labels);
                let result = format!("forwarding failed ({e})");
                self.log(Some(&client), query.name(), query.query_type(), &result, 0);
                response.metadata.response_code = ResponseCode::ServFail;
                response
            }
        };
        encode(out, &request, limit)
    }

    /// `host` resolved as this server answers its workload (mesh names their VIPs, the special-use names, the cache,
    /// the upstreams): its first IPv4 address, else its first IPv6 one. For the SOCKS5 entry's domain names, as
    /// ztunnel resolves them through its DNS proxy's resolver.
    pub async fn resolve_host(&self, host: &str) -> Result<std::net::IpAddr, String> {
        let name = Name::from_ascii(host).map_err(|e| e.to_string())?;
        let mut last = "no address".to_string();
        for qtype in [RecordType::A, RecordType::AAAA] {
            let mut q = Message::query();
            q.metadata.id = rand::random();
            q.metadata.recursion_desired = true;
            q.queries.push(hickory_proto::op::Query::query(name.clone(), qtype));
            let bytes = q.to_vec().map_err(|e| e.to_string())?;
            let Some(answer) = self.answer(&bytes, Transport::Tcp).await else { continue };
            let answer = Message::from_vec(&answer).map_err(|e| e.to_string())?;
            match answer.metadata.response_code {
                ResponseCode::NoError => {}
                // The name does not exist: no other type will have an address.
                ResponseCode::NXDomain => return Err(format!("{host}: NXDOMAIN")),
                code => {
                    last = format!("{host}: {code}");
                    continue;
                }
            }
            let ip = answer.answers.iter().find_map(|r| match &r.data {
                RData::A(a) => Some(std::net::IpAddr::V4(a.0)),
                RData::AAAA(a) => Some(std::net::IpAddr::V6(a.0)),
                _ => None,
            });
            if let Some(ip) = ip {
                return Ok(ip);
            }
        }
        Err(last)
    }

    /// ztunnel's `dns` debug record: who asked, what, and what came of it.
    fn log(&self, client: Option<&crate::state::Workload>, name: &Name, qtype: RecordType, result: &str, n: usize) {
        let events = &self.pi.events;
        if !events.enabled("dns", Level::Debug) {
            return;
        }
        events.push(crate::events::Event {
            kind: "dns",
            level: Level::Debug,
            message: "dns request".into(),
            fields: fields! {
                "src.workload" => client.map(|w| w.name.as_str()).unwrap_or("unknown"),
                "src.namespace" => client.map(|w| &*w.namespace).unwrap_or("unknown"),
                "query" => qtype.to_string(),
                "domain" => name.to_string(),
                "result" => result,
                "endpoints" => n
            },
        });
    }
}

/// RFC 6761's names a resolver answers without asking anyone (IN class), as hickory's resolver does for ztunnel:
/// `localhost.` and below, and the loopback reverse zones, get the loopback address (A, AAAA), `localhost.` (PTR)
/// or no records; `invalid.` and below NXDOMAIN. Fills `response` and says what it was, or None for any other name.
fn special_use(query: &hickory_proto::op::Query, response: &mut Message) -> Option<&'static str> {
    use hickory_proto::rr::rdata::PTR;
    use std::sync::LazyLock;
    static LOOPBACK: LazyLock<[Name; 3]> = LazyLock::new(|| {
        // ::1's reverse name: 32 nibbles, the lowest first.
        let v6 = format!("1.{}ip6.arpa.", "0.".repeat(31));
        ["localhost.", "127.in-addr.arpa.", v6.as_str()].map(|n| Name::from_ascii(n).expect("a name"))
    });
    static INVALID: LazyLock<Name> = LazyLock::new(|| Name::from_ascii("invalid.").expect("a name"));
    if query.query_class() != hickory_proto::rr::DNSClass::IN {
        return None;
    }
    let name = query.name();
    if INVALID.zone_of(name) {
        response.metadata.response_code = ResponseCode::NXDomain;
        return Some("special-use name (RFC 6761)");
    }
    if !LOOPBACK.iter().any(|z| z.zone_of(name)) {
        return None;
    }
    let rdata = match query.query_type() {
        RecordType::A => Some(RData::A(A(std::net::Ipv4Addr::LOCALHOST))),
        RecordType::AAAA => Some(RData::AAAA(AAAA(std::net::Ipv6Addr::LOCALHOST))),
        RecordType::PTR => Some(RData::PTR(PTR(LOOPBACK[0].clone()))),
        _ => None,
    };
    if let Some(rdata) = rdata {
        response.answers.push(Record::from_rdata(name.clone(), LOCALHOST_TTL, rdata));
    }
    Some("localhost (RFC 6761)")
}

fn address_rdata(ip: std::net::IpAddr) -> RData {
    match ip {
        std::net::IpAddr::V4(v4) => RData::A(A(v4)),
        std::net::IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
    }
}

/// hickory's `MAX_TTL`, what its resolver gives the loopback answers it makes.
const LOCALHOST_TTL: u32 = 86_400;

/// Encode `response` to fit `limit`: when it does not, the question alone with TC set (RFC 1035 §4.1.1, RFC 6891
/// §7), or a SERVFAIL header alone when even the questions do not fit. An OPT record answers a query that had one.
fn encode(mut response: Message, request: &Message, limit: usize) -> Option<Vec<u8>> {
    if request.edns.is_some() {
        let mut edns = Edns::new();
        edns.set_max_payload(OUR_UDP_PAYLOAD);
        edns.set_version(0);
        edns.set_dnssec_ok(request.edns.as_ref().is_some_and(|e| e.flags().dnssec_ok));
        response.edns = Some(edns);
    } else {
        response.edns = None;
    }
    let bytes = response.to_vec().ok()?;
    if bytes.len() <= limit {
        return Some(bytes);
    }
    let truncated = response.truncate();
    let bytes = truncated.to_vec().ok()?;
    if bytes.len() <= limit {
        return Some(bytes);
    }
    // Only many questions (a FORMERR's echo of them) outgrow it (found by fuzz/dns): the header alone, SERVFAIL, as
    // hickory-server (ztunnel's DNS server) answers a response it cannot encode within the size.
    let mut header = Message::response(request.metadata.id, OpCode::Query);
    header.metadata.response_code = ResponseCode::ServFail;
    header.to_vec().ok()
}

/// FORMERR for a query hickory cannot decode, when at least its header can be read (id and opcode echoed).
fn format_error(bytes: &[u8]) -> Option<Vec<u8>> {
    if bytes.len() < 12 || bytes[2] & 0x80 != 0 {
        return None;
    }
    let id = u16::from_be_bytes([bytes[0], bytes[1]]);
    let op = OpCode::from_u8((bytes[2] >> 3) & 0x0f);
    Message::error_msg(id, op, ResponseCode::FormErr).to_vec().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;

    /// A FORMERR echoes every question; truncated, 17 long ones still made a 529-byte UDP reply (found by fuzz/dns).
    /// What does not fit even truncated is a SERVFAIL header alone, as hickory-server (ztunnel's) answers it.
    #[test]
    fn a_reply_too_large_even_truncated_is_a_servfail_header() {
        let mut request = Message::query();
        request.metadata.id = 7;
        for i in 0..17 {
            let name = Name::from_ascii(format!("q{i}-{}.example.com.", "x".repeat(40))).unwrap();
            request.queries.push(Query::query(name, RecordType::A));
        }
        let mut response = Message::response(7, OpCode::Query);
        response.metadata.response_code = ResponseCode::FormErr;
        response.queries = request.queries.clone();
        let bytes = encode(response, &request, 512).expect("encoded");
        assert!(bytes.len() <= 512, "{} bytes", bytes.len());
        let reply = Message::from_vec(&bytes).unwrap();
        assert_eq!(
            (reply.metadata.id, reply.metadata.response_code, reply.queries.len(), reply.answers.len()),
            (7, ResponseCode::ServFail, 0, 0)
        );
        // Questions that fit truncated stay in the reply.
        let mut one = Message::query();
        one.queries.push(request.queries[0].clone());
        let mut response = Message::response(0, OpCode::Query);
        response.queries = one.queries.clone();
        let reply = Message::from_vec(&encode(response, &one, 512).unwrap()).unwrap();
        assert_eq!(reply.queries.len(), 1);
    }

    fn ask(name: &str, qtype: RecordType) -> (Option<&'static str>, Message) {
        let mut response = Message::response(1, OpCode::Query);
        let what = special_use(&Query::query(Name::from_ascii(name).unwrap(), qtype), &mut response);
        (what, response)
    }

    #[test]
    fn localhost_and_invalid_are_answered_here_as_rfc_6761_has_it() {
        let data = |m: &Message| m.answers.iter().map(|r| r.data.to_string()).collect::<Vec<_>>();
        for name in ["localhost.", "LocalHost.", "db.localhost."] {
            let (what, a) = ask(name, RecordType::A);
            assert!(what.is_some(), "{name}");
            assert_eq!(
                (a.metadata.response_code, data(&a)),
                (ResponseCode::NoError, vec!["127.0.0.1".to_string()]),
                "{name}"
            );
        }
        assert_eq!(data(&ask("localhost.", RecordType::AAAA).1), ["::1"]);
        let (_, mx) = ask("localhost.", RecordType::MX);
        assert_eq!(
            (mx.metadata.response_code, mx.answers.len()),
            (ResponseCode::NoError, 0),
            "other types: no records"
        );
        assert_eq!(data(&ask("1.0.0.127.in-addr.arpa.", RecordType::PTR).1), ["localhost."]);
        let v6 = format!("1.{}ip6.arpa.", "0.".repeat(31));
        assert_eq!(data(&ask(&v6, RecordType::PTR).1), ["localhost."]);
        assert_eq!(ask("x.invalid.", RecordType::A).1.metadata.response_code, ResponseCode::NXDomain);
        for other in ["localhost.example.com.", "notlocalhost.", "example.com.", "2.0.0.128.in-addr.arpa."] {
            assert_eq!(ask(other, RecordType::A).0, None, "{other} is forwarded");
        }
    }
}
