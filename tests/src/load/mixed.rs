//! The failover load: a [`PrimaryPointer`] and the [`MixedLoad`] that follows it.
//! Re-exported by [`crate::cluster`].
//!
//! * [`PrimaryPointer`]: "where the primary is now", shared by the load threads; moving it
//!   (after a failover) makes every thread drop its connection and reconnect to the new node.
//! * [`MixedLoad`]: N client threads calling `tso_next()`, `tso_next_batch(k)` and
//!   `tso_seq(key, k)` on the current primary, recording timestamps in a [`History`] and
//!   sequence blocks in a [`DenseHistory`] (errored calls with the count they asked for, so
//!   a burnt block can explain a gap). Each call is recorded under the name of the node the
//!   thread was connected to.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::Client;

use super::{Endpoint, LoadStats, Workers, MAX_LOAD_DURATION};
use crate::error::pg_error_string;
use crate::history::{DenseHistory, History};
use crate::node::Node;
use crate::rng::SplitMix64;

// ============================================================================ primary pointer

/// The node the load should talk to, with a generation number bumped by every move.
#[derive(Clone)]
pub struct PrimaryPointer {
    inner: Arc<RwLock<(u64, Endpoint)>>,
}

impl PrimaryPointer {
    pub fn new(node: &Node) -> Self {
        PrimaryPointer { inner: Arc::new(RwLock::new((0, node.endpoint()))) }
    }

    /// Point at `node`; threads connected elsewhere reconnect before their next call.
    pub fn set(&self, node: &Node) {
        let mut g = self.inner.write().unwrap_or_else(|p| p.into_inner());
        g.0 += 1;
        g.1 = node.endpoint();
    }

    /// (generation, endpoint).
    pub fn current(&self) -> (u64, Endpoint) {
        let g = self.inner.read().unwrap_or_else(|p| p.into_inner());
        (g.0, g.1.clone())
    }
}

// ============================================================================ mixed load

/// Options for [`MixedLoad`].
#[derive(Clone, Debug)]
pub struct MixedLoadOptions {
    pub threads: usize,
    /// Each thread stops after this long (capped at [`MAX_LOAD_DURATION`]) or when stopped.
    pub duration: Duration,
    /// Sleep after a failed connection attempt or a not-serving error.
    pub backoff: Duration,
    pub statement_timeout_ms: u64,
    /// Keys for `tso_seq`.
    pub seq_keys: Vec<String>,
    /// Largest `tso_next_batch` count.
    pub max_batch: i32,
    /// Largest `tso_seq` count.
    pub max_seq: i32,
    /// Probability of a `tso_seq` call; of the rest, half `tso_next()`, half batches.
    pub seq_share: f64,
    /// Probability that a `tso_next()` call is a `tso_next_uuid()` instead (recorded as the
    /// timestamp the UUID carries, decoded by the harness).
    pub uuid_share: f64,
}

impl Default for MixedLoadOptions {
    fn default() -> Self {
        MixedLoadOptions {
            threads: 16,
            duration: Duration::from_secs(120),
            backoff: Duration::from_millis(20),
            statement_timeout_ms: 20_000,
            seq_keys: vec!["k0".into(), "k1".into(), "k2".into()],
            max_batch: 64,
            max_seq: 5,
            seq_share: 0.3,
            uuid_share: 0.5,
        }
    }
}

/// A running mixed load (see the module documentation).
pub struct MixedLoad {
    workers: Workers<LoadStats>,
}

impl MixedLoad {
    pub fn start(
        target: PrimaryPointer,
        opts: MixedLoadOptions,
        ts: History,
        dense: DenseHistory,
    ) -> MixedLoad {
        assert!(!opts.seq_keys.is_empty() || opts.seq_share == 0.0, "seq_share needs seq_keys");
        let deadline = Instant::now() + opts.duration.min(MAX_LOAD_DURATION);
        let workers = Workers::spawn("mixed-load", opts.threads, |_| {
            let (target, opts, ts, dense) =
                (target.clone(), opts.clone(), ts.clone(), dense.clone());
            move |stop| mixed_worker(target, opts, ts, dense, stop, deadline)
        });
        MixedLoad { workers }
    }

    pub fn stop(&self) {
        self.workers.stop();
    }

