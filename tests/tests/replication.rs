//! Streaming replication and failover: a primary with a synchronous standby made by
//! `pg_basebackup -R`, on loopback ports.
//!
//! Every test builds its own clusters. The load ([`MixedLoad`]) calls `tso_next()`,
//! `tso_next_batch(k)` and `tso_seq(key, k)` on three keys from 16 sessions, follows the
//! "current primary" pointer, and records every call (errors included) with the name of the
//! node that answered: timestamps in a [`History`] (unique, real-time ordered), sequence blocks
//! in a [`DenseHistory`] (per key: no overlap, real-time ordered, tiling `[0, tso_seq_peek)`
//! with gaps explained only by errored calls).
//!
//! The load is moved to a new primary only once the old one can no longer answer (stopped or
//! killed). An old primary that is still up may serve from the window it had already
//! committed (never above it: it cannot commit without its synchronous standby), but only for
//! `tsoracle.window_ahead_ms` after its last confirmed commit (the last test checks it). Those
//! values are still below everything the new primary issues (test 1 checks it); a failover
//! procedure that elects a new primary sooner than that after cutting the old one off would
//! let a client see time go back (docs/operations/patroni.md).
//!
//! Tests 1, 2 and 4 make their pair, promote and check by docs/operations/replication.md's
//! worked example, its blocks run as written (`tsoracle_tests::runbook`, with `$PRIMARY`,
//! `$STANDBY_DATA` and `$STANDBY` set); first they check that the page has exactly those
//! blocks, and that its check of step 2 prints `f` when the step's `ALTER SYSTEM` is left out.
//!
//! Run with: `cargo test -p tsoracle-tests --test replication -- --test-threads=1`

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::Client;
use tsoracle_tests::cluster::{
    self, first_timestamp, make_sync, promotion_to_first_ts_ms, remove_primary_conninfo,
    wait_end_of_local_wal, wait_replayed, wait_sync, worker_activity, MixedLoad, MixedLoadOptions,
    PrimaryPointer,
};
use tsoracle_tests::runbook::{run_sh_as_server, run_step, Runbook, FAILOVER_STEPS};
use tsoracle_tests::tso::{durable_high_water, status, tso_next, TsoStatus};
use tsoracle_tests::{
    expect_sqlstate, pg_error_string, physical, poll_until, wait_for, DenseHistory, History, Node,
    NodeOpts, StopMode,
};

const KEYS: [&str; 3] = ["k0", "k1", "k2"];

// ------------------------------------------------------------------------------- helpers

/// A serving primary (extension created) and a started hot standby made from it by
/// `pg_basebackup -R` (application_name = its node name), which the primary then waits for
/// synchronously (`synchronous_standby_names`, set after `CREATE EXTENSION`: with no standby
/// connected every commit would block). The standby's own configuration has no
/// `synchronous_standby_names` (it was copied before they were set), so once promoted it
/// commits without waiting for a standby.
fn sync_pair(primary_name: &str, standby_name: &str) -> (Node, Node) {
    let mut primary = Node::start_new(primary_name, NodeOpts::new()).expect("start primary");
    primary
        .create_extension()
        .unwrap_or_else(|e| panic!("CREATE EXTENSION / wait_serving on the primary: {e}"));
    let mut standby = Node::base_backup_from(&primary, standby_name).expect("pg_basebackup");
    standby.start().expect("start standby");
    make_sync(&mut primary, standby.name()).unwrap_or_else(|e| panic!("synchronous standby: {e}"));
    (primary, standby)
}

/// [`sync_pair`] by the worked example of docs/operations/replication.md, steps 1 and 2 as
/// written: the page's `pg_basebackup` (as the `postgres` OS user) into the standby's
/// directory, the standby started, and once it streams, the page's `ALTER SYSTEM` and its
/// check, which prints `t` (and `f` in a mutant of the step without the `ALTER SYSTEM`: the
/// page's own check catches a standby left asynchronous). The primary is `primary`, the
/// standby `standby1` (the page's name).
fn page_pair() -> (Node, Node, Runbook) {
    let book = Runbook::load("replication.md", "failover");
    book.expect_steps(FAILOVER_STEPS);
    let primary = Node::start_new("primary", NodeOpts::new()).expect("start primary");
    primary
        .create_extension()
        .unwrap_or_else(|e| panic!("CREATE EXTENSION / wait_serving on the primary: {e}"));
    let vars = vec![("PRIMARY", primary.conninfo())];
    let mut standby = Node::base_backup_by(&primary, "standby1", |data| {
        let mut vars = vars.clone();
        vars.push(("STANDBY_DATA", data.display().to_string()));
        run_sh_as_server(book.step(1), &primary, &vars).map(|_| ())
    })
    .unwrap_or_else(|e| panic!("replication.md step 1: {e}\n{}", book.step(1).text));
    standby.start().expect("start standby");
    let mut c = primary.connect();
    poll_until("standby1 streams", Duration::from_secs(60), || {
        let streaming: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_stat_replication \
                  WHERE application_name = 'standby1' AND state = 'streaming'",
                &[],
            )
            .expect("pg_stat_replication")
            .get(0);
        (streaming == 1).then_some(())
    });
    let checked = |out: String| out.lines().last().unwrap_or("").trim().to_string();
    let mutant = book.step(2).without_lines("ALTER SYSTEM");
    assert_eq!(checked(run_step(&mutant, &primary, &vars)), "f", "step 2 without ALTER SYSTEM");
    assert_eq!(checked(run_step(book.step(2), &primary, &vars)), "t", "step 2's check");
    wait_sync(&primary, "standby1").unwrap_or_else(|e| panic!("synchronous standby: {e}"));
    (primary, standby, book)
}

