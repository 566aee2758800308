//! ZDS: the istio-cni ↔ ztunnel protocol (package istio.workload.zds), and its transport: a Unix
//! SOCK_SEQPACKET socket, one protobuf message per datagram, the pod's netns fd passed with SCM_RIGHTS.
//!
//! Message types are declared with prost's derive (the field numbers below are Istio's; `proto/zds.proto` is the
//! same schema for readers and for TypeScript), so no protoc is needed to build.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use nix::sys::socket::{
    connect, recvmsg, sendmsg, socket, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag,
    SockType, UnixAddr,
};
use prost::Message;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Version {
    NotUsed = 0,
    V1 = 1,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ZdsHello {
    #[prost(enumeration = "Version", tag = "1")]
    pub version: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct WorkloadInfo {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub namespace: String,
    #[prost(string, tag = "3")]
    pub service_account: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AddWorkload {
    #[prost(string, tag = "1")]
    pub uid: String,
    #[prost(message, optional, tag = "2")]
    pub workload_info: Option<WorkloadInfo>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct KeepWorkload {
    #[prost(string, tag = "1")]
    pub uid: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DelWorkload {
    #[prost(string, tag = "2")]
    pub uid: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SnapshotSent {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct WorkloadRequest {
    #[prost(oneof = "workload_request::Payload", tags = "1, 5, 2, 3")]
    pub payload: Option<workload_request::Payload>,
}

pub mod workload_request {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Payload {
        #[prost(message, tag = "1")]
        Add(super::AddWorkload),
        #[prost(message, tag = "5")]
        Keep(super::KeepWorkload),
        #[prost(message, tag = "2")]
        Del(super::DelWorkload),
        #[prost(message, tag = "3")]
        SnapshotSent(super::SnapshotSent),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Ack {
    #[prost(string, tag = "1")]
    pub error: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct WorkloadResponse {
    #[prost(oneof = "workload_response::Payload", tags = "1")]
    pub payload: Option<workload_response::Payload>,
}

pub mod workload_response {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Payload {
        #[prost(message, tag = "1")]
        Ack(super::Ack),
    }
}

/// ztunnel's receive buffer: a request is small; a larger datagram is a protocol error.
const MAX_MESSAGE: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum ZdsError {
    #[error("ZDS I/O: {0}")]
    Io(#[from] io::Error),
    #[error("ZDS protocol error: {0}")]
    Protocol(String),
}

impl From<nix::Error> for ZdsError {
    fn from(e: nix::Error) -> Self {
        ZdsError::Io(io::Error::from(e))
    }
}

/// One received request with the fds that came with it.
pub struct Received {
    pub request: WorkloadRequest,
    pub fds: Vec<OwnedFd>,
}

/// A connected ZDS client socket.
pub struct ZdsConn {
    fd: AsyncFd<OwnedFd>,
}

impl ZdsConn {
    pub async fn connect(path: &Path) -> Result<ZdsConn, ZdsError> {
        let fd =
            socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK, None)?;
        let addr = UnixAddr::new(path)?;
        match connect(fd.as_raw_fd(), &addr) {
            Ok(()) => {}
            Err(nix::Error::EINPROGRESS) | Err(nix::Error::EAGAIN) => {}
            Err(e) => return Err(e.into()),
        }
        // SAFETY: `fd` is an OwnedFd moved into the AsyncFd: it stays open and is the same descriptor for the
        // AsyncFd's whole life.
        let fd = unsafe { AsyncFd::register(fd) }.map_err(|e| ZdsError::Io(io::Error::other(e.to_string())))?;
        // Wait for writability: a non-blocking connect completes then (or reports its error). The readiness is
        // left set: the first send uses it.
        let guard = fd.writable().await?;
        drop(guard);
        if let Some(e) =
            nix::sys::socket::getsockopt(fd.get_ref(), nix::sys::socket::sockopt::SocketError).ok().filter(|e| *e != 0)
        {
            return Err(ZdsError::Io(io::Error::from_raw_os_error(e)));
        }
        Ok(ZdsConn { fd })
    }

    pub async fn send(&self, msg: &impl Message) -> Result<(), ZdsError> {
        let buf = msg.encode_to_vec();
        loop {
            let mut guard = self.fd.writable().await?;
            match guard.try_io(|fd| {
                sendmsg::<()>(fd.as_raw_fd(), &[IoSlice::new(&buf)], &[], MsgFlags::MSG_NOSIGNAL, None)
                    .map_err(io::Error::from)
            }) {
                Ok(r) => {
                    r?;
                    return Ok(());
                }
                Err(_would_block) => continue,
            }
        }
    }

    pub async fn ack(&self, error: Option<String>) -> Result<(), ZdsError> {
        let resp = WorkloadResponse {
            payload: Some(workload_response::Payload::Ack(Ack { error: error.unwrap_or_default() })),
        };
        self.send(&resp).await
    }

    /// Receive one request. Ok(None) when the peer closed the connection.
    pub async fn recv(&self) -> Result<Option<Received>, ZdsError> {
        loop {
            let mut guard = self.fd.ready(Interest::READABLE).await?;
            let res = guard.try_io(|fd| {
                recv_once(fd.as_raw_fd()).map_err(|e| match e {
                    ZdsError::Io(io) => io,
                    other => io::Error::other(other.to_string()),
                })
            });
            match res {
                Ok(Ok(Some((bytes, fds)))) => {
                    let request = WorkloadRequest::decode(bytes.as_slice())
                        .map_err(|e| ZdsError::Protocol(format!("undecodable request: {e}")))?;
                    return Ok(Some(Received { request, fds }));
                }
                Ok(Ok(None)) => return Ok(None),
                Ok(Err(e)) if e.kind() == io::ErrorKind::Other => return Err(ZdsError::Protocol(e.to_string())),
                Ok(Err(e)) => return Err(e.into()),
                Err(_would_block) => continue,
            }
        }
    }
}

type Datagram = (Vec<u8>, Vec<OwnedFd>);

fn recv_once(fd: RawFd) -> Result<Option<Datagram>, ZdsError> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut cmsg = nix::cmsg_space!([RawFd; 2]);
    let mut iov = [IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<()>(fd, &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC)?;
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(received) = c {
            // SAFETY: the kernel just installed these fds in our table; we are their only owner.
            fds.extend(received.into_iter().map(|f| unsafe { OwnedFd::from_raw_fd(f) }));
        }
    }
    if msg.flags.intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC) {
        return Err(ZdsError::Protocol("message or control data truncated".into()));
    }
    let n = msg.bytes;
    if n == 0 && fds.is_empty() {
        return Ok(None);
    }
    buf.truncate(n);
    Ok(Some((buf, fds)))
}

/// Used by tests to play the CNI side.
pub fn send_with_fd(sock: RawFd, msg: &impl Message, fd: Option<RawFd>) -> Result<(), ZdsError> {
    let buf = msg.encode_to_vec();
    let fds: Vec<RawFd> = fd.into_iter().collect();
    let cmsgs: Vec<ControlMessage> = if fds.is_empty() { vec![] } else { vec![ControlMessage::ScmRights(&fds)] };
    sendmsg::<()>(sock, &[IoSlice::new(&buf)], &cmsgs, MsgFlags::empty(), None)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Field numbers are the contract with istio-cni: DelWorkload.uid = 2, WorkloadRequest.keep = 5.
    #[test]
    fn wire_encoding_matches_istio_field_numbers() {
        let del = WorkloadRequest { payload: Some(workload_request::Payload::Del(DelWorkload { uid: "u".into() })) };
        // field 2 (del), length 3, then DelWorkload field 2 (uid), length 1, "u"
        assert_eq!(del.encode_to_vec(), vec![0x12, 0x03, 0x12, 0x01, b'u']);
        let keep = WorkloadRequest { payload: Some(workload_request::Payload::Keep(KeepWorkload { uid: "u".into() })) };
        assert_eq!(keep.encode_to_vec(), vec![0x2a, 0x03, 0x0a, 0x01, b'u']);
        let snap = WorkloadRequest { payload: Some(workload_request::Payload::SnapshotSent(SnapshotSent {})) };
        assert_eq!(snap.encode_to_vec(), vec![0x1a, 0x00]);
        let hello = ZdsHello { version: Version::V1 as i32 };
        assert_eq!(hello.encode_to_vec(), vec![0x08, 0x01]);
        let ack = WorkloadResponse { payload: Some(workload_response::Payload::Ack(Ack { error: String::new() })) };
        assert_eq!(ack.encode_to_vec(), vec![0x0a, 0x00]);
    }
}
