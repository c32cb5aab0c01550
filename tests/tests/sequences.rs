//! Dense sequences: `tso_seq`, `tso_seq_batch`, `tso_seq_peek` on real clusters.
//!
//! Every block a caller is told it owns must be owned by nobody else, ever: per key the
//! successful blocks tile `[0, total)` where `total` is the counter read back from
//! `tsoracle.seq`, and a gap is allowed only where a call failed (the worker may have committed
//! a block whose caller never heard back: a burnt block). See `check_dense` in the harness.
//!
//! Run with: `cargo test -p tsoracle-tests --test sequences -- --test-threads=1`

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::Client;
use tsoracle_tests::seqlease::{
    alter_system, peek, queue_counters, seq, seq_batch, seq_totals, sqlstate_of, QueueCounters,
    SeqLoad, SeqLoadOptions, SeqLoadStats,
};
use tsoracle_tests::{
    expect_sqlstate, pg_error_string, serving_node, wait_for, DenseHistory, DenseReport, Node,
    NodeOpts, StopMode,
};

// ============================================================================ helpers

#[track_caller]
fn counters(c: &mut Client) -> QueueCounters {
    queue_counters(c).unwrap_or_else(|e| panic!("tso_status(): {}", pg_error_string(&e)))
}

#[track_caller]
fn seq_ok(c: &mut Client, key: &str, count: i32) -> i64 {
    seq(c, key, count)
        .unwrap_or_else(|e| panic!("tso_seq({key:?}, {count}): {}", pg_error_string(&e)))
}

#[track_caller]
fn peek_ok(c: &mut Client, key: &str) -> Option<i64> {
    peek(c, key).unwrap_or_else(|e| panic!("tso_seq_peek({key:?}): {}", pg_error_string(&e)))
}

#[track_caller]
fn totals(c: &mut Client) -> BTreeMap<String, i64> {
    seq_totals(c).unwrap_or_else(|e| panic!("SELECT FROM tsoracle.seq: {}", pg_error_string(&e)))
}

/// The counters of `keys` from `tsoracle.seq`, checked against `tso_seq_peek`.
#[track_caller]
fn totals_of(c: &mut Client, keys: &[&str]) -> BTreeMap<String, i64> {
    let all = totals(c);
    let mut out = BTreeMap::new();
    for k in keys {
        let t =
            *all.get(*k).unwrap_or_else(|| panic!("key {k:?} missing from tsoracle.seq: {all:?}"));
        assert_eq!(peek_ok(c, k), Some(t), "tso_seq_peek({k:?}) disagrees with tsoracle.seq");
        out.insert(k.to_string(), t);
    }
    out
}

/// The dense check over the recorded calls with the totals read back from the server.
#[track_caller]
fn check_history(
    history: &DenseHistory,
    totals: &BTreeMap<String, i64>,
    stats: &SeqLoadStats,
) -> DenseReport {
    history
        .check(Some(totals))
        .unwrap_or_else(|v| panic!("dense check failed: {v}\ntotals {totals:?}\nload: {stats:?}"))
}

/// Wait (bounded) until the load has made `n` more successful calls than `base`.
#[track_caller]
fn wait_ok_calls(history: &DenseHistory, since: Instant, n: usize, what: &str) {
    wait_for(&format!("{what}: {n} successful calls"), Duration::from_secs(30), || {
        history.calls().iter().filter(|c| c.result.is_ok() && c.start >= since).count() >= n
    });
}

/// SQLSTATEs a call may get while the server is killed and restarted under it: the
/// connection breaks (no SQLSTATE), the server shuts down or crash-restarts (57P01, 57P02),
/// it is starting or fencing (57P03), connection failures (08xxx), and 40003 (the worker
/// restarted while holding the request).
fn outage_error(code: &str) -> bool {
    matches!(code, "none" | "57P01" | "57P02" | "57P03" | "40003") || code.starts_with("08")
}

/// The pid of the tsoracle worker and its wait event, from pg_stat_activity.
fn worker_wait(c: &mut Client, pid: i32) -> Option<(Option<String>, Option<String>)> {
    c.query_opt("SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = $1", &[&pid])
        .ok()
        .flatten()
        .map(|r| (r.get(0), r.get(1)))
}

/// Is the worker flushing WAL (its wait event WALSync up to PostgreSQL 16, WalSync from 17)?
fn worker_flushing(c: &mut Client, pid: i32) -> bool {
    matches!(worker_wait(c, pid), Some((_, Some(e))) if e.eq_ignore_ascii_case("WALSync"))
}

/// Wait (bounded) until the node serves again from a worker other than `old_pid`, after a
/// kill made with [`Node::kill9_pid`] (which returns once the postmaster has noticed, so
/// every session opened here belongs to the restarted server).
#[track_caller]
fn wait_new_worker(node: &Node, old_pid: Option<i32>, after: &str) {
    wait_for(&format!("a new worker after {after}"), Duration::from_secs(60), || {
        node.wait_serving().unwrap_or_else(|e| panic!("not serving after {after}: {e}"));
        let st = counters(&mut node.connect());
        st.worker_pid.is_some() && st.worker_pid != old_pid
    });
}

/// Every failed call failed with an error that an outage explains.
#[track_caller]
fn assert_only_outage_errors(stats: &SeqLoadStats) {
    for (code, n) in &stats.errors_by_sqlstate {
        assert!(
            outage_error(code),
            "{n} calls failed with SQLSTATE {code}, which an outage does not explain: {stats:?}"
        );
    }
}

