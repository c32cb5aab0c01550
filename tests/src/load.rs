//! Client load: N threads, each with its own connection, calling an operation in a loop and
//! recording every call in a [`History`].
//!
//! A thread runs until its stop flag is set or its duration has passed (hard cap
//! [`MAX_LOAD_DURATION`]). Errors are expected while servers restart: an errored call is
//! recorded as an error (never as a value), the connection is dropped if it is broken, and the
//! thread reconnects with a short backoff. Failed connection attempts are not calls (nothing
//! was asked of the oracle) and are only counted. Every connection has a
//! `statement_timeout`, so a hung call ends too.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::{Client, NoTls};

use crate::error::pg_error_string;
use crate::history::History;
use crate::rng::SplitMix64;

/// No load runs longer than this, whatever it was asked.
pub const MAX_LOAD_DURATION: Duration = Duration::from_secs(600);

/// Where a load thread connects: a name (recorded as the call's node) and a function giving
/// the current conninfo (so it can follow a node that moved, or later a changing primary).
///
/// A *pooled* endpoint is a connection pooler ([`crate::pooler::PgBouncer`]): PgBouncer
/// refuses the startup parameter `options`, so its connections carry no
/// `statement_timeout` of their own (the pooler's role has one on the server, see
/// [`crate::pooler::create_role`]), and loads call it with unnamed statements only.
#[derive(Clone)]
pub struct Endpoint {
    pub name: String,
    resolve: Arc<dyn Fn() -> String + Send + Sync>,
    pooled: bool,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Endpoint({}: {})", self.name, self.conninfo())
    }
}

impl Endpoint {
    pub fn new(name: &str, resolve: impl Fn() -> String + Send + Sync + 'static) -> Self {
        Endpoint { name: name.to_string(), resolve: Arc::new(resolve), pooled: false }
    }

    pub fn fixed(name: &str, conninfo: &str) -> Self {
        let c = conninfo.to_string();
        Endpoint::new(name, move || c.clone())
    }

    /// A connection pooler at `conninfo` (see the type's documentation).
    pub fn pooled(name: &str, conninfo: &str) -> Self {
        Endpoint { pooled: true, ..Endpoint::fixed(name, conninfo) }
    }

    /// Whether this is a connection pooler: no startup `options`, unnamed statements only.
    pub fn is_pooled(&self) -> bool {
        self.pooled
    }

    pub fn conninfo(&self) -> String {
        (self.resolve)()
    }

    /// One connection attempt, with the load's statement timeout (a pooled endpoint's comes
    /// from its role on the server).
    pub fn connect(&self, statement_timeout_ms: u64) -> Result<Client, postgres::Error> {
        let mut cfg: postgres::Config = self.conninfo().parse()?;
        if cfg.get_connect_timeout().is_none() {
            cfg.connect_timeout(Duration::from_secs(5));
        }
        if cfg.get_options().is_none() && !self.pooled {
            cfg.options(&format!("-c statement_timeout={statement_timeout_ms}"));
        }
        cfg.application_name("tsoracle-load");
        cfg.connect(NoTls)
    }
}

/// One operation: returns `(first, count)` of the values it obtained.
pub type Op =
    Arc<dyn Fn(&mut Client, &mut SplitMix64) -> Result<(i64, i64), postgres::Error> + Send + Sync>;

/// Ready-made operations.
pub mod ops {
    use super::Op;
    use std::sync::Arc;

    /// `SELECT tso_next()`.
    pub fn tso_next() -> Op {
        Arc::new(|c, _| Ok((c.query_one("SELECT tso_next()", &[])?.try_get(0)?, 1)))
    }

    /// `SELECT tso_next_batch(k)`, k uniform in `1..=max`.
    pub fn tso_next_batch(max: i32) -> Op {
        Arc::new(move |c, rng| {
            let k = rng.range_inclusive(1, max as i64) as i32;
            Ok((c.query_one("SELECT tso_next_batch($1)", &[&k])?.try_get(0)?, k as i64))
        })
    }

    /// Half `tso_next()`, half `tso_next_batch(k)` with k uniform in `1..=max_batch`; one
    /// batch in 200 asks for a random size up to the maximum (262144), which uses up a whole
    /// millisecond's logical space.
    pub fn mixed(max_batch: i32) -> Op {
        Arc::new(move |c, rng| {
            if rng.chance(0.5) {
                Ok((c.query_one("SELECT tso_next()", &[])?.try_get(0)?, 1))
            } else {
                let max = if rng.chance(0.005) { crate::tso::MAX_BATCH } else { max_batch };
                let k = rng.range_inclusive(1, max as i64) as i32;
                Ok((c.query_one("SELECT tso_next_batch($1)", &[&k])?.try_get(0)?, k as i64))
            }
        })
    }

