//! Stand-ins for the in-pod manager's unit tests, none of which needs privileges: a `PodProxies` that binds nothing
//! and records each start, a CNI agent serving ZDS on a SOCK_SEQPACKET socket in a temp directory, and namespace
//! fds that are fds of temp files (the manager only fstat()s a netns fd for its device and inode, so two files are
//! two namespaces and two fds of one file are the same namespace).
//!
//! The tests run on a paused clock. Tokio then moves the clock to the next timer whenever the runtime waits, also
//! while a message is in flight, so the manager's 5 s retry tick fires often; it only touches pending pods. The
//! guard on each wait is virtual time, long enough that only a hang reaches it.

use std::fs::OpenOptions;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use nix::sys::socket::{
    accept4, bind, listen, recv, sendmsg, socket, AddressFamily, Backlog, ControlMessage, MsgFlags, SockFlag, SockType,
    UnixAddr,
};
use parking_lot::{Mutex, RwLock};
use prost::Message;
use serde_json::Value;
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::netns::NetNs;
use super::zds::{
    self, workload_request::Payload, AddWorkload, DelWorkload, KeepWorkload, SnapshotSent, WorkloadInfo,
    WorkloadRequest, ZdsHello,
};
use super::{InPodConfig, OrigSrc, PodProxies, WorkloadManager};
use crate::config::Config;
use crate::drain::Drain;
use crate::events::Events;
use crate::identity::CertStore;
use crate::metrics::Metrics;
use crate::proxy::pool::Pool;
use crate::proxy::ProxyInputs;
use crate::state::State;

/// Virtual time a test waits for one answer before it fails.
const GUARD: Duration = Duration::from_secs(3600);

/// The workload info the tests' pod `uid` is added with.
pub(super) fn info(uid: &str) -> WorkloadInfo {
    WorkloadInfo { name: format!("pod-{uid}"), namespace: "ns1".into(), service_account: "sa1".into() }
}

pub(super) fn add(uid: &str) -> Payload {
    Payload::Add(AddWorkload { uid: uid.into(), workload_info: Some(info(uid)) })
}

pub(super) fn keep(uid: &str) -> Payload {
    Payload::Keep(KeepWorkload { uid: uid.into() })
}

pub(super) fn del(uid: &str) -> Payload {
    Payload::Del(DelWorkload { uid: uid.into() })
}

pub(super) fn snapshot() -> Payload {
    Payload::SnapshotSent(SnapshotSent {})
}

/// Inputs for a manager whose proxies are fakes: only the events and the connection tracker are used.
pub(crate) fn inputs() -> Arc<ProxyInputs> {
    let cfg = Arc::new(Config::default());
    let certs = Arc::new(CertStore::new(crate::tls::provider()));
    let metrics = Arc::new(Metrics::default());
    let events = Arc::new(Events::default());
    let pool = Pool::new(cfg.clone(), certs.clone(), metrics.clone(), events.clone(), Drain::new());
    Arc::new(ProxyInputs {
        cfg,
        state: Arc::new(RwLock::new(State::default())),
        state_changed: Arc::default(),
        certs,
        metrics,
        events,
        pool,
        tracker: Arc::default(),
        denials: Arc::default(),
        sockets: Arc::new(crate::socket::DefaultSockets),
        preserve_source: false,
        silos: crate::silo::Silos::inline(),
        handover: Arc::default(),
        outliers: Arc::default(),
        resets: Arc::default(),
    })
}

/// A temp directory, removed on drop.
pub(super) struct TempDir(PathBuf);

