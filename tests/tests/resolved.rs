//! The resolved timestamp on real clusters: consumers that follow the README's protocol — read
//! `R = tso_resolved()` in a statement of its own, then `WHERE ts > $last AND ts <= R` in a
//! later one, then `$last := R` — see every committed row exactly once, in `ts` order, on the
//! primary and on a hot standby, across a `kill -9` of the primary and the promotion of its
//! synchronous standby; `R` never passes an open transaction, never decreases, and reaches the
//! change stream after every change at or below it.
//!
//! Run with: `cargo test -p tsoracle-tests --test resolved -- --test-threads=2`

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::Client;
use tsoracle_tests::alerts::record;
use tsoracle_tests::cluster::{self, make_sync, PrimaryPointer};
use tsoracle_tests::exporter::Exporter;
use tsoracle_tests::tso::{set_clock_offset, tso_next};
use tsoracle_tests::{
    expect_sqlstate, pg_error_string, poll_until, serving_node, Endpoint, Node, NodeOpts,
    SplitMix64, Workers,
};

fn ok<T>(r: Result<T, postgres::Error>, what: &str) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {}", pg_error_string(&e)))
}

fn resolved(c: &mut Client) -> Result<i64, postgres::Error> {
    c.query_one("SELECT tso_resolved()", &[])?.try_get(0)
}

const EVENTS: &str =
    "CREATE TABLE events (ts bigint PRIMARY KEY DEFAULT tso_next(), writer int NOT NULL)";

// ---------------------------------------------------------------------------------------- 1

