//! Client-observed histories and their checkers.
//!
//! # Timestamps: [`History`]
//!
//! Each call is `(start, end, node, result, count)`: `start` taken just before the request was
//! sent, `end` just after the answer arrived; a successful call covers the values
//! `[first, first + count)` (count 1 for `tso_next()`); a failed call holds the error text and
//! covers nothing we know of. [`History::check`] verifies:
//!
//! * **uniqueness**: no two successful calls' ranges overlap (so no value was issued twice);
//! * **real-time order**: if call A ended before call B began (`A.end < B.start`), then every
//!   value of A is below every value of B (`A.last < B.first`). Calls that overlap in time may
//!   be ordered either way. Across a restart this is "never go back": the calls before the
//!   outage ended before the calls after it began.
//!
//! Both run in O(n log n): uniqueness sorts by first value; real-time order sorts the calls by
//! start and by end and sweeps, keeping the largest last value among the calls that ended
//! before the current call's start.
//!
//! # Dense blocks: [`DenseHistory`]
//!
//! For per-key counters (`tso_seq(key, count)` → start of `[start, start + count)`): per key, the
//! successful blocks must not overlap, must respect real-time order (as above), and must tile
//! `[0, total)` exactly, where `total` is given (e.g. read back from the server) or else the end
//! of the highest block. A gap is allowed only if it is explained by errored calls of that key:
//! the gaps must be partitionable into blocks whose sizes are the counts of distinct errored
//! calls (a request whose caller failed may still have been committed: a burnt block).
//!
//! # Files
//!
//! * `mod.rs`: the [`Recorder`] both histories are;
//! * `timestamps.rs`: [`Call`], [`History`] and its check ([`check_calls`]);
//! * `dense.rs`: [`DenseCall`], [`DenseHistory`] and its check per key ([`check_dense`]);
//! * `gaps.rs`: whether the errored calls' counts explain a key's gaps;
//! * `spans.rs`: the two sweeps both checks make (overlap, real-time order).

mod dense;
mod gaps;
mod spans;
mod timestamps;

use std::sync::{Arc, Mutex};
use std::time::Instant;

pub use dense::{check_dense, DenseCall, DenseHistory, DenseReport, DenseViolation, KeyReport};
pub use timestamps::{check_calls, Call, History, HistoryReport, NodeCounts, Violation};

/// A thread-safe, append-only record of calls of type `T`; clones share the same record.
/// [`History`] records timestamp calls, [`DenseHistory`] sequence blocks.
#[derive(Clone, Debug)]
pub struct Recorder<T> {
    origin: Instant,
    calls: Arc<Mutex<Vec<T>>>,
}

impl<T: Clone> Default for Recorder<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Clone> Recorder<T> {
    pub fn new() -> Self {
        Recorder { origin: Instant::now(), calls: Arc::new(Mutex::new(Vec::new())) }
    }

    /// Reference instant for readable reports (times are printed relative to it).
    pub fn origin(&self) -> Instant {
        self.origin
    }

    pub fn record(&self, call: T) {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).push(call);
    }

    /// A copy of the calls recorded so far.
    pub fn calls(&self) -> Vec<T> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn len(&self) -> usize {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `f` of the calls recorded so far, without copying them.
    pub fn with_calls<R>(&self, f: impl FnOnce(&[T]) -> R) -> R {
        let g = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        f(&g)
    }
}

/// `base` plus `ms` milliseconds: the instants of the checkers' tests.
#[cfg(test)]
fn at(base: Instant, ms: u64) -> Instant {
    base + std::time::Duration::from_millis(ms)
}
