//! Foundation: `tso_next()` on a single server.
//!
//! Every test starts its own cluster(s) on a loopback port; a failing test prints the tail
//! of its server log (the harness does that when a `Node` is dropped during a panic).
//! Run with: `cargo test -p tsoracle-tests --test foundation -- --test-threads=2`

use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::Client;
use tsoracle_tests::tso::{
    self, durable_high_water, show, status, tso_next, tso_next_batch, tso_seed, MAX_BATCH,
};
use tsoracle_tests::{
    expect_sqlstate, now_ms, ops, physical, poll_until, seqlease, serving_node, wait_for, History,
    Load, LoadOptions, Node, NodeOpts, StopMode,
};

/// Raw `pg_settings.setting` of a GUC (no unit suffix) and its `min_val`.
fn setting_and_min(c: &mut Client, name: &str) -> (i64, i64) {
    let r = c
        .query_one(
            "SELECT setting::bigint, min_val::bigint FROM pg_settings WHERE name = $1",
            &[&name],
        )
        .unwrap_or_else(|e| {
            panic!("{name} in pg_settings: {}", tsoracle_tests::pg_error_string(&e))
        });
    (r.get(0), r.get(1))
}

/// Set `tsoracle.window_ahead_ms` (sighup) to `max(want, the GUC's minimum)`; returns it.
fn set_window(node: &mut Node, want: i64) -> i64 {
    let mut c = node.connect();
    let (_, min) = setting_and_min(&mut c, "tsoracle.window_ahead_ms");
    let w = want.max(min);
    node.set_conf("tsoracle.window_ahead_ms", w).unwrap();
    let (now, _) = setting_and_min(&mut node.connect(), "tsoracle.window_ahead_ms");
    assert_eq!(
        now,
        w,
        "tsoracle.window_ahead_ms after reload (SHOW says {:?})",
        show(&mut c, "tsoracle.window_ahead_ms")
    );
    w
}

fn next(c: &mut Client) -> i64 {
    tso_next(c).unwrap_or_else(|e| panic!("tso_next(): {}", tsoracle_tests::pg_error_string(&e)))
}

fn status_of(c: &mut Client) -> tso::TsoStatus {
    status(c).unwrap_or_else(|e| panic!("tso_status(): {}", tsoracle_tests::pg_error_string(&e)))
}

// ---------------------------------------------------------------------------------------- 1

/// 16 sessions calling tso_next() and tso_next_batch(k) for 5 s: all values unique, real-time
/// ordered, close to the wall clock, below the durable high-water; no call fails.
#[test]
fn concurrent_unique_and_real_time_ordered() {
    let node = serving_node("concurrent", NodeOpts::new());
    let mut c = node.connect();
    let st = status_of(&mut c);
    assert_eq!(st.role, "primary", "{st:?}");
    assert_eq!(st.state, "serving", "{st:?}");
    assert_eq!(st.epoch, Some(1), "epoch is the timeline of a fresh cluster: {st:?}");
    assert_eq!(st.timeline, Some(1), "{st:?}");
    let (window_ms, _) = setting_and_min(&mut c, "tsoracle.window_ahead_ms");

    let history = History::new();
    let (sys0, inst0) = (now_ms(), Instant::now());
    let stats = Load::run(
        vec![node.endpoint()],
        LoadOptions::new(16, Duration::from_secs(5)),
        ops::mixed_with_uuid(64),
        &history,
    );
    let report = history.assert_valid();
    assert_eq!(
        report.err_calls, 0,
        "no call may fail on a healthy server: {:?}",
        stats.sample_errors
    );
    assert!(report.ok_calls >= 16, "every session got values: {report:?}");

    // Physical part near the wall clock (generous: window + 10 s either way).
    let tol = window_ms + 10_000;
    let wall = |t: Instant| sys0 + t.duration_since(inst0).as_millis() as i64;
    for call in history.calls() {
        let (first, last) = (call.first().unwrap(), call.last().unwrap());
        assert!(
            physical(first) >= wall(call.start) - tol && physical(last) <= wall(call.end) + tol,
            "value {first}..={last} (physical {}..={}) far from the wall clock {}..{} (tolerance {tol} ms)",
            physical(first),
            physical(last),
            wall(call.start),
            wall(call.end)
        );
    }

    // Nothing was issued above the durable high-water, and the counters saw every value.
    let max = report.max_value.unwrap();
    let st = status_of(&mut c);
    let hw = durable_high_water(&mut c).unwrap().expect("a high-water row");
    assert!(
        physical(max) <= hw,
        "issued {max} (physical {}) above the durable high-water {hw}",
        physical(max)
    );
    assert!(physical(max) <= st.high_water_ms.unwrap(), "{st:?}");
    assert!(st.last_issued.unwrap() >= max, "last_issued below a value we got: {st:?}, max {max}");
    assert!(
        st.timestamps_issued.unwrap() >= report.values,
        "timestamps_issued {:?} < {} values received",
        st.timestamps_issued,
        report.values
    );
    assert!(next(&mut c) > max);
    eprintln!("concurrent: {} calls, {} values, {st:?}", report.ok_calls, report.values);
}