/// A transaction that took a value holds `R` below it for as long as it is open — while
/// everyone else goes on taking values — and `tso_resolved_status()` names it; once it
/// commits, `R` passes it within one poll.
#[test]
fn an_open_transaction_holds_r_and_r_passes_it_once_it_commits() {
    let node = serving_node("resolved-hold", NodeOpts::new());
    let mut holder = node.connect();
    let mut other = node.connect();
    ok(holder.batch_execute("BEGIN"), "BEGIN");
    let held = ok(tso_next(&mut holder), "tso_next() in the open transaction");
    let holder_pid: i32 = ok(holder.query_one("SELECT pg_backend_pid()", &[]), "pid").get(0);
    let mut last_r = 0;
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        let v = ok(tso_next(&mut other), "tso_next() elsewhere");
        assert!(v > held);
        let r = ok(resolved(&mut other), "tso_resolved()");
        assert!(r < held, "R {r} passed {held}, held by an open transaction");
        assert!(r >= last_r, "R went down: {r} after {last_r}");
        last_r = r;
        std::thread::sleep(Duration::from_millis(20));
    }
    let row = ok(
        other.query_one(
            "SELECT holders, oldest_holder_pid, oldest_holder_ts, lag_ms FROM tso_resolved_status()",
            &[],
        ),
        "tso_resolved_status()",
    );
    let (holders, pid, oldest, lag): (i32, Option<i32>, Option<i64>, Option<i64>) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    assert!(holders >= 1);
    assert_eq!(pid, Some(holder_pid), "the oldest holder is the open transaction");
    assert_eq!(oldest, Some(held));
    assert!(lag.is_some_and(|l| l >= 1_000), "R lags by the open transaction's age: {lag:?}");
    // Waiting for R to pass a value one's own transaction holds can never end: refused.
    expect_sqlstate(
        holder.query_one("SELECT tso_wait_resolved($1, 100)", &[&held]),
        &SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
        "tso_wait_resolved() on its own value",
    );
    ok(holder.batch_execute("ROLLBACK; BEGIN"), "ROLLBACK");
    let held = ok(tso_next(&mut holder), "tso_next() in a new transaction");
    assert!(ok(resolved(&mut other), "R") < held);
    ok(holder.batch_execute("COMMIT"), "COMMIT");
    let r = ok(
        other.query_one("SELECT tso_wait_resolved($1, 1000)", &[&held]),
        "tso_wait_resolved() after the commit",
    )
    .get::<_, i64>(0);
    assert!(r >= held, "R {r} did not pass {held} within a second of its commit");
    assert!(ok(resolved(&mut other), "R") >= r);
    // A timeout returns R as it is.
    let future = ok(tso_next(&mut other), "tso_next()") + 1_000_000_000;
    let t0 = Instant::now();
    let r2: i64 =
        ok(other.query_one("SELECT tso_wait_resolved($1, 200)", &[&future]), "a timeout").get(0);
    assert!(r2 < future && t0.elapsed() >= Duration::from_millis(200));
    for (sql, what) in [
        ("SELECT tso_wait_resolved(-1, 10)", "a negative ts"),
        ("SELECT tso_wait_resolved(1, -10)", "a negative timeout"),
    ] {
        expect_sqlstate(other.query_one(sql, &[]), &SqlState::INVALID_PARAMETER_VALUE, what);
    }
    // The holder's age (the exporter's tsoracle_resolved_oldest_holder_age_seconds, and its
    // TsoracleResolvedStuck) is measured on a clock that does not step: with the server's
    // clock stepped back 10 minutes, so that its values run 10 minutes ahead of it, a holder
    // held for a second is a second old (by its value's millisecond it was 10 minutes in the
    // future: the exporter's 0, an alert 10 minutes late).
    ok(holder.batch_execute("BEGIN"), "BEGIN");
    let began = Instant::now();
    ok(tso_next(&mut holder), "tso_next() in an open transaction");
    set_clock_offset(&mut other, -600_000)
        .unwrap_or_else(|e| panic!("step the server's clock back: {e}"));
    std::thread::sleep(Duration::from_millis(1_000).saturating_sub(began.elapsed()));
    let age_ms: i64 = ok(
        other.query_one(
            "SELECT c.wall_ms - (extract(epoch FROM r.oldest_holder_since) * 1000)::bigint \
               FROM tso_resolved_status() r CROSS JOIN tso_clock() c",
            &[],
        ),
        "the oldest holder's age",
    )
    .get(0);
    let held_ms = began.elapsed().as_millis() as i64;
    assert!(
        age_ms >= 900 && age_ms <= held_ms + 100,
        "the oldest holder's age is {age_ms} ms after {held_ms} ms held, with the clock stepped back"
    );
    // What an exporter reads of this server now, held for 8 minutes on promtool's clock:
    // timestamps ahead of the clock page (TsoracleAheadOfClock), a holder a second old does
    // not (TsoracleResolvedStuck), and nothing else does.
    let exporter = Exporter::start("resolved-ahead", &node, "postgres").expect("the exporter");
    record(&exporter, 2, Duration::from_millis(300), 4)
        .expect("scrape")
        .assert_firing(&["TsoracleAheadOfClock"]);
    ok(holder.batch_execute("ROLLBACK"), "ROLLBACK");
}

// ---------------------------------------------------------------------------------------- 2

/// Two-phase commit: a prepared transaction outlives its session's slot, so preparing one
/// that took values is refused (0A000, with a HINT); one that took none prepares as usual.
#[test]
fn prepare_of_a_transaction_that_took_values_is_refused() {
    let node =
        serving_node("resolved-2pc", NodeOpts::new().setting("max_prepared_transactions", 4));
    let mut c = node.connect();
    ok(c.batch_execute("CREATE TABLE t (v int)"), "setup");
    ok(c.batch_execute("BEGIN; INSERT INTO t VALUES (1)"), "BEGIN");
    ok(tso_next(&mut c), "tso_next()");
    let e = expect_sqlstate(
        c.batch_execute("PREPARE TRANSACTION 'took'"),
        &SqlState::FEATURE_NOT_SUPPORTED,
        "PREPARE of a transaction that took a timestamp",
    );
    assert!(e.as_db_error().and_then(|d| d.hint()).is_some(), "a HINT says what to do");
    let _ = c.batch_execute("ROLLBACK");
    let prepared: i64 =
        ok(c.query_one("SELECT count(*) FROM pg_prepared_xacts", &[]), "pg_prepared_xacts").get(0);
    assert_eq!(prepared, 0);
    // The slot was released with the aborted transaction: R passes its value.
    let v = ok(tso_next(&mut c), "tso_next()");
    let r: i64 = ok(c.query_one("SELECT tso_wait_resolved($1, 2000)", &[&v]), "wait").get(0);
    assert!(r >= v);
    ok(c.batch_execute("BEGIN; INSERT INTO t VALUES (2); PREPARE TRANSACTION 'plain'"), "PREPARE");
    ok(c.batch_execute("COMMIT PREPARED 'plain'"), "COMMIT PREPARED");
}

