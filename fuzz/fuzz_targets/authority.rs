//! The CONNECT `:authority` an HBONE peer sends (`Authority::parse`), as any UTF-8 text. What parses is an address
//! or a hostname of hostname characters, with a port that is not 0, and writing it back out (as `ip:port`,
//! `[ip6]:port` or `host:port`) parses to the same value: the parser and the authority a request names agree. One
//! exception, ztunnel's too: a port written other than in plain digits ("10.0.0.1:+80", read as u16's parser and
//! http's `port_u16` read it) makes an address text a hostname, which written back plainly is the address.

#![no_main]

use dataplane::proxy::inbound::Authority;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    let Some(a) = Authority::parse(s) else { return };
    let written = match &a {
        Authority::Addr(sa) => {
            assert_ne!(sa.port(), 0, "{s:?}");
            sa.to_string()
        }
        Authority::Host(h, p) => {
            assert_ne!(*p, 0, "{s:?}");
            assert!(!h.is_empty() && h.len() <= 253, "{s:?}");
            assert!(h.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b)), "{s:?}");
            format!("{h}:{p}")
        }
    };
    let expected = match &a {
        Authority::Host(h, p) => match h.parse::<std::net::IpAddr>() {
            Ok(ip) => Authority::Addr(std::net::SocketAddr::new(ip, *p)),
            Err(_) => a.clone(),
        },
        Authority::Addr(_) => a.clone(),
    };
    assert_eq!(Authority::parse(&written), Some(expected), "{s:?} written back as {written:?}");
});
