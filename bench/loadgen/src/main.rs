//! ztn-loadgen: the benchmark's load client and servers, in Rust so that the client is never the bottleneck.
//!
//! Servers (run until killed, print `listening <addr>` once bound):
//!   ztn-loadgen serve --listen ADDR
//!     Each connection starts with a 1-byte mode: `s` = sink (read to EOF, then reply with the byte count as 8 bytes
//!     big-endian), `c` = checked sink (the same, then the FNV-1a 64 hash of every byte received, 8 bytes
//!     big-endian), `e` = echo (echo everything until EOF).
//! Clients (print one JSON line of results):
//!   ztn-loadgen throughput --target ADDR [--socks ADDR] --bytes N [--streams K] [--verify]
//!     `--verify` sends a position-dependent pattern to the checked sink and fails unless the server's hash of what
//!     it received equals the hash of what was sent (slower: for smoke tests, not for measurements).
//!   ztn-loadgen latency    --target ADDR [--socks ADDR] --size N --count N [--rate RPS]
//!   ztn-loadgen connections --target ADDR [--socks ADDR] --count N
//!   ztn-loadgen connections --target ADDR [--socks ADDR | --socks-port P] --sources IP-IP|IP,IP,...
//!     With `--sources`: one connection per source IP, each bound to its source (any 127/8 address binds without
//!     root), so every connection comes from a different workload. `--socks-port P` enters through the SOCKS5
//!     listener at SOURCE:P (in local mode each workload has its own, and that listener names the source identity).
//!   ztn-loadgen hold       --target ADDR [--socks ADDR] --count N [--parallel P]
//!     Opens N connections (P dials at a time), proves each one reaches the echo server with a 1-byte round trip,
//!     prints `{"holding":N,...}` and keeps them all open, idle, until its standard input closes; then closes them
//!     and prints the final JSON line. The harness measures the proxies' memory in between.

use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

struct Args(Vec<String>);

impl Args {
    fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().position(|a| a == name).and_then(|i| self.0.get(i + 1)).map(String::as_str)
    }
    fn addr(&self, name: &str) -> Res<Option<SocketAddr>> {
        Ok(match self.get(name) {
            Some(s) => Some(s.parse().map_err(|e| format!("{name}: {e}"))?),
            None => None,
        })
    }
    fn flag(&self, name: &str) -> bool {
        self.0.iter().any(|a| a == name)
    }
    fn num(&self, name: &str, default: u64) -> Res<u64> {
        Ok(match self.get(name) {
            Some(s) => s.parse().map_err(|e| format!("{name}: {e}"))?,
            None => default,
        })
    }
    /// `--sources`: `A-B` (an inclusive IPv4 range) or `a,b,c`.
    fn sources(&self) -> Res<Option<Vec<IpAddr>>> {
        let Some(spec) = self.get("--sources") else { return Ok(None) };
        let bad = |e: &dyn std::fmt::Display| format!("--sources {spec}: {e}");
        if let Some((from, to)) = spec.split_once('-') {
            let from = u32::from(from.parse::<Ipv4Addr>().map_err(|e| bad(&e))?);
            let to = u32::from(to.parse::<Ipv4Addr>().map_err(|e| bad(&e))?);
            if to < from {
                return Err(bad(&"the range ends before it starts").into());
            }
            return Ok(Some((from..=to).map(|n| IpAddr::V4(Ipv4Addr::from(n))).collect()));
        }
        Ok(Some(spec.split(',').map(|s| s.parse().map_err(|e| bad(&e))).collect::<Result<_, _>>()?))
    }
}

/// A TCP connection to `to`, from `from` when given (port chosen by the kernel).
async fn connect(to: SocketAddr, from: Option<IpAddr>) -> Res<TcpStream> {
    let s = match from {
        None => TcpStream::connect(to).await?,
        Some(ip) => {
            let sock = if ip.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
            sock.bind(SocketAddr::new(ip, 0)).map_err(|e| format!("binding {ip}: {e}"))?;
            sock.connect(to).await?
        }
    };
    s.set_nodelay(true)?;
    Ok(s)
}

/// Connect to `target`, through the SOCKS5 proxy at `socks` if given (no auth, CONNECT, IP literal).
async fn dial(target: SocketAddr, socks: Option<SocketAddr>) -> Res<TcpStream> {
    dial_from(target, socks, None).await
}

