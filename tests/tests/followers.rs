//! What follows the extension's tables through row versions, triggers or logical decoding
//! sees every advance (docs/operations/maintenance.md, "Tools that follow a table"): an
//! in-place write makes no row version, so `tso_seq` and the worker's high-water raise write
//! in place only where nothing follows the table, and otherwise as ordinary row versions.
//! On real clusters:
//!
//! - a `test_decoding` slot of the database decodes every block's end and the high-water
//!   that served a later timestamp; at `wal_level = logical` nothing is written in place,
//!   with or without a slot;
//! - a user's audit trigger on `tsoracle.seq` records an advance covering every block
//!   granted under load;
//! - a rewrite of `tsoracle.seq` in the caller's own transaction (`CLUSTER`, in a savepoint
//!   too), rolled back: no block is granted twice;
//! - `VACUUM FULL` and `CLUSTER` of `tsoracle.high_water` in a loop while the worker pauses
//!   with the row's page pinned before its in-place write (`tsoracle.test_high_water_pause_ms`,
//!   test builds): a hot standby keeps replaying (no write into a dropped file), and the table's
//!   high-water never falls below a timestamp served;
//! - `CREATE INDEX` on `tsoracle.high_water` inside the same pause: the index holds what the
//!   heap holds (`bt_index_check(…, heapallindexed => true)`);
//! - `CREATE INDEX` on it left open in a transaction: timestamps stop retryably (57P03), and
//!   serve again once it ends.
//!
//! Run with: `cargo test -p tsoracle-tests --test followers -- --test-threads=2`

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use postgres::Client;
use tsoracle_tests::cluster::wait_replayed;
use tsoracle_tests::decoding::{decoded, slot_changes};
use tsoracle_tests::seqlease::{
    alter_system, group_commits, seq, seq_ok, seq_totals, sqlstate_of, SeqLoad, SeqLoadOptions,
};
use tsoracle_tests::tso::assert_high_water_covers;
use tsoracle_tests::{
    ops, pg_error_string, physical, serving_node, DenseHistory, History, Load, LoadOptions, Node,
    NodeOpts,
};

#[track_caller]
fn exec(c: &mut Client, sql: &str) {
    c.batch_execute(sql).unwrap_or_else(|e| panic!("{sql}: {}", pg_error_string(&e)));
}

fn window_extensions(c: &mut Client) -> i64 {
    c.query_one("SELECT window_extensions FROM tso_status()", &[]).unwrap().get(0)
}

fn tso_next(c: &mut Client) -> i64 {
    c.query_one("SELECT tso_next()", &[])
        .unwrap_or_else(|e| panic!("tso_next(): {}", pg_error_string(&e)))
        .get(0)
}

// ------------------------------------------------------------------------------------ 1

