//! Everyday DBA operations on the extension's tables never stall the oracle nor hand a value
//! out twice (docs/operations/maintenance.md).
//!
//! One cluster per test, a steady load on it — `tso_next()` from three sessions, `tso_seq`
//! on three existing keys and on new keys, a lease renewed twice a second — and, one after the
//! other, each operation a DBA runs for `OP_SECONDS` (15 s; `TSORACLE_OPS_SECONDS` to change)
//! from a session of its own: the lock that `VACUUM`, `ANALYZE`, `CREATE INDEX CONCURRENTLY`
//! and an anti-wraparound autovacuum hold, held; `VACUUM`, `VACUUM FREEZE` and `ANALYZE` in a
//! loop; `CREATE INDEX` and `REINDEX` in an open transaction; `CREATE INDEX CONCURRENTLY` in
//! a loop; `CLUSTER` and `VACUUM FULL` in a loop, and `VACUUM FULL` queued behind a long
//! reader (everyone after it queues too); a superuser's open transaction on one counter's row,
//! and a prepared transaction on another's; `pg_dump` in a loop; `pg_restore
//! --single-transaction` of a dump into the live database (its transaction open for the
//! whole time). For each operation:
//!
//! - `tso_next()` never fails, and never stops: no two of its successive answers are more than
//!   `MAX_GAP` apart (a worker that cannot extend the window stops it within
//!   `tsoracle.window_ahead_ms`, 3 s, then fails it; a second of CPU starvation on two shared
//!   cores does not come close). Its throughput against the seconds before is reported, as
//!   speed is not asserted;
//! - every `tso_seq` call, and every lease call, ends within `tsoracle.extension_timeout_ms`
//!   plus 2 s, with a block (a lease) or a retryable error (55P03 naming who holds the lock,
//!   57P03; a lease whose renewals the lease table's lock kept out for its whole TTL has
//!   lapsed, 55000, and is acquired again);
//!
//! and at the end every block granted, on every key, tiles with no overlap and lies below the
//! counter's durable value.
//!
//! Run with: `cargo test -p tsoracle-tests --test operations -- --test-threads=2`

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use postgres::{Client, NoTls};
use tsoracle_tests::backup::{pg_dump, run_as_postgres, DumpFormat, PgDir, TOOL_TIMEOUT};
use tsoracle_tests::seqlease::{seq_totals, sqlstate_of};
use tsoracle_tests::{pg_error_string, serving_node, Node, NodeOpts};