/// `dial`, with the client's socket bound to `from`.
async fn dial_from(target: SocketAddr, socks: Option<SocketAddr>, from: Option<IpAddr>) -> Res<TcpStream> {
    let Some(proxy) = socks else {
        return connect(target, from).await;
    };
    let mut s = connect(proxy, from).await?;
    let mut req = vec![5u8, 1, 0, 5, 1, 0];
    match target {
        SocketAddr::V4(a) => {
            req.push(1);
            req.extend_from_slice(&a.ip().octets());
        }
        SocketAddr::V6(a) => {
            req.push(4);
            req.extend_from_slice(&a.ip().octets());
        }
    }
    req.extend_from_slice(&target.port().to_be_bytes());
    s.write_all(&req).await?;
    let mut method = [0u8; 2];
    s.read_exact(&mut method).await?;
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).await?;
    if method != [5, 0] || reply[1] != 0 {
        return Err(format!("SOCKS5 refused: method {method:?} reply code {}", reply[1]).into());
    }
    Ok(s)
}

async fn serve(listen: SocketAddr) -> Res<()> {
    let l = TcpListener::bind(listen).await?;
    println!("listening {}", l.local_addr()?);
    loop {
        let (mut s, _) = l.accept().await?;
        tokio::spawn(async move {
            let _ = s.set_nodelay(true);
            let mut mode = [0u8; 1];
            if s.read_exact(&mut mode).await.is_err() {
                return;
            }
            let mut buf = vec![0u8; 256 * 1024];
            match mode[0] {
                b's' | b'c' => {
                    let checked = mode[0] == b'c';
                    let mut total = 0u64;
                    let mut hash = Fnv::new();
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        total += n as u64;
                        if checked {
                            hash.update(&buf[..n]);
                        }
                    }
                    let mut reply = total.to_be_bytes().to_vec();
                    if checked {
                        reply.extend_from_slice(&hash.0.to_be_bytes());
                    }
                    let _ = s.write_all(&reply).await;
                    let _ = s.shutdown().await;
                }
                _ => {
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    let _ = s.shutdown().await;
                }
            }
        });
    }
}

/// FNV-1a, 64 bits: order-sensitive, so a lost, duplicated or misplaced chunk changes it.
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn update(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Sends `bytes` to the sink; returns the count the server received, and whether its hash matched (when verifying).
async fn one_stream(target: SocketAddr, socks: Option<SocketAddr>, bytes: u64, verify: bool) -> Res<(u64, bool)> {
    let mut s = dial(target, socks).await?;
    s.write_all(if verify { b"c" } else { b"s" }).await?;
    // With --verify, a pattern whose period (a prime) is not a multiple of any buffer or frame size.
    let buf: Vec<u8> = if verify {
        (0..256 * 1024 + 7).map(|i: usize| (i.wrapping_mul(31) ^ (i >> 9)) as u8).collect()
    } else {
        vec![0x5au8; 256 * 1024]
    };
    let mut sent = Fnv::new();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        s.write_all(&buf[..n]).await?;
        if verify {
            sent.update(&buf[..n]);
        }
        left -= n as u64;
    }
    s.shutdown().await?;
    let mut count = [0u8; 8];
    s.read_exact(&mut count).await?;
    let mut matched = true;
    if verify {
        let mut hash = [0u8; 8];
        s.read_exact(&mut hash).await?;
        matched = u64::from_be_bytes(hash) == sent.0;
    }
    Ok((u64::from_be_bytes(count), matched))
}

