//! Forwarded answers kept for their time to live, as ztunnel's forwarder (hickory's resolver) keeps them: a question
//! asked again is answered from here with every TTL counted down (RFC 1035 §3.2.1), until the shortest runs out.
//!
//! - Positive answers live for the smallest TTL of their records; negative ones (NXDOMAIN, or NOERROR with no answer)
//!   for their SOA's negative TTL, min(SOA TTL, SOA MINIMUM) (RFC 2308 §3, §5), and not at all without one.
//!   TTLs are capped at a day (hickory's `MAX_TTL`); a TTL of 0 is not kept.
//! - Kept by question (name without case, type, class) and the client's DO and CD bits (they change what a resolver
//!   answers). Neither failures (SERVFAIL, REFUSED...) nor truncated answers are kept.
//! - Bounded: `CAPACITY` questions per DNS server (one per workload, as ztunnel's), the least recently asked evicted
//!   first; an answer larger than `MAX_ENTRY` bytes is not kept.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Instant;

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::{DNSClass, LowerName, RData, Record, RecordType};
use parking_lot::Mutex;

use crate::metrics::Metrics;

/// Questions kept per DNS server.
pub const CAPACITY: usize = 256;
/// The largest answer kept, encoded (a few hundred bytes is usual; a TXT set over TCP may be 64 KiB).
pub const MAX_ENTRY: usize = 4096;
/// hickory's `MAX_TTL`: no answer is kept longer than a day.
const MAX_TTL: u32 = 86_400;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    name: LowerName,
    qtype: RecordType,
    class: DNSClass,
    dnssec_ok: bool,
    checking_disabled: bool,
}

impl Key {
    fn of(request: &Message) -> Option<Key> {
        let q = request.queries.first()?;
        Some(Key {
            name: LowerName::new(q.name()),
            qtype: q.query_type(),
            class: q.query_class(),
            dnssec_ok: request.edns.as_ref().is_some_and(|e| e.flags().dnssec_ok),
            checking_disabled: request.metadata.checking_disabled,
        })
    }
}

struct Entry {
    answer: Message,
    stored: Instant,
    ttl: u32,
}

/// One DNS server's answers, counted in the node's DNS metrics (entries, hits, misses).
pub struct Cache {
    map: Mutex<lru::LruCache<Key, Entry>>,
    metrics: Arc<Metrics>,
}

impl Cache {
    pub fn new(metrics: Arc<Metrics>) -> Cache {
        let cap = NonZeroUsize::new(CAPACITY).expect("a capacity");
        Cache { map: Mutex::new(lru::LruCache::new(cap)), metrics }
    }

    /// The answer kept for `request`, its TTLs counted down, or None (counted as a miss). The caller sets the id
    /// and the client's header bits.
    pub fn get(&self, request: &Message, now: Instant) -> Option<Message> {
        let key = Key::of(request)?;
        let mut map = self.map.lock();
        let hit = match map.get(&key) {
            Some(e) => {
                let age = now.saturating_duration_since(e.stored).as_secs();
                (age < u64::from(e.ttl)).then(|| count_down(&e.answer, age as u32))
            }
            None => None,
        };
        if hit.is_none() && map.pop(&key).is_some() {
            self.metrics.dns.cache_entries(-1);
        }
        drop(map);
        self.metrics.dns.cache_lookup(hit.is_some());
        hit
    }

