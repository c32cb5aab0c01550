//! The sequence load ([`SeqLoad`]), recording every `tso_seq`/`tso_seq_batch` call in a
//! [`DenseHistory`]. Re-exported by [`crate::seqlease`], whose calls it makes.
//!
//! [`SeqLoad`] runs N threads, each with its own connection (reconnecting across restarts
//! like [`crate::Load`]). Each call is either `tso_seq(key, n)` for a random key of
//! `keys` and `n` uniform in `1..=max_count`, or (with probability `batch_chance`)
//! `tso_seq_batch(batch_keys, counts)` over all of `batch_keys`, in a random order. Every
//! call is recorded per key: a batch becomes one [`crate::DenseCall`] per key, all with the
//! call's start and end. An errored call is recorded as an error *with the count it asked
//! for*, so a block the worker committed for a caller that never heard back (a burnt block)
//! explains a gap of exactly that size.
//!
//! Through a pooled endpoint ([`crate::Endpoint::pooled`]) the calls use unnamed statements
//! ([`seq_unnamed`], [`seq_batch_unnamed`]).
//!
//! The rows a batch returns are checked on the spot (request order, one row per key, the
//! counts asked for); a mismatch panics the thread, and [`SeqLoad::join`] propagates it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use postgres::Client;

use super::{Endpoint, LoadStats, Workers, MAX_LOAD_DURATION};
use crate::error::pg_error_string;
use crate::history::DenseHistory;
use crate::rng::SplitMix64;
use crate::seqlease::{seq, seq_batch, seq_batch_unnamed, seq_unnamed, sqlstate_of};

/// Options of a [`SeqLoad`].
#[derive(Clone, Debug)]
pub struct SeqLoadOptions {
    pub threads: usize,
    pub duration: Duration,
    /// Keys of the single-key calls.
    pub keys: Vec<String>,
    /// Keys of the batch calls (all of them in every batch, in a random order); empty: no
    /// batches.
    pub batch_keys: Vec<String>,
    pub batch_chance: f64,
    /// Counts are uniform in `1..=max_count`.
    pub max_count: i32,
    pub backoff: Duration,
    pub statement_timeout_ms: u64,
}

impl SeqLoadOptions {
    pub fn new(threads: usize, duration: Duration, keys: &[&str]) -> Self {
        SeqLoadOptions {
            threads,
            duration,
            keys: keys.iter().map(|s| s.to_string()).collect(),
            batch_keys: Vec::new(),
            batch_chance: 0.0,
            max_count: 100,
            backoff: Duration::from_millis(20),
            statement_timeout_ms: 30_000,
        }
    }

    pub fn batches(mut self, keys: &[&str], chance: f64) -> Self {
        self.batch_keys = keys.iter().map(|s| s.to_string()).collect();
        self.batch_chance = chance;
        self
    }
}

/// Totals of a [`SeqLoad`]: the counters of every load ([`LoadStats`]: calls, errors,
/// connections) and what only a sequence load tells apart.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeqLoadStats {
    /// Calls (single and batch), errors, connections, sample errors.
    pub load: LoadStats,
    /// Successful `tso_seq` calls.
    pub single_ok: u64,
    /// Successful `tso_seq_batch` calls.
    pub batch_ok: u64,
    /// Queue slots of the successful calls (1 per single call, one per key per batch).
    pub slots_ok: u64,
    /// Errored calls by SQLSTATE (`"none"`: no server error, e.g. the connection broke).
    pub errors_by_sqlstate: BTreeMap<String, u64>,
}

impl SeqLoadStats {
    pub fn ok_calls(&self) -> u64 {
        self.single_ok + self.batch_ok
    }

    fn merge(&mut self, o: SeqLoadStats) {
        self.load.merge(o.load);
        self.single_ok += o.single_ok;
        self.batch_ok += o.batch_ok;
        self.slots_ok += o.slots_ok;
        for (k, v) in o.errors_by_sqlstate {
            *self.errors_by_sqlstate.entry(k).or_default() += v;
        }
    }
}

/// A running sequence load (see the module documentation).
pub struct SeqLoad {
    workers: Workers<SeqLoadStats>,
}