/// The page's step 3 (`pg_promote()`, which waits until the standby is out of recovery): how
/// long it took.
fn page_promote(book: &Runbook, standby: &Node) -> Duration {
    let t0 = Instant::now();
    let out = run_step(book.step(3), standby, &[("STANDBY", standby.conninfo())]);
    assert!(out.lines().any(|l| l.trim() == "t"), "pg_promote() returned false: {out}");
    t0.elapsed()
}

/// The page's step 4 after a first promotion: epoch and timeline 2, and its `tso_next()` above
/// `first_new`, the first value the promoted standby served (so above all of the old primary's).
fn page_checks(book: &Runbook, standby: &Node, first_new: i64) {
    let (next, epoch, timeline) = page_check(book, standby);
    assert_eq!((epoch, timeline), (2, 2), "replication.md step 4: the epoch is the new timeline");
    assert!(next > first_new, "replication.md step 4: tso_next() {next} <= {first_new}");
}

/// The page's step 4 on the promoted standby: the row it prints, `tso_next()`, `epoch` and
/// `timeline`.
fn page_check(book: &Runbook, standby: &Node) -> (i64, i64, i64) {
    let out = run_step(book.step(4), standby, &[("STANDBY", standby.conninfo())]);
    let rows: Vec<Vec<i64>> = out
        .lines()
        .filter(|l| l.contains('|'))
        .filter_map(|l| l.split('|').map(|f| f.trim().parse().ok()).collect())
        .collect();
    match rows.as_slice() {
        [r] if r.len() == 3 => (r[0], r[1], r[2]),
        _ => panic!("replication.md step 4: one row of three numbers: {out}"),
    }
}

fn status_of(c: &mut Client) -> TsoStatus {
    status(c).unwrap_or_else(|e| panic!("tso_status(): {}", pg_error_string(&e)))
}

fn mixed_load(target: &PrimaryPointer, ts: &History, dense: &DenseHistory) -> MixedLoad {
    load_with_seq_share(target, ts, dense, MixedLoadOptions::default().seq_share)
}

/// The mixed load with another share of `tso_seq` calls (0: timestamps only).
fn load_with_seq_share(
    target: &PrimaryPointer,
    ts: &History,
    dense: &DenseHistory,
    seq_share: f64,
) -> MixedLoad {
    MixedLoad::start(
        target.clone(),
        MixedLoadOptions {
            threads: 16,
            duration: Duration::from_secs(240),
            seq_keys: KEYS.iter().map(|k| k.to_string()).collect(),
            seq_share,
            ..Default::default()
        },
        ts.clone(),
        dense.clone(),
    )
}

/// (min first, max last, successful calls) of the timestamps a node issued.
fn node_range(history: &History, node: &str) -> Option<(i64, i64, usize)> {
    let calls: Vec<_> =
        history.calls().into_iter().filter(|c| c.node == node && c.is_ok()).collect();
    let lo = calls.iter().filter_map(|c| c.first()).min()?;
    let hi = calls.iter().filter_map(|c| c.last()).max()?;
    Some((lo, hi, calls.len()))
}

/// Successful sequence blocks a node handed out.
fn dense_ok_on(dense: &DenseHistory, node: &str) -> usize {
    dense.calls().iter().filter(|c| c.node == node && c.result.is_ok()).count()
}

/// `tso_seq_peek(key)` for every key: the counter values the dense check tiles up to.
fn seq_totals(c: &mut Client) -> BTreeMap<String, i64> {
    KEYS.iter()
        .map(|k| {
            let v: Option<i64> = c
                .query_one("SELECT tso_seq_peek($1)", &[k])
                .and_then(|r| r.try_get(0))
                .unwrap_or_else(|e| panic!("tso_seq_peek({k}): {}", pg_error_string(&e)));
            (k.to_string(), v.unwrap_or(0))
        })
        .collect()
}

/// Both checks over the whole run, panicking with the violation.
fn check_histories(ts: &History, dense: &DenseHistory, totals: &BTreeMap<String, i64>, what: &str) {
    let report =
        ts.check().unwrap_or_else(|v| panic!("{what}: timestamp history check failed: {v}"));
    let dr = dense
        .check(Some(totals))
        .unwrap_or_else(|v| panic!("{what}: sequence history check failed: {v}"));
    eprintln!(
        "{what}: timestamps: {} calls ({} ok, {} errored), {} values, per node {:?}",
        report.calls, report.ok_calls, report.err_calls, report.values, report.per_node
    );
    for (k, kr) in &dr.keys {
        eprintln!(
            "{what}: sequence {k}: total {}, {} ok blocks, {} errored calls, gaps {:?}",
            kr.total, kr.ok_calls, kr.err_calls, kr.gaps
        );
    }
}

