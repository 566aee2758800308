//! The ZDS session (inpod/protocol.rs) as istio-cni drives it: a sequence of datagrams of any bytes, each with 0 to
//! 2 namespace fds, sent over a real SOCK_SEQPACKET connection to a `WorkloadManager` whose pod proxies bind
//! nothing (as in the session's unit tests). Every datagram goes through prost's decoding and then the session, so
//! the fuzzer explores request sequences, not one message's codec (issue #30).
//!
//! Checked against a model of the protocol (inpod/mod.rs's invariants) after every request: each request of a known
//! type is acked, with the error text the session gives; a protocol error ends the connection; the manager holds
//! exactly the model's pods, up or pending, each up pod with exactly one running start in the namespace its last add
//! carried, and every pod it no longer holds stopped; it is ready once the snapshot arrived and no pod is pending.
//!
//! Input: records of `[control, length, length bytes]`. `control` bits 0-1: the number of fds (3 counts as 2);
//! bit 2: the first fd is namespace B, not A; bit 3: the second fd likewise; bit 4: the datagram is padded past the
//! 1024 bytes a request may have. A pod whose uid ends with `!` fails to start.

#![no_main]

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::IoSlice;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use dataplane::config::Config;
use dataplane::drain::Drain;
use dataplane::events::Events;
use dataplane::identity::CertStore;
use dataplane::inpod::netns::NetNs;
use dataplane::inpod::zds::{self, workload_request::Payload, WorkloadInfo, WorkloadRequest};
use dataplane::inpod::{InPodConfig, OrigSrc, PodProxies, WorkloadManager};
use dataplane::metrics::Metrics;
use dataplane::proxy::pool::Pool;
use dataplane::proxy::ProxyInputs;
use dataplane::state::State;
use futures_util::future::BoxFuture;
use libfuzzer_sys::fuzz_target;
use nix::sys::socket::{
    accept4, bind, listen, recv, sendmsg, socket, AddressFamily, Backlog, ControlMessage, MsgFlags, SockFlag, SockType,
    UnixAddr,
};
use parking_lot::Mutex;
use prost::Message;
use tokio::io::unix::AsyncFd;

/// Requests per input: a session's worth, and a bound on one run's time.
const MAX_REQUESTS: usize = 24;
/// Virtual time (the clock is paused) to wait for an answer: only a hang reaches it.
const GUARD: Duration = Duration::from_secs(3600);

/// The process's runtime, directory and two namespace files ("A" and "B": two files are two namespaces).
struct Env {
    rt: tokio::runtime::Runtime,
    dir: PathBuf,
    netns_id: [(u64, u64); 2],
}

fn env_dir() -> PathBuf {
    std::env::temp_dir().join(format!("ztn-fuzz-zds-{}", std::process::id()))
}

/// A static is never dropped: the directory goes when libFuzzer exits at the end of its run (a crash aborts and
/// leaves it, with the rest of the evidence).
extern "C" fn remove_env_dir() {
    let _ = std::fs::remove_dir_all(env_dir());
}

static ENV: LazyLock<Env> = LazyLock::new(|| {
    // Paused: the manager's 5 s retry tick and reconnect backoff cost no real time, and a hang trips GUARD at once.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
    let dir = env_dir();
    std::fs::create_dir_all(&dir).unwrap();
    // SAFETY: registers a plain function with no state.
    unsafe { nix::libc::atexit(remove_env_dir) };
    let netns_id = ["ns-a", "ns-b"].map(|n| {
        std::fs::write(dir.join(n), b"").unwrap();
        let m = std::fs::metadata(dir.join(n)).unwrap();
        (m.dev(), m.ino())
    });
    Env { rt, dir, netns_id }
});

fn netns_fd(i: usize) -> OwnedFd {
    let name = ["ns-a", "ns-b"][i];
    OpenOptions::new().read(true).open(ENV.dir.join(name)).unwrap().into()
}

/// One start of a pod's proxies: its namespace, and its drain when it started.
struct Start {
    uid: String,
    netns: (u64, u64),
    drain: Option<Drain>,
}

/// Proxies that bind nothing and record each start; a uid ending with `!` fails.
#[derive(Default)]
struct FakeProxies {
    starts: Mutex<Vec<Start>>,
}

impl PodProxies for FakeProxies {
    fn start<'a>(
        &'a self,
        uid: &'a str,
        _info: &'a WorkloadInfo,
        netns: Arc<NetNs>,
    ) -> BoxFuture<'a, Result<Drain, String>> {
        Box::pin(async move {
            let result = if uid.ends_with('!') { Err(format!("{uid} cannot start")) } else { Ok(Drain::new()) };
            let drain = result.as_ref().ok().cloned();
            self.starts.lock().push(Start { uid: uid.into(), netns: netns.id, drain });
            result
        })
    }
}

