//! Per-worker silos: the dataplane's connection workers, one thread and one single-threaded tokio runtime each.
//!
//! A connection is accepted by one silo and stays there for its whole life: its setup, its copy, the HBONE stream
//! it opens, and the pooled HBONE connection carrying that stream (the pool keeps one set of connections per silo,
//! keyed as before). Node B's side is the same: the TLS connection, its HTTP/2 driver and every stream task it spawns
//! run on the silo that accepted it. A task waking another (data arriving for a stream; a stream's send window
//! opening) is then a local queue push, never a cross-thread wake of another worker (a futex, a context switch), which
//! is what a multi-threaded runtime paid per request on each node. Envoy's workers are silos in the same sense.
//!
//! Every listener is served by every silo: each silo registers its own descriptor of the listening socket (the
//! last silo the original, the others a duplicate: one descriptor per silo) in its own reactor and accepts from it; the kernel wakes the silos waiting on the socket and the first to call accept() takes
//! the connection (the others find nothing and wait again). A busy silo reaches accept() later, so new connections go
//! to the idle one. (SO_REUSEPORT groups would spread connections by hash instead, but would need a socket per silo
//! created in each pod's namespace, and a hash sends connections to a busy silo as readily as to an idle one.)
//!
//! Everything that is not a connection (xDS-driven work, the CNI server, DNS, timers, napi calls) runs on the control
//! runtime, as before.

use std::cell::Cell;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

thread_local! {
    /// 1-based index of the silo this thread runs; 0 on any other thread.
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// Which silo the calling thread is (1..=n), or 0 off the silos (the control runtime, tests).
pub fn current() -> usize {
    INDEX.with(Cell::get)
}

pub struct Silos {
    handles: Vec<Handle>,
    stop: CancellationToken,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Silos {
    /// `n` silo threads, named `ztunnel-<i>` (the worker names a multi-threaded runtime used before).
    pub fn start(n: usize) -> std::io::Result<Arc<Silos>> {
        let stop = CancellationToken::new();
        let mut handles = Vec::with_capacity(n);
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            let stop = stop.clone();
            let thread = std::thread::Builder::new().name(format!("ztunnel-{i}")).spawn(move || {
                INDEX.with(|c| c.set(i + 1));
                let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                let _ = tx.send(Ok(rt.handle().clone()));
                rt.block_on(stop.cancelled());
                // Whatever is still running is dropped with the runtime: its sockets close.
                drop(rt);
            })?;
            threads.push(thread);
            let handle = rx.recv().map_err(|_| std::io::Error::other("a silo thread ended before it started"))??;
            handles.push(handle);
        }
        Ok(Arc::new(Silos { handles, stop, threads: Mutex::new(threads) }))
    }

    /// No silos: listeners are served on the caller's runtime (unit tests that build their own inputs).
    pub fn inline() -> Arc<Silos> {
        Arc::new(Silos { handles: Vec::new(), stop: CancellationToken::new(), threads: Mutex::new(Vec::new()) })
    }

    pub fn handles(&self) -> &[Handle] {
        &self.handles
    }

    /// How many pool shards a pool needs: one per silo, plus one for callers off the silos.
    pub fn shards(n: usize) -> usize {
        n + 1
    }

    /// Tell every silo to stop, without waiting.
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Stop every silo: their tasks are dropped (their sockets closed). Waits up to `timeout` for the threads.
    pub fn shutdown(&self, timeout: Duration) {
        self.stop.cancel();
        let threads = std::mem::take(&mut *self.threads.lock());
        let deadline = std::time::Instant::now() + timeout;
        for t in threads {
            while !t.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }

    /// Run `make(i)` on every silo i; resolves when all have ended (at once with no silos, running it inline).
    pub async fn on_each<F, Fut>(&self, mut make: F)
    where
        F: FnMut(usize) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        if self.handles.is_empty() {
            return make(0).await;
        }
        let joins: Vec<_> = self.handles.iter().enumerate().map(|(i, h)| h.spawn(make(i + 1))).collect();
        for j in joins {
            let _ = j.await;
        }
    }
}

impl Drop for Silos {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_run_on_their_silo_and_stop_with_it() {
        let silos = Silos::start(2).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        rt.block_on(silos.on_each(move |_| {
            let s = s.clone();
            async move {
                // A task spawned from a silo stays on it.
                let outer = current();
                let inner = tokio::spawn(async { current() }).await.unwrap();
                s.lock().push((outer, inner, std::thread::current().name().map(str::to_string)));
            }
        }));
        let mut seen = seen.lock().clone();
        seen.sort();
        assert_eq!(
            seen,
            vec![(1, 1, Some("ztunnel-0".to_string())), (2, 2, Some("ztunnel-1".to_string()))],
            "each silo ran its task and the task's child on its own thread"
        );
        assert_eq!(current(), 0, "the test's thread is no silo");
        silos.shutdown(Duration::from_secs(2));
        assert!(silos.threads.lock().is_empty());
    }

    #[test]
    fn inline_runs_on_the_caller() {
        let silos = Silos::inline();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let ran = Arc::new(Mutex::new(None));
        let r = ran.clone();
        rt.block_on(silos.on_each(move |i| {
            let r = r.clone();
            async move { *r.lock() = Some((i, current())) }
        }));
        assert_eq!(*ran.lock(), Some((0, 0)));
    }
}