    /// Keep the upstream's `answer` to `request` if it may be kept.
    pub fn put(&self, request: &Message, answer: &Message, now: Instant) {
        let (Some(key), Some(ttl)) = (Key::of(request), keep_for(answer)) else { return };
        if answer.to_vec().map_or(true, |b| b.len() > MAX_ENTRY) {
            return;
        }
        let mut map = self.map.lock();
        let entry = Entry { answer: answer.clone(), stored: now, ttl };
        // Replacing its own older answer, or evicting the least recent, leaves the count as it was.
        if map.push(key, entry).is_none() {
            self.metrics.dns.cache_entries(1);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().len()
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        self.metrics.dns.cache_entries(-(self.map.get_mut().len() as i64));
    }
}

/// How long `answer` may be kept (None: not at all).
fn keep_for(answer: &Message) -> Option<u32> {
    if answer.metadata.truncation {
        return None;
    }
    let ttl = match answer.metadata.response_code {
        ResponseCode::NoError if !answer.answers.is_empty() => records(answer).map(|r| r.ttl).min()?,
        ResponseCode::NoError | ResponseCode::NXDomain => negative_ttl(answer)?,
        _ => return None,
    };
    (ttl > 0).then_some(ttl.min(MAX_TTL))
}

/// RFC 2308 §5: the negative answer's SOA TTL, or its MINIMUM if smaller.
fn negative_ttl(answer: &Message) -> Option<u32> {
    answer.authorities.iter().find_map(|r| match &r.data {
        RData::SOA(soa) => Some(r.ttl.min(soa.minimum)),
        _ => None,
    })
}

/// Every record a TTL applies to (an OPT pseudo-record is not one).
fn records(m: &Message) -> impl Iterator<Item = &Record> {
    m.answers.iter().chain(&m.authorities).chain(&m.additionals).filter(|r| r.record_type() != RecordType::OPT)
}

/// `answer` as it stands `age` seconds after it was kept: each TTL less that much.
fn count_down(answer: &Message, age: u32) -> Message {
    let mut m = answer.clone();
    for r in m.answers.iter_mut().chain(m.authorities.iter_mut()).chain(m.additionals.iter_mut()) {
        if r.record_type() != RecordType::OPT {
            r.ttl = r.ttl.saturating_sub(age);
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// How long `answer` would be kept.
    fn lifetime(answer: &Message) -> Option<Duration> {
        keep_for(answer).map(|s| Duration::from_secs(u64::from(s)))
    }
    use hickory_proto::op::{Edns, MessageType, OpCode, Query};
    use hickory_proto::rr::rdata::{A, SOA};
    use hickory_proto::rr::Name;

    fn question(name: &str, qtype: RecordType) -> Message {
        let mut m = Message::query();
        m.metadata.id = 7;
        m.queries.push(Query::query(Name::from_ascii(name).unwrap(), qtype));
        m
    }

    fn answer(q: &Message, code: ResponseCode, answers: &[(u32, [u8; 4])], soa: Option<(u32, u32)>) -> Message {
        let mut m = Message::response(q.metadata.id, OpCode::Query);
        m.metadata.message_type = MessageType::Response;
        m.metadata.response_code = code;
        m.queries = q.queries.clone();
        let name = q.queries[0].name().clone();
        for (ttl, ip) in answers {
            m.answers.push(Record::from_rdata(name.clone(), *ttl, RData::A(A::from(std::net::Ipv4Addr::from(*ip)))));
        }
        if let Some((ttl, minimum)) = soa {
            let zone = Name::from_ascii("test.").unwrap();
            let rdata = SOA::new(zone.clone(), zone.clone(), 1, 3600, 600, 86_400, minimum);
            m.authorities.push(Record::from_rdata(zone, ttl, RData::SOA(rdata)));
        }
        m
    }

    fn cache() -> (Cache, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::default());
        (Cache::new(metrics.clone()), metrics)
    }

    #[test]
    fn an_answer_is_kept_for_its_shortest_ttl_and_counted_down() {
        let (c, metrics) = cache();
        let q = question("external.test.", RecordType::A);
        let a = answer(&q, ResponseCode::NoError, &[(60, [10, 0, 0, 1]), (40, [10, 0, 0, 2])], None);
        let t0 = Instant::now();
        assert!(c.get(&q, t0).is_none(), "nothing yet");
        c.put(&q, &a, t0);
        // Asked again in another case: the same question.
        let again = question("EXTERNAL.test.", RecordType::A);
        let hit = c.get(&again, t0 + Duration::from_secs(15)).expect("kept");
        assert_eq!(hit.answers.iter().map(|r| r.ttl).collect::<Vec<_>>(), [45, 25]);
        assert!(c.get(&q, t0 + Duration::from_secs(40)).is_none(), "gone with its shortest TTL");
        assert_eq!(c.len(), 0);
        let s = metrics.dns.snapshot();
        assert_eq!(
            (s["cacheHits"].as_u64(), s["cacheMisses"].as_u64(), s["cacheEntries"].as_i64()),
            (Some(1), Some(2), Some(0))
        );
    }

    #[test]
    fn negative_answers_live_for_their_soa_and_not_without_one() {
        let (c, _) = cache();
        let t0 = Instant::now();
        let q = question("gone.test.", RecordType::A);
        c.put(&q, &answer(&q, ResponseCode::NXDomain, &[], Some((300, 20))), t0);
        assert_eq!(
            c.get(&q, t0 + Duration::from_secs(19)).map(|m| m.metadata.response_code),
            Some(ResponseCode::NXDomain)
        );
        assert!(c.get(&q, t0 + Duration::from_secs(20)).is_none(), "min(SOA TTL, MINIMUM) = 20 s");
        let nodata = question("empty.test.", RecordType::AAAA);
        assert_eq!(
            lifetime(&answer(&nodata, ResponseCode::NoError, &[], Some((10, 60)))),
            Some(Duration::from_secs(10))
        );
        assert_eq!(lifetime(&answer(&nodata, ResponseCode::NXDomain, &[], None)), None, "no SOA: not kept");
    }

    #[test]
    fn failures_truncated_zero_ttl_and_large_answers_are_not_kept_and_the_bits_tell_questions_apart() {
        let q = question("x.test.", RecordType::A);
        assert_eq!(lifetime(&answer(&q, ResponseCode::ServFail, &[], Some((60, 60)))), None);
        assert_eq!(lifetime(&answer(&q, ResponseCode::Refused, &[], Some((60, 60)))), None);
        let mut tc = answer(&q, ResponseCode::NoError, &[(60, [1, 1, 1, 1])], None);
        tc.metadata.truncation = true;
        assert_eq!(lifetime(&tc), None);
        assert_eq!(lifetime(&answer(&q, ResponseCode::NoError, &[(0, [1, 1, 1, 1])], None)), None);
        assert_eq!(
            lifetime(&answer(&q, ResponseCode::NoError, &[(172_800, [1, 1, 1, 1])], None)),
            Some(Duration::from_secs(86_400))
        );

        let (c, _) = cache();
        let t0 = Instant::now();
        let big: Vec<(u32, [u8; 4])> = (0..400).map(|i| (60, [10, 0, (i / 256) as u8, i as u8])).collect();
        c.put(&q, &answer(&q, ResponseCode::NoError, &big, None), t0);
        assert_eq!(c.len(), 0, "over MAX_ENTRY");
        c.put(&q, &answer(&q, ResponseCode::NoError, &[(60, [1, 1, 1, 1])], None), t0);
        let mut dnssec = q.clone();
        let mut edns = Edns::new();
        edns.set_dnssec_ok(true);
        dnssec.edns = Some(edns);
        assert!(c.get(&dnssec, t0).is_none(), "DO set: another question");
        let mut cd = q.clone();
        cd.metadata.checking_disabled = true;
        assert!(c.get(&cd, t0).is_none(), "CD set: another question");
        assert!(c.get(&q, t0).is_some());
    }

    #[test]
    fn it_holds_at_most_its_capacity_the_least_recently_asked_going_first() {
        let (c, metrics) = cache();
        let t0 = Instant::now();
        let q = |i: usize| question(&format!("n{i}.test."), RecordType::A);
        for i in 0..CAPACITY + 10 {
            c.put(&q(i), &answer(&q(i), ResponseCode::NoError, &[(60, [1, 1, 1, 1])], None), t0);
            if i == 20 {
                assert!(c.get(&q(0), t0).is_some(), "asked again: now the most recent");
            }
        }
        assert_eq!(c.len(), CAPACITY);
        assert!(c.get(&q(0), t0).is_some(), "kept: asked recently");
        assert!(c.get(&q(1), t0).is_none(), "evicted");
        assert_eq!(metrics.dns.snapshot()["cacheEntries"].as_i64(), Some(CAPACITY as i64));
        drop(c);
        assert_eq!(metrics.dns.snapshot()["cacheEntries"].as_i64(), Some(0), "a server's end takes its entries off");
    }
}
