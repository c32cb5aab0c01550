//! The timestamp load: [`Load`] runs N threads calling an [`Op`] in a loop, each with its
//! own connection, and records every call in a [`History`] (see the
//! [module documentation](super)).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::Client;

use super::{Endpoint, LoadStats, Workers, MAX_LOAD_DURATION};
use crate::error::pg_error_string;
use crate::history::History;
use crate::rng::SplitMix64;

/// What one operation obtained.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Got {
    /// `(first, count)`: the values `[first, first + count)` of one call.
    Batch(i64, i64),
    /// One statement's values, in the order the statement took them (its rows' order).
    Statement(Vec<i64>),
}

/// One operation: returns what it obtained.
pub type Op =
    Arc<dyn Fn(&mut Client, &mut SplitMix64) -> Result<Got, postgres::Error> + Send + Sync>;

#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Number of client threads (each with its own connection); spread round-robin over the
    /// endpoints.
    pub threads: usize,
    /// Each thread stops after this long (capped at [`MAX_LOAD_DURATION`]) or when stopped.
    pub duration: Duration,
    /// Sleep after a failed connection attempt or an error.
    pub backoff: Duration,
    /// `statement_timeout` for the load's connections.
    pub statement_timeout_ms: u64,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            threads: 16,
            duration: Duration::from_secs(5),
            backoff: Duration::from_millis(20),
            statement_timeout_ms: 30_000,
        }
    }
}

impl LoadOptions {
    pub fn new(threads: usize, duration: Duration) -> Self {
        LoadOptions { threads, duration, ..Default::default() }
    }
}

/// A running load.
pub struct Load {
    workers: Workers<LoadStats>,
}

impl Load {
    /// Start `opts.threads` threads calling `op` against `endpoints`, recording into `history`.
    pub fn start(endpoints: Vec<Endpoint>, opts: LoadOptions, op: Op, history: History) -> Load {
        assert!(!endpoints.is_empty(), "load needs at least one endpoint");
        let deadline = Instant::now() + opts.duration.min(MAX_LOAD_DURATION);
        let workers = Workers::spawn("load", opts.threads, |i| {
            let ep = endpoints[i % endpoints.len()].clone();
            let (op, history, opts) = (op.clone(), history.clone(), opts.clone());
            move |stop| worker(ep, op, history, stop, deadline, opts)
        });
        Load { workers }
    }

    /// Start, wait for `opts.duration`, join.
    pub fn run(
        endpoints: Vec<Endpoint>,
        opts: LoadOptions,
        op: Op,
        history: &History,
    ) -> LoadStats {
        Load::start(endpoints, opts, op, history.clone()).join()
    }

    /// The flag that stops the threads (shareable with other code).
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.workers.stop_flag()
    }

    pub fn stop(&self) {
        self.workers.stop();
    }

    /// Wait for the threads (they end at their deadline or when stopped); a panic in a thread
    /// is propagated.
    pub fn join(self) -> LoadStats {
        let mut total = LoadStats::default();
        for s in self.workers.join() {
            total.merge(s);
        }
        total
    }

    pub fn stop_and_join(self) -> LoadStats {
        self.stop();
        self.join()
    }
}

fn worker(
    ep: Endpoint,
    op: Op,
    history: History,
    stop: Arc<AtomicBool>,
    deadline: Instant,
    opts: LoadOptions,
) -> LoadStats {
    let mut rng = SplitMix64::from_entropy();
    let mut stats = LoadStats::default();
    let mut client: Option<Client> = None;
    while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
        let Some(c) = client.as_mut() else {
            match ep.connect(opts.statement_timeout_ms) {
                Ok(c) => {
                    stats.connects += 1;
                    client = Some(c);
                }
                Err(e) => {
                    stats.connect_failures += 1;
                    stats.note(format!("connect: {}", pg_error_string(&e)));
                    std::thread::sleep(opts.backoff);
                }
            }
            continue;
        };
        let start = Instant::now();
        let r = op(c, &mut rng);
        let end = Instant::now();
        match r {
            Ok(got) => {
                stats.ok_calls += 1;
                match got {
                    Got::Batch(first, count) => {
                        history.record_ok(start, end, &ep.name, first, count)
                    }
                    Got::Statement(values) => {
                        history.record_statement(start, end, &ep.name, &values)
                    }
                }
            }
            Err(e) => {
                stats.err_calls += 1;
                let msg = pg_error_string(&e);
                stats.note(msg.clone());
                // The count is unknown to the op on error; 1 is recorded (errors carry no
                // values, so the timestamp checks do not use it).
                history.record_err(start, end, &ep.name, msg, 1);
                let broken = crate::error::session_broken(c, &e);
                if broken {
                    client = None;
                }
                if broken || e.code() == Some(&SqlState::CANNOT_CONNECT_NOW) {
                    std::thread::sleep(opts.backoff);
                }
            }
        }
    }
    stats
}