/// A `test_decoding` slot of the database decodes every advance: the end of every block of
/// 40 calls (each served by the worker, as a row version), and a high-water raised after the
/// slot was made, at or above a timestamp served after it. At `wal_level = logical` every
/// call goes to the worker, the slot named in `tsoracle.in_place_ignore_slots` (deprecated)
/// or dropped.
#[test]
fn a_decoding_slot_sees_every_advance() {
    let node = serving_node(
        "follow-slot",
        NodeOpts::new().setting("wal_level", "logical").setting("tsoracle.window_ahead_ms", 400),
    );
    let mut su = node.connect();
    assert_eq!(seq_ok(&mut su, "d", 1), 0, "a new key starts at 0");
    exec(&mut su, "SELECT pg_create_logical_replication_slot('follow_td', 'test_decoding')");
    let commits = group_commits(&mut su);
    let mut ends = Vec::new();
    for i in 0..40 {
        let count = 1 + i % 5;
        let start = seq_ok(&mut su, "d", count);
        ends.push(start + i64::from(count));
    }
    assert!(
        group_commits(&mut su) >= commits + 40,
        "with a test_decoding slot the worker serves every call"
    );
    let extensions = window_extensions(&mut su);
    tsoracle_tests::wait_for("two window extensions", Duration::from_secs(20), || {
        window_extensions(&mut su) >= extensions + 2
    });
    let served = tso_next(&mut su);

    let lines = slot_changes(&mut su, "follow_td");
    let nexts: Vec<i64> =
        lines.iter().filter_map(|l| decoded(l, "tsoracle.seq", Some("d"), "next")).collect();
    for end in &ends {
        assert!(nexts.contains(end), "no decoded advance of d to {end}: decoded {nexts:?}");
    }
    let high_water = lines
        .iter()
        .filter_map(|l| decoded(l, "tsoracle.high_water", None, "physical_ms"))
        .max()
        .unwrap_or_else(|| panic!("no high-water raise decoded in {} changes", lines.len()));
    assert!(
        high_water >= physical(served),
        "decoded high-water {high_water} below a timestamp served after it ({})",
        physical(served)
    );

    // Named in tsoracle.in_place_ignore_slots (deprecated, no effect), and with no slot at
    // all: at wal_level = logical a standby may decode what the primary cannot see, so the
    // worker serves every call.
    alter_system(&node, "tsoracle.in_place_ignore_slots", Some(" other , follow_td")).unwrap();
    let mut su = node.connect();
    let end = *ends.last().unwrap();
    let commits = group_commits(&mut su);
    assert_eq!(seq_ok(&mut su, "d", 1), end);
    assert!(group_commits(&mut su) > commits, "an ignored slot: served by the worker");
    alter_system(&node, "tsoracle.in_place_ignore_slots", None).unwrap();
    exec(&mut su, "SELECT pg_drop_replication_slot('follow_td')");
    let commits = group_commits(&mut su);
    assert_eq!(seq_ok(&mut su, "d", 1), end + 1);
    assert!(group_commits(&mut su) > commits, "no slot, wal_level = logical: served by the worker");
}

// ------------------------------------------------------------------------------------ 2

/// A user's audit trigger (`AFTER UPDATE … FOR EACH ROW`) on `tsoracle.seq`, under 6
/// sessions on 2 keys for 3 s: every block granted lies inside an advance the trigger
/// recorded, and the last one recorded is the table's counter. Dropped, calls advance in
/// place again.
#[test]
fn an_audit_trigger_records_every_advance() {
    let node = serving_node("follow-trigger", NodeOpts::new());
    let mut su = node.connect();
    let keys = ["a1", "a2"];
    let history = DenseHistory::new();
    for k in keys {
        let t0 = Instant::now();
        let start = seq_ok(&mut su, k, 1);
        history.record_ok(t0, Instant::now(), "n", k, start, 1);
    }
    exec(
        &mut su,
        "CREATE TABLE public.seq_audit (key text, old_next bigint, new_next bigint); \
         CREATE FUNCTION public.seq_audit() RETURNS trigger LANGUAGE plpgsql AS \
           $$BEGIN INSERT INTO public.seq_audit VALUES (NEW.key, OLD.next, NEW.next); RETURN NULL; END$$; \
         CREATE TRIGGER seq_audit AFTER UPDATE ON tsoracle.seq \
           FOR EACH ROW EXECUTE FUNCTION public.seq_audit()",
    );
    let stats = SeqLoad::start(
        node.endpoint(),
        SeqLoadOptions::new(6, Duration::from_secs(3), &keys),
        history.clone(),
    )
    .join();
    assert!(stats.single_ok >= 50, "too few calls to prove anything: {stats:?}");
    let totals = seq_totals(&mut su).unwrap();
    history
        .check(Some(&totals))
        .unwrap_or_else(|v| panic!("dense check failed: {v}\ntotals {totals:?}\n{stats:?}"));
    let mut audited: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    for r in su.query("SELECT key, old_next, new_next FROM public.seq_audit", &[]).unwrap() {
        audited.entry(r.get(0)).or_default().push((r.get(1), r.get(2)));
    }
    for call in history.calls() {
        let Ok(start) = call.result else { continue };
        if start == 0 {
            continue; // the key's creation: an INSERT, before the trigger existed
        }
        let covered = audited
            .get(&call.key)
            .is_some_and(|a| a.iter().any(|&(old, new)| old <= start && start + call.count <= new));
        assert!(
            covered,
            "block [{start}, {}) of {} is in no recorded advance",
            start + call.count,
            call.key
        );
    }
    for k in keys {
        let last = audited.get(k).and_then(|a| a.iter().map(|p| p.1).max());
        assert_eq!(last, totals.get(k).copied(), "key {k}: the last advance recorded");
    }
    exec(&mut su, "DROP TRIGGER seq_audit ON tsoracle.seq");
    let commits = group_commits(&mut su);
    seq_ok(&mut su, "a1", 1);
    assert_eq!(group_commits(&mut su), commits, "without the trigger: served in place");
}