// ---------------------------------------------------------------------------------------- 2

/// Under load: restart fast, immediate, and kill -9 of the postmaster, twice each. Every value
/// after a restart is above every value before it; every epoch between restarts made progress.
#[test]
fn restarts_never_go_back() {
    let mut node = serving_node("restarts", NodeOpts::new());
    let history = History::new();
    let load = Load::start(
        vec![node.endpoint()],
        LoadOptions::new(16, Duration::from_secs(300)),
        ops::mixed_with_uuid(64),
        history.clone(),
    );
    #[derive(Debug, Clone, Copy)]
    enum How {
        Fast,
        Immediate,
        Kill9,
    }
    let plan = [How::Fast, How::Immediate, How::Kill9, How::Fast, How::Immediate, How::Kill9];
    let mut epochs = Vec::new(); // (label, from, to)
    let mut epoch_start = Instant::now();
    let mut label = "initial".to_string();
    for how in plan {
        history.wait_progress(epoch_start, 20, &format!("epoch {label}"));
        let down = Instant::now();
        epochs.push((label.clone(), epoch_start, down));
        match how {
            How::Fast => node.restart(StopMode::Fast).unwrap(),
            How::Immediate => node.restart(StopMode::Immediate).unwrap(),
            How::Kill9 => {
                node.kill9_postmaster().unwrap();
                node.start().unwrap();
            }
        }
        node.wait_serving().unwrap_or_else(|e| panic!("not serving after {how:?}: {e}"));
        epoch_start = Instant::now();
        label = format!("after {how:?}");
    }
    history.wait_progress(epoch_start, 20, &format!("epoch {label}"));
    epochs.push((label, epoch_start, Instant::now()));
    let stats = load.stop_and_join();

    let report =
        history.check().unwrap_or_else(|v| panic!("history check failed: {v}\nload: {stats:?}"));
    let mut prev: Option<(String, i64)> = None;
    for (label, from, to) in &epochs {
        let n = history.ok_calls_within(*from, *to);
        assert!(n >= 1, "no value recorded in epoch {label}");
        let (lo, hi) = history.value_range_within(*from, *to).unwrap();
        if let Some((pl, phi)) = &prev {
            assert!(lo > *phi, "epoch {label} issued {lo}, not above {phi} issued in epoch {pl}");
        }
        prev = Some((label.clone(), hi));
    }
    assert!(report.ok_calls > 0);
    // And the durable bound still covers everything.
    let mut c = node.connect();
    let hw = durable_high_water(&mut c).unwrap().unwrap();
    assert!(physical(report.max_value.unwrap()) <= hw);
    assert!(next(&mut c) > report.max_value.unwrap());
    eprintln!(
        "restarts: {} ok calls, {} errored calls, {} connects; epochs: {:?}",
        report.ok_calls,
        report.err_calls,
        stats.connects,
        epochs
            .iter()
            .map(|(l, f, t)| (l.as_str(), history.ok_calls_within(*f, *t)))
            .collect::<Vec<_>>()
    );
}

// ---------------------------------------------------------------------------------------- 3