impl TempDir {
    pub(super) fn new(name: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ztn-inpod-{}-{n}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub(super) fn path(&self) -> &PathBuf {
        &self.0
    }

    /// An fd standing for the network namespace `name`: a new fd of the file `name` each call.
    pub(super) fn netns(&self, name: &str) -> OwnedFd {
        let f = OpenOptions::new().create(true).truncate(false).read(true).write(true).open(self.0.join(name)).unwrap();
        f.into()
    }

    /// The (device, inode) the manager records for `netns(name)`.
    pub(super) fn netns_id(&self, name: &str) -> (u64, u64) {
        let m = std::fs::metadata(self.0.join(name)).unwrap();
        (m.dev(), m.ino())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One call of `FakeProxies::start`.
#[derive(Clone)]
pub(super) struct Start {
    pub(super) uid: String,
    pub(super) info: WorkloadInfo,
    pub(super) netns: (u64, u64),
    /// The drain handed to the manager; None when the start failed.
    pub(super) drain: Option<Drain>,
}

/// Proxies that bind nothing: each start is recorded and returns a fresh drain, or fails while `fail_with` is set.
#[derive(Default)]
pub(super) struct FakeProxies {
    fail: Mutex<Option<String>>,
    starts: Mutex<Vec<Start>>,
    changed: Notify,
}

impl FakeProxies {
    pub(super) fn fail_with(&self, error: Option<&str>) {
        *self.fail.lock() = error.map(str::to_string);
    }

    /// Every start of `uid`, failed ones included, in order.
    pub(super) fn starts(&self, uid: &str) -> Vec<Start> {
        self.starts.lock().iter().filter(|s| s.uid == uid).cloned().collect()
    }

    /// The successful starts of `uid`, in order.
    pub(super) fn up(&self, uid: &str) -> Vec<Start> {
        self.starts(uid).into_iter().filter(|s| s.drain.is_some()).collect()
    }

    pub(super) fn total(&self) -> usize {
        self.starts.lock().len()
    }

    /// Wait until `uid` has been started successfully `n` times.
    pub(super) async fn wait_up(&self, uid: &str, n: usize) {
        let wait = async {
            while self.up(uid).len() < n {
                self.changed.notified().await;
            }
        };
        tokio::time::timeout(GUARD, wait).await.unwrap_or_else(|_| panic!("{uid} was not started {n} times"));
    }
}

impl PodProxies for FakeProxies {
    fn start<'a>(
        &'a self,
        uid: &'a str,
        info: &'a WorkloadInfo,
        netns: Arc<NetNs>,
    ) -> BoxFuture<'a, Result<Drain, String>> {
        Box::pin(async move {
            let result = match self.fail.lock().clone() {
                Some(e) => Err(e),
                None => Ok(Drain::new()),
            };
            let drain = result.as_ref().ok().cloned();
            self.starts.lock().push(Start { uid: uid.into(), info: info.clone(), netns: netns.id, drain });
            self.changed.notify_one();
            result
        })
    }
}

/// Whether a pod's drain has been triggered (the manager stopped its proxies).
pub(super) fn drained(s: &Start) -> bool {
    let d = s.drain.as_ref().expect("a successful start");
    d.graceful.is_cancelled() && d.force.is_cancelled()
}

/// The CNI agent's side: listens where the manager connects.
pub(super) struct FakeCni {
    pub(super) dir: TempDir,
    listener: Option<AsyncFd<OwnedFd>>,
}

impl FakeCni {
    /// A directory for the socket, not listened on yet.
    pub(super) fn new(name: &str) -> FakeCni {
        FakeCni { dir: TempDir::new(name), listener: None }
    }

    pub(super) fn uds(&self) -> PathBuf {
        self.dir.path().join("zds.sock")
    }

    pub(super) fn listen(&mut self) {
        let fd =
            socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK, None)
                .unwrap();
        bind(fd.as_raw_fd(), &UnixAddr::new(&self.uds()).unwrap()).unwrap();
        listen(&fd, Backlog::new(8).unwrap()).unwrap();
        self.listener = Some(register(fd));
    }

    /// Accept the manager's next connection and read its hello.
    pub(super) async fn accept(&self) -> CniConn {
        let listener = self.listener.as_ref().expect("listening");
        let accept = async {
            loop {
                let mut guard = listener.readable().await.unwrap();
                let flags = SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK;
                if let Ok(r) = guard.try_io(|fd| accept4(fd.as_raw_fd(), flags).map_err(io::Error::from)) {
                    // SAFETY: accept4 just returned this fd; nothing else owns it.
                    return unsafe { OwnedFd::from_raw_fd(r.unwrap()) };
                }
            }
        };
        let fd = tokio::time::timeout(GUARD, accept).await.expect("the manager connects");
        let conn = CniConn { fd: register(fd) };
        let hello = conn.recv().await.expect("a hello");
        assert_eq!(ZdsHello::decode(hello.as_slice()).unwrap(), ZdsHello { version: zds::Version::V1 as i32 });
        conn
    }
}

fn register(fd: OwnedFd) -> AsyncFd<OwnedFd> {
    // SAFETY: the OwnedFd moves into the AsyncFd: it stays open and is the same descriptor for the AsyncFd's life.
    unsafe { AsyncFd::register(fd) }.unwrap_or_else(|e| panic!("registering an fd with the reactor: {e}"))
}

