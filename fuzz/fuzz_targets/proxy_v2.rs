//! The PROXY v2 header written toward an application tunnel (`proxy_protocol::header`), for any pair of addresses
//! and any identity, its length padded up to and past what the header's 16-bit length can carry. The dataplane has
//! no PROXY parser (it only writes headers), so the bytes are read back here by the layout of the HAProxy
//! specification (section 2.2), not by the library that wrote them: the addresses (one family; mixed ones as
//! IPv4-mapped IPv6), then exactly one TLV, 0xD0, holding the identity. A header too long to encode is an error,
//! never a wrong length.
//!
//! Input: `flags` (bit 0: source is IPv4, bit 1: destination is IPv4, bit 2: with an identity), source address
//! (16 bytes, the first 4 for IPv4) and port (big-endian), the same for the destination, a big-endian u16 of padding
//! bytes appended to the service account, then the identity's trust domain, namespace and service account as text
//! separated by NUL bytes.

#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use dataplane::identity::Identity;
use dataplane::proxy::proxy_protocol::{header, TLV_PEER_IDENTITY};
use libfuzzer_sys::fuzz_target;

const FIXED: usize = 1 + 18 + 18 + 2;
const SIGNATURE: [u8; 12] = [0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A];

fn addr(v4: bool, b: &[u8]) -> SocketAddr {
    let ip: IpAddr = if v4 {
        Ipv4Addr::new(b[0], b[1], b[2], b[3]).into()
    } else {
        Ipv6Addr::from(<[u8; 16]>::try_from(&b[..16]).unwrap()).into()
    };
    SocketAddr::new(ip, u16::from_be_bytes([b[16], b[17]]))
}

fuzz_target!(|data: &[u8]| {
    if data.len() < FIXED {
        return;
    }
    let flags = data[0];
    let (src, dst) = (addr(flags & 1 != 0, &data[1..19]), addr(flags & 2 != 0, &data[19..37]));
    let pad = u16::from_be_bytes([data[37], data[38]]) as usize;
    let text = String::from_utf8_lossy(&data[FIXED..]);
    let mut parts = text.splitn(3, '\0');
    let (td, ns, sa) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let id = (flags & 4 != 0).then(|| Identity::new(td, ns, &format!("{sa}{}", "x".repeat(pad))));
    let want_id = id.as_ref().map(|i| i.to_string().into_bytes());

    let both_v4 = src.is_ipv4() && dst.is_ipv4();
    let addr_len = if both_v4 { 12 } else { 36 };
    let payload_len = addr_len + want_id.as_ref().map_or(0, |v| 3 + v.len());
    let h = match header(src, dst, id.as_ref()) {
        Ok(h) => h,
        Err(e) => {
            assert!(payload_len > u16::MAX as usize, "{payload_len} bytes fit a header, yet: {e}");
            return;
        }
    };
    assert!(payload_len <= u16::MAX as usize, "a {payload_len}-byte payload was written");

    assert_eq!(h[..12], SIGNATURE);
    assert_eq!(h[12], 0x21, "version 2, PROXY");
    assert_eq!(h[13], if both_v4 { 0x11 } else { 0x21 }, "family (INET or INET6), STREAM");
    assert_eq!(u16::from_be_bytes([h[14], h[15]]) as usize, payload_len);
    assert_eq!(h.len(), 16 + payload_len);
    let canon = |a: SocketAddr| (a.ip().to_canonical(), a.port());
    let p = &h[16..];
    let (got_src, got_dst) = if both_v4 {
        let ip = |b: &[u8]| IpAddr::from(<[u8; 4]>::try_from(b).unwrap());
        ((ip(&p[0..4]), u16::from_be_bytes([p[8], p[9]])), (ip(&p[4..8]), u16::from_be_bytes([p[10], p[11]])))
    } else {
        // Canonical: an IPv4 source or destination was written IPv4-mapped.
        let ip = |b: &[u8]| IpAddr::from(<[u8; 16]>::try_from(b).unwrap()).to_canonical();
        ((ip(&p[0..16]), u16::from_be_bytes([p[32], p[33]])), (ip(&p[16..32]), u16::from_be_bytes([p[34], p[35]])))
    };
    assert_eq!((got_src, got_dst), (canon(src), canon(dst)));
    let tlvs = &p[addr_len..];
    match want_id {
        None => assert!(tlvs.is_empty(), "no identity, no TLV"),
        Some(want) => {
            assert_eq!(tlvs[0], TLV_PEER_IDENTITY);
            assert_eq!(u16::from_be_bytes([tlvs[1], tlvs[2]]) as usize, want.len());
            assert_eq!(&tlvs[3..], &want[..]);
        }
    }
});