// ------------------------------------------------------------------------------------ 3

/// `CLUSTER tsoracle.seq` in the caller's own transaction (and in a savepoint), then
/// `tso_seq`, then a rollback that throws the new file away: the block (if the call got
/// one) is never granted again.
#[test]
fn a_rewrite_rolled_back_in_the_callers_transaction_grants_nothing_twice() {
    let node = serving_node("follow-rollback", NodeOpts::new());
    let mut su = node.connect();
    assert_eq!(seq_ok(&mut su, "r", 10), 0);
    let mut granted_end = seq_ok(&mut su, "r", 10) + 10;
    let cases = [
        ("BEGIN; CLUSTER tsoracle.seq USING seq_pkey", "ROLLBACK"),
        ("BEGIN; SAVEPOINT s; CLUSTER tsoracle.seq USING seq_pkey", "ROLLBACK TO s; COMMIT"),
    ];
    for (begin, end) in cases {
        let mut t = node.connect();
        exec(&mut t, begin);
        match seq(&mut t, "r", 10) {
            Ok(start) => {
                assert!(start >= granted_end, "{begin}: block {start} below {granted_end}");
                granted_end = start + 10;
            }
            Err(e) => eprintln!("{begin}: tso_seq failed: {}", pg_error_string(&e)),
        }
        exec(&mut t, end);
        let next = seq_ok(&mut su, "r", 10);
        assert!(next >= granted_end, "after {begin}; {end}: block {next} granted again");
        granted_end = next + 10;
    }
    let totals = seq_totals(&mut su).unwrap();
    assert!(totals["r"] >= granted_end, "counter {} below {granted_end}", totals["r"]);
}

// ------------------------------------------------------------------------------------ 4

/// A primary and a hot standby; the worker raises the high-water every few hundred ms and
/// pauses 100 ms with the row's page pinned before its in-place write (where a rewrite that
/// took no account of the table lock would copy the page, commit, and wait for the pin to
/// drop the file), under 3 `tso_next()` sessions,
/// while `VACUUM FULL` and `CLUSTER` of `tsoracle.high_water` run in a loop for 8 s. The
/// standby keeps replaying to the end (a record for a dropped file would stop it with
/// PANIC), the table's high-water is never below a timestamp served before it was read, and
/// the timestamps are unique and in real-time order.
#[test]
fn a_hot_standby_stays_up_through_rewrites_of_the_high_water() {
    let opts = NodeOpts::new()
        .setting("tsoracle.window_ahead_ms", 300)
        .setting("tsoracle.test_high_water_pause_ms", 100);
    let primary = serving_node("follow-hw-p", opts);
    let mut standby = Node::base_backup_from(&primary, "follow-hw-s").expect("pg_basebackup");
    standby.start().expect("start standby");
    let history = History::new();
    let load = Load::start(
        vec![primary.endpoint()],
        LoadOptions::new(3, Duration::from_secs(60)),
        ops::tso_next(),
        history.clone(),
    );
    let mut su = primary.connect();
    let started = Instant::now();
    let mut rounds = 0;
    while started.elapsed() < Duration::from_secs(8) {
        for sql in
            ["VACUUM FULL tsoracle.high_water", "CLUSTER tsoracle.high_water USING high_water_pkey"]
        {
            let served = history.max_value();
            exec(&mut su, sql);
            assert_high_water_covers(&mut su, served, sql);
        }
        rounds += 1;
    }
    let stats = load.stop_and_join();
    assert!(rounds >= 5, "only {rounds} rounds of rewrites");
    assert_eq!(stats.err_calls, 0, "tso_next() failed: {stats:?}");
    let report = history.assert_valid();
    eprintln!("{rounds} rounds of rewrites under {report:?}");
    wait_replayed(&primary, &standby).expect("the standby replays to the end");
    assert!(standby.is_running(), "the standby stopped:\n{}", standby.log_tail(40));
    let log = standby.log_contents();
    assert!(!log.contains("PANIC"), "the standby panicked:\n{}", standby.log_tail(40));
}