/// kill -9 of the tsoracle worker: the postmaster crash-restarts, a new worker fences again and
/// serves; no value goes back.
#[test]
fn worker_kill9_refences() {
    let mut node = serving_node("workerkill", NodeOpts::new());
    let mut c = node.connect();
    let st = status_of(&mut c);
    let wpid = st.worker_pid.expect("tso_status().worker_pid while serving");
    assert!(
        node.child_pids().contains(&wpid),
        "worker_pid {wpid} is not a child of the postmaster {:?}",
        node.postmaster_pid()
    );
    let pm = node.postmaster_pid();

    let history = History::new();
    let load = Load::start(
        vec![node.endpoint()],
        LoadOptions::new(8, Duration::from_secs(300)),
        ops::mixed_with_uuid(64),
        history.clone(),
    );
    let t0 = Instant::now();
    history.wait_progress(t0, 50, "before the kill");
    let before_max = history.max_value().unwrap();

    node.kill9_pid(wpid).unwrap();
    // The postmaster has noticed (kill9_pid waits for that): the new worker is polled for.
    let st = poll_until(&format!("a worker other than {wpid}"), Duration::from_secs(60), || {
        let st = node
            .wait_serving()
            .unwrap_or_else(|e| panic!("not serving after the worker was killed: {e}"));
        (st.worker_pid != Some(wpid)).then_some(st)
    });
    let up = Instant::now();
    history.wait_progress(up, 50, "after the worker restart");
    let stats = load.stop_and_join();

    assert!(node.is_running() && node.postmaster_pid() == pm, "the postmaster itself stayed up");
    assert!(c.query_one("SELECT 1", &[]).is_err(), "a crash restart ends old sessions");
    assert!(st.worker_pid.is_some() && st.worker_pid != Some(wpid), "{st:?}");
    assert!(st.fences.unwrap() >= 1, "the new worker fenced: {st:?}");
    history.check().unwrap_or_else(|v| panic!("history check failed: {v}\nload: {stats:?}"));
    let (lo, _) = history.value_range_within(up, Instant::now()).unwrap();
    assert!(lo > before_max, "after the crash {lo} <= {before_max} before it");
    eprintln!("worker kill: old pid {wpid}, new status {st:?}, load {stats:?}");
}

// ---------------------------------------------------------------------------------------- 4

/// A tiny window (50 ms or the GUC's minimum, set by reload): under load the worker extends it
/// many times (at least 10 within 20 s; at 50 ms that takes well under a second once the
/// window set before the reload has been used up), and the history stays correct.
#[test]
fn small_window_many_extensions() {
    let mut node = serving_node("smallwindow", NodeOpts::new());
    let w = set_window(&mut node, 50);
    let mut c = node.connect();
    let st0 = status_of(&mut c);
    let history = History::new();
    let load = Load::start(
        vec![node.endpoint()],
        LoadOptions::new(8, Duration::from_secs(60)),
        ops::mixed_with_uuid(64),
        history.clone(),
    );
    let t0 = Instant::now();
    let mut ext = 0;
    while t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(100));
        ext = status_of(&mut c).window_extensions.unwrap() - st0.window_extensions.unwrap();
        if ext >= 10 && t0.elapsed() >= Duration::from_secs(2) {
            break;
        }
    }
    let stats = load.stop_and_join();
    let st1 = status_of(&mut c);
    let report =
        history.check().unwrap_or_else(|v| panic!("history check failed: {v}\nload: {stats:?}"));
    assert!(report.ok_calls > 0, "{stats:?}");
    assert!(
        ext >= 10,
        "only {ext} window extensions in {:?} with window_ahead_ms = {w} ({st0:?} -> {st1:?})",
        t0.elapsed()
    );
    let hw = durable_high_water(&mut c).unwrap().unwrap();
    assert!(physical(report.max_value.unwrap()) <= hw, "issued above the durable high-water {hw}");
    eprintln!(
        "window {w} ms: {ext} extensions, {} calls ok, {} errors {:?}",
        report.ok_calls, report.err_calls, stats.sample_errors
    );
}

// ---------------------------------------------------------------------------------------- 5