/// How long each operation runs.
fn op_seconds() -> u64 {
    std::env::var("TSORACLE_OPS_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(15)
}

/// The cluster's `tsoracle.extension_timeout_ms`: the bound on any call, plus 2 s.
const EXTENSION_TIMEOUT_MS: u64 = 5_000;
const EXISTING: [&str; 3] = ["e1", "e2", "e3"];

/// One call of the load.
#[derive(Clone, Debug)]
struct Call {
    what: &'static str,
    started: Instant,
    took: Duration,
    /// The block (key, start, count) a `tso_seq` call got.
    block: Option<(String, i64, i64)>,
    /// The SQLSTATE and message of an error.
    error: Option<(String, String)>,
}

#[derive(Default)]
struct Record {
    calls: Mutex<Vec<Call>>,
    /// Completion instants of `tso_next()` calls (their throughput over time).
    next_done: Mutex<Vec<Instant>>,
}

/// What one load session does per call.
type Caller = Box<dyn FnMut(&mut Client, u64) -> Call + Send>;
/// What a DBA session does for the given time.
type Dba = Box<dyn Fn(&Node, &mut Client, Duration)>;

struct OpsLoad {
    stop: Arc<AtomicBool>,
    record: Arc<Record>,
    handles: Vec<JoinHandle<()>>,
}

fn retryable(code: &str) -> bool {
    code == "55P03" || code == "57P03"
}

impl OpsLoad {
    fn start(node: &Node) -> OpsLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let record = Arc::new(Record::default());
        let conninfo = node.conninfo();
        let mut handles = Vec::new();
        let spawn = |f: Caller, handles: &mut Vec<JoinHandle<()>>, pause: Duration| {
            let (stop, record, conninfo) = (stop.clone(), record.clone(), conninfo.clone());
            let mut f = f;
            handles.push(thread::spawn(move || {
                let mut c = Client::connect(&conninfo, NoTls).expect("load connects");
                c.batch_execute("SET statement_timeout = '30s'").expect("statement_timeout");
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let call = f(&mut c, i);
                    i += 1;
                    if call.what == "tso_next" && call.error.is_none() {
                        record.next_done.lock().unwrap().push(call.started + call.took);
                    } else {
                        record.calls.lock().unwrap().push(call);
                    }
                    if !pause.is_zero() {
                        thread::sleep(pause);
                    }
                }
            }));
        };
        for _ in 0..3 {
            spawn(
                Box::new(|c, _| timed(c, "tso_next", "SELECT tso_next()", None)),
                &mut handles,
                Duration::ZERO,
            );
        }
        for t in 0..2u64 {
            spawn(
                Box::new(move |c, i| {
                    let key = EXISTING[((i + t) % 3) as usize];
                    let count = 1 + (i % 5) as i64;
                    timed(
                        c,
                        "tso_seq",
                        &format!("SELECT tso_seq('{key}', {count})"),
                        Some((key, count)),
                    )
                }),
                &mut handles,
                Duration::from_millis(2),
            );
        }
        static NEW_KEYS: AtomicU64 = AtomicU64::new(0);
        spawn(
            Box::new(|c, _| {
                let key = format!("n{}", NEW_KEYS.fetch_add(1, Ordering::Relaxed));
                timed(
                    c,
                    "tso_seq new",
                    &format!("SELECT tso_seq('{key}', 1)"),
                    Some((key.as_str(), 1)),
                )
            }),
            &mut handles,
            Duration::from_millis(20),
        );
        let lease: Arc<Mutex<Option<i64>>> = Arc::new(Mutex::new(None));
        spawn(
            Box::new(move |c, _| {
                let id = *lease.lock().unwrap();
                let (call, value) = match id {
                    None => timed_value(
                        c,
                        "lease acquire",
                        "SELECT lease_id FROM tso_lease_acquire_bounds('ops-holder', 1, 5000)",
                    ),
                    Some(id) => timed_value(
                        c,
                        "lease renew",
                        &format!("SELECT ts_lower_bound FROM tso_lease_renew_bounds({id})"),
                    ),
                };
                if let (None, Some(acquired)) = (id, value) {
                    *lease.lock().unwrap() = Some(acquired);
                }
                // Renewals that could not get through for longer than the TTL (the lease
                // table locked) let the lease lapse: the holder acquires again.
                if call.error.as_ref().is_some_and(|(code, _)| code == "55000") {
                    *lease.lock().unwrap() = None;
                }
                call
            }),
            &mut handles,
            Duration::from_millis(500),
        );
        OpsLoad { stop, record, handles }
    }

    fn join(self) -> Arc<Record> {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.handles {
            h.join().expect("a load thread panicked");
        }
        self.record
    }
}

/// Run `sql` (one bigint back), timed: the call and the value.
fn timed_value(c: &mut Client, what: &'static str, sql: &str) -> (Call, Option<i64>) {
    let started = Instant::now();
    let r = c.query_one(sql, &[]);
    let took = started.elapsed();
    match r {
        Ok(row) => {
            let value: i64 = row.get(0);
            (Call { what, started, took, block: None, error: None }, Some(value))
        }
        Err(e) => (
            Call {
                what,
                started,
                took,
                block: None,
                error: Some((sqlstate_of(&e), pg_error_string(&e))),
            },
            None,
        ),
    }
}

/// Run `sql`, timed; `block` names the key and count of a `tso_seq` call.
fn timed(c: &mut Client, what: &'static str, sql: &str, block: Option<(&str, i64)>) -> Call {
    let (mut call, value) = timed_value(c, what, sql);
    call.block = block.zip(value).map(|((k, n), start)| (k.to_string(), start, n));
    call
}

/// `tso_next()` completions per second in `[from, to)`.
/// The longest time in `[from, to)` without an answer of `tso_next()` (the window's edges
/// count as answers).
fn longest_gap(done: &[Instant], from: Instant, to: Instant) -> Duration {
    let mut times: Vec<Instant> = done.iter().copied().filter(|&t| t >= from && t < to).collect();
    times.sort_unstable();
    let mut last = from;
    let mut gap = Duration::ZERO;
    for t in times.into_iter().chain(std::iter::once(to)) {
        gap = gap.max(t.duration_since(last));
        last = t;
    }
    gap
}

/// The longest `tso_next()` may go without answering while an operation runs.
const MAX_GAP: Duration = Duration::from_secs(2);

fn rate(done: &[Instant], from: Instant, to: Instant) -> f64 {
    let n = done.iter().filter(|&&t| t >= from && t < to).count();
    n as f64 / to.duration_since(from).as_secs_f64()
}