// ---------------------------------------------------------------------------------------- 2b

/// On a hot standby `R` is what the primary published, as far as the standby replayed it:
/// before the first publication the standby answers 57P03, and so it does in a database
/// other than `tsoracle.database`; after it, the standby's `R` covers a value the primary
/// issued before.
#[test]
fn a_standby_serves_the_r_it_has_replayed_and_57p03_before() {
    let mut primary = serving_node(
        "resolved-standby-primary",
        NodeOpts::new().setting("tsoracle.resolved_interval_ms", 60_000),
    );
    let mut p = primary.connect();
    ok(p.batch_execute("CREATE DATABASE other"), "CREATE DATABASE");
    let mut other = Client::connect(&primary.conninfo_for("postgres", "other"), postgres::NoTls)
        .expect("connect to other");
    ok(other.batch_execute("CREATE EXTENSION tsoracle"), "CREATE EXTENSION in other");
    let mut standby = Node::base_backup_from(&primary, "resolved-standby").expect("pg_basebackup");
    standby.start().expect("start the standby");
    let mut s = standby.connect();
    for (sql, what) in [
        ("SELECT tso_resolved()", "tso_resolved() before any R was published"),
        ("SELECT tso_wait_resolved(1, 10)", "tso_wait_resolved() before any R was published"),
    ] {
        let e = expect_sqlstate(s.query_one(sql, &[]), &SqlState::CANNOT_CONNECT_NOW, what);
        let message = e.as_db_error().map(|d| d.message().to_string()).unwrap_or_default();
        assert!(message.contains("has not replayed"), "{what}: {message}");
    }
    let mut so = Client::connect(&standby.conninfo_for("postgres", "other"), postgres::NoTls)
        .expect("connect to other on the standby");
    let e = expect_sqlstate(
        so.query_one("SELECT tso_resolved()", &[]),
        &SqlState::CANNOT_CONNECT_NOW,
        "tso_resolved() on a standby outside tsoracle.database",
    );
    assert!(e.as_db_error().is_some_and(|d| d.message().contains("tsoracle.database")));
    // Nobody but the worker writes the published R, superusers included.
    for sql in [
        "UPDATE tsoracle.resolved SET ts = 9223372036854775807",
        "DELETE FROM tsoracle.resolved",
        "TRUNCATE tsoracle.resolved",
        "INSERT INTO tsoracle.resolved (id, ts) VALUES (true, 1) ON CONFLICT (id) DO UPDATE SET ts = 1",
    ] {
        expect_sqlstate(p.batch_execute(sql), &SqlState::INSUFFICIENT_PRIVILEGE, sql);
    }
    // Publishing again: the standby's R reaches a value the primary took before.
    let v = ok(tso_next(&mut p), "tso_next() on the primary");
    primary.set_conf("tsoracle.resolved_interval_ms", 50).expect("resolved_interval_ms");
    let r = poll_until("the standby replays an R above the value", Duration::from_secs(30), || {
        resolved(&mut s).ok().filter(|&r| r >= v)
    });
    let waited: i64 =
        ok(s.query_one("SELECT tso_wait_resolved($1, 1000)", &[&v]), "wait on the standby").get(0);
    assert!(waited >= r, "the standby's R went down: {waited} after {r}");
    expect_sqlstate(
        s.query_one("SELECT tso_next()", &[]),
        &SqlState::READ_ONLY_SQL_TRANSACTION,
        "tso_next() on the standby",
    );
}

// ---------------------------------------------------------------------------------------- 3

