//! Property tests over the parsers that take input from the network or the control plane (bounded: a few hundred
//! cases each, so `cargo test` stays fast; `PROPTEST_CASES=100000 cargo test --release --test fuzz` digs deeper).
//! Each property: no panic on any input, and what is accepted means what the input said.
//!
//! - SOCKS5 greeting and CONNECT request (a local client's bytes);
//! - the CONNECT `:authority` (an HBONE peer's header), and its resolution against a small state;
//! - the PROXY v2 header we write toward application tunnels, read back with an independent parser's API;
//! - WDS Address resources (istiod's bytes): random bytes, and structurally valid resources with random field
//!   values: each resource is either accepted or rejected with a reason, and nothing panics;
//! - ZDS messages (istio-cni's bytes).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::LazyLock;

use dataplane::config::Config;
use dataplane::identity::Identity;
use dataplane::inpod::zds::{workload_request, WorkloadRequest};
use dataplane::proxy::inbound::Authority;
use dataplane::state::wds;
use dataplane::Dataplane;
use proptest::prelude::*;
use prost::Message;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256),
        ..ProptestConfig::default()
    })]

    #[test]
    fn socks5_handshake_takes_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        let got = rt().block_on(async {
            let (mut client, mut server) = tokio::io::duplex(4096);
            tokio::io::AsyncWriteExt::write_all(&mut client, &bytes).await.unwrap();
            drop(client);
            tokio::time::timeout(std::time::Duration::from_secs(1), dataplane::proxy::socks5::handshake(&mut server)).await
        });
        let got = got.expect("the handshake ends when its input does");
        if let Ok(dst) = got {
            // Accepted: version 5, a method list with "no authentication", CONNECT, and a port that is not 0.
            prop_assert_eq!(bytes[0], 5);
            prop_assert!(bytes[2..2 + bytes[1] as usize].contains(&0));
            prop_assert_ne!(dst.port(), 0);
        }
    }

    #[test]
    fn socks5_handshake_reads_the_address_it_was_sent(ip in any::<[u8; 4]>(), port in 1u16.., methods in proptest::collection::vec(any::<u8>(), 0..8)) {
        let mut bytes = vec![5, (methods.len() + 1) as u8];
        bytes.extend(&methods);
        bytes.push(0);
        bytes.extend([5, 1, 0, 1]);
        bytes.extend(ip);
        bytes.extend(port.to_be_bytes());
        let got = rt().block_on(async {
            let (mut client, mut server) = tokio::io::duplex(4096);
            tokio::io::AsyncWriteExt::write_all(&mut client, &bytes).await.unwrap();
            dataplane::proxy::socks5::handshake(&mut server).await
        });
        prop_assert_eq!(got.ok(), Some(dataplane::proxy::socks5::Target::Addr(SocketAddr::new(Ipv4Addr::from(ip).into(), port))));
    }

    #[test]
    fn authority_parsing_takes_any_text(s in "\\PC{0,40}|[0-9a-z.:\\[\\]-]{0,40}") {
        if let Some(a) = Authority::parse(&s) {
            match a {
                Authority::Addr(sa) => prop_assert_ne!(sa.port(), 0),
                Authority::Host(h, p) => {
                    prop_assert!(!h.is_empty());
                    prop_assert_ne!(p, 0);
                    // The port is what follows the last ':', as u16's parser reads it (and http's `port_u16`,
                    // ztunnel's): "a:080" and "a:+80" are port 80.
                    let tail = s.rsplit_once(':').map(|(_, t)| t).unwrap_or_default();
                    prop_assert_eq!(tail.parse::<u16>().ok(), Some(p));
                }
            }
        }
    }

    #[test]
    fn authority_parsing_round_trips_addresses(v4 in any::<[u8; 4]>(), v6 in any::<[u8; 16]>(), port in 1u16..) {
        for ip in [IpAddr::from(v4), IpAddr::from(Ipv6Addr::from(v6))] {
            let sa = SocketAddr::new(ip, port);
            prop_assert_eq!(Authority::parse(&sa.to_string()), Some(Authority::Addr(sa)));
        }
        prop_assert_eq!(Authority::parse(&SocketAddr::new(IpAddr::from(v4), 0).to_string()), None);
    }

    #[test]
    fn proxy_v2_header_reads_back(src in any::<(bool, [u8; 16], u16)>(), dst in any::<(bool, [u8; 16], u16)>(), sa in "[a-z0-9-]{1,20}") {
        let addr = |(v4, b, port): (bool, [u8; 16], u16)| {
            let ip: IpAddr = if v4 { Ipv4Addr::new(b[0], b[1], b[2], b[3]).into() } else { Ipv6Addr::from(b).into() };
            SocketAddr::new(ip, port)
        };
        let (src, dst) = (addr(src), addr(dst));
        let id = Identity::new("cluster.local", "default", &sa);
        let bytes = dataplane::proxy::proxy_protocol::header(src, dst, Some(&id)).unwrap();
        let h = ppp::v2::Header::try_from(&bytes[..]).expect("a header we wrote parses");
        // Mixed families are written as IPv6 (IPv4-mapped), as the specification requires one family.
        let canon = |a: SocketAddr| (a.ip().to_canonical(), a.port());
        let (got_src, got_dst) = match h.addresses {
            ppp::v2::Addresses::IPv4(a) => ((IpAddr::from(a.source_address), a.source_port), (IpAddr::from(a.destination_address), a.destination_port)),
            ppp::v2::Addresses::IPv6(a) => ((IpAddr::from(a.source_address).to_canonical(), a.source_port), (IpAddr::from(a.destination_address).to_canonical(), a.destination_port)),
            other => return Err(TestCaseError::fail(format!("addresses {other:?}"))),
        };
        prop_assert_eq!(got_src, canon(src));
        prop_assert_eq!(got_dst, canon(dst));
        let tlvs: Vec<_> = h.tlvs().collect::<Result<_, _>>().expect("TLVs parse");
        prop_assert_eq!(tlvs.len(), 1);
        prop_assert_eq!(tlvs[0].kind, 0xD0);
        let want = id.to_string();
        prop_assert_eq!(&tlvs[0].value[..], want.as_bytes());
    }

    #[test]
    fn wds_decoding_takes_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = wds::unpack(&bytes);
        let r = wds::decode_resource(0, &bytes);
        prop_assert!(r.record.is_ok() || !r.record.as_ref().err().unwrap().to_string().is_empty());
        let _ = wds::decode_address_json(&bytes);
    }

    #[test]
    fn every_wds_resource_is_accepted_or_rejected_with_a_reason(resources in proptest::collection::vec(address(), 1..8)) {
        let mut packed = Vec::new();
        for (i, a) in resources.iter().enumerate() {
            let r = wds::Resource {
                version: format!("v{i}"),
                name: format!("r{i}"),
                resource: Some(wds::Any { type_url: "type.googleapis.com/istio.workload.Address".into(), value: a.encode_to_vec() }),
            };
            let bytes = r.encode_to_vec();
            packed.extend((bytes.len() as u32).to_le_bytes());
            packed.extend(bytes);
        }
        let out = DP.apply_addresses(&packed, Vec::new()).expect("a well-packed response is judged, never refused whole");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let accepted = v["accepted"].as_array().unwrap().len();
        let rejected = v["rejected"].as_array().unwrap();
        prop_assert_eq!(accepted + rejected.len(), resources.len());
        for r in rejected {
            let r = r.as_str().unwrap();
            prop_assert!(r.starts_with('r') && r.contains(": ") && r.len() > 4, "reason {}", r);
        }
        // And the state renders (config_dump) whatever was accepted.
        let _: serde_json::Value = serde_json::from_str(&DP.mesh_dump_json()).unwrap();
    }

    #[test]
    fn zds_messages_take_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
        let _ = WorkloadRequest::decode(&bytes[..]);
    }

    #[test]
    fn zds_add_round_trips(uid in "\\PC{0,30}", ns in "\\PC{0,20}", name in "\\PC{0,20}", sa in "\\PC{0,20}") {
        let req = WorkloadRequest {
            payload: Some(workload_request::Payload::Add(dataplane::inpod::zds::AddWorkload {
                uid: uid.clone(),
                workload_info: Some(dataplane::inpod::zds::WorkloadInfo { name, namespace: ns, service_account: sa }),
            })),
        };
        prop_assert_eq!(WorkloadRequest::decode(&req.encode_to_vec()[..]).unwrap(), req);
    }
}

