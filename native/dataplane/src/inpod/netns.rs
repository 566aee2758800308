//! Network namespaces: creating sockets inside a pod's namespace from a daemon that lives in the node's.
//!
//! Invariant: `NetNs::run` switches only the calling thread (setns is per thread), runs a short synchronous
//! closure, and switches back before returning. A socket keeps the namespace it was created in, so listeners and
//! upstream sockets made inside `run` stay in the pod while the thread moves on. If switching back fails the thread
//! would keep serving other tasks in the wrong namespace, so that is a panic, not an error.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use nix::sched::{setns, CloneFlags};
use socket2::{Domain, Protocol, Socket, Type};

use crate::socket::SocketFactory;

#[derive(Debug)]
pub struct NetNs {
    file: File,
    /// (device, inode) of the namespace: two fds name the same namespace iff these are equal.
    pub id: (u64, u64),
}

impl NetNs {
    pub fn from_fd(fd: OwnedFd) -> io::Result<NetNs> {
        let file = File::from(fd);
        let meta = file.metadata()?;
        Ok(NetNs { id: (meta.dev(), meta.ino()), file })
    }

    pub fn open(path: &str) -> io::Result<NetNs> {
        NetNs::from_fd(File::open(path)?.into())
    }

    /// The calling thread's current namespace.
    pub fn current() -> io::Result<NetNs> {
        NetNs::open("/proc/thread-self/ns/net")
    }

    pub fn run<T>(&self, f: impl FnOnce() -> T) -> io::Result<T> {
        let original = NetNs::current()?;
        if original.id == self.id {
            return Ok(f());
        }
        setns(self.file.as_fd(), CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
        let out = f();
        if let Err(e) = setns(original.file.as_fd(), CloneFlags::CLONE_NEWNET) {
            panic!("cannot return to the daemon's network namespace: {e}");
        }
        Ok(out)
    }
}

/// Sockets inside a pod's namespace, carrying the in-pod mark so the pod's redirection rules skip them.
pub struct InPodSockets {
    pub netns: Arc<NetNs>,
    pub mark: u32,
}

impl SocketFactory for InPodSockets {
    fn tcp(&self, domain: Domain) -> io::Result<Socket> {
        self.marked(domain, Type::STREAM, Protocol::TCP)
    }
    fn udp(&self, domain: Domain) -> io::Result<Socket> {
        self.marked(domain, Type::DGRAM, Protocol::UDP)
    }
}

impl InPodSockets {
    fn marked(&self, domain: Domain, ty: Type, proto: Protocol) -> io::Result<Socket> {
        let sock = self.netns.run(|| Socket::new(domain, ty, Some(proto)))??;
        if self.mark != 0 {
            sock.set_mark(self.mark)?;
        }
        Ok(sock)
    }
}