/// Rows a writer committed (acknowledged) and rows whose commit outcome it could not know.
#[derive(Default)]
struct Written {
    committed: BTreeSet<i64>,
    unknown: BTreeSet<i64>,
}

/// One writer: transactions of 1–3 rows (`ts DEFAULT tso_next()`), some with a savepoint
/// rolled back, 0–300 ms long, one in five aborted; writer 0 also holds one transaction idle
/// for 3 s.
fn writer(
    i: usize,
    target: PrimaryPointer,
    written: Arc<Mutex<Written>>,
    stop: Arc<AtomicBool>,
) -> (u64, u64) {
    let mut rng = SplitMix64::from_entropy();
    let (mut commits, mut aborts) = (0u64, 0u64);
    let mut conn: Option<(Client, u64)> = None;
    let mut idle_done = i != 0;
    while !stop.load(Ordering::SeqCst) {
        let (generation, ep) = target.current();
        if conn.as_ref().is_some_and(|(_, g)| *g != generation) {
            conn = None;
        }
        let Some((c, _)) = conn.as_mut() else {
            match ep.connect(10_000) {
                Ok(c) => conn = Some((c, generation)),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
            continue;
        };
        let mut rows = Vec::new();
        let result = (|| -> Result<bool, postgres::Error> {
            c.batch_execute("BEGIN")?;
            for _ in 0..rng.range_inclusive(1, 3) {
                rows.push(
                    c.query_one(
                        "INSERT INTO events (writer) VALUES ($1) RETURNING ts",
                        &[&(i as i32)],
                    )?
                    .get::<_, i64>(0),
                );
            }
            if rng.chance(0.3) {
                c.batch_execute("SAVEPOINT s")?;
                c.query_one(
                    "INSERT INTO events (writer) VALUES ($1) RETURNING ts",
                    &[&(i as i32)],
                )?;
                c.batch_execute("ROLLBACK TO SAVEPOINT s")?;
            }
            let pause = if idle_done { rng.range_inclusive(0, 300) as u64 } else { 3_000 };
            idle_done = true;
            std::thread::sleep(Duration::from_millis(pause));
            if rng.chance(0.2) {
                c.batch_execute("ROLLBACK")?;
                Ok(false)
            } else {
                c.batch_execute("COMMIT")?;
                Ok(true)
            }
        })();
        let mut w = written.lock().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(true) => {
                commits += 1;
                w.committed.extend(rows);
            }
            Ok(false) => aborts += 1,
            Err(_) => {
                // A COMMIT cut off by the failover may or may not have happened.
                w.unknown.extend(rows);
                conn = None;
            }
        }
    }
    (commits, aborts)
}