impl SeqLoad {
    pub fn start(endpoint: Endpoint, opts: SeqLoadOptions, history: DenseHistory) -> SeqLoad {
        assert!(!opts.keys.is_empty() || !opts.batch_keys.is_empty(), "a sequence load needs keys");
        let deadline = Instant::now() + opts.duration.min(MAX_LOAD_DURATION);
        let workers = Workers::spawn("seq-load", opts.threads, |_| {
            let (ep, history, opts) = (endpoint.clone(), history.clone(), opts.clone());
            move |stop| seq_worker(ep, history, stop, deadline, opts)
        });
        SeqLoad { workers }
    }

    pub fn stop(&self) {
        self.workers.stop();
    }

    /// Wait for the threads; a panic in one (e.g. a malformed batch answer) is propagated.
    pub fn join(self) -> SeqLoadStats {
        let mut total = SeqLoadStats::default();
        for s in self.workers.join() {
            total.merge(s);
        }
        total
    }

    pub fn stop_and_join(self) -> SeqLoadStats {
        self.stop();
        self.join()
    }
}

fn seq_worker(
    ep: Endpoint,
    history: DenseHistory,
    stop: Arc<AtomicBool>,
    deadline: Instant,
    opts: SeqLoadOptions,
) -> SeqLoadStats {
    let mut rng = SplitMix64::from_entropy();
    let mut stats = SeqLoadStats::default();
    let mut client: Option<Client> = None;
    while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
        let Some(c) = client.as_mut() else {
            match ep.connect(opts.statement_timeout_ms) {
                Ok(c) => {
                    stats.load.connects += 1;
                    client = Some(c);
                }
                Err(e) => {
                    stats.load.connect_failures += 1;
                    stats.load.note(format!("connect: {}", pg_error_string(&e)));
                    std::thread::sleep(opts.backoff);
                }
            }
            continue;
        };
        let batch =
            !opts.batch_keys.is_empty() && (opts.keys.is_empty() || rng.chance(opts.batch_chance));
        // (key, count) of every entry of this call.
        let entries: Vec<(String, i32)> = if batch {
            let mut keys = opts.batch_keys.clone();
            for i in (1..keys.len()).rev() {
                let j = rng.range_inclusive(0, i as i64) as usize;
                keys.swap(i, j);
            }
            keys.into_iter()
                .map(|k| (k, rng.range_inclusive(1, opts.max_count as i64) as i32))
                .collect()
        } else {
            let k = &opts.keys[rng.range_inclusive(0, opts.keys.len() as i64 - 1) as usize];
            vec![(k.clone(), rng.range_inclusive(1, opts.max_count as i64) as i32)]
        };
        let start = Instant::now();
        let result: std::result::Result<Vec<i64>, postgres::Error> = if batch {
            let keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
            let counts: Vec<i32> = entries.iter().map(|(_, n)| *n).collect();
            let rows = if ep.is_pooled() {
                seq_batch_unnamed(c, &keys, &counts)
            } else {
                seq_batch(c, &keys, &counts)
            };
            rows.map(|rows| {
                assert_eq!(rows.len(), entries.len(), "tso_seq_batch({keys:?}, {counts:?}) returned {rows:?}");
                for ((k, n), (rk, _, rn)) in entries.iter().zip(&rows) {
                    assert!(
                        k == rk && n == rn,
                        "tso_seq_batch({keys:?}, {counts:?}) returned {rows:?}: not in request order"
                    );
                }
                rows.into_iter().map(|(_, s, _)| s).collect()
            })
        } else if ep.is_pooled() {
            seq_unnamed(c, &entries[0].0, entries[0].1).map(|s| vec![s])
        } else {
            seq(c, &entries[0].0, entries[0].1).map(|s| vec![s])
        };
        let end = Instant::now();
        match result {
            Ok(starts) => {
                if batch {
                    stats.batch_ok += 1;
                } else {
                    stats.single_ok += 1;
                }
                stats.load.ok_calls += 1;
                stats.slots_ok += entries.len() as u64;
                for ((k, n), s) in entries.iter().zip(starts) {
                    history.record_ok(start, end, &ep.name, k, s, *n as i64);
                }
            }
            Err(e) => {
                stats.load.err_calls += 1;
                *stats.errors_by_sqlstate.entry(sqlstate_of(&e)).or_default() += 1;
                let msg = pg_error_string(&e);
                stats.load.note(msg.clone());
                for (k, n) in &entries {
                    history.record_err(start, end, &ep.name, k, msg.clone(), *n as i64);
                }
                let broken = crate::error::session_broken(c, &e);
                if broken {
                    client = None;
                }
                std::thread::sleep(opts.backoff);
            }
        }
    }
    stats
}
