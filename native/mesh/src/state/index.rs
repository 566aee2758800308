//! The service indexes that many records may share: the services of one hostname (one per namespace that has it),
//! of one VIP, of one address range. istiod decides how many services share a key, so each change must cost the
//! same whatever the key's fan-out: removing 100k services of one hostname was quadratic under the state's write
//! lock when each removal searched a list (issue 29), and a CIDR VIP lookup walked every range.
//!
//! [`Keys`] keeps arrival order (the lookups' "first" is the first to arrive) with a plain list while it is short,
//! which is nearly always and costs least, and an ordered map with a position index once it is long, where an
//! insertion or a removal is O(log n). [`Ranges`] answers "the longest range that contains this address" with one
//! hash lookup per distinct prefix length in use.

use super::model::ServiceKey;
use super::policy::Cidr;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

/// Past this many keys a list becomes an ordered map (a linear search of a few dozen keys costs less than a map).
const LIST_MAX: usize = 32;

/// Service keys in arrival order.
#[derive(Debug)]
pub enum Keys {
    List(Vec<ServiceKey>),
    Ordered(Box<Ordered>),
}

#[derive(Debug, Default)]
pub struct Ordered {
    next: u64,
    by_arrival: BTreeMap<u64, ServiceKey>,
    arrival: HashMap<ServiceKey, u64>,
}

impl Default for Keys {
    fn default() -> Keys {
        Keys::List(Vec::new())
    }
}

impl Keys {
    /// Appends `key` (moved to the end if it is already here).
    pub fn push(&mut self, key: ServiceKey) {
        match self {
            Keys::List(v) => {
                v.retain(|k| *k != key);
                if v.len() < LIST_MAX {
                    v.reserve_exact(1);
                    v.push(key);
                    return;
                }
                let mut o = Ordered::default();
                for k in v.drain(..).chain(std::iter::once(key)) {
                    o.push(k);
                }
                *self = Keys::Ordered(Box::new(o));
            }
            Keys::Ordered(o) => o.push(key),
        }
    }

    /// Removes `key`; whether any key is left.
    pub fn remove(&mut self, key: &ServiceKey) -> bool {
        match self {
            Keys::List(v) => {
                if let Some(i) = v.iter().position(|k| k == key) {
                    v.remove(i);
                }
                !v.is_empty()
            }
            Keys::Ordered(o) => {
                if let Some(at) = o.arrival.remove(key) {
                    o.by_arrival.remove(&at);
                }
                !o.arrival.is_empty()
            }
        }
    }

    pub fn iter(&self) -> Box<dyn Iterator<Item = &ServiceKey> + '_> {
        match self {
            Keys::List(v) => Box::new(v.iter()),
            Keys::Ordered(o) => Box::new(o.by_arrival.values()),
        }
    }

    pub fn first(&self) -> Option<&ServiceKey> {
        match self {
            Keys::List(v) => v.first(),
            Keys::Ordered(o) => o.by_arrival.values().next(),
        }
    }

    /// `key` itself, if it is here: O(1) however many keys there are (a list is short).
    pub fn get(&self, key: &ServiceKey) -> Option<&ServiceKey> {
        match self {
            Keys::List(v) => v.iter().find(|k| *k == key),
            Keys::Ordered(o) => o.arrival.get_key_value(key).map(|(k, _)| k),
        }
    }

    /// The key of namespace `ns` among keys that share one hostname.
    pub fn in_namespace(&self, ns: &str, hostname: &super::intern::Str) -> Option<&ServiceKey> {
        match self {
            Keys::List(v) => v.iter().find(|k| *k.namespace == *ns),
            Keys::Ordered(_) => {
                self.get(&ServiceKey { namespace: super::intern::intern(ns), hostname: hostname.clone() })
            }
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Keys::List(v) => v.len(),
            Keys::Ordered(o) => o.arrival.len(),
        }
    }
}

impl Ordered {
    fn push(&mut self, key: ServiceKey) {
        let at = self.next;
        self.next += 1;
        if let Some(old) = self.arrival.insert(key.clone(), at) {
            self.by_arrival.remove(&old);
        }
        self.by_arrival.insert(at, key);
    }
}

/// Services addressed by whole ranges (CIDR VIPs), per network.
#[derive(Debug, Default)]
pub struct Ranges {
    /// (network, range) → its services.
    by_range: HashMap<(String, Cidr), Keys>,
    /// The prefix lengths in use per family (IPv6?, prefix) → how many ranges have it; walked longest first.
    prefixes: BTreeMap<(bool, u8), usize>,
}