/// Values obtained inside a rolled-back transaction (while the window was extended several
/// times) are never issued again, neither right after nor after an immediate restart.
#[test]
fn rollback_does_not_reissue() {
    let mut node = serving_node("rollback", NodeOpts::new());
    set_window(&mut node, 50);
    let mut other = node.connect();
    let ext0 = status_of(&mut other).window_extensions.unwrap();

    let mut c = node.connect();
    let mut max = i64::MIN;
    c.batch_execute("BEGIN").unwrap();
    // Keep the transaction open until the worker has extended the window a few times (the
    // window set before the reload drains first), bounded in time and count.
    let t0 = Instant::now();
    let mut calls = 0u64;
    let mut ext1 = ext0;
    while ext1 < ext0 + 3 && t0.elapsed() < Duration::from_secs(20) && calls < 2_000_000 {
        let v = next(&mut c);
        assert!(v > max, "tso_next() went back inside a transaction: {v} after {max}");
        max = v;
        let b = tso_next_batch(&mut c, 100).unwrap();
        assert!(b > max);
        max = b + 99;
        calls += 1;
        if calls.is_multiple_of(50) {
            ext1 = status_of(&mut other).window_extensions.unwrap();
        }
    }
    c.batch_execute("ROLLBACK").unwrap();
    assert!(
        ext1 >= ext0 + 3,
        "the window was not extended while the transaction was open ({ext0} -> {ext1} in {:?})",
        t0.elapsed()
    );

    // The durable bound was not rolled back with the caller's transaction.
    let hw = durable_high_water(&mut c).unwrap().unwrap();
    assert!(physical(max) <= hw, "rolled-back values above the durable high-water {hw}: {max}");
    let v = next(&mut c);
    assert!(v > max, "after ROLLBACK: {v} <= {max}");
    max = v;

    // A transaction aborted by an error.
    c.batch_execute("BEGIN").unwrap();
    let v = next(&mut c);
    assert!(v > max);
    max = v;
    assert!(c.batch_execute("SELECT 1/0").is_err());
    c.batch_execute("ROLLBACK").unwrap();
    let v = next(&mut c);
    assert!(v > max);
    max = v;

    drop(c);
    drop(other);
    node.restart(StopMode::Immediate).unwrap();
    node.wait_serving().unwrap();
    let mut c = node.connect();
    let v = next(&mut c);
    assert!(v > max, "after restart -m immediate: {v} <= {max} seen before");
}

// ---------------------------------------------------------------------------------------- 6

/// A role without privileges can get timestamps but cannot touch the durable high-water nor
/// call tso_seed; the high-water is unchanged after its attempts.
#[test]
fn plain_role_cannot_lower_high_water() {
    let mut node = serving_node("privileges", NodeOpts::new());
    let mut su = node.connect();
    su.batch_execute("CREATE ROLE plain LOGIN").unwrap();
    let hw0 = durable_high_water(&mut su).unwrap().expect("a high-water row");
    let mut max = next(&mut su);

    let mut p = node.connect_as("plain");
    let v = next(&mut p);
    assert!(v > max);
    max = v;
    let b = tso_next_batch(&mut p, 10).unwrap();
    assert!(b > max);
    max = b + 9;

    let attempts = [
        "UPDATE tsoracle.high_water SET physical_ms = 0",
        "DELETE FROM tsoracle.high_water",
        "INSERT INTO tsoracle.high_water (physical_ms, epoch) VALUES (0, 0)",
        "TRUNCATE tsoracle.high_water",
        "DROP TABLE tsoracle.high_water",
        "ALTER TABLE tsoracle.high_water DROP CONSTRAINT high_water_pkey",
    ];
    for sql in attempts {
        expect_sqlstate(p.batch_execute(sql), &SqlState::INSUFFICIENT_PRIVILEGE, sql);
    }
    expect_sqlstate(tso_seed(&mut p, 1), &SqlState::INSUFFICIENT_PRIVILEGE, "tso_seed(1) as plain");
    expect_sqlstate(tso_seed(&mut p, 0), &SqlState::INSUFFICIENT_PRIVILEGE, "tso_seed(0) as plain");

    let hw1 = durable_high_water(&mut su).unwrap().expect("the high-water row is still there");
    assert!(hw1 >= hw0, "high-water went from {hw0} to {hw1}");
    let v = next(&mut p);
    assert!(v > max);
    max = v;

    drop(p);
    drop(su);
    node.restart(StopMode::Immediate).unwrap();
    node.wait_serving().unwrap();
    let mut su = node.connect();
    let v = next(&mut su);
    assert!(v > max, "after restart: {v} <= {max}");
    assert!(durable_high_water(&mut su).unwrap().unwrap() >= hw1);
}

// ---------------------------------------------------------------------------------------- 7