    /// `SELECT tso_next_uuid()`: the timestamp it carries, decoded by the harness (a UUID that
    /// is not version 7 fails the load).
    pub fn tso_next_uuid() -> Op {
        Arc::new(|c, _| {
            let text: String = c.query_one("SELECT tso_next_uuid()::text", &[])?.try_get(0)?;
            let ts = crate::tso::uuid_timestamp(&text)
                .unwrap_or_else(|e| panic!("tso_next_uuid() returned {e}"));
            Ok((ts, 1))
        })
    }

    /// A third each: `tso_next()`, `tso_next_uuid()` (recorded as the timestamp it carries, so
    /// the history checks the UUIDs' order: their bytes are ordered like their timestamps) and
    /// [`mixed`]'s batches.
    pub fn mixed_with_uuid(max_batch: i32) -> Op {
        let (uuid, batches) = (tso_next_uuid(), mixed(max_batch));
        Arc::new(move |c, rng| if rng.chance(1.0 / 3.0) { uuid(c, rng) } else { batches(c, rng) })
    }

    /// Any statement returning one bigint, count 1.
    pub fn statement(sql: &str) -> Op {
        let sql = sql.to_string();
        Arc::new(move |c, _| Ok((c.query_one(sql.as_str(), &[])?.try_get(0)?, 1)))
    }

    /// The same operations with unnamed statements (`query_typed`: parse, bind, execute and
    /// sync in one round trip), for a transaction pooler ([`super::Endpoint::pooled`]): it
    /// gives a client a server connection per transaction, so a statement prepared by name
    /// in one round trip may be executed in the next on another server connection, which
    /// does not know it (PgBouncer 1.18 has no prepared statements in transaction pooling).
    pub mod unnamed {
        use super::super::Op;
        use postgres::types::Type;
        use std::sync::Arc;

        /// `SELECT tso_next()`.
        pub fn tso_next() -> Op {
            Arc::new(|c, _| Ok((c.query_typed_one("SELECT tso_next()", &[])?.try_get(0)?, 1)))
        }

        fn batch(c: &mut postgres::Client, k: i32) -> Result<(i64, i64), postgres::Error> {
            let row = c.query_typed_one("SELECT tso_next_batch($1)", &[(&k, Type::INT4)])?;
            Ok((row.try_get(0)?, k as i64))
        }

        /// `SELECT tso_next_uuid()`, recorded as the timestamp it carries.
        pub fn tso_next_uuid() -> Op {
            Arc::new(|c, _| {
                let text: String =
                    c.query_typed_one("SELECT tso_next_uuid()::text", &[])?.try_get(0)?;
                let ts = crate::tso::uuid_timestamp(&text)
                    .unwrap_or_else(|e| panic!("tso_next_uuid() returned {e}"));
                Ok((ts, 1))
            })
        }

        /// As [`super::mixed_with_uuid`]: a third each of `tso_next_uuid()`, `tso_next()` and
        /// `tso_next_batch(k)` (k uniform in `1..=max_batch`, one in 200 up to the maximum).
        pub fn mixed_with_uuid(max_batch: i32) -> Op {
            let (next, uuid) = (tso_next(), tso_next_uuid());
            Arc::new(move |c, rng| {
                if rng.chance(1.0 / 3.0) {
                    uuid(c, rng)
                } else if rng.chance(0.5) {
                    next(c, rng)
                } else {
                    let max = if rng.chance(0.005) { crate::tso::MAX_BATCH } else { max_batch };
                    batch(c, rng.range_inclusive(1, max as i64) as i32)
                }
            })
        }
    }
}

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

/// Totals over all threads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadStats {
    pub ok_calls: u64,
    pub err_calls: u64,
    /// Successful (re)connections, the first ones included.
    pub connects: u64,
    pub connect_failures: u64,
    /// A few distinct error messages seen (for diagnostics).
    pub sample_errors: Vec<String>,
}

impl LoadStats {
    /// Keep `e` among the sample errors (ten distinct ones at most).
    pub(crate) fn note(&mut self, e: String) {
        if self.sample_errors.len() < 10 && !self.sample_errors.contains(&e) {
            self.sample_errors.push(e);
        }
    }

    pub(crate) fn merge(&mut self, o: LoadStats) {
        self.ok_calls += o.ok_calls;
        self.err_calls += o.err_calls;
        self.connects += o.connects;
        self.connect_failures += o.connect_failures;
        for e in o.sample_errors {
            self.note(e);
        }
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
            Ok((first, count)) => {
                stats.ok_calls += 1;
                history.record_ok(start, end, &ep.name, first, count);
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