/// Open a session on the standby before promoting it (a hot-standby session survives the
/// promotion), promote it ([`cluster::promote`]: `pg_promote(false)`, then poll until
/// `pg_is_in_recovery()` is false, which is when `pg_promote(true)` would return), and time
/// the first `tso_next()` that succeeds after that. Returns (first value, time to it,
/// `promotion_to_first_ts_ms`, the new primary's status).
fn promote_and_time(
    standby: &Node,
    label: &str,
    page: Option<&Runbook>,
) -> (i64, Duration, Option<i64>, TsoStatus) {
    let mut c = standby.connect();
    let promotion = match page {
        Some(book) => page_promote(book, standby),
        None => cluster::promote(standby).unwrap_or_else(|e| panic!("{label}: promotion: {e}")),
    };
    let promoted = Instant::now();
    let (first, took) = first_timestamp(&mut c, promoted, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{label}: no timestamp from the promoted standby: {e}"));
    let st = status_of(&mut c);
    let p2f =
        promotion_to_first_ts_ms(&mut c).unwrap_or_else(|e| panic!("{}", pg_error_string(&e)));
    eprintln!(
        "{label}: PROMOTION TIMING: pg_promote() -> out of recovery {:.1} ms; out of recovery -> first tso_next() {:.1} ms; \
         tso_status().promotion_to_first_ts_ms = {p2f:?}; last_fence_ms = {:?}",
        promotion.as_secs_f64() * 1e3,
        took.as_secs_f64() * 1e3,
        st.last_fence_ms
    );
    (first, took, p2f, st)
}

/// Checks shared by the two single-failover tests.
#[allow(clippy::too_many_arguments)]
fn check_single_failover(
    label: &str,
    ts: &History,
    dense: &DenseHistory,
    old: &str,
    new: &Node,
    first_new: i64,
    st_old: &TsoStatus,
    st_new: &TsoStatus,
    p2f: Option<i64>,
) {
    let mut c = new.connect();
    let totals = seq_totals(&mut c);
    check_histories(ts, dense, &totals, label);

    let (old_lo, old_hi, old_n) = node_range(ts, old).expect("the old primary issued timestamps");
    let (new_lo, new_hi, new_n) =
        node_range(ts, new.name()).expect("the new primary issued timestamps");
    assert!(
        old_n >= 100 && new_n >= 100,
        "{label}: {old_n} calls on the old primary, {new_n} on the new one"
    );
    assert!(dense_ok_on(dense, old) > 0, "{label}: no tso_seq succeeded on the old primary");
    assert!(dense_ok_on(dense, new.name()) > 0, "{label}: no tso_seq succeeded on the new primary");
    assert!(
        first_new > old_hi,
        "{label}: first timestamp of the new primary {first_new} (physical {}) is not above the last one of the old primary {old_hi} (physical {})",
        physical(first_new),
        physical(old_hi)
    );
    assert!(
        new_lo > old_hi,
        "{label}: the new primary issued {new_lo} <= {old_hi} issued by the old one"
    );
    let _ = old_lo;

    assert_eq!(st_new.role, "primary", "{st_new:?}");
    assert_eq!(st_new.state, "serving", "{st_new:?}");
    assert_eq!(st_new.timeline, Some(2), "promotion moves to timeline 2: {st_new:?}");
    assert_eq!(st_new.epoch, Some(2), "the epoch is the new timeline: {st_new:?}");
    assert!(
        st_new.epoch > st_old.epoch && st_new.timeline > st_old.timeline,
        "epoch/timeline did not rise: {st_old:?} -> {st_new:?}"
    );
    assert!(st_new.fences.unwrap_or(0) >= 1, "{st_new:?}");
    assert!(
        p2f.is_some_and(|v| v >= 0),
        "{label}: promotion_to_first_ts_ms is {p2f:?} after a promotion and a served timestamp"
    );
    // The new primary still goes forward.
    let v = tso_next(&mut c).unwrap();
    assert!(v > new_hi && v > first_new);
}

// ---------------------------------------------------------------------------------------- 1

/// Under load, promote the synchronous standby while the old primary is still up, stop the
/// old primary (fast), then move the load. Every value the old primary issued, including those
/// it served from its already committed window after the promotion, is below the first value
/// of the new primary; both histories pass; epoch and timeline go from 1 to 2.
#[test]
fn promote_after_clean_stop() {
    let (mut primary, standby, book) = page_pair();
    let st_old = status_of(&mut primary.connect());
    assert_eq!((st_old.epoch, st_old.timeline), (Some(1), Some(1)), "{st_old:?}");
    assert_eq!(st_old.sync_replication, Some(true), "{st_old:?}");

    let (ts, dense) = (History::new(), DenseHistory::new());
    let target = PrimaryPointer::new(&primary);
    let load = mixed_load(&target, &ts, &dense);
    let t0 = Instant::now();
    ts.wait_progress(t0, 300, "before the promotion");

    // A prober calling only tso_next() on the old primary through the promotion, so that the
    // old primary's window is exercised while the new primary already serves (the load's
    // sessions soon all wait in tso_seq, which needs a commit the old primary cannot make).
    let probing = Arc::new(AtomicBool::new(true));
    let prober = {
        let (probing, ts, node) = (probing.clone(), ts.clone(), primary.name().to_string());
        let mut c = primary.connect();
        std::thread::spawn(move || {
            while probing.load(Ordering::SeqCst) {
                let start = Instant::now();
                match tso_next(&mut c) {
                    Ok(v) => ts.record_ok(start, Instant::now(), &node, v, 1),
                    Err(e) => {
                        ts.record_err(start, Instant::now(), &node, pg_error_string(&e), 1);
                        if c.is_closed() || e.as_db_error().is_none() {
                            break;
                        }
                    }
                }
            }
        })
    };
    let (first_new, _, p2f, st_new) = promote_and_time(&standby, "clean", Some(&book));
    page_checks(&book, &standby, first_new);
    let promoted = Instant::now();
    // The old primary keeps serving from its committed window for a moment: let it.
    std::thread::sleep(Duration::from_millis(300));
    primary.stop(StopMode::Fast).expect("stop the old primary (fast)");
    probing.store(false, Ordering::SeqCst);
    prober.join().unwrap();
    target.set(&standby);
    let moved = Instant::now();
    ts.wait_progress(moved, 300, "after the failover");
    let stats = load.stop_and_join();
    eprintln!(
        "clean: the old primary answered {} tso_next() calls that started after pg_promote() returned (all must be below {first_new}); load {stats:?}",
        ts.calls()
            .iter()
            .filter(|c| c.node == primary.name() && c.is_ok() && c.start >= promoted)
            .count()
    );
    check_single_failover(
        "clean",
        &ts,
        &dense,
        primary.name(),
        &standby,
        first_new,
        &st_old,
        &st_new,
        p2f,
    );
}

// ---------------------------------------------------------------------------------------- 2

/// Under load, kill -9 the primary's postmaster and all its processes, promote the
/// synchronous standby, move the load: everything the new primary issues is above everything
/// the old one issued; both histories pass; epoch and timeline go from 1 to 2.
#[test]
fn promote_after_kill9() {
    let (mut primary, standby, book) = page_pair();
    let st_old = status_of(&mut primary.connect());
    assert_eq!((st_old.epoch, st_old.timeline), (Some(1), Some(1)), "{st_old:?}");

    let (ts, dense) = (History::new(), DenseHistory::new());
    let target = PrimaryPointer::new(&primary);
    let load = mixed_load(&target, &ts, &dense);
    let t0 = Instant::now();
    ts.wait_progress(t0, 300, "before the kill");

    let killed = primary.kill9_postmaster().expect("kill -9 the old primary");
    assert!(!killed.is_empty());
    let (first_new, _, p2f, st_new) = promote_and_time(&standby, "kill9", Some(&book));
    page_checks(&book, &standby, first_new);
    target.set(&standby);
    let moved = Instant::now();
    ts.wait_progress(moved, 300, "after the failover");
    let stats = load.stop_and_join();
    eprintln!("kill9: load {stats:?}");
    check_single_failover(
        "kill9",
        &ts,
        &dense,
        primary.name(),
        &standby,
        first_new,
        &st_old,
        &st_new,
        p2f,
    );
}

// ---------------------------------------------------------------------------------------- 3

/// Three failovers in a row under one continuous load (old primary stopped fast, then killed
/// -9, then stopped immediate, each before the promotion); after each one a fresh standby is
/// base-backed-up from the new primary and made synchronous. The epoch goes 1 -> 2 -> 3 -> 4,
/// each primary's values are above the previous one's, and the combined histories pass.
#[test]
fn three_promotions_in_a_row() {
    let (mut primary, mut standby) = sync_pair("node1", "node2");
    let st = status_of(&mut primary.connect());
    assert_eq!(st.epoch, Some(1), "{st:?}");
    let mut order = vec![(primary.name().to_string(), st.epoch)];

    let (ts, dense) = (History::new(), DenseHistory::new());
    let target = PrimaryPointer::new(&primary);
    let load = mixed_load(&target, &ts, &dense);
    let mut since = Instant::now();
    let mut timings = Vec::new();
    let t_start = Instant::now();
    let lap = |what: &str| {
        eprintln!("three promotions: +{:.1} s {what}", t_start.elapsed().as_secs_f64())
    };
    for (round, how) in ["fast", "kill9", "immediate"].into_iter().enumerate() {
        ts.wait_progress(since, 200, &format!("round {round}: on {}", primary.name()));
        lap(&format!("round {}: load progressed on {}", round + 1, primary.name()));
        match how {
            "fast" => primary.stop(StopMode::Fast).expect("stop fast"),
            "immediate" => primary.stop(StopMode::Immediate).expect("stop immediate"),
            _ => {
                primary.kill9_postmaster().expect("kill -9");
            }
        }
        let (_, took, p2f, st) =
            promote_and_time(&standby, &format!("round {} ({how})", round + 1), None);
        target.set(&standby);
        let want = round as i64 + 2;
        assert_eq!(st.epoch, Some(want), "promotion {}: {st:?}", round + 1);
        assert_eq!(st.timeline, Some(want), "promotion {}: {st:?}", round + 1);
        assert!(p2f.is_some(), "promotion_to_first_ts_ms after promotion {}: {st:?}", round + 1);
        timings.push((took, p2f));
        order.push((standby.name().to_string(), st.epoch));
        lap(&format!(
            "round {}: {} stopped ({how}), {} promoted and serving",
            round + 1,
            primary.name(),
            standby.name()
        ));

        // A fresh standby from the new primary, made synchronous.
        let mut fresh = Node::base_backup_from(&standby, &format!("node{}", round + 3))
            .unwrap_or_else(|e| panic!("base backup from {}: {e}", standby.name()));
        lap(&format!("round {}: base backup {} done", round + 1, fresh.name()));
        fresh.start().expect("start the fresh standby");
        make_sync(&mut standby, fresh.name()).unwrap_or_else(|e| panic!("round {round}: {e}"));
        lap(&format!("round {}: {} is the synchronous standby", round + 1, fresh.name()));
        // The next failover comes only after the load has run with the synchronous standby.
        since = Instant::now();
        let old = std::mem::replace(&mut primary, std::mem::replace(&mut standby, fresh));
        drop(old);
        let st = status_of(&mut primary.connect());
        assert_eq!(st.sync_replication, Some(true), "{st:?}");
    }
    ts.wait_progress(since, 200, "after the last promotion");
    let stats = load.stop_and_join();

    let mut c = primary.connect();
    let totals = seq_totals(&mut c);
    check_histories(&ts, &dense, &totals, "three promotions");
    // Each primary, in order, issued values above all of its predecessor's.
    let mut prev: Option<(String, i64)> = None;
    for (node, epoch) in &order {
        let (lo, hi, n) = node_range(&ts, node)
            .unwrap_or_else(|| panic!("{node} (epoch {epoch:?}) issued nothing"));
        assert!(n >= 100, "{node}: only {n} calls");
        assert!(dense_ok_on(&dense, node) > 0, "{node}: no tso_seq succeeded");
        if let Some((pn, phi)) = &prev {
            assert!(
                lo > *phi,
                "{node} (epoch {epoch:?}) issued {lo}, not above {phi} issued by {pn}"
            );
        }
        prev = Some((node.clone(), hi));
    }
    let st = status_of(&mut c);
    assert_eq!((st.epoch, st.timeline), (Some(4), Some(4)), "{st:?}");
    eprintln!(
        "three promotions: primaries and epochs {order:?}; timings (pg_promote -> first tso_next, promotion_to_first_ts_ms) {:?}; load {stats:?}",
        timings
            .iter()
            .map(|(d, p)| (format!("{:.1} ms", d.as_secs_f64() * 1e3), *p))
            .collect::<Vec<_>>()
    );
}

// ---------------------------------------------------------------------------------------- 4

/// On a hot standby every function that issues or reads allocator state fails with 25006 and
/// a HINT naming the primary's host and port; tso_status() works and shows role/state
/// 'standby', the replay timeline and the replayed durable high-water.
#[test]
fn standby_errors_and_status() {
    let (primary, standby, book) = page_pair();
    let mut pc = primary.connect();
    let mut max = 0i64;
    for _ in 0..200 {
        max = max.max(tso_next(&mut pc).unwrap());
    }
    let b: i64 = pc.query_one("SELECT tso_next_batch(1000)", &[]).unwrap().get(0);
    max = max.max(b + 999);
    let s: i64 = pc.query_one("SELECT tso_seq('k0', 3)", &[]).unwrap().get(0);
    let lease: i64 = pc
        .query_one("SELECT lease_id FROM tso_lease_acquire('holder-1', 1, 30000)", &[])
        .unwrap_or_else(|e| panic!("tso_lease_acquire on the primary: {}", pg_error_string(&e)))
        .get(0);
    let pst = status_of(&mut pc);
    let last_issued = pst.last_issued.expect("last_issued on the primary");
    assert!(last_issued >= max);
    let durable = durable_high_water(&mut pc).unwrap().expect("a durable high-water");
    let lsn = wait_replayed(&primary, &standby).unwrap_or_else(|e| panic!("replay: {e}"));

    let mut sc = standby.connect();
    let hint_needle = format!("host=127.0.0.1 port={}", primary.port());
    let calls: Vec<(&str, String)> = vec![
        ("tso_next", "SELECT tso_next()".into()),
        ("tso_next_batch", "SELECT tso_next_batch(10)".into()),
        ("tso_seq", "SELECT tso_seq('k0', 1)".into()),
        ("tso_seq_batch", "SELECT * FROM tso_seq_batch(ARRAY['k0', 'k1'], ARRAY[1, 2])".into()),
        ("tso_seq_peek", "SELECT tso_seq_peek('k0')".into()),
        ("tso_lease_acquire", "SELECT * FROM tso_lease_acquire('holder-2', 1, 30000)".into()),
        ("tso_lease_renew", format!("SELECT * FROM tso_lease_renew({lease})")),
        ("tso_lease_release", format!("SELECT tso_lease_release({lease})")),
        ("tso_safe_frontier", "SELECT tso_safe_frontier()".into()),
    ];
    for (what, sql) in &calls {
        let e = expect_sqlstate(
            sc.batch_execute(sql),
            &SqlState::READ_ONLY_SQL_TRANSACTION,
            &format!("{what} on the standby"),
        );
        let db = e.as_db_error().unwrap();
        let hint = db.hint().unwrap_or("");
        assert!(
            hint.contains(&format!("{hint_needle} ")) || hint.ends_with(&hint_needle),
            "{what} on the standby: HINT does not name the primary ({hint_needle}): {}",
            pg_error_string(&e)
        );
        eprintln!("standby: {what}: {}", pg_error_string(&e));
    }
    // The session is still usable, and pure functions work.
    let p: i64 = sc.query_one("SELECT tso_physical($1)", &[&max]).unwrap().get(0);
    assert_eq!(p, physical(max));

    // One snapshot for tso_status() and the table read below: the standby is still replaying
    // the primary's extensions.
    sc.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ").unwrap();
    let st = status_of(&mut sc);
    assert_eq!(st.role, "standby", "{st:?}");
    assert_eq!(st.state, "standby", "{st:?}");
    assert_eq!(st.timeline, Some(1), "{st:?}");
    assert!(
        st.detail.as_deref().is_some_and(|d| d.contains(&hint_needle)),
        "standby status detail does not name the primary: {st:?}"
    );
    let hw = st.high_water_ms.expect("the replayed high-water on the standby");
    assert!(
        hw >= durable,
        "replayed high-water {hw} below the primary's durable high-water {durable} (replayed to {lsn})"
    );
    assert!(
        hw >= physical(last_issued),
        "replayed high-water {hw} below the physical ms {} of the primary's last issued timestamp",
        physical(last_issued)
    );
    // The same figure read from the table.
    let table: i64 = sc
        .query_one("SELECT max(physical_ms)::bigint FROM tsoracle.high_water", &[])
        .unwrap()
        .get(0);
    assert_eq!(hw, table, "tso_status().high_water_ms vs tsoracle.high_water on the standby");
    sc.batch_execute("COMMIT").unwrap();
    // Sequence state was replicated too (read on the promoted node below).
    drop(sc);
    drop(pc);
    drop(primary);
    page_promote(&book, &standby);
    let st = standby.wait_serving().unwrap();
    assert_eq!((st.role.as_str(), st.epoch), ("primary", Some(2)), "{st:?}");
    let (page_next, _, _) = page_check(&book, &standby);
    assert!(page_next > last_issued, "replication.md step 4: {page_next} <= {last_issued}");
    let mut c = standby.connect();
    let next: Option<i64> = c.query_one("SELECT tso_seq_peek('k0')", &[]).unwrap().get(0);
    assert_eq!(next, Some(s + 3), "the replicated counter of k0");
    let v = tso_next(&mut c).unwrap();
    assert!(v > last_issued, "after promotion {v} <= {last_issued}");
}

// ---------------------------------------------------------------------------------------- 5

/// The synchronous-replication trap, with the mixed load (the worker is typically cut off in
/// a group commit of `tso_seq` requests). See [`sync_trap`].
#[test]
fn sync_wait_cancelled_never_serves_above_standby() {
    sync_trap("sync trap (mixed)", MixedLoadOptions::default().seq_share);
}

/// The same with timestamps only: the commit the worker is cut off in is a window extension.
#[test]
fn sync_wait_cancelled_window_extension() {
    sync_trap("sync trap (window)", 0.0);
}

/// The synchronous-replication trap. With the standby stopped (immediate), the primary's
/// worker blocks in a commit (wait event SyncRep) and callers time out; `pg_cancel_backend`
/// must not end that wait (PostgreSQL would then report the commit as done), and
/// `pg_terminate_backend` ends it (PostgreSQL's WARNING "canceling the wait for synchronous
/// replication and terminating connection") but the worker must not serve from that commit.
///
/// What is guaranteed, and asserted: the allocator only ever serves from windows that were
/// committed AND flushed by the synchronous standby (which fsyncs: an immediate stop loses
/// nothing it acknowledged), so
///   * every timestamp the old primary returned has physical ms <= the high-water the standby
///     replays from its own WAL (started again with `primary_conninfo` removed, so it cannot
///     reconnect, and read once its startup process waits for WAL that will not come);
///   * so does every `tso_status().high_water_ms` (the allocator's committed bound) sampled on
///     the primary every 10 ms from before the stop to the end;
///   * the cancelled worker is the same process, still waiting, and nothing in the log says
///     a wait was cancelled;
///   * after the terminate the restarted worker cannot commit either (it is seen waiting in
///     SyncRep): tso_status() never says 'serving' and no call that started from then on
///     succeeds;
///   * every `tso_seq` block the old primary returned lies below the standby's counter (the
///     dense check with the promoted standby's `tso_seq_peek` as totals fails with
///     `BeyondTotal` otherwise), and gaps are explained by errored calls;
///   * the promoted standby (epoch 2) starts above everything the old primary returned, and
///     the combined histories pass.
///
/// Not guaranteed, only reported: the old primary's own `tsoracle.high_water` row may be above
/// the standby's, since a commit whose wait was cut short is still committed locally.
///
/// Checked last (so that a failure there does not hide the above): while the restarted worker
/// waits for the standby, `tso_status().state` says `fencing` (README: the fence runs after
/// every start and must commit), not `starting` / "connecting to database".
fn sync_trap(label: &str, seq_share: f64) {
    let (mut primary, mut standby) = sync_pair("primary", "standby1");
    let mut ctl = primary.connect();
    let st0 = status_of(&mut ctl);
    assert_eq!(st0.sync_replication, Some(true), "{st0:?}");

    // Sample the primary's tso_status() all along: the largest allocator bound and the
    // largest last_issued it ever showed, and the (state, worker) transitions.
    let sampling = Arc::new(AtomicBool::new(true));
    let samples = Arc::new(Mutex::new((None::<i64>, None::<i64>, Vec::<String>::new())));
    let sampler = {
        let (sampling, samples) = (sampling.clone(), samples.clone());
        let mut c = primary.connect();
        std::thread::spawn(move || {
            while sampling.load(Ordering::SeqCst) {
                if let Ok(st) = status(&mut c) {
                    let mut g = samples.lock().unwrap();
                    if let Some(h) = st.high_water_ms {
                        g.0 = Some(g.0.map_or(h, |m: i64| m.max(h)));
                    }
                    if let Some(l) = st.last_issued {
                        g.1 = Some(g.1.map_or(l, |m: i64| m.max(l)));
                    }
                    let s = format!("{}/{:?}", st.state, st.worker_pid);
                    if g.2.last() != Some(&s) {
                        g.2.push(s);
                    }
                } else if c.is_closed() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };

    let (ts, dense) = (History::new(), DenseHistory::new());
    let target = PrimaryPointer::new(&primary);
    let load = load_with_seq_share(&target, &ts, &dense, seq_share);
    let t0 = Instant::now();
    ts.wait_progress(t0, 300, "before the standby stops");

    // What the standby had flushed, as last reported: a lower bound for its replay later.
    let flushed: String = ctl
        .query_one(
            "SELECT flush_lsn::text FROM pg_stat_replication WHERE application_name = $1",
            &[&standby.name()],
        )
        .unwrap()
        .get(0);
    standby.stop(StopMode::Immediate).expect("stop the standby (immediate)");
    let down = Instant::now();

    // The worker ends up waiting for the standby, and callers fail (timeouts).
    let wpid =
        poll_until("the worker waiting for the standby (SyncRep)", Duration::from_secs(30), || {
            match worker_activity(&mut ctl).unwrap() {
                Some((pid, Some(ev))) if ev == "SyncRep" => Some(pid),
                _ => None,
            }
        });
    wait_for("calls failing with the standby down", Duration::from_secs(30), || {
        let ts_err = ts.calls().iter().filter(|c| !c.is_ok() && c.start >= down).count();
        let seq_err = dense.calls().iter().filter(|c| c.result.is_err() && c.start >= down).count();
        ts_err >= 1 && (seq_share == 0.0 || seq_err >= 1)
    });
    let st_blocked = status_of(&mut ctl);

    // A query cancel does not end the worker's wait.
    let log_before = primary.log_contents().len();
    let ok: bool = ctl.query_one("SELECT pg_cancel_backend($1)", &[&wpid]).unwrap().get(0);
    assert!(ok, "pg_cancel_backend({wpid})");
    std::thread::sleep(Duration::from_millis(1500));
    let after_cancel = worker_activity(&mut ctl).unwrap();
    assert_eq!(
        after_cancel,
        Some((wpid, Some("SyncRep".to_string()))),
        "after pg_cancel_backend the worker must still be the same process, still waiting for the standby"
    );
    let log_cancel = primary.log_contents()[log_before..].to_string();
    assert!(
        !log_cancel.contains("canceling wait for synchronous replication"),
        "a query cancel ended the worker's synchronous-replication wait:\n{log_cancel}"
    );

    // Terminate it: the wait ends and the worker exits; the postmaster starts a new one after
    // 1 s, whose fence must commit again and so waits for the standby too.
    let log_before = primary.log_contents().len();
    let ok: bool = ctl.query_one("SELECT pg_terminate_backend($1)", &[&wpid]).unwrap().get(0);
    assert!(ok, "pg_terminate_backend({wpid})");
    let (new_pid, blocked_seen) = poll_until(
        "a new worker waiting for the standby after the terminate",
        Duration::from_secs(30),
        || match worker_activity(&mut ctl).unwrap() {
            Some((pid, Some(ev))) if pid != wpid && ev == "SyncRep" => Some((pid, Instant::now())),
            _ => None,
        },
    );
    // For 2 s: not serving, and what tso_status() says meanwhile.
    let mut blocked_states: Vec<String> = Vec::new();
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        let st = status_of(&mut ctl);
        assert_ne!(st.state, "serving", "serving without its synchronous standby: {st:?}");
        assert_eq!(st.worker_pid, Some(new_pid), "{st:?}");
        let s = format!("{} ({})", st.state, st.detail.unwrap_or_default());
        if !blocked_states.contains(&s) {
            blocked_states.push(s);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let blocked_worker = worker_row(&mut ctl);
    let stats = load.stop_and_join();
    let st_end = status_of(&mut ctl);
    let local_hw = durable_high_water(&mut ctl).unwrap();
    sampling.store(false, Ordering::SeqCst);
    sampler.join().unwrap();
    let (max_bound, max_last_issued, states) = samples.lock().unwrap().clone();
    let log_term = primary.log_contents()[log_before..].to_string();
    drop(ctl);
    primary.stop(StopMode::Immediate).expect("stop the old primary");

    let worker_lines: Vec<&str> = log_term
        .lines()
        .filter(|l| {
            l.contains("tsoracle worker :") || l.contains(" background worker \"tsoracle worker\"")
        })
        .take(12)
        .collect();
    eprintln!(
        "{label}: primary log after the terminate (worker lines):\n{}",
        worker_lines.join("\n")
    );
    assert!(
        log_term.contains("canceling the wait for synchronous replication and terminating connection"),
        "the terminate did not end a synchronous-replication wait of the worker (scenario not reached):\n{}",
        worker_lines.join("\n")
    );

    // Nothing succeeded once the new worker was waiting for the standby.
    let late_ok = ts.calls().iter().filter(|c| c.is_ok() && c.start >= blocked_seen).count()
        + dense.calls().iter().filter(|c| c.result.is_ok() && c.start >= blocked_seen).count();
    assert_eq!(late_ok, 0, "calls succeeded while the restarted worker could not commit");

    // The standby, started without primary_conninfo: replays its own WAL, nothing more.
    let removed = remove_primary_conninfo(&standby).unwrap();
    assert!(!removed.is_empty(), "no primary_conninfo in postgresql.auto.conf");
    standby.start().expect("start the standby alone");
    let replayed = wait_end_of_local_wal(&standby, &flushed).unwrap_or_else(|e| panic!("{e}"));
    let mut sc = standby.connect();
    let sst = status_of(&mut sc);
    assert_eq!((sst.role.as_str(), sst.state.as_str()), ("standby", "standby"), "{sst:?}");
    let standby_hw = sst.high_water_ms.expect("the standby's replayed high-water");
    let table: i64 = sc
        .query_one("SELECT max(physical_ms)::bigint FROM tsoracle.high_water", &[])
        .unwrap()
        .get(0);
    assert_eq!(standby_hw, table, "tso_status().high_water_ms vs the table on the standby");

    let served_max = [ts.max_value(), max_last_issued, st_end.last_issued, st_blocked.last_issued]
        .into_iter()
        .flatten()
        .max()
        .expect("the old primary issued timestamps");
    let outcome_unknown = dense
        .calls()
        .iter()
        .filter(|c| c.result.as_ref().is_err_and(|e| e.contains("SQLSTATE 40003")))
        .count();
    eprintln!(
        "{label}: standby replayed to {replayed} (flushed {flushed} before the stop); standby high-water {standby_hw}; \
         old primary: max served {served_max} (physical {}), max allocator bound seen {max_bound:?}, \
         its visible durable high-water {local_hw:?} ({}); states {states:?}; tso_seq calls answered 40003: {outcome_unknown}; \
         while blocked {st_blocked:?}; load {stats:?}",
        physical(served_max),
        match local_hw {
            Some(h) if h > standby_hw => format!("{} ms above the standby: committed locally, never served", h - standby_hw),
            _ => "not above the standby".into(),
        }
    );
    assert!(
        physical(served_max) <= standby_hw,
        "the old primary returned {served_max} (physical {}) above the high-water {standby_hw} its synchronous standby has",
        physical(served_max)
    );
    let max_bound = max_bound.expect("a sampled allocator bound");
    assert!(
        max_bound <= standby_hw,
        "the old primary's allocator bound reached {max_bound}, above the standby's {standby_hw}"
    );

    // Promote the standby: it starts above everything the old primary returned.
    drop(sc);
    let (first_new, _, p2f, st_new) = promote_and_time(&standby, label, None);
    assert!(
        first_new > served_max,
        "first timestamp after promotion {first_new} <= {served_max} returned by the old primary"
    );
    assert_eq!((st_new.epoch, st_new.timeline), (Some(2), Some(2)), "{st_new:?}");
    assert!(p2f.is_some(), "{st_new:?}");
    // Load on the new primary, then both histories over everything.
    target.set(&standby);
    let load = mixed_load(&target, &ts, &dense);
    let moved = Instant::now();
    ts.wait_progress(moved, 100, "on the promoted standby");
    load.stop_and_join();
    let mut c = standby.connect();
    let totals = seq_totals(&mut c);
    check_histories(&ts, &dense, &totals, label);

    // Last (so that everything above is checked first): while the restarted worker waited
    // for the standby, tso_status() must have said what it was doing: the fence.
    eprintln!("{label}: while the restarted worker waited for the standby: states {blocked_states:?}; worker {blocked_worker}");
    assert!(
        blocked_states.iter().all(|s| s.starts_with("fencing ")),
        "while the restarted worker waited for the standby (SyncRep), tso_status() said {blocked_states:?}, not 'fencing'; \
         the worker (pid, wait_event, backend_xid, xact_start): {blocked_worker}"
    );
}

/// The tsoracle worker's row in pg_stat_activity: pid, wait_event, backend_xid, xact_start.
fn worker_row(c: &mut Client) -> String {
    match c.query(
        "SELECT pid::text, coalesce(wait_event, '-'), coalesce(backend_xid::text, '-'), coalesce(xact_start::text, '-') \
           FROM pg_stat_activity WHERE backend_type = 'tsoracle worker'",
        &[],
    ) {
        Ok(rows) => format!(
            "{:?}",
            rows.iter().map(|r| (0..4).map(|i| r.get::<_, String>(i)).collect::<Vec<_>>()).collect::<Vec<_>>()
        ),
        Err(e) => pg_error_string(&e),
    }
}

/// A primary cut off from its synchronous standby stops issuing within
/// `tsoracle.window_ahead_ms`, even though a lease left its committed window a minute ahead of
/// the clock: issuing needs a commit the standby confirmed in the last window, and the worker
/// cannot make one. Callers then get 57P03.
#[test]
fn a_primary_cut_off_from_its_standby_stops_issuing_within_the_window() {
    cut_off_primary_stops_issuing("cutoff", 0);
}

/// The same, with the cut-off primary's wall clock stepping back a minute right after the
/// cut: the gate is measured on the monotonic clock, so the step keeps it open no longer.
#[test]
fn a_cut_off_primary_whose_clock_steps_back_stops_issuing_within_the_window() {
    cut_off_primary_stops_issuing("cutoff-step", -60_000);
}

fn cut_off_primary_stops_issuing(name: &str, step_ms: i64) {
    let (mut primary, mut standby) =
        sync_pair(&format!("{name}-primary"), &format!("{name}-standby"));
    let window = 2_000u64;
    primary.set_conf("tsoracle.window_ahead_ms", window).expect("window_ahead_ms");
    let mut c = primary.connect();
    c.query("SELECT * FROM tso_lease_acquire('far', 1, 60000)", &[])
        .unwrap_or_else(|e| panic!("lease: {}", pg_error_string(&e)));
    let hw = durable_high_water(&mut c).unwrap().unwrap();
    assert!(
        hw >= tsoracle_tests::now_ms() + 50_000,
        "the lease put the high-water a minute ahead: {hw}"
    );
    // Let the last confirmation made under the old window size age out.
    std::thread::sleep(Duration::from_millis(3_500));
    tso_next(&mut c).unwrap_or_else(|e| panic!("tso_next before the cut: {}", pg_error_string(&e)));
    // Only now a short wait for the worker, so that calls after the cut are answered quickly:
    // the set-up above (a lease, a window extension, each a synchronous commit to a standby
    // that has just started) may take longer than 200 ms on a busy box. `c` reads the new
    // value before its next command.
    primary.set_conf("tsoracle.extension_timeout_ms", 200).expect("extension_timeout_ms");

    standby.stop(StopMode::Immediate).expect("stop the standby");
    let cut = Instant::now();
    if step_ms != 0 {
        let mut su = primary.connect();
        tsoracle_tests::tso::set_clock_offset(&mut su, step_ms)
            .unwrap_or_else(|e| panic!("step the cut-off primary's clock: {e}"));
    }
    let (mut last_ok, mut refused) = (None, 0);
    while cut.elapsed() < Duration::from_millis(window + 3_000) {
        // When the call began: one begun inside the window may be answered late on a busy box.
        let began = cut.elapsed();
        match tso_next(&mut c) {
            Ok(_) => last_ok = Some(began),
            Err(e) => {
                assert_eq!(
                    e.code(),
                    Some(&SqlState::CANNOT_CONNECT_NOW),
                    "{}",
                    pg_error_string(&e)
                );
                refused += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Some(last) = last_ok {
        assert!(
            last <= Duration::from_millis(window + 1_000),
            "the cut-off primary still issued to a call begun {last:?} after losing its standby (window_ahead_ms = {window})"
        );
    }
    assert!(refused > 0, "the cut-off primary kept issuing");
    let st = status_of(&mut c);
    assert_eq!(st.state, "serving", "it has not failed over; it only stopped issuing: {st:?}");
}