/// Without shared_preload_libraries the extension can be created, but its functions fail with
/// SQLSTATE 55000 and an error that names shared_preload_libraries; the server stays up.
#[test]
fn not_preloaded_gives_clear_error() {
    let mut node = Node::start_new("nopreload", NodeOpts::new().without_preload()).unwrap();
    let pm = node.postmaster_pid();
    let mut c = node.connect();
    c.batch_execute("CREATE EXTENSION tsoracle").unwrap_or_else(|e| {
        panic!("CREATE EXTENSION without preload: {}", tsoracle_tests::pg_error_string(&e))
    });

    let checks: [(&str, Result<i64, postgres::Error>); 2] =
        [("tso_next()", tso_next(&mut c)), ("tso_next_batch(10)", tso_next_batch(&mut c, 10))];
    for (what, r) in checks {
        let e = expect_sqlstate(r, &SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE, what);
        let db = e.as_db_error().unwrap();
        let text =
            format!("{} {} {}", db.message(), db.detail().unwrap_or(""), db.hint().unwrap_or(""));
        assert!(
            text.contains("shared_preload_libraries"),
            "{what}: the error does not say how to fix it: {}",
            tsoracle_tests::pg_error_string(&e)
        );
    }
    // The same session still works (no backend crash, no crash restart) and so do new ones.
    let one: i32 = c.query_one("SELECT 1", &[]).unwrap().get(0);
    assert_eq!(one, 1);
    let one: i32 = node.connect().query_one("SELECT 1", &[]).unwrap().get(0);
    assert_eq!(one, 1);
    assert!(node.is_running() && node.postmaster_pid() == pm);
    assert!(!node.log_contents().contains("terminated by signal"), "a server process crashed");
}

// ---------------------------------------------------------------------------------------- 8

/// tso_seed moves the oracle forward (an hour ahead here) and never back; the seed is durable.
#[test]
fn seed_advances_never_lowers() {
    let mut node = serving_node("seed", NodeOpts::new());
    let mut c = node.connect();
    let before = next(&mut c);
    let target = now_ms() + 3_600_000;
    tso_seed(&mut c, target)
        .unwrap_or_else(|e| panic!("tso_seed: {}", tsoracle_tests::pg_error_string(&e)));
    let v = next(&mut c);
    assert!(v > before);
    assert!(physical(v) >= target, "after tso_seed({target}): physical {} ", physical(v));
    let mut max = v;

    tso_seed(&mut c, 1)
        .unwrap_or_else(|e| panic!("tso_seed(1): {}", tsoracle_tests::pg_error_string(&e)));
    let v = next(&mut c);
    assert!(v > max, "tso_seed(1) lowered the oracle: {v} <= {max}");
    assert!(physical(v) >= target);
    max = v;
    let b = tso_next_batch(&mut c, 1000).unwrap();
    assert!(b > max && physical(b) >= target);
    max = b + 999;
    assert!(durable_high_water(&mut c).unwrap().unwrap() >= physical(max));
    let st = status_of(&mut c);
    assert!(st.high_water_ms.unwrap() >= target, "{st:?}");

    drop(c);
    node.restart(StopMode::Immediate).unwrap();
    node.wait_serving().unwrap();
    let mut c = node.connect();
    let v = next(&mut c);
    assert!(v > max, "after restart -m immediate: {v} <= {max}");
    assert!(physical(v) >= target);
}

// ---------------------------------------------------------------------------------------- 9

/// tso_next_batch rejects counts outside 1..=262144 with 22023 and accepts the bounds; the
/// conversion functions agree with the layout `physical_ms << 18 | logical`.
#[test]
fn batch_bounds_and_conversions() {
    let node = serving_node("batchconv", NodeOpts::new());
    let mut c = node.connect();
    for bad in [0, -1, MAX_BATCH + 1, i32::MIN, i32::MAX] {
        expect_sqlstate(
            tso_next_batch(&mut c, bad),
            &SqlState::INVALID_PARAMETER_VALUE,
            &format!("tso_next_batch({bad})"),
        );
    }
    let a = tso_next_batch(&mut c, 1).unwrap();
    let b = tso_next_batch(&mut c, MAX_BATCH).unwrap();
    assert!(b > a);
    let v = next(&mut c);
    assert!(
        v >= b + MAX_BATCH as i64,
        "{v} inside the previous batch [{b}, {})",
        b + MAX_BATCH as i64
    );

    for ts in [v, b, a, 0, (1i64 << 62) + 12345] {
        let r = c
            .query_one(
                "SELECT tso_physical($1), tso_logical($1), \
                        (extract(epoch FROM tso_to_timestamptz($1)) * 1000)::bigint, \
                        tso_physical(tso_from_timestamptz(tso_to_timestamptz($1)))",
                &[&ts],
            )
            .unwrap_or_else(|e| {
                panic!("conversions of {ts}: {}", tsoracle_tests::pg_error_string(&e))
            });
        let (p, l, ms, p2): (i64, i32, i64, i64) = (r.get(0), r.get(1), r.get(2), r.get(3));
        assert_eq!(p, ts >> 18, "tso_physical({ts})");
        assert_eq!(l as i64, ts & ((1 << 18) - 1), "tso_logical({ts})");
        assert_eq!(ms, p, "tso_to_timestamptz({ts}) is physical_ms after the epoch");
        assert_eq!(p2, p, "tso_from_timestamptz round trip of {ts}");
    }
    // A timestamp taken now is near now.
    let r = c
        .query_one("SELECT tso_physical(tso_from_timestamptz(now())), (extract(epoch FROM now()) * 1000)::bigint", &[])
        .unwrap();
    let (p, ms): (i64, i64) = (r.get(0), r.get(1));
    assert!((p - ms).abs() <= 1, "tso_from_timestamptz(now()) = {p} ms, now() = {ms} ms");
}

