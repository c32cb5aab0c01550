//! `tso_seq`'s in-place path (docs/seq-in-place.md): a call on an existing
//! key of the worker's database advances the counter itself, logs it with generic WAL and
//! flushes it, without the worker. On real clusters:
//!
//! - the path serves (the worker's group commits do not move) and falls back to the worker
//!   where it must (a new key, `tsoracle.seq_in_place = off`, a role that may not use the key);
//! - its blocks and the worker's tile under one load, with `VACUUM (FULL)`, `CLUSTER`,
//!   `CHECKPOINT`, a restore merge and a superuser's `UPDATE` of the table running under it
//!   (row locks and the `BEFORE UPDATE` trigger against MVCC writers);
//! - `kill -9` between a block's WAL insert and its flush: nothing returned comes back, and an
//!   unflushed block is really lost;
//! - standbys replay the counter and continue it once promoted; with synchronous standbys
//!   configured calls go to the worker (its wait for them is bounded); the in-place path's
//!   own wait for a gone standby (forced in test builds) returns no block to a cancelled or
//!   terminated caller.
//!
//! Run with: `cargo test -p tsoracle-tests --test seq_in_place -- --test-threads=2`

use std::time::{Duration, Instant};

use postgres::Client;
use tsoracle_tests::cluster::{make_sync, wait_replayed};
use tsoracle_tests::seqlease::{
    group_commits, seq, seq_ok, seq_totals, sqlstate_of, SeqLoad, SeqLoadOptions,
};
use tsoracle_tests::{
    pg_error_string, poll_until, serving_node, wait_for, DenseHistory, Node, NodeOpts, StopMode,
};

fn counter(c: &mut Client, key: &str) -> Option<i64> {
    seq_totals(c)
        .unwrap_or_else(|e| panic!("tsoracle.seq: {}", pg_error_string(&e)))
        .get(key)
        .copied()
}

fn backend_pid(c: &mut Client) -> i32 {
    c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0)
}

/// A serving primary (extension created) and a started hot standby base-backed-up from it,
/// asynchronous until the test makes it synchronous.
fn primary_and_standby(name: &str, opts: NodeOpts) -> (Node, Node) {
    let primary = Node::start_new(&format!("{name}-p"), opts).expect("start primary");
    primary.create_extension().expect("CREATE EXTENSION");
    let mut standby =
        Node::base_backup_from(&primary, &format!("{name}-s")).expect("pg_basebackup");
    standby.start().expect("start standby");
    (primary, standby)
}

/// `tso_seq(key, count)` served in place: its start, with the worker's group-commit counter
/// unmoved.
#[track_caller]
fn seq_in_place(c: &mut Client, key: &str, count: i32, what: &str) -> i64 {
    let commits = group_commits(c);
    let start = seq_ok(c, key, count);
    assert_eq!(group_commits(c), commits, "{what}: the worker served the call");
    start
}