impl Ranges {
    pub fn is_empty(&self) -> bool {
        self.by_range.is_empty()
    }

    pub fn insert(&mut self, network: &str, cidr: Cidr, key: ServiceKey) {
        let keys = self.by_range.entry((network.to_string(), cidr)).or_default();
        let before = keys.len();
        keys.push(key);
        if keys.len() > before {
            *self.prefixes.entry((cidr.addr.is_ipv6(), cidr.prefix)).or_default() += 1;
        }
    }

    pub fn remove(&mut self, network: &str, cidr: Cidr, key: &ServiceKey) {
        let at = (network.to_string(), cidr);
        let Some(keys) = self.by_range.get_mut(&at) else { return };
        let before = keys.len();
        if !keys.remove(key) {
            self.by_range.remove(&at);
        }
        let removed = before - self.by_range.get(&at).map_or(0, Keys::len);
        if removed > 0 {
            let p = (cidr.addr.is_ipv6(), cidr.prefix);
            if let Some(n) = self.prefixes.get_mut(&p) {
                *n -= removed;
                if *n == 0 {
                    self.prefixes.remove(&p);
                }
            }
        }
    }

    /// The services of the longest range in `network` that contains `ip`.
    pub fn longest(&self, network: &str, ip: IpAddr) -> Option<&Keys> {
        let v6 = ip.is_ipv6();
        let mut at = (network.to_string(), Cidr::of(ip, 0));
        for &(_, prefix) in self.prefixes.range((v6, 0)..=(v6, u8::MAX)).rev().map(|(p, _)| p) {
            at.1 = Cidr::of(ip, prefix);
            if let Some(keys) = self.by_range.get(&at) {
                return Some(keys);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: usize) -> ServiceKey {
        ServiceKey::new(&format!("ns{i}"), "shared.example.com")
    }

    #[test]
    fn keys_keep_arrival_order_across_the_switch_to_a_map() {
        let mut k = Keys::default();
        for i in 0..100 {
            k.push(key(i));
        }
        assert!(matches!(k, Keys::Ordered(_)));
        k.push(key(3)); // again: to the end
        assert!(k.remove(&key(0)));
        let order: Vec<String> = k.iter().map(|k| k.namespace.to_string()).collect();
        assert_eq!(order.first().map(String::as_str), Some("ns1"));
        assert_eq!(order.last().map(String::as_str), Some("ns3"));
        assert_eq!(order.len(), 99);
        assert_eq!(k.first(), Some(&key(1)));
        assert_eq!(k.in_namespace("ns50", &key(0).hostname), Some(&key(50)));
        assert_eq!(k.in_namespace("ns0", &key(0).hostname), None);
        for i in 1..100 {
            let left = k.remove(&key(i));
            assert_eq!(left, i < 99, "after removing {i}");
        }
    }

    #[test]
    fn the_longest_range_wins_per_network_and_family() {
        let mut r = Ranges::default();
        let c = |s: &str| Cidr::parse(s).unwrap();
        r.insert("", c("10.0.0.0/8"), key(1));
        r.insert("", c("10.1.0.0/16"), key(2));
        r.insert("other", c("10.1.2.0/24"), key(3));
        r.insert("", c("fd00::/8"), key(4));
        let at = |r: &Ranges, net: &str, ip: &str| r.longest(net, ip.parse().unwrap()).and_then(Keys::first).cloned();
        assert_eq!(at(&r, "", "10.1.2.3"), Some(key(2)));
        assert_eq!(at(&r, "", "10.2.0.1"), Some(key(1)));
        assert_eq!(at(&r, "other", "10.1.2.3"), Some(key(3)));
        assert_eq!(at(&r, "other", "10.1.3.3"), None);
        assert_eq!(at(&r, "", "fd00::1"), Some(key(4)));
        assert_eq!(at(&r, "", "11.0.0.1"), None);
        r.remove("", c("10.1.0.0/16"), &key(2));
        assert_eq!(at(&r, "", "10.1.2.3"), Some(key(1)));
        r.remove("", c("10.0.0.0/8"), &key(1));
        r.remove("other", c("10.1.2.0/24"), &key(3));
        r.remove("", c("fd00::/8"), &key(4));
        assert!(r.is_empty());
        assert!(r.prefixes.is_empty());
    }
}