fn inputs() -> Arc<ProxyInputs> {
    let cfg = Arc::new(Config::default());
    let certs = Arc::new(CertStore::new(dataplane::tls::provider()));
    let metrics = Arc::new(Metrics::default());
    // Nothing is reported: the manager's log lines are not what is under test, and the queue would only fill.
    let events = Arc::new(Events::default());
    events.set_min_levels(u8::MAX, u8::MAX);
    let pool = Pool::new(cfg.clone(), certs.clone(), metrics.clone(), events.clone(), Drain::new());
    Arc::new(ProxyInputs {
        cfg,
        state: Arc::new(parking_lot::RwLock::new(State::default())),
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
    })
}

/// The agent's side of one connection.
struct Conn(AsyncFd<OwnedFd>);

impl Conn {
    fn send(&self, bytes: &[u8], fds: &[OwnedFd]) {
        let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let cmsgs: Vec<ControlMessage> = if raw.is_empty() { vec![] } else { vec![ControlMessage::ScmRights(&raw)] };
        sendmsg::<()>(self.0.as_raw_fd(), &[IoSlice::new(bytes)], &cmsgs, MsgFlags::empty(), None).unwrap();
    }

    /// The manager's next datagram; None once it closed the connection.
    async fn recv(&self) -> Option<Vec<u8>> {
        let read = async {
            loop {
                let mut guard = self.0.readable().await.unwrap();
                let mut buf = vec![0u8; 2048];
                let r = guard.try_io(|fd| recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()).map_err(Into::into));
                if let Ok(r) = r {
                    let n = r.unwrap();
                    buf.truncate(n);
                    return (n > 0).then_some(buf);
                }
            }
        };
        tokio::time::timeout(GUARD, read).await.expect("the manager answers or closes")
    }
}

fn register(fd: OwnedFd) -> AsyncFd<OwnedFd> {
    // SAFETY: the OwnedFd moves into the AsyncFd: it stays open and is the same descriptor for the AsyncFd's life.
    unsafe { AsyncFd::register(fd) }.unwrap()
}

async fn accept(listener: &AsyncFd<OwnedFd>) -> Conn {
    let accept = async {
        loop {
            let mut guard = listener.readable().await.unwrap();
            let flags = SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK;
            if let Ok(r) = guard.try_io(|fd| accept4(fd.as_raw_fd(), flags).map_err(Into::into)) {
                // SAFETY: accept4 just returned this fd; nothing else owns it.
                return unsafe { OwnedFd::from_raw_fd(r.unwrap()) };
            }
        }
    };
    let fd = tokio::time::timeout(GUARD, accept).await.expect("the manager connects");
    let conn = Conn(register(fd));
    let hello = conn.recv().await.expect("a hello");
    assert_eq!(zds::ZdsHello::decode(hello.as_slice()).unwrap().version, zds::Version::V1 as i32);
    conn
}

/// One datagram from the input.
struct Request {
    bytes: Vec<u8>,
    /// Indexes of the namespace files attached.
    fds: Vec<usize>,
}

fn requests(mut data: &[u8]) -> Vec<Request> {
    let mut out = Vec::new();
    while let [control, len, rest @ ..] = data {
        let n = (*len as usize).min(rest.len());
        let mut bytes = rest[..n].to_vec();
        data = &rest[n..];
        if control & 0x10 != 0 {
            bytes.resize(1100, 0);
        }
        let fds = [(control >> 2) & 1, (control >> 3) & 1].map(usize::from);
        out.push(Request { bytes, fds: fds[..(control & 3).min(2) as usize].to_vec() });
        if out.len() == MAX_REQUESTS {
            break;
        }
    }
    out
}

/// What the model expects of one request: its ack (None: none), and whether the connection then ends.
struct Expect {
    ack: Option<String>,
    ends: bool,
}

/// The protocol's state, as inpod/mod.rs states its invariants.
#[derive(Default)]
struct Model {
    /// uid → (namespace index, up).
    pods: BTreeMap<String, (usize, bool)>,
    named: BTreeSet<String>,
    snapshot: bool,
}

