//! The hand-over protocol's framing over a Unix stream socket: a 12-byte header (`ZTHO`, the frame's kind, how many
//! descriptors ride with it, the payload's length), the descriptors as SCM_RIGHTS on the header's bytes, then the
//! payload. Blocking I/O: a hand-over is one short exchange, run on a blocking thread.
//!
//! The descriptors are read only with a header: a header is read exactly (and a payload exactly), so one read never
//! reaches into the next frame, whose descriptors the kernel hands to the read that first touches it.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

const MAGIC: &[u8; 4] = b"ZTHO";
const HEADER: usize = 12;
/// At most this many descriptors per frame: the kernel's limit per message is 253 (SCM_MAX_FD), and a connection
/// carries two.
pub const MAX_FDS: usize = 252;
/// A payload larger than this is a protocol error (a batch's is its connections' metadata and at most two read
/// buffers each).
pub const MAX_PAYLOAD: usize = 256 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Both ways, first: `{version, pid}`.
    Hello = 1,
    /// The predecessor will not hand over: `{reason}`.
    Refuse = 2,
    /// Paused connections: their descriptors (two each), where each leg is and its pending bytes (and the metadata
    /// of those not described before).
    Conn = 3,
    /// Predecessor: that was all, `{count}`.
    Offered = 4,
    /// Successor: all taken in, none started, `{count}`.
    Ready = 5,
    /// Predecessor: they are yours.
    Commit = 6,
    /// Successor: taken (sent before it starts any of them).
    Committed = 7,
    /// Either side gives up: `{reason}`.
    Abort = 8,
    /// Connections described before the pause: their metadata by id, no descriptors.
    Meta = 9,
    /// One paused HBONE connection: its TCP socket and its streams' application sockets, its TLS and HTTP/2 state,
    /// the bytes read and not processed, and each stream's metadata and pending bytes. A successor that does not
    /// know this kind fails the exchange, and the predecessor keeps everything.
    Hbone = 10,
    /// Predecessor, in waves (both Hellos said `waves`): the last wave was committed, nothing more comes.
    Done = 11,
    /// Successor, in waves, after each `Committed`: the wave's connections run here (or `START_WAIT` passed); the
    /// predecessor pauses the next wave only then.
    Started = 12,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        use Kind::*;
        [Hello, Refuse, Conn, Offered, Ready, Commit, Committed, Abort, Meta, Hbone, Done, Started]
            .into_iter()
            .find(|k| *k as u8 == b)
    }
}

pub struct Frame {
    pub kind: Kind,
    pub fds: Vec<OwnedFd>,
    pub payload: Vec<u8>,
}

pub fn send(sock: &UnixStream, kind: Kind, fds: &[RawFd], payload: &[u8]) -> io::Result<()> {
    if fds.len() > MAX_FDS || payload.len() > MAX_PAYLOAD {
        return Err(io::Error::other("hand-over frame too large"));
    }
    let mut header = [0u8; HEADER];
    header[..4].copy_from_slice(MAGIC);
    header[4] = kind as u8;
    header[5] = fds.len() as u8;
    header[8..].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    let cmsgs: Vec<ControlMessage> = if fds.is_empty() { vec![] } else { vec![ControlMessage::ScmRights(fds)] };
    let total = HEADER + payload.len();
    let sent = loop {
        match sendmsg::<()>(
            sock.as_raw_fd(),
            &[IoSlice::new(&header), IoSlice::new(payload)],
            &cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(n) => break n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    // A signal can cut a blocking send short; the descriptors went with its first byte.
    if sent < total {
        let mut rest = Vec::with_capacity(total - sent);
        rest.extend_from_slice(&header[sent.min(HEADER)..]);
        rest.extend_from_slice(&payload[sent.saturating_sub(HEADER)..]);
        (&*sock).write_all(&rest)?;
    }
    Ok(())
}

/// The next frame; `None` at a clean end of stream (between frames).
pub fn recv(sock: &UnixStream) -> io::Result<Option<Frame>> {
    let mut header = [0u8; HEADER];
    let mut cmsg = nix::cmsg_space!([RawFd; MAX_FDS]);
    let (n, fds, truncated) = loop {
        let mut iov = [IoSliceMut::new(&mut header)];
        match recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC) {
            Ok(msg) => {
                let mut fds = Vec::new();
                for c in msg.cmsgs()? {
                    if let ControlMessageOwned::ScmRights(received) = c {
                        // SAFETY: the kernel just installed these descriptors in our table; we are their only owner.
                        fds.extend(received.into_iter().map(|f| unsafe { OwnedFd::from_raw_fd(f) }));
                    }
                }
                break (msg.bytes, fds, msg.flags.contains(MsgFlags::MSG_CTRUNC));
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    if truncated {
        return Err(io::Error::other("hand-over frame carried more descriptors than allowed"));
    }
    if n == 0 {
        return if fds.is_empty() { Ok(None) } else { Err(io::Error::other("descriptors without a frame")) };
    }
    if n < HEADER {
        (&*sock).read_exact(&mut header[n..])?;
    }
    if &header[..4] != MAGIC {
        return Err(io::Error::other("not a hand-over frame"));
    }
    let kind = Kind::from_u8(header[4]).ok_or_else(|| io::Error::other(format!("unknown frame kind {}", header[4])))?;
    if fds.len() != header[5] as usize {
        return Err(io::Error::other("the frame's descriptors do not match its header"));
    }
    let len = u32::from_le_bytes([header[8], header[9], header[10], header[11]]) as usize;
    if len > MAX_PAYLOAD {
        return Err(io::Error::other(format!("hand-over frame of {len} bytes")));
    }
    let mut payload = vec![0u8; len];
    (&*sock).read_exact(&mut payload)?;
    Ok(Some(Frame { kind, fds, payload }))
}

/// The uid and pid of the process at the other end.
pub fn peer(sock: &UnixStream) -> io::Result<(u32, i32)> {
    let c = nix::sys::socket::getsockopt(sock, nix::sys::socket::sockopt::PeerCredentials)?;
    Ok((c.uid(), c.pid()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_carry_descriptors_and_payloads_in_order() {
        let (a, b) = UnixStream::pair().unwrap();
        let (x, _y) = UnixStream::pair().unwrap();
        // Read as it comes: the large frame is more than the socket buffers hold.
        let recv_all = std::thread::spawn(move || {
            let mut got = Vec::new();
            while let Some(f) = recv(&b).unwrap() {
                got.push((f.kind, f.fds.len(), f.payload.len()));
            }
            got
        });
        send(&a, Kind::Hello, &[], b"{}").unwrap();
        let big = vec![7u8; 300_000];
        send(&a, Kind::Conn, &[x.as_raw_fd(), x.as_raw_fd()], &big).unwrap();
        send(&a, Kind::Commit, &[], b"").unwrap();
        drop(a);
        assert_eq!(recv_all.join().unwrap(), vec![(Kind::Hello, 0, 2), (Kind::Conn, 2, 300_000), (Kind::Commit, 0, 0)]);
    }

    #[test]
    fn garbage_is_a_protocol_error() {
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(b"GET / HTTP/1.1\r\n").unwrap();
        assert!(recv(&b).is_err());
        let (uid, pid) = peer(&b).unwrap();
        // SAFETY: geteuid has no preconditions.
        assert_eq!((uid, pid), (unsafe { nix::libc::geteuid() }, std::process::id() as i32));
    }
}