// ------------------------------------------------------------------------------------ 5

/// `CREATE INDEX` on `tsoracle.high_water (physical_ms)` while the worker pauses 1 s with the
/// row's page pinned before its in-place write (seen through `pg_buffercache`'s pin count),
/// 4 times: 1.1 s later (the paused raise done; the window of 4 s needs no other raise yet)
/// the index holds every live heap tuple's value (`bt_index_check` with `heapallindexed`). A
/// raise written in place after the index was built would leave the index stale.
#[test]
fn an_index_made_during_a_raise_holds_the_raised_value() {
    let opts = NodeOpts::new()
        .setting("tsoracle.window_ahead_ms", 4000)
        .setting("tsoracle.test_high_water_pause_ms", 1000);
    let node = serving_node("follow-index", opts);
    let mut su = node.connect();
    exec(&mut su, "CREATE EXTENSION amcheck; CREATE EXTENSION pg_buffercache");
    let pinned = |c: &mut Client| -> bool {
        c.query_one(
            "SELECT coalesce(sum(pinning_backends), 0)::bigint FROM pg_buffercache \
             WHERE relfilenode = pg_relation_filenode('tsoracle.high_water') \
               AND reldatabase = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[],
        )
        .unwrap()
        .get::<_, i64>(0)
            > 0
    };
    for i in 0..4 {
        tsoracle_tests::wait_for("the worker paused mid-raise", Duration::from_secs(20), || {
            pinned(&mut su)
        });
        exec(&mut su, "CREATE INDEX hw_ms ON tsoracle.high_water (physical_ms)");
        std::thread::sleep(Duration::from_millis(1100));
        if let Err(e) = su.batch_execute("SELECT bt_index_check('tsoracle.hw_ms', true)") {
            panic!(
                "round {i}: the index misses the heap ({}): {}",
                sqlstate_of(&e),
                pg_error_string(&e)
            );
        }
        exec(&mut su, "DROP INDEX tsoracle.hw_ms");
    }
    assert!(tso_next(&mut su) > 0);
}

// ------------------------------------------------------------------------------------ 6

/// `CREATE INDEX` on `tsoracle.high_water` in a transaction left open keeps the worker's
/// raise out (its table lock conflicts with the index build's, and the MVCC update's with
/// it too): `tso_next()` serves what the window holds (1 s here), then answers 57P03 —
/// retryable, never a value out of order — and serves again once the transaction ends.
#[test]
fn an_index_build_left_open_on_the_high_water_stops_timestamps_retryably() {
    let node = serving_node(
        "follow-open-index",
        NodeOpts::new().setting("tsoracle.window_ahead_ms", 1000),
    );
    let mut su = node.connect();
    let mut dba = node.connect();
    exec(&mut dba, "BEGIN; CREATE INDEX ON tsoracle.high_water (updated_at)");
    let (mut last, mut refused) = (0i64, 0);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(4) {
        match su.query_one("SELECT tso_next()", &[]) {
            Ok(r) => {
                let v: i64 = r.get(0);
                assert!(v > last, "tso_next() went back: {v} after {last}");
                last = v;
            }
            Err(e) => {
                assert_eq!(sqlstate_of(&e), "57P03", "{}", pg_error_string(&e));
                refused += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(refused > 0, "tso_next() served for 4 s without a raise of its 1 s window");
    exec(&mut dba, "ROLLBACK");
    tsoracle_tests::wait_for("tso_next() serving again", Duration::from_secs(10), || {
        su.query_one("SELECT tso_next()", &[]).is_ok_and(|r| r.get::<_, i64>(0) > last)
    });
}