/// Wait (bounded) until backend `pid` waits for synchronous replication.
#[track_caller]
fn wait_sync_rep_wait(c: &mut Client, pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let row: Option<(Option<String>, Option<String>, Option<String>)> = c
            .query_opt(
                "SELECT state, wait_event, query FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .unwrap()
            .map(|r| (r.get(0), r.get(1), r.get(2)));
        if matches!(&row, Some((_, Some(e), _)) if e == "SyncRep") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "backend {pid} never waited for its synchronous standby: {row:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ------------------------------------------------------------------------------------ 1

/// An existing key is advanced in place: 200 calls, consecutive blocks, and the worker's
/// group-commit counter does not move. A new key, a session with `tsoracle.seq_in_place = off`
/// and a role that may not use the key all go to the worker (the last one refused, 42501,
/// with nothing advanced), also once the key was dropped and made again by another role
/// (a backend's hint of where the row was is checked again, owner included).
#[test]
fn existing_keys_advance_in_place_and_the_rest_goes_to_the_worker() {
    let node = serving_node("inplace-basic", NodeOpts::new());
    let mut su = node.connect();
    let before = group_commits(&mut su);
    assert_eq!(seq_ok(&mut su, "orders", 3), 0, "a new key starts at 0");
    let created = group_commits(&mut su);
    assert!(created > before, "a new key is created by the worker ({before} -> {created})");

    let mut expected = 3;
    for i in 0..200 {
        let count = 1 + (i % 7);
        assert_eq!(seq_ok(&mut su, "orders", count), expected, "call {i}");
        expected += i64::from(count);
    }
    assert_eq!(group_commits(&mut su), created, "the worker served none of the 200 calls");
    assert_eq!(counter(&mut su, "orders"), Some(expected), "tsoracle.seq holds the next start");
    // A member's block (tsoracle.member_seq) in place too, with the key's incarnation as the
    // worker made it, read from the page.
    let made: i64 =
        su.query_one("SELECT made FROM tsoracle.seq WHERE key = 'orders'", &[]).unwrap().get(0);
    assert!(made > 0, "a key the worker made has an incarnation");
    let row = su
        .query_one("SELECT start, made FROM tsoracle.member_seq(ARRAY['orders'], ARRAY[2])", &[])
        .unwrap_or_else(|e| panic!("tsoracle.member_seq: {}", pg_error_string(&e)));
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (expected, made));
    assert_eq!(group_commits(&mut su), created, "the member's block was not in place");
    expected += 2;

    su.batch_execute("SET tsoracle.seq_in_place = off").unwrap();
    assert_eq!(seq_ok(&mut su, "orders", 1), expected);
    assert!(group_commits(&mut su) > created, "with the setting off, the worker serves the call");
    su.batch_execute("RESET tsoracle.seq_in_place").unwrap();
    expected += 1;

    // Ownership is the worker's check: the call goes to it, and it refuses.
    su.batch_execute(
        "CREATE ROLE inplace_owner LOGIN IN ROLE tsoracle_seq_user; \
         CREATE ROLE inplace_other LOGIN IN ROLE tsoracle_seq_user",
    )
    .unwrap();
    let mut owner = node.connect_as("inplace_owner");
    assert_eq!(seq_ok(&mut owner, "owned", 5), 0);
    assert_eq!(seq_ok(&mut owner, "owned", 5), 5, "the owner advances its key in place");
    let mut other = node.connect_as("inplace_other");
    let e = seq(&mut other, "owned", 1).expect_err("another role may not use the key");
    assert_eq!(sqlstate_of(&e), "42501", "{}", pg_error_string(&e));
    assert_eq!(counter(&mut su, "owned"), Some(10), "the refused call advanced nothing");
    assert_eq!(seq_ok(&mut su, "owned", 1), 10, "a superuser may use it");
    assert_eq!(seq_ok(&mut su, "orders", 1), expected);

    // The key dropped, its line pointer freed and the key made again by another role: the
    // first owner's backend, which found the row before, may not use the new one.
    su.batch_execute("SELECT tso_seq_drop('owned')").unwrap();
    su.batch_execute("VACUUM tsoracle.seq").unwrap();
    assert_eq!(seq_ok(&mut other, "owned", 2), 0, "made again by inplace_other");
    let e = seq(&mut owner, "owned", 1).expect_err("the old owner may not use the new key");
    assert_eq!(sqlstate_of(&e), "42501", "{}", pg_error_string(&e));
    assert_eq!(seq_ok(&mut other, "owned", 1), 2, "its owner advances it in place");
    assert_eq!(counter(&mut su, "owned"), Some(3));
}

// ------------------------------------------------------------------------------------ 2

/// 12 sessions on 3 keys (single calls in place, batches through the worker) for 8 s, while
/// another session runs `VACUUM (FULL)`, `CLUSTER`, `CHECKPOINT`, plain `VACUUM`, a restore
/// merge of a row (`INSERT`, merged with `GREATEST`) and a superuser's `UPDATE` of the
/// counters, over and over. Every one of those rewrites or re-versions the rows the in-place
/// writers write into; the blocks must still tile `[0, total)` with no gap and no overlap.
/// The superuser's `UPDATE` may be refused (55006): when a counter is advanced in place
/// between the scan that built its new row and the lock it then takes, that new row would
/// lower the counter, and `keep_what_was_issued` refuses it (the race the trigger is there for).
#[test]
fn blocks_tile_under_maintenance_and_mvcc_writers() {
    let node = serving_node("inplace-maint", NodeOpts::new());
    let keys = ["m1", "m2", "m3"];
    let history = DenseHistory::new();
    let opts = SeqLoadOptions::new(12, Duration::from_secs(8), &keys).batches(&["m1", "m2"], 0.2);
    let load = SeqLoad::start(node.endpoint(), opts, history.clone());

    let mut su = node.connect();
    let statements = [
        "VACUUM (FULL) tsoracle.seq",
        "CLUSTER tsoracle.seq USING seq_pkey",
        "CHECKPOINT",
        "VACUUM tsoracle.seq",
        "INSERT INTO tsoracle.seq (key, next) VALUES ('m1', 0), ('m3', 0)",
        "UPDATE tsoracle.seq SET updated_at = now() WHERE key IN ('m1', 'm2', 'm3')",
    ];
    let started = Instant::now();
    let mut rounds = 0;
    let mut refused = 0;
    while started.elapsed() < Duration::from_secs(7) {
        for sql in statements {
            match su.batch_execute(sql) {
                Ok(()) => {}
                Err(e) if sql.starts_with("UPDATE") && sqlstate_of(&e) == "55006" => {
                    // Its HINT says what to do first: run it again (docs/operations/maintenance.md).
                    let hint = e.as_db_error().and_then(|d| d.hint()).unwrap_or_default();
                    assert!(
                        hint.starts_with("If this UPDATE did not mean to lower it, run it again"),
                        "{sql}: {}",
                        pg_error_string(&e)
                    );
                    refused += 1
                }
                Err(e) => panic!("{sql}: {}", pg_error_string(&e)),
            }
        }
        rounds += 1;
    }
    eprintln!("{rounds} rounds of maintenance; the superuser's UPDATE refused {refused} times");
    let stats = load.join();
    assert!(rounds >= 3, "only {rounds} rounds of maintenance ran under the load");
    // The restore merge has the worker fence again; a call may meet that (57P03), or a key
    // the superuser's statements hold locked longer than the worker waits (55P03): both
    // retryable, nothing else.
    for (code, n) in &stats.errors_by_sqlstate {
        assert!(code == "57P03" || code == "55P03", "{n} calls failed with {code}: {stats:?}");
    }
    assert!(stats.single_ok >= 100 && stats.batch_ok >= 5, "{stats:?}");
    let totals = seq_totals(&mut su).unwrap();
    let report = history
        .check(Some(&totals))
        .unwrap_or_else(|v| panic!("dense check failed: {v}\ntotals {totals:?}\n{stats:?}"));
    for k in keys {
        let kr = &report.keys[k];
        if stats.load.err_calls == 0 {
            assert!(kr.gaps.is_empty(), "key {k}: gaps {:?} without a failed call", kr.gaps);
        }
        assert_eq!(kr.covered + kr.gaps.iter().map(|g| g.1 - g.0).sum::<i64>(), totals[k]);
    }
    eprintln!("{rounds} maintenance rounds under {} ok calls ({stats:?})", stats.ok_calls());
}

// ------------------------------------------------------------------------------------ 3

/// `kill -9` of the server while a caller sits between its block's WAL insert and the flush
/// (`tsoracle.test_seq_pause_ms`, test builds). Round 1, the caller alone: the counter comes
/// back where it was or with the block taken (a kill keeps WAL the kernel already has, and a
/// write of the same WAL page for an earlier record may have carried it there), never
/// anything else. Round 2, another caller takes and returns a block meanwhile (its flush
/// covers the paused record): after the crash the counter is above everything returned.
/// Either way the next call continues from the durable counter, and the paused caller never
/// got its block.
#[test]
fn kill9_between_the_wal_insert_and_its_flush() {
    // The WAL writer would flush the record on its own within wal_writer_delay.
    // Little else writes WAL meanwhile (so round 1 usually loses the record): the WAL writer
    // sleeps 10 s, the background writer writes no page (it would flush the page's WAL
    // first), the worker renews its window only every 5 minutes.
    let opts = NodeOpts::new()
        .setting("wal_writer_delay", "10s")
        .setting("bgwriter_lru_maxpages", 0)
        .setting("tsoracle.window_ahead_ms", 600_000);
    let mut node = serving_node("inplace-kill9", opts);
    let lsn = |c: &mut Client, f: &str| -> i64 {
        c.query_one(&format!("SELECT ({f}() - '0/0'::pg_lsn)::bigint"), &[]).unwrap().get(0)
    };
    for round in 1..=2 {
        let mut su = node.connect();
        let base = seq_ok(&mut su, "p", 1) + 1;
        let before = lsn(&mut su, "pg_current_wal_insert_lsn");
        let mut paused = node.connect();
        paused.batch_execute("SET tsoracle.test_seq_pause_ms = 20000").unwrap();
        let caller =
            std::thread::spawn(move || seq(&mut paused, "p", 5).map_err(|e| pg_error_string(&e)));
        wait_for("the paused caller's write in the page", Duration::from_secs(10), || {
            counter(&mut su, "p") == Some(base + 5)
        });
        let returned_end = if round == 2 {
            let start = seq_ok(&mut su, "p", 2);
            assert_eq!(start, base + 5, "the next block follows the paused one");
            Some(start + 2)
        } else {
            None
        };
        // Reported: how far the WAL had reached the kernel when the server was killed.
        let written = lsn(&mut su, "pg_current_wal_lsn");
        let inserted = lsn(&mut su, "pg_current_wal_insert_lsn");
        node.kill9_postmaster().unwrap();
        let outcome = caller.join().unwrap();
        assert!(outcome.is_err(), "round {round}: the paused caller got its block: {outcome:?}");
        node.start().unwrap();
        node.wait_serving().unwrap();
        let mut c = node.connect();
        let after = counter(&mut c, "p").expect("the key survives");
        match returned_end {
            Some(end) => assert!(
                after >= end,
                "round {round}: counter {after} below the returned block's end {end}"
            ),
            // Never returned, so either is safe: lost with the WAL buffers, or kept because a
            // write of the same WAL page (for an earlier record, by the WAL writer) took its
            // bytes to the kernel before the kill.
            None => assert!(
                after == base || after == base + 5,
                "round {round}: counter {after}, neither {base} nor {}",
                base + 5
            ),
        }
        assert_eq!(
            seq_ok(&mut c, "p", 1),
            after,
            "round {round}: the next call continues from the counter"
        );
        eprintln!(
            "round {round}: WAL before {before}, written {written}, inserted {inserted}; counter {after} (base {base})"
        );
    }
}

// ------------------------------------------------------------------------------------ 4

/// A primary and a hot standby. Asynchronous: calls advance in place, and the standby
/// replays the counter (generic WAL). Once the standby is synchronous, calls go to the
/// worker (whose wait for the standby is bounded): with the standby gone they fail with
/// 57P03 or 40003 and return nothing; with it back the next block is above theirs. Promoted, the
/// standby continues the counter it replayed.
#[test]
fn standbys_replay_the_counter_and_synchronous_ones_route_to_the_worker() {
    let (mut primary, mut standby) = primary_and_standby(
        "inplace-repl",
        NodeOpts::new().setting("tsoracle.extension_timeout_ms", 2000),
    );
    let mut su = primary.connect();
    assert_eq!(seq_ok(&mut su, "r", 10), 0);
    let commits = group_commits(&mut su);
    assert_eq!(seq_in_place(&mut su, "r", 10, "asynchronous standby"), 10);
    let lsn = wait_replayed(&primary, &standby).expect("standby replay");
    assert_eq!(counter(&mut standby.connect(), "r"), Some(20), "replayed at {lsn}");

    make_sync(&mut primary, standby.name()).expect("synchronous standby");
    let mut su = primary.connect();
    assert_eq!(seq_ok(&mut su, "r", 5), 20);
    assert!(group_commits(&mut su) > commits, "synchronous standby: the worker serves");
    standby.stop(StopMode::Immediate).expect("stop the standby");
    let mut failed = 0;
    for _ in 0..2 {
        let e = seq(&mut su, "r", 1).expect_err("no block without the synchronous standby");
        // 57P03 while the worker had not taken it, 40003 once it had (the outcome unknown).
        let code = sqlstate_of(&e);
        assert!(code == "57P03" || code == "40003", "{}", pg_error_string(&e));
        failed += 1;
    }
    standby.start().expect("restart the standby");
    // Served again once the standby acknowledges the worker's commit: until then a call is
    // refused as before (the restarted standby catches up first, seconds on a busy machine).
    let next = poll_until("served with the standby back", Duration::from_secs(60), || {
        match seq(&mut su, "r", 1) {
            Ok(v) => Some(v),
            Err(e) => {
                let code = sqlstate_of(&e);
                assert!(code == "57P03" || code == "40003", "{}", pg_error_string(&e));
                failed += 1;
                None
            }
        }
    });
    assert!(next >= 25, "a block at {next} below the calls that failed");
    assert!(next <= 25 + failed, "more than the failed calls' blocks skipped: {next}");
    wait_replayed(&primary, &standby).expect("standby replay");
    primary.stop(StopMode::Fast).expect("stop the primary");
    standby.promote().expect("promote");
    wait_for("the promoted standby serving", Duration::from_secs(60), || {
        standby.wait_serving().is_ok()
    });
    let mut promoted = standby.connect();
    assert_eq!(
        seq_ok(&mut promoted, "r", 1),
        next + 1,
        "the promoted standby continues the counter"
    );
}

/// The in-place path's own wait for synchronous standbys (reached in production only when
/// standbys are configured between a call's check and its flush; here forced with the test
/// setting `tsoracle.test_seq_in_place_under_sync`). With the standby gone the caller waits,
/// even with its own `synchronous_commit = off`; `pg_cancel_backend` ends the wait with
/// 57014 and no block, `pg_terminate_backend` ends the session with none; both blocks are
/// gaps, never granted again; no process crashed.
#[test]
fn the_in_place_wait_for_a_gone_standby_never_returns_a_cancelled_block() {
    let (mut primary, mut standby) = primary_and_standby(
        "inplace-sync",
        NodeOpts::new().setting("tsoracle.test_seq_in_place_under_sync", "on"),
    );
    make_sync(&mut primary, standby.name()).expect("synchronous standby");
    let pm = primary.postmaster_pid();
    let mut su = primary.connect();
    assert_eq!(seq_ok(&mut su, "s", 10), 0);
    let commits = group_commits(&mut su);
    assert_eq!(seq_ok(&mut su, "s", 10), 10, "in place, acknowledged by the standby");
    standby.stop(StopMode::Immediate).expect("stop the standby");

    let mut a = primary.connect();
    a.batch_execute("SET synchronous_commit = off").unwrap();
    let a_pid = backend_pid(&mut a);
    let waiter = std::thread::spawn(move || {
        seq(&mut a, "s", 5).map_err(|e| (sqlstate_of(&e), pg_error_string(&e)))
    });
    std::thread::sleep(Duration::from_millis(1500));
    if waiter.is_finished() {
        panic!("the caller did not wait for the gone standby: {:?}", waiter.join().unwrap());
    }
    wait_sync_rep_wait(&mut su, a_pid);
    assert_eq!(counter(&mut su, "s"), Some(25), "the block is written, not returned");
    su.execute("SELECT pg_cancel_backend($1)", &[&a_pid]).unwrap();
    let (code, message) = waiter.join().unwrap().expect_err("a cancelled wait returns no block");
    assert_eq!(code, "57014", "{message}");
    assert!(message.contains("synchronous replication"), "{message}");

    let mut b = primary.connect();
    let b_pid = backend_pid(&mut b);
    let waiter = std::thread::spawn(move || seq(&mut b, "s", 7).map_err(|e| pg_error_string(&e)));
    wait_sync_rep_wait(&mut su, b_pid);
    su.execute("SELECT pg_terminate_backend($1)", &[&b_pid]).unwrap();
    assert!(waiter.join().unwrap().is_err(), "a terminated wait returns no block");
    assert_eq!(group_commits(&mut su), commits, "the worker served none of these calls");

    standby.start().expect("restart the standby");
    let mut c = primary.connect();
    assert_eq!(seq_ok(&mut c, "s", 1), 32, "the cancelled and terminated blocks are never granted");
    assert_eq!(primary.postmaster_pid(), pm, "no crash restart");
    let log = primary.log_contents();
    assert!(!log.contains("terminated by signal"), "a process crashed:\n{}", primary.log_tail(40));
}

// ------------------------------------------------------------------------------------ 5

/// A caller that cancels itself anywhere in the call (`statement_timeout = 1ms`, 8 sessions
/// for 4 s on existing keys, blocks of 1): before the write nothing moves, after it the block is a gap;
/// no block is ever returned twice, every gap is explained by a failed call, every failure is
/// a cancel (57014), and no backend crashed.
#[test]
fn self_cancelled_calls_never_return_a_block_twice() {
    let mut node = serving_node("inplace-cancel", NodeOpts::new());
    let pm = node.postmaster_pid();
    let keys = ["c1", "c2"];
    let mut su = node.connect();
    let history = DenseHistory::new();
    for k in keys {
        let t0 = Instant::now();
        let start = seq_ok(&mut su, k, 1);
        history.record_ok(t0, Instant::now(), "n", k, start, 1);
    }
    let mut opts = SeqLoadOptions::new(8, Duration::from_secs(4), &keys);
    opts.statement_timeout_ms = 1;
    // Blocks of 1 keep the explanation of the gaps (burnt blocks) exact: with hundreds of
    // cancelled calls of random counts, matching gaps to counts is a search that can run out.
    opts.max_count = 1;
    let stats = SeqLoad::start(node.endpoint(), opts, history.clone()).join();
    for (code, n) in &stats.errors_by_sqlstate {
        assert_eq!(code, "57014", "{n} calls failed with {code}: {stats:?}");
    }
    assert!(stats.single_ok >= 50, "too few calls got through to prove anything: {stats:?}");
    let totals = seq_totals(&mut su).unwrap();
    let report = history
        .check(Some(&totals))
        .unwrap_or_else(|v| panic!("dense check failed: {v}\ntotals {totals:?}\n{stats:?}"));
    let gaps: usize = keys.iter().map(|k| report.keys[*k].gaps.len()).sum();
    eprintln!(
        "{} ok, {} cancelled, {gaps} gaps (burnt blocks)",
        stats.ok_calls(),
        stats.load.err_calls
    );
    assert!(node.is_running() && node.postmaster_pid() == pm, "the postmaster restarted");
    let log = node.log_contents();
    assert!(!log.contains("terminated by signal"), "a process crashed:\n{}", node.log_tail(40));
}

// ------------------------------------------------------------------------------------ 6

/// Over the SQL of 0.2.0 (this library serving a database not yet updated) the table's
/// `keep_what_was_issued` trigger does not fire in every session (it is not `ENABLE ALWAYS`),
/// so a superuser's statement under `session_replication_role = replica` could write back a
/// counter an in-place writer moved: every call goes to the worker, which refuses to serve
/// over an outdated schema (57P03), and nothing moves. After `ALTER EXTENSION tsoracle UPDATE`,
/// calls advance in place.
#[test]
fn over_older_extension_sql_every_call_goes_to_the_worker() {
    let node = Node::start_new("inplace-old-sql", NodeOpts::new()).expect("start");
    let mut c = node.connect();
    c.batch_execute("CREATE EXTENSION tsoracle VERSION '0.2.0'").unwrap();
    c.batch_execute("INSERT INTO tsoracle.seq (key, next) VALUES ('old', 5)").unwrap();
    let e = seq(&mut c, "old", 1).expect_err("no in-place advance over the 0.2.0 schema");
    assert_eq!(sqlstate_of(&e), "57P03", "{}", pg_error_string(&e));
    assert_eq!(counter(&mut c, "old"), Some(5), "nothing moved");

    c.batch_execute("ALTER EXTENSION tsoracle UPDATE").unwrap();
    node.wait_serving().expect("serving after the update");
    let mut c = node.connect();
    assert_eq!(seq_ok(&mut c, "old", 1), 5);
    assert_eq!(seq_in_place(&mut c, "old", 1, "the SQL of 0.4.0"), 6);
}

// ------------------------------------------------------------------------------------ 7

/// The in-place path checks its preconditions on every call (docs/seq-in-place.md): with the
/// trigger `keep_what_was_issued` disabled, or enabled for origin sessions only, with an index
/// on `next` or `updated_at`, a rule, a constraint or a policy of someone else's, with the table
/// in a publication, every call goes to the worker
/// (its group commits move) and the blocks still follow on; with each undone, calls advance in
/// place again. A superuser who sets `session_replication_role = replica` (as logical apply
/// workers run) cannot lower a counter: the trigger fires always, and a replicated update
/// merges. The high-water's in-place raise checks the same of `tsoracle.high_water`: with its
/// trigger disabled, window extensions go on through MVCC.
#[test]
fn the_in_place_path_checks_its_preconditions_on_every_call() {
    let node = serving_node("inplace-pre", NodeOpts::new());
    let mut su = node.connect();
    assert_eq!(seq_ok(&mut su, "pre", 1), 0, "a new key starts at 0");
    assert_eq!(seq_in_place(&mut su, "pre", 1, "to begin with"), 1);
    let mut expected = 2;
    let cases = [
        (
            "ALTER TABLE tsoracle.seq DISABLE TRIGGER keep_what_was_issued",
            "ALTER TABLE tsoracle.seq ENABLE ALWAYS TRIGGER keep_what_was_issued",
        ),
        (
            "ALTER TABLE tsoracle.seq ENABLE TRIGGER keep_what_was_issued",
            "ALTER TABLE tsoracle.seq ENABLE ALWAYS TRIGGER keep_what_was_issued",
        ),
        ("CREATE INDEX pre_next ON tsoracle.seq (next)", "DROP INDEX tsoracle.pre_next"),
        (
            "CREATE INDEX pre_updated ON tsoracle.seq (key) WHERE updated_at > '2000-01-01'",
            "DROP INDEX tsoracle.pre_updated",
        ),
        (
            "CREATE RULE pre_rule AS ON UPDATE TO tsoracle.seq DO ALSO NOTIFY pre",
            "DROP RULE pre_rule ON tsoracle.seq",
        ),
        (
            "ALTER TABLE tsoracle.seq ADD CONSTRAINT pre_check CHECK (next < 1000000)",
            "ALTER TABLE tsoracle.seq DROP CONSTRAINT pre_check",
        ),
        (
            "CREATE POLICY pre_policy ON tsoracle.seq USING (true)",
            "DROP POLICY pre_policy ON tsoracle.seq",
        ),
        (
            "ALTER TABLE tsoracle.seq ADD COLUMN pre_note text",
            "ALTER TABLE tsoracle.seq DROP COLUMN pre_note",
        ),
        ("CREATE PUBLICATION pre_pub FOR TABLE tsoracle.seq", "DROP PUBLICATION pre_pub"),
        ("CREATE PUBLICATION pre_all FOR ALL TABLES", "DROP PUBLICATION pre_all"),
    ];
    for (break_it, mend_it) in cases {
        su.batch_execute(break_it)
            .unwrap_or_else(|e| panic!("{break_it}: {}", pg_error_string(&e)));
        let commits = group_commits(&mut su);
        // A session opened now and one opened before both see it (its relcache entry is new).
        let mut fresh = node.connect();
        assert_eq!(seq_ok(&mut fresh, "pre", 2), expected, "after {break_it}");
        assert_eq!(seq_ok(&mut su, "pre", 1), expected + 2, "after {break_it}");
        assert!(group_commits(&mut su) >= commits + 2, "after {break_it}: served in place");
        su.batch_execute(mend_it).unwrap_or_else(|e| panic!("{mend_it}: {}", pg_error_string(&e)));
        assert_eq!(seq_in_place(&mut su, "pre", 1, mend_it), expected + 3);
        expected += 4;
    }
    // A replica-role session cannot lower a counter: a replicated update merges. Its commit
    // has the worker fence again, and look first whether what came brought a member's mark
    // (nothing is written in place until it has): the next call in place once it fenced.
    let fences = |c: &mut Client| -> i64 {
        c.query_one("SELECT fences FROM tso_status()", &[]).unwrap().get(0)
    };
    let before = fences(&mut su);
    su.batch_execute(
        "SET session_replication_role = replica; UPDATE tsoracle.seq SET next = 0 WHERE key = 'pre'; RESET session_replication_role",
    )
    .unwrap();
    poll_until("the worker fenced again after the merge", Duration::from_secs(30), || {
        (fences(&mut su) > before).then_some(())
    });
    assert_eq!(
        counter(&mut su, "pre"),
        Some(expected),
        "a replica-role UPDATE lowered the counter"
    );
    assert_eq!(seq_in_place(&mut su, "pre", 1, "after the replica-role UPDATE"), expected);
    // An origin session is refused the same (55006).
    let e = su.batch_execute("UPDATE tsoracle.seq SET next = 0 WHERE key = 'pre'").unwrap_err();
    assert_eq!(sqlstate_of(&e), "55006", "{}", pg_error_string(&e));

    // The high-water: its trigger disabled, extensions go on (through MVCC) and serve.
    su.batch_execute("ALTER TABLE tsoracle.high_water DISABLE TRIGGER keep_what_was_issued")
        .unwrap();
    let before: i64 =
        su.query_one("SELECT window_extensions FROM tso_status()", &[]).unwrap().get(0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = 0i64;
    while Instant::now() < deadline {
        let ts: i64 = su.query_one("SELECT tso_next()", &[]).unwrap().get(0);
        assert!(ts > last, "timestamps went back");
        last = ts;
        let now: i64 =
            su.query_one("SELECT window_extensions FROM tso_status()", &[]).unwrap().get(0);
        if now >= before + 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let after: i64 =
        su.query_one("SELECT window_extensions FROM tso_status()", &[]).unwrap().get(0);
    assert!(
        after >= before + 2,
        "no window extension with the trigger disabled ({before} -> {after})"
    );
    su.batch_execute("ALTER TABLE tsoracle.high_water ENABLE ALWAYS TRIGGER keep_what_was_issued")
        .unwrap();
}

/// What decides whether an MVCC writer may lower a counter is part of "as installed"
/// (`pg::installed`), and the worker reads only the extension's own table: an inheritance
/// child of `tsoracle.seq` (whose row with a lower `next` the worker never grants again), the
/// trigger's function replaced (`CREATE OR REPLACE FUNCTION` sends no invalidation of the
/// table: a session that verified it before sees it too) or given another owner, and
/// `tsoracle.allow_drop` set as a database or role default each send every call to the
/// worker; each undone, calls advance in place again.
#[test]
fn the_trigger_its_function_and_its_settings_are_part_of_as_installed() {
    let node = serving_node("inplace-trigger", NodeOpts::new());
    let mut su = node.connect();
    assert_eq!(seq_ok(&mut su, "kid", 10), 0, "a new key starts at 0");
    assert_eq!(seq_in_place(&mut su, "kid", 1, "to begin with"), 10);
    let mut expected = 11;
    let mut failures = Vec::new();
    let mut check = |su: &mut Client, expected: &mut i64, what: &str, in_place: bool| {
        let commits = group_commits(su);
        match seq(su, "kid", 1) {
            Ok(start) if start != *expected => {
                failures.push(format!("{what}: granted {start}, expected {expected}"))
            }
            Ok(_) => {}
            Err(e) => failures.push(format!("{what}: {}", pg_error_string(&e))),
        }
        *expected += 1;
        let served_in_place = group_commits(su) == commits;
        if served_in_place != in_place {
            failures.push(format!("{what}: served in place {served_in_place}"));
        }
    };

    // An inheritance child whose row has a lower next: the worker reads the parent only.
    let exec = |c: &mut Client, sql: &str| {
        c.batch_execute(sql).unwrap_or_else(|e| panic!("{sql}: {}", pg_error_string(&e)))
    };
    exec(
        &mut su,
        "CREATE TABLE public.seq_child () INHERITS (tsoracle.seq); \
         INSERT INTO public.seq_child (key, next) VALUES ('kid', 0)",
    );
    check(&mut su, &mut expected, "an inheritance child", false);
    exec(&mut su, "SET tsoracle.seq_in_place = off");
    check(&mut su, &mut expected, "an inheritance child, through the worker", false);
    exec(&mut su, "RESET tsoracle.seq_in_place; DROP TABLE public.seq_child; ANALYZE tsoracle.seq");
    check(&mut su, &mut expected, "the child dropped and the table analyzed", true);

    // The trigger's function replaced by one that lets a lowered counter through, then put
    // back as it was.
    let original: String = su
        .query_one(
            "SELECT pg_get_functiondef('tsoracle.keep_what_was_issued()'::regprocedure)",
            &[],
        )
        .unwrap()
        .get(0);
    exec(
        &mut su,
        "CREATE OR REPLACE FUNCTION tsoracle.keep_what_was_issued() RETURNS trigger \
         LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp \
         AS $$ BEGIN RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END; END $$",
    );
    check(&mut su, &mut expected, "the trigger's function replaced", false);
    exec(&mut su, &original);
    check(&mut su, &mut expected, "the trigger's function put back", true);
    exec(
        &mut su,
        "CREATE ROLE seq_fn_owner; \
         ALTER FUNCTION tsoracle.keep_what_was_issued() OWNER TO seq_fn_owner",
    );
    check(&mut su, &mut expected, "the trigger's function given another owner", false);
    exec(&mut su, "ALTER FUNCTION tsoracle.keep_what_was_issued() OWNER TO CURRENT_USER");
    check(&mut su, &mut expected, "its owner back", true);

    // tsoracle.allow_drop as a default of the database, then of a role.
    let database: String = su.query_one("SELECT current_database()", &[]).unwrap().get(0);
    exec(&mut su, &format!("ALTER DATABASE \"{database}\" SET tsoracle.allow_drop = on"));
    check(&mut su, &mut expected, "allow_drop a database default", false);
    exec(&mut su, &format!("ALTER DATABASE \"{database}\" RESET tsoracle.allow_drop"));
    check(&mut su, &mut expected, "the database default reset", true);
    exec(&mut su, "ALTER ROLE seq_fn_owner SET tsoracle.allow_drop = on");
    check(&mut su, &mut expected, "allow_drop a role default", false);
    exec(&mut su, "ALTER ROLE seq_fn_owner RESET tsoracle.allow_drop");
    check(&mut su, &mut expected, "the role default reset", true);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(counter(&mut su, "kid"), Some(expected), "the counter after every call");
}
