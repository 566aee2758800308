//! A DNS server's rate budget: questions per second (a token bucket), so that one workload flooding its own proxy
//! costs the node a bounded share of the control thread, where every server answers (issue #29: a flood took the
//! whole thread and, on a busy node, the tunnels' CPU). Over its budget a UDP server drops the question in hand and
//! stops reading until a token is due (the kernel drops the rest at the full receive buffer, at no cost to the
//! daemon); a TCP connection's next question waits for a token.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Questions per second one server answers, and the burst it may spend at once (a second's worth).
pub const QUESTIONS_PER_SECOND: u32 = 10_000;

pub struct Rate {
    per_second: f64,
    bucket: Mutex<Bucket>,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Rate {
    pub fn new(per_second: u32) -> Rate {
        let per_second = f64::from(per_second.max(1));
        Rate { per_second, bucket: Mutex::new(Bucket { tokens: per_second, at: Instant::now() }) }
    }

    /// Takes one question's token if there is one now; else how long until there is.
    pub fn take(&self, now: Instant) -> Result<(), Duration> {
        let mut b = self.bucket.lock();
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed * self.per_second).min(self.per_second);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - b.tokens) / self.per_second))
        }
    }

    /// Waits for a token (TCP: a connection's questions are paced, not dropped).
    pub async fn wait(&self) {
        while let Err(wait) = self.take(Instant::now()) {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_a_second_then_the_rate() {
        let r = Rate::new(100);
        let t0 = Instant::now();
        assert_eq!((0..150).filter(|_| r.take(t0).is_ok()).count(), 100, "the burst is a second's worth");
        let wait = r.take(t0).unwrap_err();
        assert!(wait <= Duration::from_millis(10) && wait > Duration::ZERO, "{wait:?}");
        let t1 = t0 + Duration::from_millis(500);
        assert_eq!((0..150).filter(|_| r.take(t1).is_ok()).count(), 50, "refilled at the rate");
        let t2 = t1 + Duration::from_secs(60);
        assert_eq!((0..150).filter(|_| r.take(t2).is_ok()).count(), 100, "never more than the burst");
    }
}
