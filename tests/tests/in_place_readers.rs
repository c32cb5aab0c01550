//! Readers nobody listed (docs/operations/maintenance.md, "Tools that follow a table"): an
//! in-place write is made only where the table is exactly as the extension installed it and
//! no logical decoding could see it; everything else is an ordinary row version, and what can
//! appear without a conflicting lock is looked at again after the write. On real clusters:
//!
//! - an audit rule on `tsoracle.seq` records every advance; an index on a whole-row
//!   expression stays consistent (`bt_index_check(…, heapallindexed)`);
//! - a copy of a `pgoutput` slot, decoding with `test_decoding`, decodes every advance made
//!   after the original was made;
//! - the extension's tables cannot be made unlogged, and a worker that finds one unlogged
//!   (made so while the library was not loaded) serves nothing from it;
//! - 16 and later: a `test_decoding` slot on a hot standby (with a physical slot and
//!   `hot_standby_feedback`) decodes every advance made once the primary has its feedback;
//! - a brief `LOCK TABLE` delays calls instead of failing them, up to the caller's
//!   `lock_timeout`;
//! - a slot made between a call's check and its write, a handover requested then, and a
//!   slot and publication made while the caller holds the table locked: never a block that
//!   the slot misses or a dump taken after the handover does not hold.
//!
//! Run with: `cargo test -p tsoracle-tests --test in_place_readers -- --test-threads=2`

use std::time::{Duration, Instant};

use postgres::Client;
use tsoracle_tests::cluster::wait_replayed;
use tsoracle_tests::decoding::decoded_nexts;
use tsoracle_tests::seqlease::{group_commits, seq, seq_ok, seq_totals, sqlstate_of};
use tsoracle_tests::{pg_error_string, serving_node, wait_for, Node, NodeOpts, StopMode};

#[track_caller]
fn exec(c: &mut Client, sql: &str) {
    c.batch_execute(sql).unwrap_or_else(|e| panic!("{sql}: {}", pg_error_string(&e)));
}

fn counter(c: &mut Client, key: &str) -> i64 {
    seq_totals(c).unwrap_or_else(|e| panic!("tsoracle.seq: {}", pg_error_string(&e)))[key]
}

/// 20 calls of `tso_seq(key, 10)`: the end of each block.
fn twenty_blocks(c: &mut Client, key: &str) -> Vec<i64> {
    (0..20).map(|_| seq_ok(c, key, 10) + 10).collect()
}

#[track_caller]
fn assert_all_decoded(ends: &[i64], decoded: &[i64], what: &str) {
    let missed: Vec<&i64> = ends.iter().filter(|end| !decoded.contains(end)).collect();
    assert!(
        missed.is_empty(),
        "{what}: {} of {} advances not decoded ({missed:?}); decoded {decoded:?}",
        missed.len(),
        ends.len()
    );
}

/// Wait until `pid` holds a lock on `tsoracle.seq` (a caller paused inside its in-place call).
fn wait_holding_the_table(c: &mut Client, pid: i32) {
    wait_for("the paused caller to hold tsoracle.seq", Duration::from_secs(20), || {
        c.query_one(
            "SELECT count(*) FROM pg_locks WHERE pid = $1 AND granted \
              AND relation = 'tsoracle.seq'::regclass",
            &[&pid],
        )
        .unwrap()
        .get::<_, i64>(0)
            > 0
    });
}

fn backend_pid(c: &mut Client) -> i32 {
    c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0)
}

/// A call in a thread: its value, or its SQLSTATE and message.
type Call = std::thread::JoinHandle<Result<i64, (String, String)>>;

/// A session paused between its in-place checks and its write, calling `tso_seq(key, 5)` in a
/// thread; its pid.
fn paused_call(node: &Node, key: &'static str) -> (i32, Call) {
    let mut paused = node.connect();
    exec(&mut paused, "SET tsoracle.test_seq_check_pause_ms = 3000");
    let pid = backend_pid(&mut paused);
    let caller = std::thread::spawn(move || {
        seq(&mut paused, key, 5).map_err(|e| (sqlstate_of(&e), pg_error_string(&e)))
    });
    (pid, caller)
}

// ------------------------------------------------------------------------------------ 1