/// One connection from the manager, as the agent sees it.
pub(super) struct CniConn {
    fd: AsyncFd<OwnedFd>,
}

impl CniConn {
    /// Send one datagram with `fds` attached.
    pub(super) fn send_raw(&self, bytes: &[u8], fds: &[&OwnedFd]) {
        let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let cmsgs: Vec<ControlMessage> = if raw.is_empty() { vec![] } else { vec![ControlMessage::ScmRights(&raw)] };
        sendmsg::<()>(self.fd.as_raw_fd(), &[IoSlice::new(bytes)], &cmsgs, MsgFlags::empty(), None).unwrap();
    }

    pub(super) fn send(&self, payload: Payload, fds: &[&OwnedFd]) {
        self.send_raw(&WorkloadRequest { payload: Some(payload) }.encode_to_vec(), fds);
    }

    /// The next datagram from the manager; None when it closed the connection.
    pub(super) async fn recv(&self) -> Option<Vec<u8>> {
        let read = async {
            loop {
                let mut guard = self.fd.readable().await.unwrap();
                let mut buf = vec![0u8; 1024];
                if let Ok(r) =
                    guard.try_io(|fd| recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()).map_err(io::Error::from))
                {
                    let n = r.unwrap();
                    buf.truncate(n);
                    return (n > 0).then_some(buf);
                }
            }
        };
        tokio::time::timeout(GUARD, read).await.expect("the manager answers or closes")
    }

    /// The next ack's error text ("" for success).
    pub(super) async fn ack(&self) -> String {
        let bytes = self.recv().await.expect("an ack, not the end of the connection");
        match zds::WorkloadResponse::decode(bytes.as_slice()).unwrap().payload {
            Some(zds::workload_response::Payload::Ack(a)) => a.error,
            None => panic!("a response without an ack"),
        }
    }

    /// Send a request and return its ack's error text.
    pub(super) async fn request(&self, payload: Payload, fds: &[&OwnedFd]) -> String {
        self.send(payload, fds);
        self.ack().await
    }

    /// The manager ends the connection with nothing more sent.
    pub(super) async fn closed(&self) {
        if let Some(more) = self.recv().await {
            panic!("expected the connection to end, got {more:?}");
        }
    }
}

/// A manager with fake proxies, running against a fake CNI agent.
pub(super) struct Harness {
    pub(super) mgr: Arc<WorkloadManager>,
    pub(super) proxies: Arc<FakeProxies>,
    pub(super) cni: FakeCni,
    drain: Drain,
    task: Option<JoinHandle<()>>,
}

impl Harness {
    /// A manager not running yet, with the agent listening.
    pub(super) fn new(name: &str) -> Harness {
        let mut cni = FakeCni::new(name);
        cni.listen();
        Harness::with_cni(cni)
    }

    pub(super) fn with_cni(cni: FakeCni) -> Harness {
        let cfg =
            InPodConfig { uds: cni.uds(), mark: 0, reuse_port: false, orig_src: OrigSrc::Never, dedicated: false };
        let proxies = Arc::new(FakeProxies::default());
        let drain = Drain::new();
        let mgr = WorkloadManager::with_proxies(inputs(), cfg, drain.clone(), proxies.clone());
        Harness { mgr, proxies, cni, drain, task: None }
    }

    /// Start the manager's connection loop.
    pub(super) fn run(&mut self) {
        self.task = Some(tokio::spawn(self.mgr.clone().run()));
    }

    /// A new manager running, and its first connection accepted.
    pub(super) async fn connected(name: &str) -> (Harness, CniConn) {
        let mut h = Harness::new(name);
        h.run();
        let c = h.cni.accept().await;
        (h, c)
    }

    /// The admin view, without connections.
    pub(super) fn state(&self) -> Value {
        serde_json::from_str(&self.mgr.state_json(false)).unwrap()
    }

    /// A pod's entry in the admin view (Null when the manager does not have it).
    pub(super) fn pod(&self, uid: &str) -> Value {
        self.state()["workloads"][uid].clone()
    }

    /// Drain the daemon: the connection loop ends.
    pub(super) async fn stop(mut self) {
        self.drain.graceful.cancel();
        if let Some(task) = self.task.take() {
            tokio::time::timeout(GUARD, task).await.expect("run ends with the daemon's drain").unwrap();
        }
    }
}