async fn throughput(a: &Args) -> Res<serde_json::Value> {
    let target = a.addr("--target")?.ok_or("--target is required")?;
    let socks = a.addr("--socks")?;
    let bytes = a.num("--bytes", 1 << 30)?;
    let streams = a.num("--streams", 1)?.max(1);
    let verify = a.flag("--verify");
    let per = bytes / streams;
    let started = Instant::now();
    let tasks: Vec<_> = (0..streams).map(|_| tokio::spawn(one_stream(target, socks, per, verify))).collect();
    let mut received = 0;
    let mut mismatched = 0;
    for t in tasks {
        let (n, matched) = t.await.map_err(|e| e.to_string())??;
        received += n;
        mismatched += u64::from(!matched);
    }
    let secs = started.elapsed().as_secs_f64();
    if received != per * streams {
        return Err(format!("server received {received} bytes, sent {}", per * streams).into());
    }
    if mismatched > 0 {
        return Err(format!("{mismatched} of {streams} streams arrived with a different hash than was sent").into());
    }
    Ok(serde_json::json!({
        "bytes": received, "streams": streams, "seconds": secs, "gbps": received as f64 * 8.0 / secs / 1e9,
        "verified": verify,
    }))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

async fn latency(a: &Args) -> Res<serde_json::Value> {
    let target = a.addr("--target")?.ok_or("--target is required")?;
    let socks = a.addr("--socks")?;
    let size = a.num("--size", 1024)? as usize;
    let count = a.num("--count", 5000)?;
    let rate = a.num("--rate", 0)?;
    let mut s = dial(target, socks).await?;
    s.write_all(b"e").await?;
    let req = vec![0x42u8; size];
    let mut resp = vec![0u8; size];
    // Warm up: the first exchanges pay for lazy setup that is not the steady state.
    for _ in 0..50 {
        s.write_all(&req).await?;
        s.read_exact(&mut resp).await?;
    }
    let interval = (rate > 0).then(|| Duration::from_secs_f64(1.0 / rate as f64));
    let mut samples = Vec::with_capacity(count as usize);
    let started = Instant::now();
    for i in 0..count {
        if let Some(iv) = interval {
            let due = started + iv * i as u32;
            tokio::time::sleep_until(due.into()).await;
        }
        let t = Instant::now();
        s.write_all(&req).await?;
        s.read_exact(&mut resp).await?;
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let total = started.elapsed().as_secs_f64();
    samples.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    Ok(serde_json::json!({
        "count": count, "size": size, "rps": count as f64 / total,
        "p50_us": percentile(&samples, 50.0), "p90_us": percentile(&samples, 90.0),
        "p99_us": percentile(&samples, 99.0), "p999_us": percentile(&samples, 99.9),
    }))
}

async fn connections(a: &Args) -> Res<serde_json::Value> {
    let target = a.addr("--target")?.ok_or("--target is required")?;
    let socks = a.addr("--socks")?;
    let socks_port =
        a.get("--socks-port").map(|p| p.parse::<u16>().map_err(|e| format!("--socks-port: {e}"))).transpose()?;
    // Without --sources: `count` connections from the default source; with it, one from each source.
    let sources: Vec<Option<IpAddr>> = match a.sources()? {
        Some(list) => list.into_iter().map(Some).collect(),
        None => vec![None; a.num("--count", 1000)? as usize],
    };
    if socks_port.is_some() && (socks.is_some() || a.get("--sources").is_none()) {
        return Err("--socks-port needs --sources and no --socks".into());
    }
    let started = Instant::now();
    for &from in &sources {
        let entry = match (socks_port, from) {
            (Some(port), Some(ip)) => Some(SocketAddr::new(ip, port)),
            _ => socks,
        };
        let mut s = dial_from(target, entry, from).await.map_err(|e| match from {
            Some(ip) => format!("from {ip}: {e}"),
            None => e.to_string(),
        })?;
        s.write_all(b"e!").await?;
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await?;
        drop(s);
    }
    let secs = started.elapsed().as_secs_f64();
    let count = sources.len();
    Ok(serde_json::json!({"count": count, "seconds": secs, "cps": count as f64 / secs}))
}

async fn hold(a: &Args) -> Res<serde_json::Value> {
    let target = a.addr("--target")?.ok_or("--target is required")?;
    let socks = a.addr("--socks")?;
    let count = a.num("--count", 1000)? as usize;
    let parallel = a.num("--parallel", 64)?.max(1) as usize;
    let started = Instant::now();
    let mut open = Vec::with_capacity(count);
    while open.len() < count {
        let batch = parallel.min(count - open.len());
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..batch {
            set.spawn(async move {
                let mut s = dial(target, socks).await?;
                s.write_all(b"e!").await?;
                let mut b = [0u8; 1];
                s.read_exact(&mut b).await?;
                Res::Ok(s)
            });
        }
        while let Some(r) = set.join_next().await {
            open.push(r.map_err(|e| e.to_string())??);
        }
    }
    let open_secs = started.elapsed().as_secs_f64();
    println!("{}", serde_json::json!({"holding": open.len(), "open_seconds": open_secs}));
    // Idle until the harness closes our stdin (or exits).
    tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
    })
    .await
    .map_err(|e| e.to_string())?;
    let held = open.len();
    drop(open);
    Ok(
        serde_json::json!({"count": held, "open_seconds": open_secs, "held_seconds": started.elapsed().as_secs_f64() - open_secs}),
    )
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let a = Args(argv.clone());
    let result = match argv.first().map(String::as_str) {
        Some("serve") => match a.addr("--listen") {
            Ok(Some(addr)) => serve(addr).await.map(|_| serde_json::Value::Null),
            Ok(None) => Err("--listen is required".into()),
            Err(e) => Err(e),
        },
        Some("throughput") => throughput(&a).await,
        Some("latency") => latency(&a).await,
        Some("connections") => connections(&a).await,
        Some("hold") => hold(&a).await,
        _ => {
            Err("usage: ztn-loadgen serve|throughput|latency|connections|hold [options] (see the source header)".into())
        }
    };
    match result {
        Ok(v) => println!("{v}"),
        Err(e) => {
            eprintln!("ztn-loadgen: {e}");
            std::process::exit(1);
        }
    }
}
