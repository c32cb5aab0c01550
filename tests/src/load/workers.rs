//! The threads of a load: [`Workers`], named, sharing a stop flag, joined on drop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// A group of named threads that share a stop flag, each returning a result. Joining
/// propagates a thread's panic; dropping the group (a test that panicked) stops and joins
/// them, so nothing is left running. Every load of the harness is one.
pub struct Workers<S> {
    stop: Arc<AtomicBool>,
    handles: Vec<JoinHandle<S>>,
}

impl<S: Send + 'static> Workers<S> {
    /// Start `n` threads named `name-0`, `name-1`, ...; `make(i)` builds thread `i`'s body,
    /// which receives the stop flag.
    pub fn spawn<F>(name: &str, n: usize, mut make: impl FnMut(usize) -> F) -> Workers<S>
    where
        F: FnOnce(Arc<AtomicBool>) -> S + Send + 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let handles = (0..n)
            .map(|i| {
                let (body, stop) = (make(i), stop.clone());
                std::thread::Builder::new()
                    .name(format!("{name}-{i}"))
                    .spawn(move || body(stop))
                    .unwrap_or_else(|e| panic!("spawn thread {name}-{i}: {e}"))
            })
            .collect();
        Workers { stop, handles }
    }

    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Wait for every thread; a panic in one is propagated.
    pub fn join(mut self) -> Vec<S> {
        self.handles
            .drain(..)
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    }
}

impl<S> Drop for Workers<S> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}