/// One operation: a name, and what a DBA session does for `secs` seconds.
struct Operation {
    name: &'static str,
    run: Dba,
}

fn op(name: &'static str, run: impl Fn(&Node, &mut Client, Duration) + 'static) -> Operation {
    Operation { name, run: Box::new(run) }
}

/// Run `sql` in a loop until `secs` have passed.
fn in_a_loop(c: &mut Client, secs: Duration, sqls: &[&str]) {
    let until = Instant::now() + secs;
    while Instant::now() < until {
        for sql in sqls {
            c.batch_execute(sql).unwrap_or_else(|e| panic!("{sql}: {}", pg_error_string(&e)));
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// Open a transaction, run `sqls` in it, hold it for `secs`, then end it with `end`.
fn held(c: &mut Client, secs: Duration, sqls: &[&str], end: &str) {
    c.batch_execute("BEGIN").unwrap();
    for sql in sqls {
        c.batch_execute(sql).unwrap_or_else(|e| panic!("{sql}: {}", pg_error_string(&e)));
    }
    thread::sleep(secs);
    c.batch_execute(end).unwrap_or_else(|e| panic!("{end}: {}", pg_error_string(&e)));
}

/// Open a transaction that holds `key`'s counter row with a superuser's `UPDATE` of its
/// `updated_at`, as a DBA would. That `UPDATE` may be refused `55006`, and then it is run
/// again in a new transaction: its new row is built from the scan, before the row lock, so a
/// counter advanced in place in between would be lowered by it, and `keep_what_was_issued`
/// refuses that (docs/operations/maintenance.md says to run it again). Any other error, or
/// the race lost 50 times in a row, fails the test.
fn begin_holding(c: &mut Client, key: &str) {
    let sql = format!("UPDATE tsoracle.seq SET updated_at = now() WHERE key = '{key}'");
    for _ in 0..50 {
        c.batch_execute("BEGIN").unwrap();
        match c.batch_execute(&sql) {
            Ok(()) => return,
            Err(e) if sqlstate_of(&e) == "55006" => c.batch_execute("ROLLBACK").unwrap(),
            Err(e) => panic!("{sql}: {}", pg_error_string(&e)),
        }
    }
    panic!("{sql}: refused 55006 50 times in a row");
}

/// A cluster for the suite: prepared transactions allowed, autovacuum on its own schedule.
fn ops_node(name: &str) -> Node {
    let node = serving_node(
        name,
        NodeOpts::new()
            .setting("max_prepared_transactions", 4)
            .setting("tsoracle.extension_timeout_ms", EXTENSION_TIMEOUT_MS),
    );
    let mut su = node.connect();
    for key in EXISTING {
        su.query_one(&format!("SELECT tso_seq('{key}', 1)"), &[]).expect("create the keys");
    }
    node
}

/// Run each operation under the load and check every promise (see the module doc).
fn run_operations(name: &str, operations: Vec<Operation>) {
    let node = ops_node(name);
    let secs = Duration::from_secs(op_seconds());
    let load = OpsLoad::start(&node);
    let mut dba = node.connect();
    let mut windows = Vec::new();
    thread::sleep(Duration::from_secs(3));
    for operation in &operations {
        let began = Instant::now();
        (operation.run)(&node, &mut dba, secs);
        let ended = Instant::now();
        windows.push((operation.name, began, ended));
        // Let the load settle between operations (a restore's fence, a lock queue draining).
        thread::sleep(Duration::from_secs(2));
    }
    let record = load.join();
    let done = record.next_done.lock().unwrap().clone();
    let calls = record.calls.lock().unwrap().clone();
    let mut su = node.connect();

    let bound = Duration::from_millis(EXTENSION_TIMEOUT_MS + 2_000);
    let mut report = Vec::new();
    for (name, began, ended) in &windows {
        let steady = rate(&done, *began - Duration::from_secs(2), *began);
        let during = rate(&done, *began, *ended);
        let in_window: Vec<&Call> =
            calls.iter().filter(|c| c.started >= *began && c.started < *ended).collect();
        let retried = in_window.iter().filter(|c| c.error.is_some()).count();
        report.push(format!(
            "{name}: tso_next {during:.0}/s (steady {steady:.0}/s, {:.2}x), {} other calls, {retried} retryable errors",
            during / steady.max(1.0),
            in_window.len()
        ));
        let gap = longest_gap(&done, *began, *ended);
        assert!(
            gap <= MAX_GAP,
            "{name}: tso_next() answered nothing for {gap:?}\n{}",
            report.join("\n")
        );
    }
    eprintln!("{}", report.join("\n"));
    // tso_next() never failed (its errors are recorded as calls).
    let next_errors: Vec<&Call> = calls.iter().filter(|c| c.what == "tso_next").collect();
    assert!(next_errors.is_empty(), "tso_next() failed: {:?}", next_errors.first());
    for call in &calls {
        assert!(
            call.took <= bound,
            "{} took {:?} (more than extension_timeout_ms + 2 s): {call:?}",
            call.what,
            call.took
        );
        if let Some((code, msg)) = &call.error {
            // A lease whose renewals could not get through for its whole TTL has lapsed
            // (55000): its holder acquires again, as its contract says.
            let lapsed = call.what == "lease renew" && code == "55000";
            assert!(
                retryable(code) || lapsed,
                "{} failed with {code} (not retryable): {msg}",
                call.what
            );
            if code == "55P03" {
                assert!(msg.contains("locked by"), "a 55P03 names who holds the lock: {msg}");
            }
        }
    }
    // Every block tiles with the others of its key and lies below the durable counter.
    let totals = seq_totals(&mut su).expect("tsoracle.seq");
    let mut blocks: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    for (key, start, count) in calls.iter().filter_map(|c| c.block.clone()) {
        blocks.entry(key).or_default().push((start, count));
    }
    for (key, mut bs) in blocks {
        bs.sort_unstable();
        for w in bs.windows(2) {
            assert!(
                w[0].0 + w[0].1 <= w[1].0,
                "key {key}: blocks {:?} and {:?} overlap",
                w[0],
                w[1]
            );
        }
        let (start, count) = *bs.last().unwrap();
        let next = totals.get(&key).copied().unwrap_or(0);
        assert!(start + count <= next, "key {key}: block {start}+{count} above the counter {next}");
    }
    let granted = calls.iter().filter(|c| c.block.is_some()).count();
    assert!(granted > 100, "only {granted} blocks were granted");
}

/// Locks: the lock that VACUUM and friends hold, CREATE INDEX and REINDEX in an open
/// transaction, VACUUM FULL queued behind a long reader. On `tsoracle.high_water` the last
/// three keep the worker's raise out (its table lock conflicts with them: an index built or
/// a file copied around an in-place write would miss it), so timestamps stop once the window
/// is used up: docs/operations/maintenance.md lists them under "What does stop timestamps",
/// and they run here on the other tables only.
#[test]
fn locks_held_by_maintenance_stall_nothing() {
    run_operations(
        "ops-locks",
        vec![
            op("SHARE UPDATE EXCLUSIVE held (VACUUM, ANALYZE, CREATE INDEX CONCURRENTLY, anti-wraparound autovacuum)", |_, c, s| {
                held(c, s, &["LOCK TABLE tsoracle.high_water, tsoracle.seq, tsoracle.lease IN SHARE UPDATE EXCLUSIVE MODE"], "COMMIT")
            }),
            op("CREATE INDEX in an open transaction", |_, c, s| {
                held(
                    c,
                    s,
                    &[
                        "CREATE INDEX ON tsoracle.seq (updated_at)",
                        "CREATE INDEX ON tsoracle.lease (expires_at_ms)",
                    ],
                    "ROLLBACK",
                )
            }),
            op("REINDEX in an open transaction", |_, c, s| {
                held(c, s, &["REINDEX TABLE tsoracle.seq", "REINDEX TABLE tsoracle.lease"], "COMMIT")
            }),
            op("VACUUM FULL queued behind a long reader", |node, c, s| {
                let mut reader = node.connect();
                reader.batch_execute("BEGIN; SELECT count(*) FROM tsoracle.seq; SELECT count(*) FROM tsoracle.high_water").unwrap();
                let conninfo = node.conninfo();
                let vacuum = thread::spawn(move || {
                    let mut v = Client::connect(&conninfo, NoTls).unwrap();
                    v.batch_execute("VACUUM FULL tsoracle.seq").map_err(|e| pg_error_string(&e))
                });
                thread::sleep(s);
                reader.batch_execute("COMMIT").unwrap();
                vacuum.join().unwrap().expect("VACUUM FULL");
                let _ = c;
            }),
        ],
    );
}

/// Maintenance in a loop: VACUUM, VACUUM FREEZE and ANALYZE; CREATE INDEX CONCURRENTLY on
/// the columns written in place; CLUSTER and VACUUM FULL (rewrites of the tables).
#[test]
fn maintenance_in_a_loop_stalls_nothing() {
    run_operations(
        "ops-loops",
        vec![
            op("VACUUM, VACUUM FREEZE and ANALYZE in a loop", |_, c, s| {
                in_a_loop(
                    c,
                    s,
                    &[
                        "VACUUM tsoracle.high_water, tsoracle.seq, tsoracle.lease",
                        "VACUUM (FREEZE) tsoracle.high_water, tsoracle.seq, tsoracle.lease",
                        "ANALYZE tsoracle.high_water, tsoracle.seq, tsoracle.lease",
                    ],
                )
            }),
            op("CREATE INDEX CONCURRENTLY and DROP INDEX CONCURRENTLY in a loop", |_, c, s| {
                in_a_loop(
                    c,
                    s,
                    &[
                        "CREATE INDEX CONCURRENTLY ops_next ON tsoracle.seq (next)",
                        "CREATE INDEX CONCURRENTLY ops_physical ON tsoracle.high_water (physical_ms)",
                        "DROP INDEX CONCURRENTLY tsoracle.ops_next",
                        "DROP INDEX CONCURRENTLY tsoracle.ops_physical",
                    ],
                )
            }),
            op("CLUSTER in a loop", |_, c, s| {
                in_a_loop(
                    c,
                    s,
                    &[
                        "CLUSTER tsoracle.seq USING seq_pkey",
                        "CLUSTER tsoracle.high_water USING high_water_pkey",
                        "CLUSTER tsoracle.lease USING lease_pkey",
                    ],
                )
            }),
            op("VACUUM FULL in a loop", |_, c, s| {
                in_a_loop(c, s, &["VACUUM FULL tsoracle.high_water, tsoracle.seq, tsoracle.lease"])
            }),
        ],
    );
}

/// Transactions and tools: a superuser's open transaction on one counter's row, a prepared
/// transaction on another's, pg_dump in a loop, pg_restore --single-transaction into the
/// live database.
#[test]
fn transactions_and_dumps_stall_nothing() {
    run_operations(
        "ops-xacts",
        vec![
            op("a superuser's open transaction on one row", |_, c, s| {
                begin_holding(c, "e1");
                thread::sleep(s);
                c.batch_execute("COMMIT").unwrap();
            }),
            op("a prepared transaction on one row", |_, c, s| {
                begin_holding(c, "e2");
                c.batch_execute("PREPARE TRANSACTION 'ops-prepared'").unwrap();
                thread::sleep(s);
                c.batch_execute("COMMIT PREPARED 'ops-prepared'").unwrap();
            }),
            op("pg_dump in a loop", |node, _, s| {
                let dir = PgDir::new("ops-dump").expect("dump dir");
                let until = Instant::now() + s;
                while Instant::now() < until {
                    pg_dump(node, "postgres", DumpFormat::Custom, &dir).expect("pg_dump");
                }
            }),
            op("pg_restore --single-transaction into the live database", |node, c, s| {
                // A table whose rows take a second each to load (a CHECK that sleeps), restored
                // after the extension's tables (schema zzz sorts after tsoracle): the restore's
                // transaction holds what it merged for the whole time.
                let rows = s.as_secs().max(1);
                c.batch_execute(&format!(
                    "CREATE SCHEMA IF NOT EXISTS zzz;
                     CREATE OR REPLACE FUNCTION zzz.nap(int) RETURNS boolean LANGUAGE sql AS 'SELECT pg_sleep(1) IS NOT NULL';
                     CREATE TABLE IF NOT EXISTS zzz.slow (x int CHECK (zzz.nap(x)));
                     TRUNCATE zzz.slow;
                     INSERT INTO zzz.slow SELECT generate_series(1, {rows});"
                ))
                .expect("the slow table");
                let dir = PgDir::new("ops-restore").expect("dump dir");
                let dump = pg_dump(node, "postgres", DumpFormat::Custom, &dir).expect("pg_dump");
                c.batch_execute("TRUNCATE zzz.slow").unwrap();
                let mut cmd = dir.command("pg_restore");
                cmd.args([
                    "--exit-on-error",
                    "--single-transaction",
                    "--data-only",
                    "-h",
                    "127.0.0.1",
                    "-p",
                ])
                .arg(node.port().to_string())
                .args(["-U", "postgres", "-d", "postgres"])
                .arg(&dump);
                run_as_postgres(cmd, TOOL_TIMEOUT).expect("pg_restore --single-transaction");
                let restored: i64 =
                    c.query_one("SELECT count(*) FROM zzz.slow", &[]).unwrap().get(0);
                assert_eq!(restored, rows as i64, "the restore ran");
            }),
        ],
    );
}