/// One consumer, following the README's protocol on `endpoint()`, until `target` (set once
/// the writers stopped) is resolved. Returns every `ts` it read, in order, and every `R`.
fn consumer(
    endpoint: impl Fn() -> Endpoint,
    target: Arc<AtomicI64>,
    stop: Arc<AtomicBool>,
) -> (Vec<i64>, Vec<i64>) {
    let (mut seen, mut rs) = (Vec::new(), Vec::new());
    let mut last = 0i64;
    let mut client: Option<(Client, String)> = None;
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        assert!(Instant::now() < deadline, "a consumer did not finish within 180 s");
        let ep = endpoint();
        if client.as_ref().is_some_and(|(_, c)| *c != ep.conninfo()) {
            client = None;
        }
        let Some((c, _)) = client.as_mut() else {
            if let Ok(c) = ep.connect(10_000) {
                client = Some((c, ep.conninfo()));
            } else {
                std::thread::sleep(Duration::from_millis(50));
            }
            continue;
        };
        // R first, in a statement of its own; the rows in a later one (a newer snapshot).
        let round = resolved(c).and_then(|r| {
            let rows = c.query(
                "SELECT ts FROM events WHERE ts > $1 AND ts <= $2 ORDER BY ts",
                &[&last, &r],
            )?;
            Ok((r, rows.iter().map(|row| row.get::<_, i64>(0)).collect::<Vec<_>>()))
        });
        match round {
            Ok((r, rows)) => {
                if r > last {
                    seen.extend(rows);
                    last = r;
                }
                rs.push(r);
                let t = target.load(Ordering::SeqCst);
                if stop.load(Ordering::SeqCst) && t > 0 && last >= t {
                    return (seen, rs);
                }
            }
            Err(e) => {
                if c.is_closed() || e.as_db_error().is_none() {
                    client = None;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The whole run: a primary with a synchronous standby, 16 writers, two consumers on the
/// primary and one on the standby; with `failover`, the primary is killed (`kill -9`) halfway
/// and the standby promoted, and everyone moves to it.
fn consumers_lose_nothing(name: &str, failover: bool) {
    let mut primary = serving_node(&format!("{name}-primary"), NodeOpts::new());
    ok(primary.connect().batch_execute(EVENTS), "CREATE TABLE events");
    let mut standby =
        Node::base_backup_from(&primary, &format!("{name}-standby")).expect("pg_basebackup");
    standby.start().expect("start the standby");
    make_sync(&mut primary, standby.name()).unwrap_or_else(|e| panic!("synchronous standby: {e}"));

    let target = PrimaryPointer::new(&primary);
    let written = Arc::new(Mutex::new(Written::default()));
    let writers = Workers::spawn("writer", 16, |i| {
        let (target, written) = (target.clone(), written.clone());
        move |stop: Arc<AtomicBool>| writer(i, target, written, stop)
    });
    let resolve_target = Arc::new(AtomicI64::new(0));
    let consumers_stop = Arc::new(AtomicBool::new(false));
    let standby_ep = standby.endpoint();
    let consumers = Workers::spawn("consumer", 3, |i| {
        let (target, standby_ep) = (target.clone(), standby_ep.clone());
        let (goal, stop) = (resolve_target.clone(), consumers_stop.clone());
        move |_: Arc<AtomicBool>| {
            if i < 2 {
                consumer(move || target.current().1, goal, stop)
            } else {
                consumer(move || standby_ep.clone(), goal, stop)
            }
        }
    });

    std::thread::sleep(Duration::from_secs(6));
    if failover {
        primary.kill9_postmaster().expect("kill -9 the primary");
        cluster::promote(&standby).unwrap_or_else(|e| panic!("promote: {e}"));
        standby.wait_serving().unwrap_or_else(|e| panic!("the promoted standby serves: {e}"));
        target.set(&standby);
        std::thread::sleep(Duration::from_secs(6));
    }
    writers.stop();
    let counts = writers.join();
    let (commits, aborts) = counts.iter().fold((0, 0), |(c, a), (x, y)| (c + x, a + y));
    let written = std::mem::take(&mut *written.lock().unwrap_or_else(|p| p.into_inner()));
    let serving = if failover { &standby } else { &primary };
    let mut c = serving.connect();
    let table: Vec<i64> = ok(c.query("SELECT ts FROM events ORDER BY ts", &[]), "the table")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let table_set: BTreeSet<i64> = table.iter().copied().collect();
    assert!(
        written.committed.is_subset(&table_set),
        "committed rows are missing from the table: {:?}",
        written.committed.difference(&table_set).take(5).collect::<Vec<_>>()
    );
    let extra: Vec<&i64> =
        table_set.difference(&written.committed).filter(|t| !written.unknown.contains(t)).collect();
    assert!(extra.is_empty(), "rows no writer committed: {:?}", &extra[..extra.len().min(5)]);
    if !failover {
        assert!(written.unknown.is_empty(), "no commit outcome is unknown without a failover");
    }
    let max = table.last().copied().unwrap_or(0);
    resolve_target.store(max.max(1), Ordering::SeqCst);
    consumers_stop.store(true, Ordering::SeqCst);
    let results = consumers.join();
    for (i, (seen, rs)) in results.iter().enumerate() {
        let on = if i < 2 { "the primary" } else { "the standby" };
        assert!(rs.windows(2).all(|w| w[0] <= w[1]), "consumer {i} on {on}: R went down");
        assert_eq!(
            seen.len(),
            table.len(),
            "consumer {i} on {on}: {} rows read, {} committed",
            seen.len(),
            table.len()
        );
        assert!(
            seen == &table,
            "consumer {i} on {on}: not exactly the committed rows, each once, in ts order"
        );
    }
    eprintln!(
        "{name}: {commits} commits, {aborts} aborts, {} rows, {} of unknown outcome; consumers read {:?} rows in {:?} rounds",
        table.len(),
        written.unknown.len(),
        results.iter().map(|(s, _)| s.len()).collect::<Vec<_>>(),
        results.iter().map(|(_, r)| r.len()).collect::<Vec<_>>()
    );
    assert!(commits > 50 && aborts > 5, "the load ran: {commits} commits, {aborts} aborts");
}

#[test]
fn consumers_on_the_primary_and_a_standby_lose_nothing() {
    consumers_lose_nothing("resolved-consumers", false);
}

#[test]
fn consumers_lose_nothing_across_kill9_and_promotion() {
    consumers_lose_nothing("resolved-failover", true);
}

// ---------------------------------------------------------------------------------------- 4

/// In the change stream (`test_decoding`, `wal_level = logical`): the worker's transactional
/// messages with prefix `tsoracle.resolved` come after every change whose `ts` is at or below
/// the `R` they carry, and their `R` never decreases.
#[test]
fn the_change_stream_announces_r_after_every_change_at_or_below_it() {
    let node = serving_node("resolved-decoding", NodeOpts::new().setting("wal_level", "logical"));
    let mut c = node.connect();
    ok(c.batch_execute(EVENTS), "CREATE TABLE events");
    ok(
        c.batch_execute("SELECT pg_create_logical_replication_slot('tso', 'test_decoding')"),
        "slot",
    );
    let target = PrimaryPointer::new(&node);
    let written = Arc::new(Mutex::new(Written::default()));
    let writers = Workers::spawn("writer", 6, |i| {
        let (target, written) = (target.clone(), written.clone());
        move |stop: Arc<AtomicBool>| writer(i + 1, target, written, stop)
    });
    std::thread::sleep(Duration::from_secs(4));
    writers.stop();
    writers.join();
    let max = written.lock().unwrap_or_else(|p| p.into_inner()).committed.iter().max().copied();
    let max = max.expect("rows were committed");
    let mut lines: Vec<String> = Vec::new();
    poll_until("a message announcing R above every row", Duration::from_secs(30), || {
        let rows =
            c.query("SELECT data FROM pg_logical_slot_get_changes('tso', NULL, NULL)", &[]).ok()?;
        lines.extend(rows.iter().map(|r| r.get::<_, String>(0)));
        lines.iter().rev().find_map(|l| message_r(l)).filter(|&r| r >= max)
    });
    let mut announced = Vec::new();
    let mut changes = 0;
    for line in &lines {
        if let Some(r) = message_r(line) {
            announced.push(r);
        } else if let Some(ts) = inserted_ts(line) {
            changes += 1;
            if let Some(&r) = announced.last() {
                assert!(ts > r, "a change with ts {ts} streamed after R {r} was announced");
            }
        }
    }
    assert!(announced.windows(2).all(|w| w[0] <= w[1]), "announced R went down");
    assert!(
        announced.len() >= 5 && changes > 20,
        "{} messages, {changes} changes",
        announced.len()
    );
}

/// `message: transactional: 1 prefix: tsoracle.resolved, sz: N content:R`
fn message_r(line: &str) -> Option<i64> {
    let rest = line.strip_prefix("message: transactional: 1 prefix: tsoracle.resolved, ")?;
    rest.split("content:").nth(1)?.trim().parse().ok()
}

/// `table public.events: INSERT: ts[bigint]:123 writer[integer]:4`
fn inserted_ts(line: &str) -> Option<i64> {
    let rest = line.strip_prefix("table public.events: INSERT: ts[bigint]:")?;
    rest.split_whitespace().next()?.parse().ok()
}