/// Wait (bounded) until the worker waits on a heavyweight lock.
#[track_caller]
fn wait_worker_blocked(c: &mut Client, pid: i32) {
    wait_for(
        &format!("the worker (pid {pid}) held in a group commit"),
        Duration::from_secs(20),
        || {
            c.query_opt(
                "SELECT wait_event_type = 'Extension' AND xact_start IS NOT NULL FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .ok()
            .flatten()
            .is_some_and(|r| r.get::<_, Option<bool>>(0) == Some(true))
        },
    );
}

/// Hold the worker in every group commit that names `key` (a worker stuck in its commit: the
/// test build's `tsoracle.test_worker_hold_key`), or let it go (`None`).
fn hold_worker(node: &Node, key: Option<&str>) {
    alter_system(node, "tsoracle.test_worker_hold_key", key)
        .unwrap_or_else(|e| panic!("tsoracle.test_worker_hold_key: {e}"));
}

/// Wait (bounded) until backend `pid` sleeps in the extension (waiting for the worker).
#[track_caller]
fn wait_backend_waiting(c: &mut Client, pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = c
            .query_opt(
                "SELECT state, wait_event_type FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .unwrap();
        if let Some(r) = &r {
            let (state, wtype): (Option<String>, Option<String>) = (r.get(0), r.get(1));
            if state.as_deref() == Some("active") && wtype.as_deref() == Some("Extension") {
                return;
            }
        }
        assert!(Instant::now() < deadline, "backend {pid} never waited for the worker");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn backend_pid(c: &mut Client) -> i32 {
    c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0)
}

#[track_caller]
fn assert_session_alive(c: &mut Client, what: &str) {
    let one: i32 = c
        .query_one("SELECT 1", &[])
        .unwrap_or_else(|e| panic!("{what}: the session did not survive: {}", pg_error_string(&e)))
        .get(0);
    assert_eq!(one, 1);
}

#[track_caller]
fn assert_no_crash(node: &mut Node, pm: Option<i32>) {
    assert!(node.is_running() && node.postmaster_pid() == pm, "the postmaster restarted or died");
    let log = node.log_contents();
    assert!(
        !log.contains("terminated by signal") && !log.contains("was terminated by exception"),
        "a server process crashed:\n{}",
        node.log_tail(60)
    );
}

/// Wait (bounded) until the worker has committed counter `key` at `total`.
#[track_caller]
fn wait_for_total(c: &mut Client, key: &str, total: i64) {
    wait_for(
        &format!("counter {key} at {total} after the lock was released"),
        Duration::from_secs(20),
        || totals(c).get(key) == Some(&total),
    );
}

/// One call, timed and recorded into `history` (error recorded with its count).
fn recorded_seq(
    c: &mut Client,
    history: &DenseHistory,
    key: &str,
    count: i32,
) -> Result<i64, postgres::Error> {
    let start = Instant::now();
    let r = seq(c, key, count);
    let end = Instant::now();
    match &r {
        Ok(s) => history.record_ok(start, end, "n", key, *s, count as i64),
        Err(e) => history.record_err(start, end, "n", key, pg_error_string(e), count as i64),
    }
    r
}

/// A node whose `tso_seq` calls all go through the worker's group commit, for the tests of
/// that path (`tsoracle.seq_in_place = off`; by default a call on an existing key of the
/// worker's database advances it in place, without the worker).
fn worker_only() -> NodeOpts {
    NodeOpts::new().setting("tsoracle.seq_in_place", "off")
}

// ============================================================================ 1

/// 16 sessions on 3 keys, single calls with random counts 1..=100 and batches over 2 of the
/// keys, for 5 s: per key the blocks tile `[0, total)` exactly (no gap, no overlap, real-time
/// order), `tsoracle.seq` and `tso_seq_peek` agree on the totals, no call fails, and group
/// commit happened: the queue counters account for exactly the requests made, and there were
/// fewer commits than calls (some commit carried two calls or more).
#[test]
fn concurrent_blocks_tile_and_group_commit() {
    let node = serving_node("seq-concurrent", worker_only());
    let mut su = node.connect();
    let keys = ["alpha", "beta", "gamma"];
    let before = counters(&mut su);

    let history = DenseHistory::new();
    let opts =
        SeqLoadOptions::new(16, Duration::from_secs(5), &keys).batches(&["alpha", "beta"], 0.25);
    let stats = SeqLoad::start(node.endpoint(), opts, history.clone()).join();
    let after = counters(&mut su);

    assert_eq!(stats.load.err_calls, 0, "no call may fail on a healthy server: {stats:?}");
    assert!(stats.single_ok >= 16 && stats.batch_ok >= 1, "{stats:?}");
    let totals = totals_of(&mut su, &keys);
    let report = check_history(&history, &totals, &stats);
    for k in keys {
        let kr = &report.keys[k];
        assert!(kr.gaps.is_empty(), "key {k}: gaps {:?} without any failed call", kr.gaps);
        assert_eq!(kr.covered, totals[k], "key {k}: covered {} of {}", kr.covered, totals[k]);
    }

    // Group commit. Every call is one unit of the queue: all its requests are taken by the
    // same group commit. The counters moved by exactly the requests we made.
    let commits = after.group_commits - before.group_commits;
    let requests = after.grouped_requests - before.grouped_requests;
    let calls = stats.ok_calls() as i64;
    assert_eq!(
        requests, stats.slots_ok as i64,
        "grouped_requests moved by {requests}, but the load made {} requests ({stats:?})",
        stats.slots_ok
    );
    assert!(commits >= 1, "{before:?} -> {after:?}");
    assert!(
        requests as f64 / commits as f64 > 1.0,
        "grouped_requests / group_commits = {requests} / {commits}: no grouping"
    );
    assert!(
        commits < calls,
        "{commits} group commits for {calls} calls from 16 concurrent sessions: no commit carried two calls"
    );
    eprintln!(
        "concurrent: {} single + {} batch calls, {requests} requests in {commits} group commits ({:.1} per commit); totals {totals:?}",
        stats.single_ok,
        stats.batch_ok,
        requests as f64 / commits as f64
    );
}

// ============================================================================ 2

#[derive(Clone, Copy, Debug)]
enum Crash {
    Postmaster,
    Worker,
}

fn crash_under_load(name: &str, how: Crash) {
    let mut node = serving_node(name, NodeOpts::new());
    let keys = ["k1", "k2", "k3"];
    let history = DenseHistory::new();
    let opts =
        SeqLoadOptions::new(16, Duration::from_secs(120), &keys).batches(&["k1", "k2"], 0.25);
    let load = SeqLoad::start(node.endpoint(), opts, history.clone());

    let t0 = Instant::now();
    wait_ok_calls(&history, t0, 300, "before the crash");
    std::thread::sleep(Duration::from_millis(2_500).saturating_sub(t0.elapsed()));
    let mut c = node.connect();
    let before = counters(&mut c);
    let pm = node.postmaster_pid();
    match how {
        Crash::Postmaster => {
            node.kill9_postmaster().unwrap();
            node.start().unwrap();
        }
        Crash::Worker => {
            let wpid = before.worker_pid.expect("worker_pid while serving");
            node.kill9_pid(wpid).unwrap();
        }
    }
    wait_new_worker(&node, before.worker_pid, &format!("{how:?}"));
    let up = Instant::now();
    wait_ok_calls(&history, up, 300, "after the restart");
    std::thread::sleep(Duration::from_millis(2_500).saturating_sub(up.elapsed()));
    let stats = load.stop_and_join();
    if let Crash::Worker = how {
        assert_eq!(node.postmaster_pid(), pm, "the postmaster itself stayed up");
    }

    assert_only_outage_errors(&stats);
    assert!(stats.load.err_calls >= 1, "the crash interrupted no call at all? {stats:?}");

    let mut c = node.connect();
    let totals = totals_of(&mut c, &keys);
    let report = check_history(&history, &totals, &stats);
    let gaps: Vec<_> = report.keys.iter().map(|(k, r)| (k.clone(), r.gaps.clone())).collect();
    eprintln!(
        "{how:?} kill -9: {} ok calls, errors {:?}, {} connects; totals {totals:?}; gaps (burnt blocks) {gaps:?}",
        stats.ok_calls(),
        stats.errors_by_sqlstate,
        stats.load.connects
    );
    // Still dense afterwards: the next block of every key starts at its total.
    for k in keys {
        assert_eq!(seq_ok(&mut c, k, 1), totals[k], "key {k}");
    }
}

/// kill -9 of the postmaster (and all its processes) in the middle of a 16-session load
/// (about 2.5 s before and 2.5 s after), then start: no block is granted twice, before or
/// after; every gap is explained by calls that failed (recorded with their counts); only
/// outage errors; the next block of every key starts at its durable total.
#[test]
fn kill9_postmaster_under_load_grants_no_block_twice() {
    crash_under_load("seq-kill9-pm", Crash::Postmaster);
}

/// kill -9 of the tsoracle worker in the middle of the load (the postmaster crash-restarts):
/// the same guarantees.
#[test]
fn kill9_worker_under_load_grants_no_block_twice() {
    crash_under_load("seq-kill9-worker", Crash::Worker);
}

/// kill -9 of the worker at the moment it is seen flushing (`pg_stat_activity`: `WALSync`),
/// five times under one 16-session load (three were not always enough, on a loaded machine,
/// for one kill to land between a group's commit and its callers' answer). A group's commit record has then reached the
/// kernel (WAL is written before it is flushed, and a process kill loses nothing written), so
/// recovery keeps it, but its callers were not answered: their blocks must be burnt, never
/// granted to a later call. The history check of the tests above holds (no block twice, every
/// gap explained by failed calls), and at least one crash burnt a block: a kill did land
/// after a group's commit and before its caller read the answer.
#[test]
fn kill9_while_the_worker_flushes_never_grants_the_groups_blocks() {
    let node = serving_node("seq-kill9-flush", worker_only());
    let keys = ["k1", "k2", "k3"];
    let history = DenseHistory::new();
    let opts = SeqLoadOptions::new(16, Duration::from_secs(180), &keys);
    let load = SeqLoad::start(node.endpoint(), opts, history.clone());

    for round in 1..=5 {
        let t0 = Instant::now();
        wait_ok_calls(&history, t0, 300, &format!("before crash {round}"));
        let mut c = node.connect();
        let wpid = counters(&mut c).worker_pid.expect("worker_pid while serving");
        let killed = node
            .kill9_pid_when(wpid, Duration::from_secs(30), || worker_flushing(&mut c, wpid))
            .unwrap();
        assert!(killed, "crash {round}: the worker (pid {wpid}) was never seen in WALSync");
        drop(c);
        wait_new_worker(&node, Some(wpid), &format!("crash {round}"));
    }
    let up = Instant::now();
    wait_ok_calls(&history, up, 300, "after the last crash");
    let stats = load.stop_and_join();
    assert_only_outage_errors(&stats);

    let mut c = node.connect();
    let totals = totals_of(&mut c, &keys);
    let report = check_history(&history, &totals, &stats);
    let burnt: i64 =
        report.keys.values().flat_map(|r| r.gaps.iter()).map(|(from, to)| to - from).sum();
    eprintln!(
        "kill -9 in WALSync x5: {} ok calls, errors {:?}; totals {totals:?}; {burnt} values burnt",
        stats.ok_calls(),
        stats.errors_by_sqlstate
    );
    assert!(burnt > 0, "no crash left a committed, unanswered block: the window was missed");
    for k in keys {
        assert_eq!(seq_ok(&mut c, k, 1), totals[k], "key {k}: the next block starts at the total");
    }
}

// ============================================================================ 3

/// A block is not returned by the caller's ROLLBACK (explicit, or after an error in the
/// transaction): the next call gets the following block. The same across `restart -m
/// immediate`, also with the caller's transaction still open when the server went down.
#[test]
fn rollback_does_not_return_the_block() {
    let mut node = serving_node("seq-rollback", NodeOpts::new());
    let mut c = node.connect();
    assert_eq!(peek_ok(&mut c, "rb"), None, "a new key peeks as NULL");
    assert_eq!(seq_ok(&mut c, "rb", 3), 0, "a new key starts at 0");

    c.batch_execute("BEGIN").unwrap();
    let s = seq_ok(&mut c, "rb", 10);
    assert_eq!(s, 3);
    c.batch_execute("ROLLBACK").unwrap();
    assert_eq!(peek_ok(&mut c, "rb"), Some(13), "the rolled-back block stays taken");
    assert_eq!(seq_ok(&mut c, "rb", 5), 13);

    // A transaction aborted by an error, with a batch in it.
    c.batch_execute("BEGIN").unwrap();
    let rows = seq_batch(&mut c, &["rb", "rb2"], &[2, 4]).unwrap();
    assert_eq!(rows, vec![("rb".to_string(), 18, 2), ("rb2".to_string(), 0, 4)]);
    assert!(c.batch_execute("SELECT 1/0").is_err());
    c.batch_execute("ROLLBACK").unwrap();
    assert_eq!(seq_ok(&mut c, "rb", 1), 20);
    assert_eq!(seq_ok(&mut c, "rb2", 1), 4);

    // ROLLBACK, then an immediate restart.
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(seq_ok(&mut c, "rb", 7), 21);
    c.batch_execute("ROLLBACK").unwrap();
    drop(c);
    node.restart(StopMode::Immediate).unwrap();
    node.wait_serving().unwrap();
    let mut c = node.connect();
    assert_eq!(peek_ok(&mut c, "rb"), Some(28), "after restart -m immediate");
    assert_eq!(seq_ok(&mut c, "rb", 1), 28);

    // The caller's transaction still open when the server goes down.
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(seq_ok(&mut c, "rb", 9), 29);
    node.restart(StopMode::Immediate).unwrap();
    assert!(c.query_one("SELECT 1", &[]).is_err(), "the old session ended with the server");
    node.wait_serving().unwrap();
    let mut c = node.connect();
    assert_eq!(
        seq_ok(&mut c, "rb", 1),
        38,
        "the block of the never-committed transaction stays taken"
    );
    let t = totals(&mut c);
    assert_eq!((t["rb"], t["rb2"]), (39, 5));
}

// ============================================================================ 4

/// A caller waiting for a stuck worker (the test build's `tsoracle.test_worker_hold_key` holds
/// the worker inside its group transaction, as a worker stuck in its commit would be; a row
/// locked by another session no longer does, the worker answers 55P03 instead) gets a clean
/// error and its backend survives:
///
/// * X, whose request the worker took before blocking: 40003 after
///   `tsoracle.extension_timeout_ms` (5 s): the worker may commit it later (outcome unknown);
/// * A with `statement_timeout = 300ms`, and B cancelled with `pg_cancel_backend`: 57014
///   (query_canceled; their requests were still pending in the queue, and are dropped);
/// * C (single) and D (batch) without a statement timeout: 57P03 after 5 s (the worker never
///   took their requests; "timed out waiting for the worker to take the request");
/// * 8 more sessions with statement timeouts of 100..3000 ms or none: 57014 or 57P03 only
///   (never 40003: the stuck worker takes nothing more).
///
/// After the lock is released the worker commits X's block, which is burnt: the next block
/// starts right after it and nobody else got it. Z, cancelled (`pg_cancel_backend`) while the
/// stuck worker holds its request, gets 57014 and its block is burnt too. A concurrent load
/// afterwards stays dense; the only gaps are X's and Z's blocks.
///
/// Then the worker is terminated (`pg_terminate_backend`, exit code 1, so no crash restart)
/// while it is blocked holding Y's request (with `extension_timeout_ms` raised to 20 s so Y
/// can only hear from the next worker): Y gets 40003 ("the worker restarted"), its block was
/// not committed (the worker's transaction aborted), the other sessions survive.
#[test]
fn cancel_and_timeouts_while_the_worker_is_stuck() {
    let mut node = serving_node("seq-stuck", worker_only());
    let pm = node.postmaster_pid();
    let history = DenseHistory::new();
    let mut su = node.connect();
    assert_eq!(recorded_seq(&mut su, &history, "w", 1).unwrap(), 0);
    assert_eq!(seq_ok(&mut su, "w_other", 1), 0);
    let wpid = counters(&mut su).worker_pid.expect("worker pid");

    let mut locker = node.connect();
    hold_worker(&node, Some("w"));

    // X: taken by the worker, which is then held in its group.
    let mut cx = node.connect();
    let hx = history.clone();
    let x = std::thread::spawn(move || {
        let r = recorded_seq(&mut cx, &hx, "w", 4);
        (r.map_err(|e| (sqlstate_of(&e), pg_error_string(&e))), cx)
    });
    wait_worker_blocked(&mut su, wpid);

    // C and D: pending, never taken.
    let mut cc = node.connect();
    let hc = history.clone();
    let c_thread = std::thread::spawn(move || {
        let r = recorded_seq(&mut cc, &hc, "w", 5);
        (r.map_err(|e| (sqlstate_of(&e), pg_error_string(&e))), cc)
    });
    let mut cd = node.connect();
    let hd = history.clone();
    let d_thread = std::thread::spawn(move || {
        let start = Instant::now();
        let r = seq_batch(&mut cd, &["w_other", "w"], &[2, 3]);
        let end = Instant::now();
        if let Err(e) = &r {
            hd.record_err(start, end, "n", "w_other", pg_error_string(e), 2);
            hd.record_err(start, end, "n", "w", pg_error_string(e), 3);
        }
        (r.map_err(|e| (sqlstate_of(&e), pg_error_string(&e))), cd)
    });

    // A: statement_timeout.
    let mut ca = node.connect();
    ca.batch_execute("SET statement_timeout = 300").unwrap();
    let ra = recorded_seq(&mut ca, &history, "w", 2);
    let e = expect_sqlstate(ra, &SqlState::QUERY_CANCELED, "tso_seq under statement_timeout");
    assert_eq!(e.as_db_error().unwrap().message(), "canceling statement due to statement timeout");
    ca.batch_execute("RESET statement_timeout").unwrap();
    assert_session_alive(&mut ca, "after statement_timeout");

    // B: pg_cancel_backend.
    let mut cb = node.connect();
    let bpid = backend_pid(&mut cb);
    let hb = history.clone();
    let b_thread = std::thread::spawn(move || {
        let r = recorded_seq(&mut cb, &hb, "w", 3);
        (r.map_err(|e| (sqlstate_of(&e), pg_error_string(&e))), cb)
    });
    wait_backend_waiting(&mut su, bpid);
    let cancelled: bool = su.query_one("SELECT pg_cancel_backend($1)", &[&bpid]).unwrap().get(0);
    assert!(cancelled);
    let (rb, mut cb) = b_thread.join().unwrap();
    match rb {
        Err((code, msg)) => {
            assert_eq!(code, "57014", "cancelled tso_seq: {msg}");
            assert!(msg.contains("canceling statement due to user request"), "{msg}");
        }
        Ok(v) => panic!("a cancelled tso_seq succeeded with {v} while the worker was stuck"),
    }
    assert_session_alive(&mut cb, "after pg_cancel_backend");

    // Eight more sessions with assorted statement timeouts.
    let mut others = Vec::new();
    for i in 0..8 {
        let mut c = node.connect();
        let timeout = [100, 400, 1000, 3000, 0, 0, 250, 2000][i];
        c.batch_execute(&format!("SET statement_timeout = {timeout}")).unwrap();
        let h = history.clone();
        others.push(std::thread::spawn(move || {
            let r = recorded_seq(&mut c, &h, "w", (i + 1) as i32);
            c.batch_execute("RESET statement_timeout").unwrap();
            (timeout, r.map_err(|e| (sqlstate_of(&e), pg_error_string(&e))), c)
        }));
    }

    let (rx, mut cx) = x.join().unwrap();
    match rx {
        Err((code, msg)) => {
            assert_eq!(code, "40003", "X, whose request the stuck worker holds: {msg}")
        }
        Ok(v) => panic!("X succeeded with {v} while the worker was stuck"),
    }
    assert_session_alive(&mut cx, "X after 40003");
    let (rc, cc) = c_thread.join().unwrap();
    let (rd, cd) = d_thread.join().unwrap();
    for (what, r, mut c) in [
        ("C (single)", rc.map(|v| format!("{v}")), cc),
        ("D (batch)", rd.map(|v| format!("{v:?}")), cd),
    ] {
        match r {
            Err((code, msg)) => {
                assert_eq!(code, "57P03", "{what}, pending while the worker was stuck: {msg}")
            }
            Ok(v) => panic!("{what} succeeded with {v:?} while the worker was stuck"),
        }
        assert_session_alive(&mut c, what);
    }
    let mut seen = BTreeMap::new();
    for t in others {
        let (timeout, r, mut c) = t.join().unwrap();
        match r {
            Err((code, msg)) => {
                assert!(
                    code == "57014" || code == "57P03",
                    "a pending call (statement_timeout {timeout}) failed with {code}: {msg}"
                );
                if timeout > 0 && timeout < 5000 {
                    assert_eq!(code, "57014", "statement_timeout {timeout} ms fires before the 5 s extension timeout: {msg}");
                }
                *seen.entry(code).or_insert(0) += 1;
            }
            Ok(v) => panic!("a call (statement_timeout {timeout}) succeeded with {v} while the worker was stuck"),
        }
        assert_session_alive(&mut c, "a timed-out session");
    }
    eprintln!("while stuck: X 40003, A/B 57014, C/D 57P03, others {seen:?}");

    // Release: the worker commits X's block [1, 5), which nobody else gets.
    hold_worker(&node, None);
    wait_for_total(&mut su, "w", 5);
    assert_eq!(peek_ok(&mut su, "w"), Some(5), "only X's block was burnt");
    assert_eq!(peek_ok(&mut su, "w_other"), Some(1), "D's batch advanced nothing");
    assert_eq!(recorded_seq(&mut su, &history, "w", 1).unwrap(), 5);

    // Z: cancelled after the worker took its request: 57014 (the interrupt wins; the
    // extension does not turn it into 40003), and its block [6, 13) is burnt once the
    // worker gets the lock.
    hold_worker(&node, Some("w"));
    let mut cz = node.connect();
    let zpid = backend_pid(&mut cz);
    let hz = history.clone();
    let z = std::thread::spawn(move || {
        let r = recorded_seq(&mut cz, &hz, "w", 7);
        (r.map_err(|e| (sqlstate_of(&e), pg_error_string(&e))), cz)
    });
    wait_worker_blocked(&mut su, wpid); // nothing else is queued: the worker holds Z's request
    wait_backend_waiting(&mut su, zpid);
    let cancelled: bool = su.query_one("SELECT pg_cancel_backend($1)", &[&zpid]).unwrap().get(0);
    assert!(cancelled);
    let (rz, mut cz) = z.join().unwrap();
    match rz {
        Err((code, msg)) => {
            assert_eq!(code, "57014", "Z, cancelled while the stuck worker held its request: {msg}")
        }
        Ok(v) => panic!("Z succeeded with {v} while the worker was stuck"),
    }
    assert_session_alive(&mut cz, "Z after the cancel");
    hold_worker(&node, None);
    wait_for_total(&mut su, "w", 13);
    assert_eq!(
        recorded_seq(&mut su, &history, "w", 1).unwrap(),
        13,
        "Z's block is burnt, not reused"
    );

    // A concurrent load after the release stays dense (all the calls above included).
    let opts = SeqLoadOptions::new(8, Duration::from_secs(2), &["w"]);
    let stats = SeqLoad::start(node.endpoint(), opts, history.clone()).join();
    assert_eq!(stats.load.err_calls, 0, "{stats:?}");
    let t = totals_of(&mut su, &["w"]);
    let report = check_history(&history, &t, &stats);
    assert_eq!(
        report.keys["w"].gaps,
        vec![(1, 5), (6, 13)],
        "the only gaps are X's and Z's burnt blocks"
    );

    // Part 2: the worker is terminated while it holds Y's request.
    assert_eq!(alter_system(&node, "tsoracle.extension_timeout_ms", Some("20000")).unwrap(), "20s");
    let next_w = peek_ok(&mut su, "w").unwrap();
    hold_worker(&node, Some("w"));
    let mut cy = node.connect();
    let hy = history.clone();
    let y = std::thread::spawn(move || {
        let r = recorded_seq(&mut cy, &hy, "w", 6);
        (r.map_err(|e| (sqlstate_of(&e), pg_error_string(&e))), cy)
    });
    wait_worker_blocked(&mut su, wpid);
    let t_kill = Instant::now();
    let ok: bool = su.query_one("SELECT pg_terminate_backend($1)", &[&wpid]).unwrap().get(0);
    assert!(ok, "pg_terminate_backend(worker)");
    let (ry, mut cy) = y.join().unwrap();
    match ry {
        Err((code, msg)) => {
            assert_eq!(code, "40003", "Y, held by a worker that was terminated: {msg}");
            assert!(
                msg.contains("restarted"),
                "Y should hear from the next worker, not time out: {msg}"
            );
        }
        Ok(v) => panic!("Y succeeded with {v}, but the worker holding it was terminated"),
    }
    eprintln!("worker terminated: Y answered 40003 after {:?}", t_kill.elapsed());
    assert_session_alive(&mut cy, "Y after 40003");
    assert_session_alive(&mut locker, "the locker (no crash restart)");
    // The next worker answers Y before it publishes its pid: poll for it.
    wait_for("a new worker pid", Duration::from_secs(20), || {
        counters(&mut su).worker_pid.is_some_and(|p| p != wpid)
    });
    hold_worker(&node, None);
    assert_eq!(
        peek_ok(&mut su, "w"),
        Some(next_w),
        "Y's block was never committed (its transaction aborted)"
    );
    assert_eq!(recorded_seq(&mut su, &history, "w", 1).unwrap(), next_w);
    let t = totals_of(&mut su, &["w"]);
    check_history(&history, &t, &stats);
    assert_eq!(alter_system(&node, "tsoracle.extension_timeout_ms", None).unwrap(), "5s");
    assert_no_crash(&mut node, pm);
}

// ============================================================================ 5

/// `tso_seq_batch` is all or nothing.
///
/// Key cap: with `tsoracle.max_seq_keys` lowered (ALTER SYSTEM + reload) to one more than the
/// keys that exist, a batch that would create two keys fails with 54000 and advances none of
/// its keys (the existing one included); a batch creating exactly one succeeds; then any new
/// key fails (single or batch), existing keys still advance; resetting the cap lifts it.
///
/// Overflow: with counter 'big' at 2^63 - 8 (inserted by a superuser), `tso_seq('big', 100)`
/// is 22003, and a batch with 'big' and other keys (existing or new) advances nothing;
/// exactly filling bigint works and the next call is 22003. Failing batches in the same
/// group commits as 8 sessions' successful calls do not disturb them: their key stays
/// exactly dense.
#[test]
fn batch_is_all_or_nothing() {
    let node = serving_node("seq-batch", NodeOpts::new());
    let mut c = node.connect();
    assert_eq!(seq_ok(&mut c, "a", 10), 0);
    assert_eq!(seq_ok(&mut c, "b", 20), 0);
    let keys_now = totals(&mut c).len();

    // --- key cap
    let cap = (keys_now + 1).to_string();
    assert_eq!(alter_system(&node, "tsoracle.max_seq_keys", Some(&cap)).unwrap(), cap);
    let e = expect_sqlstate(
        seq_batch(&mut c, &["a", "new1", "new2"], &[1, 1, 1]),
        &SqlState::PROGRAM_LIMIT_EXCEEDED,
        "batch creating 2 keys under a cap of 1 more",
    );
    eprintln!("key cap: {}", pg_error_string(&e));
    assert_eq!(peek_ok(&mut c, "a"), Some(10), "the failed batch advanced 'a'");
    assert_eq!(peek_ok(&mut c, "new1"), None, "the failed batch created 'new1'");
    assert_eq!(peek_ok(&mut c, "new2"), None);
    assert_eq!(totals(&mut c).len(), keys_now);
    // Exactly one new key fits.
    let rows = seq_batch(&mut c, &["a", "new1"], &[1, 2]).unwrap();
    assert_eq!(rows, vec![("a".to_string(), 10, 1), ("new1".to_string(), 0, 2)]);
    // Now full.
    expect_sqlstate(
        seq_batch(&mut c, &["b", "new3"], &[1, 1]),
        &SqlState::PROGRAM_LIMIT_EXCEEDED,
        "batch over a full cap",
    );
    expect_sqlstate(
        seq(&mut c, "new4", 1),
        &SqlState::PROGRAM_LIMIT_EXCEEDED,
        "tso_seq of a new key over a full cap",
    );
    assert_eq!(peek_ok(&mut c, "b"), Some(20), "the failed batch advanced 'b'");
    assert_eq!(peek_ok(&mut c, "new3"), None);
    assert_eq!(seq_ok(&mut c, "b", 1), 20, "existing keys still advance at the cap");
    assert_eq!(totals(&mut c).len(), keys_now + 1);
    alter_system(&node, "tsoracle.max_seq_keys", None).unwrap();
    assert_eq!(seq_ok(&mut c, "new4", 1), 0, "the cap was lifted");

    // --- overflow
    c.batch_execute("INSERT INTO tsoracle.seq (key, next) VALUES ('big', 9223372036854775800)")
        .unwrap();
    let big = 9_223_372_036_854_775_800i64;
    expect_sqlstate(
        seq(&mut c, "big", 100),
        &SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
        "tso_seq('big', 100)",
    );
    assert_eq!(peek_ok(&mut c, "big"), Some(big));
    for (keys, counts) in [
        (vec!["a", "big"], vec![5, 100]),
        (vec!["big", "a"], vec![100, 5]),
        (vec!["a", "fresh", "big"], vec![1, 1, 8]),
    ] {
        let what = format!("tso_seq_batch({keys:?}, {counts:?})");
        expect_sqlstate(
            seq_batch(&mut c, &keys, &counts),
            &SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
            &what,
        );
        assert_eq!(peek_ok(&mut c, "a"), Some(11), "{what} advanced 'a'");
        assert_eq!(peek_ok(&mut c, "fresh"), None, "{what} created 'fresh'");
        assert_eq!(peek_ok(&mut c, "big"), Some(big), "{what} advanced 'big'");
    }
    // Exactly up to i64::MAX fits; after that, nothing does.
    let rows = seq_batch(&mut c, &["a", "big"], &[1, 7]).unwrap();
    assert_eq!(rows, vec![("a".to_string(), 11, 1), ("big".to_string(), big, 7)]);
    assert_eq!(peek_ok(&mut c, "big"), Some(i64::MAX));
    expect_sqlstate(
        seq(&mut c, "big", 1),
        &SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
        "tso_seq('big', 1) at i64::MAX",
    );
    assert_eq!(peek_ok(&mut c, "big"), Some(i64::MAX));

    // --- failing batches inside busy group commits
    let history = DenseHistory::new();
    let load = SeqLoad::start(
        node.endpoint(),
        SeqLoadOptions::new(8, Duration::from_secs(3), &["busy"]),
        history.clone(),
    );
    let mut failed = 0;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(3) {
        // Not recorded: an all-or-nothing failure must not explain any gap.
        expect_sqlstate(
            seq_batch(&mut c, &["busy", "big"], &[3, 1]),
            &SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
            "batch with 'big'",
        );
        failed += 1;
    }
    let stats = load.join();
    assert_eq!(stats.load.err_calls, 0, "{stats:?}");
    let t = totals_of(&mut c, &["busy"]);
    let report = check_history(&history, &t, &stats);
    assert!(report.keys["busy"].gaps.is_empty());
    eprintln!("{failed} failing batches among {} successful calls on 'busy'", stats.ok_calls());
}

// ============================================================================ 6

/// Every bad argument, over SQL, is 22023 and advances nothing; the limits themselves work
/// (128-byte key, count = tsoracle.max_seq_count).
#[test]
fn bad_arguments_are_22023_over_sql() {
    let node = serving_node("seq-bad", NodeOpts::new());
    let mut c = node.connect();
    assert_eq!(seq_ok(&mut c, "x", 1), 0);
    let bad = SqlState::INVALID_PARAMETER_VALUE;
    let long = "k".repeat(129);
    let wide = "é".repeat(65); // 130 bytes
    let cases: Vec<(&str, Vec<&(dyn postgres::types::ToSql + Sync)>)> = vec![
        ("SELECT tso_seq(NULL)", vec![]),
        ("SELECT tso_seq(NULL, 1)", vec![]),
        ("SELECT tso_seq('')", vec![]),
        ("SELECT tso_seq($1)", vec![&long]),
        ("SELECT tso_seq($1)", vec![&wide]),
        ("SELECT tso_seq('x', 0)", vec![]),
        ("SELECT tso_seq('x', -1)", vec![]),
        ("SELECT tso_seq('x', NULL)", vec![]),
        ("SELECT tso_seq('x', 65537)", vec![]),
        ("SELECT tso_seq('x', 2147483647)", vec![]),
        ("SELECT tso_seq_peek(NULL)", vec![]),
        ("SELECT tso_seq_peek('')", vec![]),
        ("SELECT tso_seq_peek($1)", vec![&long]),
        ("SELECT * FROM tso_seq_batch(NULL, ARRAY[1])", vec![]),
        ("SELECT * FROM tso_seq_batch(ARRAY['x'], NULL)", vec![]),
        ("SELECT * FROM tso_seq_batch(ARRAY[]::text[], ARRAY[]::int[])", vec![]),
        ("SELECT * FROM tso_seq_batch(ARRAY['x', 'y'], ARRAY[1])", vec![]),
        ("SELECT * FROM tso_seq_batch(ARRAY['x'], ARRAY[1, 1])", vec![]),
        ("SELECT * FROM tso_seq_batch(ARRAY['x', 'x'], ARRAY[1, 1])", vec![]),
        ("SELECT * FROM tso_seq_batch(ARRAY['y', 'x', 'y'], ARRAY[1, 1, 1])", vec![]),
        ("SELECT * FROM tso_seq_batch(ARRAY['x', NULL], ARRAY[1, 1])", vec![]),
        ("SELECT * FROM tso_seq_batch(ARRAY['x', 'y'], ARRAY[1, NULL])", vec![]),
        ("SELECT * FROM tso_seq_batch(ARRAY['x', 'y'], ARRAY[1, 0])", vec![]),
        ("SELECT * FROM tso_seq_batch(ARRAY['x', 'y'], ARRAY[1, 65537])", vec![]),
        ("SELECT * FROM tso_seq_batch(ARRAY['x', ''], ARRAY[1, 1])", vec![]),
        ("SELECT * FROM tso_seq_batch(ARRAY['x', $1], ARRAY[1, 1])", vec![&long]),
        // More keys than one call may advance (64).
        (
            "SELECT * FROM tso_seq_batch(ARRAY(SELECT 'm' || i FROM generate_series(1, 65) i), array_fill(1, ARRAY[65]))",
            vec![],
        ),
    ];
    for (sql, params) in &cases {
        let what = format!(
            "{sql} {:?}",
            params
                .iter()
                .map(|p| format!("{p:?}").chars().take(20).collect::<String>())
                .collect::<Vec<_>>()
        );
        expect_sqlstate(c.query(*sql, params), &bad, &what);
    }
    assert_eq!(peek_ok(&mut c, "x"), Some(1), "no rejected call advanced 'x'");
    assert_eq!(peek_ok(&mut c, "y"), None, "no rejected call created 'y'");
    assert_eq!(peek_ok(&mut c, "m1"), None);
    assert_eq!(totals(&mut c).len(), 1);

    // The limits are inclusive.
    let edge = "é".repeat(64); // 128 bytes
    assert_eq!(seq_ok(&mut c, &edge, 1), 0, "a 128-byte key is allowed");
    assert_eq!(seq_ok(&mut c, &"k".repeat(128), 65536), 0, "count = max_seq_count is allowed");
    let rows: Vec<(String, i64, i32)> = c
        .query("SELECT * FROM tso_seq_batch(ARRAY(SELECT 'm' || i FROM generate_series(1, 64) i), array_fill(1, ARRAY[64]))", &[])
        .unwrap()
        .into_iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(rows.len(), 64, "64 keys per batch are allowed");
    assert!(rows
        .iter()
        .enumerate()
        .all(|(i, r)| r.0 == format!("m{}", i + 1) && r.1 == 0 && r.2 == 1));
    // tsoracle.max_seq_count is settable by a superuser per session.
    c.batch_execute("SET tsoracle.max_seq_count = 10").unwrap();
    expect_sqlstate(seq(&mut c, "x", 11), &bad, "count above a lowered tsoracle.max_seq_count");
    expect_sqlstate(
        seq_batch(&mut c, &["x", "y"], &[1, 11]),
        &bad,
        "batch count above a lowered tsoracle.max_seq_count",
    );
    assert_eq!(seq_ok(&mut c, "x", 10), 1);
    assert_eq!(seq_ok(&mut c, "x", 1), 11);
    assert_eq!(
        c.query_one("SELECT tso_seq('x')", &[]).unwrap().get::<_, i64>(0),
        12,
        "count defaults to 1"
    );
    assert_eq!(peek_ok(&mut c, "x"), Some(13));
    assert_eq!(peek_ok(&mut c, "y"), None);
}

/// A worker that refuses takes no call until it is started again, so a call it has not
/// taken fails at once (`57P03`, saying why), not at `tsoracle.extension_timeout_ms` (10 s
/// here): one call is held in the worker's group (`tsoracle.test_worker_hold_key`), a second
/// is queued behind it, `tso_handover()` is asked meanwhile; once the group is let go the
/// worker answers the first (granted, or refused as handed over) and hands over, and the
/// second is refused well before the timeout. (It waited out the timeout, and a member's call
/// behind it was reported lost, `40003`.)
#[test]
fn a_refusing_worker_fails_the_calls_it_has_not_taken_at_once() {
    let node = serving_node(
        "seq-refused",
        NodeOpts::new().setting("tsoracle.extension_timeout_ms", 10_000),
    );
    alter_system(&node, "tsoracle.test_worker_hold_key", Some("held")).unwrap();
    let call = |key: &'static str| {
        let mut c = node.connect();
        std::thread::spawn(move || {
            let started = Instant::now();
            let r = seq(&mut c, key, 1);
            (r.map_err(|e| (sqlstate_of(&e), pg_error_string(&e))), started.elapsed())
        })
    };
    let held = call("held");
    std::thread::sleep(Duration::from_millis(500));
    let queued = call("queued");
    std::thread::sleep(Duration::from_millis(500));
    let handover = {
        let mut c = node.connect();
        std::thread::spawn(move || {
            c.batch_execute("SELECT tso_handover()").map_err(|e| pg_error_string(&e))
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    alter_system(&node, "tsoracle.test_worker_hold_key", None).unwrap();
    let (first, _) = held.join().unwrap();
    // The held group may be granted or refused, as the handover found it.
    assert!(
        first.as_ref().is_ok_and(|&s| s == 0) || first.as_ref().is_err_and(|e| e.0 == "57P03"),
        "{first:?}"
    );
    handover.join().unwrap().expect("tso_handover()");
    let (second, took) = queued.join().unwrap();
    let (code, text) = second.expect_err("a handed-over server grants nothing");
    assert_eq!(code, "57P03", "{text}");
    assert!(text.contains("handed over"), "{text}");
    // Queued 1 s before the hold was let go: refused soon after, well before the timeout.
    assert!(took < Duration::from_secs(6), "refused after {took:?}, not at once: {text}");
}