/// One dataplane for every case (a runtime each would dominate the time).
static DP: LazyLock<Dataplane> = LazyLock::new(|| Dataplane::new(Config::default()).unwrap());

/// Strings as istiod might send them, and as an attacker in the control plane could: names, control characters,
/// separators of baggage and headers, non-ASCII, empty.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9-]{1,12}",
        "[a-z0-9-]{1,8}(\\.[a-z0-9-]{1,8}){0,4}",
        "\\PC{0,16}",
        "[ ,;=/\\x00-\\x1f]{0,4}[a-z]{0,4}",
        Just(String::new()),
    ]
}

fn ip_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        any::<[u8; 4]>().prop_map(|b| b.to_vec()),
        any::<[u8; 16]>().prop_map(|b| b.to_vec()),
        proptest::collection::vec(any::<u8>(), 0..20),
    ]
}

fn gateway() -> impl Strategy<Value = Option<wds::WireGateway>> {
    proptest::option::of((text(), text(), ip_bytes(), any::<u32>(), any::<bool>()).prop_map(
        |(ns, host, ip, port, by_host)| wds::WireGateway {
            destination: Some(if by_host {
                wds::GatewayDestinationWire::Hostname(wds::NamespacedHostname { namespace: ns, hostname: host })
            } else {
                wds::GatewayDestinationWire::Address(wds::NetworkAddress { network: ns, address: ip, length: None })
            }),
            hbone_mtls_port: port,
        },
    ))
}