/// Until `CREATE EXTENSION tsoracle` has run in `tsoracle.database`, calls fail with 57P03
/// and a message naming that database; the extension may exist in other databases, and once
/// it exists in `tsoracle.database` every database's functions use the one shared oracle.
#[test]
fn not_serving_until_created_in_the_configured_database() {
    let node = Node::start_new(
        "otherdb",
        NodeOpts::new()
            .setting("tsoracle.database", "oracle")
            .setting("tsoracle.extension_timeout_ms", 300),
    )
    .expect("start node");
    let mut c = node.connect();
    c.batch_execute("CREATE EXTENSION tsoracle").unwrap();
    let e = expect_sqlstate(
        tso_next(&mut c),
        &SqlState::CANNOT_CONNECT_NOW,
        "tso_next() before the oracle database has the extension",
    );
    let message = e.as_db_error().map(|d| d.message().to_string()).unwrap_or_default();
    assert!(message.contains("\"oracle\""), "the message names the configured database: {message}");
    let state: String = c.query_one("SELECT state FROM tso_status()", &[]).unwrap().get(0);
    assert!(state == "starting" || state == "waiting_for_extension", "state {state}");

    c.batch_execute("CREATE DATABASE oracle").unwrap();
    let mut oracle =
        postgres::Client::connect(&node.conninfo_for("postgres", "oracle"), postgres::NoTls)
            .unwrap();
    oracle.batch_execute("CREATE EXTENSION tsoracle").unwrap();
    tso::wait_serving(&mut oracle).expect("serving once the extension exists in tsoracle.database");
    let a = tso_next(&mut oracle).unwrap();
    let b = tso_next(&mut c).expect("the postgres database uses the same oracle");
    let d = tso_next(&mut oracle).unwrap();
    assert!(a < b && b < d, "one order across databases: {a} {b} {d}");
}

/// `tsoracle.ha_ttl_ms` with the manager's `loop_wait` and `retry_timeout`
/// (`tsoracle.ha_loop_wait_ms`, `tsoracle.ha_retry_timeout_ms`, Patroni's defaults of 10 s
/// each): the worker warns, at start and at reload, unless `window_ahead_ms` + 1 s <
/// `ttl − loop_wait − retry_timeout` (docs/operations/patroni.md). A window of 9.5 s under a
/// TTL of 30 s — under half of it — is warned; the manager's shorter loop and retry make it
/// safe again.
#[test]
fn the_worker_warns_of_a_window_too_long_for_the_ha_managers_timing() {
    const WARNING: &str = "is too long for the HA manager's timing";
    let node = serving_node(
        "ha-timing",
        NodeOpts::new()
            .setting("tsoracle.ha_ttl_ms", 30_000)
            .setting("tsoracle.window_ahead_ms", 3_000),
    );
    let warnings = || node.log_contents().matches(WARNING).count();
    assert_eq!(warnings(), 0, "3 s leaves 7 s of the 30 s TTL: no warning");
    seqlease::alter_system(&node, "tsoracle.window_ahead_ms", Some("9500")).unwrap();
    wait_for("the warning at reload", Duration::from_secs(10), || warnings() > 0);
    let warned = warnings();
    seqlease::alter_system(&node, "tsoracle.ha_loop_wait_ms", Some("1000")).unwrap();
    seqlease::alter_system(&node, "tsoracle.ha_retry_timeout_ms", Some("5000")).unwrap();
    // Two reloads more; the worker re-reads its configuration within a pass.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(warnings(), warned, "30 - 1 - 5 - 9.5 s leaves 14.5 s: no new warning");
}
