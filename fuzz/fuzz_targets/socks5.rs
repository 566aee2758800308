//! The SOCKS5 greeting and CONNECT request a local client sends (`socks5::handshake`), as any bytes over an
//! in-memory stream whose write side then closes. Checked against a model of RFC 1928 written here from the
//! specification: the same destination or the same refusal (and reply code), the same method selection written
//! back, and not one byte read past the request (the proxy's invariant: nothing is forwarded before the reply).

#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::LazyLock;
use std::time::Duration;

use dataplane::proxy::socks5::{handshake, reply, Target};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The longest request: greeting (2 + 255 methods), request head (4), a 255-byte name with its length, port (2).
/// A few bytes more show that what follows the request is left unread.
const MAX_INPUT: usize = 2 + 255 + 4 + 1 + 255 + 2 + 8;

static RT: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    // Paused: a handshake that waits for input that never comes trips the timeout at once, not after real time.
    tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap()
});

/// What the handshake should make of `b`: the destination and the request's length, or a refusal's reply code
/// (None: no reply, the connection is simply closed) and the bytes read.
type Outcome = Result<(Target, usize), Option<u8>>;

/// RFC 1928 over a slice: running out of bytes is a refusal without a reply.
fn model(b: &[u8]) -> Outcome {
    let at = |i: usize| b.get(i).copied().ok_or(None);
    if at(0)? != 5 {
        return Err(None);
    }
    let n = at(1)? as usize;
    let methods = b.get(2..2 + n).ok_or(None)?;
    if !methods.contains(&0) {
        return Err(None);
    }
    let r = 2 + n;
    // VER CMD RSV ATYP, read whole before any is judged.
    let req = b.get(r..r + 4).ok_or(None)?;
    if req[0] != 5 {
        return Err(None);
    }
    if req[1] != 1 {
        return Err(Some(reply::COMMAND_NOT_SUPPORTED));
    }
    let a = r + 4;
    let (host, port_at): (Result<IpAddr, &[u8]>, usize) = match req[3] {
        1 => (Ok(Ipv4Addr::from(<[u8; 4]>::try_from(b.get(a..a + 4).ok_or(None)?).unwrap()).into()), a + 4),
        4 => (Ok(Ipv6Addr::from(<[u8; 16]>::try_from(b.get(a..a + 16).ok_or(None)?).unwrap()).into()), a + 16),
        3 => {
            let len = at(a)? as usize;
            (Err(b.get(a + 1..a + 1 + len).ok_or(None)?), a + 1 + len)
        }
        _ => return Err(Some(reply::ADDRESS_TYPE_NOT_SUPPORTED)),
    };
    let port = u16::from_be_bytes(b.get(port_at..port_at + 2).ok_or(None)?.try_into().unwrap());
    if port == 0 {
        return Err(Some(reply::NOT_ALLOWED));
    }
    let end = port_at + 2;
    match host {
        Ok(ip) => Ok((Target::Addr(SocketAddr::new(ip, port)), end)),
        Err(name) if !name.is_empty() && name.iter().all(|c| c.is_ascii_alphanumeric() || b"-._".contains(c)) => {
            Ok((Target::Name(String::from_utf8(name.to_vec()).unwrap(), port), end))
        }
        Err(_) => Err(Some(reply::HOST_UNREACHABLE)),
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() > MAX_INPUT {
        return;
    }
    RT.block_on(async {
        let (mut client, mut server) = tokio::io::duplex(4096);
        client.write_all(data).await.unwrap();
        // End of input, with the client still there to take the method selection.
        client.shutdown().await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(60), handshake(&mut server))
            .await
            .expect("the handshake ends when its input does");
        let mut left = Vec::new();
        server.read_to_end(&mut left).await.unwrap();
        drop(server);
        let mut written = Vec::new();
        client.read_to_end(&mut written).await.unwrap();

        match (model(data), got) {
            (Ok((want, end)), Ok(dst)) => {
                assert_eq!(dst, want, "{data:?}");
                assert_eq!(left, &data[end..], "the bytes after the request are left unread: {data:?}");
            }
            (Err(code), Err((e, got_code))) => {
                assert_eq!(got_code, code, "{e} for {data:?}");
                assert!(!e.to_string().is_empty());
            }
            (want, got) => panic!("model {want:?}, handshake {got:?} for {data:?}"),
        }
        // The method selection: [5, 0] once a greeting offering "no authentication" was read, [5, 0xff] when it
        // offers none, nothing before a whole greeting.
        let greeting = data.len() >= 2 && data[0] == 5 && data.len() >= 2 + data[1] as usize;
        let want = match greeting {
            true if data[2..2 + data[1] as usize].contains(&0) => vec![5, 0],
            true => vec![5, 0xff],
            false => vec![],
        };
        assert_eq!(written, want, "method selection for {data:?}");
    });
});