impl Model {
    fn step(&mut self, r: &Request) -> Expect {
        let close = Expect { ack: None, ends: true };
        let nack = |e: String| Expect { ack: Some(e), ends: true };
        let ok = Expect { ack: Some(String::new()), ends: false };
        if r.bytes.len() > 1024 {
            return close;
        }
        if r.bytes.is_empty() && r.fds.is_empty() {
            // A datagram of nothing reads as the end of the connection.
            return close;
        }
        let Ok(WorkloadRequest { payload: Some(payload) }) = WorkloadRequest::decode(r.bytes.as_slice()) else {
            return close;
        };
        match payload {
            Payload::Add(add) => {
                if r.fds.len() != 1 {
                    return nack(format!("add for {} carries {} fds, want exactly one", add.uid, r.fds.len()));
                }
                if add.workload_info.is_none() {
                    return nack("add without workload_info".into());
                }
                self.named.insert(add.uid.clone());
                let up = !add.uid.ends_with('!');
                let ack = if up { String::new() } else { format!("{} cannot start", add.uid) };
                self.pods.insert(add.uid, (r.fds[0], up));
                Expect { ack: Some(ack), ends: false }
            }
            Payload::Keep(_) if self.snapshot => nack("keep after snapshot_sent".into()),
            Payload::Keep(keep) => {
                self.named.insert(keep.uid);
                ok
            }
            Payload::Del(del) => {
                if self.snapshot {
                    self.pods.remove(&del.uid);
                } else {
                    self.named.remove(&del.uid);
                }
                ok
            }
            Payload::SnapshotSent(_) if self.snapshot => nack("second snapshot_sent".into()),
            Payload::SnapshotSent(_) => {
                self.snapshot = true;
                let named = &self.named;
                self.pods.retain(|uid, _| named.contains(uid));
                ok
            }
        }
    }
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

async fn session(data: &[u8]) {
    let env = &*ENV;
    let uds = env.dir.join(format!("zds-{}.sock", NEXT.fetch_add(1, Ordering::Relaxed)));
    let fd = socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK, None)
        .unwrap();
    bind(fd.as_raw_fd(), &UnixAddr::new(&uds).unwrap()).unwrap();
    listen(&fd, Backlog::new(8).unwrap()).unwrap();
    let listener = register(fd);

    let cfg = InPodConfig { uds: uds.clone(), mark: 0, reuse_port: false, orig_src: OrigSrc::Never, dedicated: false };
    let proxies = Arc::new(FakeProxies::default());
    let drain = Drain::new();
    let mgr = WorkloadManager::with_proxies(inputs(), cfg, drain.clone(), proxies.clone());
    let task = tokio::spawn(mgr.clone().run());
    let conn = accept(&listener).await;

    let mut model = Model::default();
    for (i, r) in requests(data).iter().enumerate() {
        let want = model.step(r);
        conn.send(&r.bytes, &r.fds.iter().map(|&n| netns_fd(n)).collect::<Vec<_>>());
        let got = match &want.ack {
            None => None,
            Some(_) => {
                let bytes = conn.recv().await.unwrap_or_else(|| panic!("request {i}: closed without an ack"));
                match zds::WorkloadResponse::decode(bytes.as_slice()).unwrap().payload {
                    Some(zds::workload_response::Payload::Ack(a)) => Some(a.error),
                    None => panic!("request {i}: a response without an ack"),
                }
            }
        };
        assert_eq!(got, want.ack, "request {i}");
        if want.ends {
            if let Some(more) = conn.recv().await {
                panic!("request {i}: the connection goes on, with {more:?}");
            }
            break;
        }
        check(&mgr, &proxies, &model, env, i);
    }

    drain.graceful.cancel();
    tokio::time::timeout(GUARD, task).await.expect("run ends with the daemon's drain").unwrap();
    let _ = std::fs::remove_file(&uds);
}

/// The manager holds the model's pods: up ones running once, in the namespace their last add carried.
fn check(mgr: &WorkloadManager, proxies: &FakeProxies, model: &Model, env: &Env, i: usize) {
    let st: serde_json::Value = serde_json::from_str(&mgr.state_json(false)).unwrap();
    let held: BTreeMap<&str, bool> =
        st["workloads"].as_object().unwrap().iter().map(|(u, p)| (u.as_str(), p["state"] == "Up")).collect();
    let want: BTreeMap<&str, bool> = model.pods.iter().map(|(u, (_, up))| (u.as_str(), *up)).collect();
    assert_eq!(held, want, "after request {i}");
    let ready = model.snapshot && model.pods.values().all(|(_, up)| *up);
    assert_eq!((&st["snapshotReceived"], &st["ready"]), (&model.snapshot.into(), &ready.into()), "after request {i}");
    let starts = proxies.starts.lock();
    let running = |uid: &str| -> Vec<&Start> {
        starts.iter().filter(|s| s.uid == uid && s.drain.as_ref().is_some_and(|d| !d.graceful.is_cancelled())).collect()
    };
    for (uid, (ns, up)) in &model.pods {
        let running = running(uid);
        if *up {
            assert_eq!(running.len(), 1, "{uid:?} runs once after request {i}");
            assert_eq!(running[0].netns, env.netns_id[*ns], "{uid:?} in its namespace after request {i}");
        } else {
            assert!(running.is_empty(), "{uid:?} failed to start, yet runs, after request {i}");
        }
    }
    for s in starts.iter().filter(|s| !model.pods.contains_key(&s.uid)) {
        assert!(running(&s.uid).is_empty(), "{:?} is stopped after request {i}", s.uid);
    }
}

fuzz_target!(|data: &[u8]| {
    ENV.rt.block_on(session(data));
});
