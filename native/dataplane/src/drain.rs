//! Drain: one vocabulary for shutting things down.
//!
//! A `Drain` has a trigger (`graceful`: stop accepting, send GOAWAY, let connections finish), a `force` signal
//! (close whatever is still open), a deadline between the two, and the set of tasks it waits for. Per-workload
//! drains are children of the daemon's: draining the daemon drains every workload.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[derive(Clone, Default)]
pub struct Drain {
    pub graceful: CancellationToken,
    pub force: CancellationToken,
    pub tasks: TaskTracker,
}

impl Drain {
    pub fn new() -> Drain {
        Drain::default()
    }

    /// A drain that is triggered with its parent, and can also be triggered on its own.
    pub fn child(&self) -> Drain {
        Drain { graceful: self.graceful.child_token(), force: self.force.child_token(), tasks: TaskTracker::new() }
    }

    /// Graceful drain: signal, wait up to `deadline` for the tracked tasks, then force-close and wait for them to
    /// notice. Returns true if everything finished before the deadline.
    pub async fn drain(&self, deadline: Duration) -> bool {
        self.graceful.cancel();
        self.tasks.close();
        let clean = tokio::time::timeout(deadline, self.tasks.wait()).await.is_ok();
        if !clean {
            self.force.cancel();
            // Forced tasks drop their sockets at once; a short bound keeps a stuck task from blocking exit.
            let _ = tokio::time::timeout(Duration::from_secs(1), self.tasks.wait()).await;
        }
        clean
    }

    /// Immediate drain: force-close now.
    pub async fn drain_now(&self) {
        self.graceful.cancel();
        self.force.cancel();
        self.tasks.close();
        let _ = tokio::time::timeout(Duration::from_secs(1), self.tasks.wait()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn graceful_then_forced_after_the_deadline() {
        let d = Drain::new();
        let child = d.child();
        let f = child.force.clone();
        child.tasks.spawn(async move { f.cancelled().await });
        let clean = child.drain(Duration::from_millis(50)).await;
        assert!(!clean, "a task that only ends when forced cannot finish gracefully");
        assert!(child.force.is_cancelled());
        assert!(!d.force.is_cancelled(), "a child's drain does not drain the parent");
    }

    #[tokio::test]
    async fn parent_drain_reaches_children() {
        let d = Drain::new();
        let child = d.child();
        d.graceful.cancel();
        assert!(child.graceful.is_cancelled());
    }
}