/// An audit rule (`ON UPDATE … DO ALSO INSERT`) sees every one of 20 advances; dropped, calls
/// advance in place again.
#[test]
fn an_audit_rule_sees_every_advance() {
    let node = serving_node("readers-rule", NodeOpts::new());
    let mut su = node.connect();
    assert_eq!(seq_ok(&mut su, "r", 1), 0, "a new key starts at 0");
    exec(
        &mut su,
        "CREATE TABLE public.seq_audit (key text, next bigint); \
         CREATE RULE audit AS ON UPDATE TO tsoracle.seq \
           DO ALSO INSERT INTO public.seq_audit VALUES (NEW.key, NEW.next)",
    );
    let ends = twenty_blocks(&mut su, "r");
    let audited: Vec<i64> = su
        .query("SELECT next FROM public.seq_audit WHERE key = 'r'", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_all_decoded(&ends, &audited, "the audit rule");
    exec(&mut su, "DROP RULE audit ON tsoracle.seq");
    let commits = group_commits(&mut su);
    assert_eq!(seq_ok(&mut su, "r", 1), *ends.last().unwrap());
    assert_eq!(group_commits(&mut su), commits, "the rule dropped: served in place again");
}

/// An index on a whole-row expression (`f(seq)`, an IMMUTABLE plpgsql function of the row):
/// after 20 advances it holds exactly what the heap holds.
#[test]
fn an_index_on_a_whole_row_expression_stays_consistent() {
    let node = serving_node("readers-index", NodeOpts::new());
    let mut su = node.connect();
    assert_eq!(seq_ok(&mut su, "x", 1), 0, "a new key starts at 0");
    exec(
        &mut su,
        "CREATE EXTENSION amcheck; \
         CREATE FUNCTION public.seq_next(s tsoracle.seq) RETURNS bigint LANGUAGE plpgsql \
           IMMUTABLE AS $$ BEGIN RETURN s.next; END $$; \
         CREATE INDEX seq_by_row ON tsoracle.seq (public.seq_next(seq))",
    );
    let commits = group_commits(&mut su);
    let ends = twenty_blocks(&mut su, "x");
    assert!(group_commits(&mut su) >= commits + 20, "with the index, the worker serves every call");
    exec(&mut su, "SELECT bt_index_check('tsoracle.seq_by_row', true)");
    let indexed: i64 = su
        .query_one(
            "SELECT count(*) FROM tsoracle.seq WHERE public.seq_next(seq) = $1",
            &[ends.last().unwrap()],
        )
        .unwrap()
        .get(0);
    assert_eq!(indexed, 1, "the index finds the counter at its last end");
}

// ------------------------------------------------------------------------------------ 2

/// A `pgoutput` slot's copy, made after 20 advances with `test_decoding`, decodes all 20 (a
/// copy starts where its original had reached).
#[test]
fn a_copied_slot_decodes_every_advance() {
    let node = serving_node("readers-copy", NodeOpts::new().setting("wal_level", "logical"));
    let mut su = node.connect();
    assert_eq!(seq_ok(&mut su, "c", 1), 0, "a new key starts at 0");
    exec(&mut su, "SELECT pg_create_logical_replication_slot('sub', 'pgoutput')");
    let ends = twenty_blocks(&mut su, "c");
    exec(&mut su, "SELECT pg_copy_logical_replication_slot('sub', 'peek', false, 'test_decoding')");
    assert_all_decoded(&ends, &decoded_nexts(&mut su, "peek", "c"), "the copied slot");
}

// ------------------------------------------------------------------------------------ 3

/// `ALTER TABLE … SET UNLOGGED` of the extension's tables is refused (55006), however the
/// table is named; the counter survives a crash. A table made unlogged while the library was
/// not loaded: the worker refuses to serve (57P03, saying why) until it is logged again.
#[test]
fn the_tables_stay_logged() {
    let mut node = serving_node("readers-unlogged", NodeOpts::new());
    let mut su = node.connect();
    for table in ["tsoracle.seq", "tsoracle.high_water", "tsoracle.lease", "tsoracle.member_oracle"]
    {
        let e = su
            .batch_execute(&format!("ALTER TABLE {table} SET UNLOGGED"))
            .expect_err("an extension's table made unlogged");
        assert_eq!(sqlstate_of(&e), "55006", "{table}: {}", pg_error_string(&e));
    }
    let e = su
        .batch_execute("SET search_path = tsoracle, public; ALTER TABLE seq SET UNLOGGED")
        .expect_err("made unlogged through the search_path");
    assert_eq!(sqlstate_of(&e), "55006", "{}", pg_error_string(&e));
    exec(&mut su, "RESET search_path");
    let unlogged: i64 = su
        .query_one(
            "SELECT count(*) FROM pg_class WHERE relnamespace = 'tsoracle'::regnamespace \
              AND relkind = 'r' AND relpersistence <> 'p'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(unlogged, 0, "every table of the extension is logged");
    // A table of someone else's may still be made unlogged.
    exec(&mut su, "CREATE TABLE public.scratch (i int); ALTER TABLE public.scratch SET UNLOGGED");

    for _ in 0..5 {
        seq_ok(&mut su, "u", 10);
    }
    drop(su);
    node.restart(StopMode::Immediate).expect("crash and restart");
    node.wait_serving().expect("serving after the crash");
    let mut su = node.connect();
    assert_eq!(seq_ok(&mut su, "u", 1), 50, "the counter continues after the crash");

    // Without the library, nothing refuses the change: the worker then refuses the table.
    drop(su);
    node.set_conf("shared_preload_libraries", "").unwrap();
    node.restart(StopMode::Fast).unwrap();
    exec(&mut node.connect(), "ALTER TABLE tsoracle.seq SET UNLOGGED");
    node.set_conf("shared_preload_libraries", "tsoracle").unwrap();
    node.restart(StopMode::Fast).unwrap();
    let mut su = node.connect();
    let mut refusal = String::new();
    wait_for("the worker to refuse the unlogged table", Duration::from_secs(20), || {
        match seq(&mut su, "u", 1) {
            Ok(start) => panic!("served {start} from an unlogged table"),
            Err(e) => {
                refusal = pg_error_string(&e);
                sqlstate_of(&e) == "57P03" && refusal.contains("unlogged")
            }
        }
    });
    exec(&mut su, "ALTER TABLE tsoracle.seq SET LOGGED");
    node.wait_serving().expect("serving once the table is logged again");
    let mut su = node.connect();
    assert_eq!(seq_ok(&mut su, "u", 1), 51, "the counter continues (refused: {refusal})");
}

// ------------------------------------------------------------------------------------ 4

/// 16 and later: a `test_decoding` slot on a hot standby that streams through a physical
/// slot with `hot_standby_feedback`: once the primary has the standby's `catalog_xmin`, the
/// slot decodes every one of 20 advances made on the primary.
#[test]
fn a_slot_on_a_standby_decodes_every_advance() {
    let primary = serving_node("readers-sb-p", NodeOpts::new().setting("wal_level", "logical"));
    let mut p = primary.connect();
    let version: i32 =
        p.query_one("SHOW server_version_num", &[]).unwrap().get::<_, String>(0).parse().unwrap();
    if version < 160_000 {
        // Logical decoding on a standby came with PostgreSQL 16.
        return;
    }
    assert_eq!(seq_ok(&mut p, "s", 1), 0, "a new key starts at 0");
    exec(&mut p, "SELECT pg_create_physical_replication_slot('standby_slot')");
    let mut standby = Node::base_backup_from(&primary, "readers-sb-s").expect("pg_basebackup");
    standby.set_conf("primary_slot_name", "standby_slot").unwrap();
    standby.set_conf("hot_standby_feedback", "on").unwrap();
    standby.set_conf("wal_receiver_status_interval", "1s").unwrap();
    standby.start().expect("start the standby");
    wait_replayed(&primary, &standby).expect("replayed");
    // A slot on a standby waits for a running-transactions record from the primary.
    let mut s = standby.connect();
    let creating = std::thread::spawn(move || {
        s.batch_execute("SELECT pg_create_logical_replication_slot('cdc', 'test_decoding')")
            .map_err(|e| pg_error_string(&e))
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while !creating.is_finished() && Instant::now() < deadline {
        exec(&mut p, "SELECT pg_log_standby_snapshot()");
        std::thread::sleep(Duration::from_millis(100));
    }
    creating.join().unwrap().expect("the slot on the standby");
    wait_for("the standby's catalog_xmin on the primary", Duration::from_secs(30), || {
        p.query_one(
            "SELECT catalog_xmin IS NOT NULL FROM pg_replication_slots \
              WHERE slot_name = 'standby_slot'",
            &[],
        )
        .unwrap()
        .get(0)
    });
    let ends = twenty_blocks(&mut p, "s");
    wait_replayed(&primary, &standby).expect("replayed");
    let mut s = standby.connect();
    assert_all_decoded(&ends, &decoded_nexts(&mut s, "cdc", "s"), "the standby's slot");
}

// ------------------------------------------------------------------------------------ 5

/// A brief `LOCK TABLE` (as pg_repack's swap takes) delays calls, which then succeed; with a
/// `lock_timeout` of the caller's own, a lock held longer fails the call `55P03`.
#[test]
fn a_brief_table_lock_delays_calls_instead_of_failing_them() {
    let node = serving_node("readers-lock", NodeOpts::new());
    let mut su = node.connect();
    assert_eq!(seq_ok(&mut su, "w", 1), 0, "a new key starts at 0");
    for (held, lock_timeout, expect_ok) in [(600u64, None, true), (3000, Some("300ms"), false)] {
        let before = counter(&mut su, "w");
        let mut locker = node.connect();
        exec(&mut locker, "BEGIN; LOCK TABLE tsoracle.seq IN ACCESS EXCLUSIVE MODE");
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(held));
            locker.batch_execute("COMMIT").unwrap();
        });
        let mut c = node.connect();
        if let Some(t) = lock_timeout {
            exec(&mut c, &format!("SET lock_timeout = '{t}'"));
        }
        let outcome = seq(&mut c, "w", 1);
        match (expect_ok, outcome) {
            (true, Ok(start)) => assert_eq!(start, before, "the next block after the lock"),
            (false, Err(e)) => assert_eq!(sqlstate_of(&e), "55P03", "{}", pg_error_string(&e)),
            (_, outcome) => panic!(
                "lock held {held} ms, lock_timeout {lock_timeout:?}: {:?}",
                outcome.map_err(|e| pg_error_string(&e))
            ),
        }
        release.join().unwrap();
    }
}

// ------------------------------------------------------------------------------------ 6

/// A `pgoutput` slot made while a call is paused between its check and its write: the block
/// the call returns is one the slot decodes (read through a `test_decoding` copy of it); what
/// was written in place before the slot was seen is a gap.
#[test]
fn a_slot_made_between_the_check_and_the_write_decodes_the_block() {
    let node = serving_node("readers-late", NodeOpts::new().setting("wal_level", "logical"));
    let mut su = node.connect();
    assert_eq!(seq_ok(&mut su, "l", 1), 0, "a new key starts at 0");
    let (pid, caller) = paused_call(&node, "l");
    wait_holding_the_table(&mut su, pid);
    exec(&mut su, "SELECT pg_create_logical_replication_slot('late', 'pgoutput')");
    let start = caller.join().unwrap().unwrap_or_else(|e| panic!("the paused call: {e:?}"));
    exec(
        &mut su,
        "SELECT pg_copy_logical_replication_slot('late', 'late_td', false, 'test_decoding')",
    );
    assert_all_decoded(&[start + 5], &decoded_nexts(&mut su, "late_td", "l"), "the late slot");
}

/// `tso_handover()` while a call is paused between its check and its write, then a read of
/// the counter as a dump taken after the handover makes it: the call returns no block above
/// what that read holds.
#[test]
fn a_handover_during_an_in_place_call_returns_nothing_a_dump_misses() {
    let node = serving_node("readers-handover", NodeOpts::new());
    let mut su = node.connect();
    assert_eq!(seq_ok(&mut su, "h", 1), 0, "a new key starts at 0");
    let (pid, caller) = paused_call(&node, "h");
    wait_holding_the_table(&mut su, pid);
    exec(&mut su, "SELECT tso_handover()");
    let dumped = counter(&mut su, "h");
    match caller.join().unwrap() {
        Ok(start) => assert!(
            start + 5 <= dumped,
            "the paused call returned [{start}, {}) after a handover whose dump holds {dumped}",
            start + 5
        ),
        Err((code, message)) => assert_eq!(code, "57P03", "{message}"),
    }
}

/// A caller that holds `tsoracle.seq` `ROW EXCLUSIVE` in its transaction (its lock then reads
/// no invalidations): a publication and a `pgoutput` slot made meanwhile still send its next
/// call to the worker, as a row version the slot decodes.
#[test]
fn a_slot_made_while_the_caller_holds_the_table_decodes_its_next_block() {
    let node = serving_node("readers-held", NodeOpts::new().setting("wal_level", "logical"));
    let mut su = node.connect();
    assert_eq!(seq_ok(&mut su, "t", 1), 0, "a new key starts at 0");
    let mut holder = node.connect();
    exec(&mut holder, "BEGIN; LOCK TABLE tsoracle.seq IN ROW EXCLUSIVE MODE");
    let commits = group_commits(&mut su);
    assert_eq!(seq_ok(&mut holder, "t", 1), 1);
    assert_eq!(group_commits(&mut su), commits, "served in place to begin with");
    exec(&mut su, "CREATE PUBLICATION held_pub FOR ALL TABLES");
    exec(&mut su, "SELECT pg_create_logical_replication_slot('held', 'pgoutput')");
    let start = seq_ok(&mut holder, "t", 5);
    exec(&mut holder, "COMMIT");
    exec(
        &mut su,
        "SELECT pg_copy_logical_replication_slot('held', 'held_td', false, 'test_decoding')",
    );
    assert_all_decoded(&[start + 5], &decoded_nexts(&mut su, "held_td", "t"), "the new slot");
}
