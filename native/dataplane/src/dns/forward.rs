//! Forwarding a question the mesh does not answer to the daemon's upstream resolvers.
//!
//! Upstream sockets come from the server's `SocketFactory`: inside a pod's namespace they carry the in-pod mark, so
//! the pod's DNS capture rules let them out instead of sending them back to 15053. Each upstream is tried in turn
//! over UDP (a fresh socket and a random message id per attempt, answers from another address or with another id or
//! question ignored); an answer with TC set is asked again over TCP. Every attempt is bounded; the whole forward is
//! bounded by `deadline`.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::Message;
use socket2::Domain;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, UdpSocket};

use crate::socket::SocketFactory;

const UDP_ATTEMPT: Duration = Duration::from_secs(2);
const TCP_ATTEMPT: Duration = Duration::from_secs(5);

pub struct Forwarder {
    pub upstreams: Arc<[SocketAddr]>,
    pub sockets: Arc<dyn SocketFactory>,
    pub deadline: Duration,
}

impl Forwarder {
    /// The upstream's answer to `request`, with the client's id restored.
    pub async fn forward(&self, request: &Message) -> Result<Message, String> {
        if self.upstreams.is_empty() {
            return Err("no upstream resolver configured".into());
        }
        match tokio::time::timeout(self.deadline, self.try_all(request)).await {
            Ok(r) => r,
            Err(_) => Err(format!("no upstream answered within {:?}", self.deadline)),
        }
    }

    async fn try_all(&self, request: &Message) -> Result<Message, String> {
        let mut last = String::new();
        for upstream in self.upstreams.iter() {
            match self.ask(*upstream, request).await {
                Ok(mut answer) => {
                    answer.metadata.id = request.metadata.id;
                    return Ok(answer);
                }
                Err(e) => last = format!("{upstream}: {e}"),
            }
        }
        Err(last)
    }

    async fn ask(&self, upstream: SocketAddr, request: &Message) -> io::Result<Message> {
        let mut query = request.clone();
        query.metadata.id = rand::random();
        let bytes = query.to_vec().map_err(io::Error::other)?;
        let answer = match tokio::time::timeout(UDP_ATTEMPT, self.udp(upstream, &bytes, &query)).await {
            Ok(r) => r?,
            Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "no answer over UDP")),
        };
        if !answer.metadata.truncation {
            return Ok(answer);
        }
        match tokio::time::timeout(TCP_ATTEMPT, self.tcp(upstream, &bytes, &query)).await {
            Ok(r) => r,
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "no answer over TCP")),
        }
    }

    async fn udp(&self, upstream: SocketAddr, bytes: &[u8], query: &Message) -> io::Result<Message> {
        let sock = self.sockets.udp(Domain::for_address(upstream))?;
        sock.set_nonblocking(true)?;
        let sock = UdpSocket::from_std(std::net::UdpSocket::from(sock))?;
        sock.connect(upstream).await?;
        sock.send(bytes).await?;
        // An answer over UDP is at most what the query advertised (512 bytes without EDNS); one byte more tells a
        // longer, cut-off datagram from an answer that fits.
        let room = query.edns.as_ref().map_or(512, |e| e.max_payload().max(512)) as usize + 1;
        let mut buf = vec![0u8; room];
        loop {
            let n = sock.recv(&mut buf).await?;
            if let Some(m) = matching(&buf[..n], query) {
                return Ok(m);
            }
        }
    }

    async fn tcp(&self, upstream: SocketAddr, bytes: &[u8], query: &Message) -> io::Result<Message> {
        let sock = self.sockets.tcp(Domain::for_address(upstream))?;
        sock.set_nonblocking(true)?;
        let mut stream = TcpSocket::from_std_stream(sock.into()).connect(upstream).await?;
        let len = u16::try_from(bytes.len()).map_err(io::Error::other)?;
        let mut framed = Vec::with_capacity(bytes.len() + 2);
        framed.extend_from_slice(&len.to_be_bytes());
        framed.extend_from_slice(bytes);
        stream.write_all(&framed).await?;
        loop {
            let len = stream.read_u16().await? as usize;
            let mut buf = vec![0u8; len];
            stream.read_exact(&mut buf).await?;
            if let Some(m) = matching(&buf, query) {
                return Ok(m);
            }
        }
    }
}

/// The bytes decoded, if they are the answer to `query` (same id, a response, same question).
fn matching(bytes: &[u8], query: &Message) -> Option<Message> {
    let m = Message::from_vec(bytes).ok()?;
    let same = m.metadata.id == query.metadata.id
        && m.metadata.message_type == hickory_proto::op::MessageType::Response
        && (m.queries.is_empty() || m.queries == query.queries);
    same.then_some(m)
}
