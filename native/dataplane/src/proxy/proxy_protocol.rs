//! PROXY protocol v2 toward a local application tunnel (ztunnel's `write_proxy_protocol`): the original client
//! and the tunnel target as addresses, and the client's SPIFFE identity as TLV 0xD0. Written only on the last,
//! local hop to a workload that asked for it (`application_tunnel.protocol: PROXY`); never across the network.

use std::net::{IpAddr, SocketAddr};

use ppp::v2::{Builder, Command, Protocol, Version};

use crate::identity::Identity;

/// Istio's TLV type for the peer's SPIFFE identity.
pub const TLV_PEER_IDENTITY: u8 = 0xD0;

/// The header for a stream from `src` to `dst`. Mixed families are written as IPv6 (v4-mapped), since a header has
/// one address family.
pub fn header(src: SocketAddr, dst: SocketAddr, identity: Option<&Identity>) -> std::io::Result<Vec<u8>> {
    let (src, dst) = match (src, dst) {
        (SocketAddr::V4(_), SocketAddr::V6(_)) => (v6(src), dst),
        (SocketAddr::V6(_), SocketAddr::V4(_)) => (src, v6(dst)),
        _ => (src, dst),
    };
    let mut b = Builder::with_addresses(Version::Two | Command::Proxy, Protocol::Stream, (src, dst));
    if let Some(id) = identity {
        b = b.write_tlv(TLV_PEER_IDENTITY, id.to_string().as_bytes())?;
    }
    b.build()
}

fn v6(a: SocketAddr) -> SocketAddr {
    match a.ip() {
        IpAddr::V4(v4) => SocketAddr::new(IpAddr::V6(v4.to_ipv6_mapped()), a.port()),
        IpAddr::V6(_) => a,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes, checked field by field against the layout of the HAProxy specification (section 2.2), not by
    /// reading them back with the library that wrote them.
    #[test]
    fn v2_header_bytes_follow_the_specification() {
        let id = Identity::new("cluster.local", "default", "sleep");
        let h = header("10.0.0.1:41000".parse().unwrap(), "10.96.0.10:80".parse().unwrap(), Some(&id)).unwrap();
        let sig = [0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A];
        assert_eq!(&h[..12], &sig, "signature");
        assert_eq!(h[12], 0x21, "version 2, command PROXY");
        assert_eq!(h[13], 0x11, "AF_INET, STREAM");
        let id_bytes = id.to_string().into_bytes();
        let len = u16::from_be_bytes([h[14], h[15]]) as usize;
        assert_eq!(len, 12 + 3 + id_bytes.len(), "addresses (12) + one TLV");
        assert_eq!(h.len(), 16 + len);
        assert_eq!(&h[16..20], &[10, 0, 0, 1], "source address");
        assert_eq!(&h[20..24], &[10, 96, 0, 10], "destination address");
        assert_eq!(u16::from_be_bytes([h[24], h[25]]), 41000, "source port");
        assert_eq!(u16::from_be_bytes([h[26], h[27]]), 80, "destination port");
        assert_eq!(h[28], 0xD0, "TLV type: peer identity");
        assert_eq!(u16::from_be_bytes([h[29], h[30]]) as usize, id_bytes.len());
        assert_eq!(&h[31..], id_bytes.as_slice());
    }

    #[test]
    fn no_identity_means_no_tlv_and_mixed_families_are_v6() {
        let h = header("10.0.0.1:1".parse().unwrap(), "[fd00::1]:2".parse().unwrap(), None).unwrap();
        assert_eq!(h[13], 0x21, "AF_INET6, STREAM");
        assert_eq!(u16::from_be_bytes([h[14], h[15]]), 36, "two IPv6 addresses and ports, no TLV");
        let mapped: [u8; 16] = "::ffff:10.0.0.1".parse::<std::net::Ipv6Addr>().unwrap().octets();
        assert_eq!(&h[16..32], &mapped);
    }
}