    /// Stop the threads and wait for them; a panic in a thread is propagated.
    pub fn stop_and_join(self) -> LoadStats {
        self.stop();
        let mut total = LoadStats::default();
        for s in self.workers.join() {
            total.merge(s);
        }
        total
    }
}

enum MixedOp {
    Next,
    Uuid,
    Batch(i32),
    Seq(usize, i32),
}

fn mixed_worker(
    target: PrimaryPointer,
    opts: MixedLoadOptions,
    ts: History,
    dense: DenseHistory,
    stop: Arc<AtomicBool>,
    deadline: Instant,
) -> LoadStats {
    let mut rng = SplitMix64::from_entropy();
    let mut stats = LoadStats::default();
    // (client, generation it was made for, node name)
    let mut conn: Option<(Client, u64, String)> = None;
    while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
        let (generation, ep) = target.current();
        if conn.as_ref().is_some_and(|(_, g, _)| *g != generation) {
            conn = None; // the primary moved
        }
        let Some((client, _, node)) = conn.as_mut() else {
            match ep.connect(opts.statement_timeout_ms) {
                Ok(c) => {
                    stats.connects += 1;
                    conn = Some((c, generation, ep.name.clone()));
                }
                Err(e) => {
                    stats.connect_failures += 1;
                    stats.note(format!("connect: {}", pg_error_string(&e)));
                    std::thread::sleep(opts.backoff);
                }
            }
            continue;
        };
        let op = if rng.chance(opts.seq_share) {
            let k = rng.range_inclusive(0, opts.seq_keys.len() as i64 - 1) as usize;
            MixedOp::Seq(k, rng.range_inclusive(1, opts.max_seq as i64) as i32)
        } else if rng.chance(0.5) {
            if rng.chance(opts.uuid_share) {
                MixedOp::Uuid
            } else {
                MixedOp::Next
            }
        } else {
            MixedOp::Batch(rng.range_inclusive(1, opts.max_batch as i64) as i32)
        };
        let start = Instant::now();
        let r: std::result::Result<i64, postgres::Error> = match &op {
            MixedOp::Next => client.query_one("SELECT tso_next()", &[]).and_then(|r| r.try_get(0)),
            MixedOp::Uuid => client
                .query_one("SELECT tso_next_uuid()::text", &[])
                .and_then(|r| r.try_get::<_, String>(0))
                .map(|text| {
                    crate::tso::uuid_timestamp(&text)
                        .unwrap_or_else(|e| panic!("tso_next_uuid() returned {e}"))
                }),
            MixedOp::Batch(k) => {
                client.query_one("SELECT tso_next_batch($1)", &[k]).and_then(|r| r.try_get(0))
            }
            MixedOp::Seq(key, k) => client
                .query_one("SELECT tso_seq($1::text, $2::int)", &[&opts.seq_keys[*key], k])
                .and_then(|r| r.try_get(0)),
        };
        let end = Instant::now();
        let node = node.clone();
        match r {
            Ok(first) => {
                stats.ok_calls += 1;
                match op {
                    MixedOp::Next | MixedOp::Uuid => ts.record_ok(start, end, &node, first, 1),
                    MixedOp::Batch(k) => ts.record_ok(start, end, &node, first, k as i64),
                    MixedOp::Seq(key, k) => {
                        dense.record_ok(start, end, &node, &opts.seq_keys[key], first, k as i64)
                    }
                }
            }
            Err(e) => {
                stats.err_calls += 1;
                let msg = pg_error_string(&e);
                stats.note(msg.clone());
                match op {
                    MixedOp::Next | MixedOp::Uuid => ts.record_err(start, end, &node, msg, 1),
                    MixedOp::Batch(k) => ts.record_err(start, end, &node, msg, k as i64),
                    MixedOp::Seq(key, k) => {
                        dense.record_err(start, end, &node, &opts.seq_keys[key], msg, k as i64)
                    }
                }
                let closed = conn.as_ref().is_none_or(|(c, _, _)| c.is_closed());
                let not_serving = e.code() == Some(&SqlState::CANNOT_CONNECT_NOW);
                let broken = closed
                    || conn.as_ref().is_some_and(|(c, _, _)| crate::error::session_broken(c, &e));
                if broken {
                    conn = None;
                }
                if broken || not_serving {
                    std::thread::sleep(opts.backoff);
                }
            }
        }
    }
    stats
}