fn workload() -> impl Strategy<Value = wds::WireWorkload> {
    (
        (text(), text(), text(), proptest::collection::vec(ip_bytes(), 0..3), text(), -1i32..4),
        (text(), text(), gateway(), text(), text(), -1i32..6),
        (
            proptest::collection::vec(text(), 0..3),
            -1i32..3,
            proptest::collection::hash_map(text(), proptest::collection::vec((any::<u32>(), any::<u32>()), 0..3), 0..3),
            -1i32..3,
        ),
    )
        .prop_map(
            |(
                (uid, name, namespace, addresses, network, proto),
                (td, sa, waypoint, node, canonical, wtype),
                (policies, status, services, mode),
            )| wds::WireWorkload {
                uid,
                name,
                namespace,
                addresses,
                network,
                tunnel_protocol: proto,
                trust_domain: td,
                service_account: sa,
                waypoint,
                node,
                canonical_name: canonical,
                workload_type: wtype,
                authorization_policies: policies,
                status,
                network_mode: mode,
                services: services
                    .into_iter()
                    .map(|(k, ports)| {
                        let ports =
                            ports.into_iter().map(|(s, t)| wds::WirePort { service_port: s, target_port: t }).collect();
                        (k, wds::PortList { ports })
                    })
                    .collect(),
                ..Default::default()
            },
        )
}

fn service() -> impl Strategy<Value = wds::WireService> {
    (
        (text(), text(), text()),
        proptest::collection::vec((text(), ip_bytes(), proptest::option::of(any::<u32>())), 0..3),
        proptest::collection::vec((any::<u32>(), any::<u32>()), 0..3),
        (proptest::collection::vec(text(), 0..2), gateway(), -1i32..5, any::<bool>(), -1i32..3),
    )
        .prop_map(
            |((name, namespace, hostname), addrs, ports, (sans, waypoint, families, canonical, visibility))| {
                wds::WireService {
                    name,
                    namespace,
                    hostname,
                    addresses: addrs
                        .into_iter()
                        .map(|(network, address, length)| wds::NetworkAddress { network, address, length })
                        .collect(),
                    ports: ports.into_iter().map(|(s, t)| wds::WirePort { service_port: s, target_port: t }).collect(),
                    subject_alt_names: sans,
                    waypoint,
                    ip_families: families,
                    canonical,
                    visibility,
                    ..Default::default()
                }
            },
        )
}

fn address() -> impl Strategy<Value = wds::Address> {
    prop_oneof![
        workload().prop_map(|w| wds::Address { r#type: Some(wds::AddressType::Workload(w)) }),
        service().prop_map(|s| wds::Address { r#type: Some(wds::AddressType::Service(s)) }),
        Just(wds::Address { r#type: None }),
    ]
}
