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
//! - 16 and later: `test_decoding` slots on hot standbys decode every advance where the
//!   primary cannot know of them: a standby whose feedback is switched off, a cascaded
//!   standby, after a crash before a checkpoint, after a failover to a new slot;
//! - a brief `LOCK TABLE` delays calls instead of failing them, up to the caller's
//!   `lock_timeout`;
//! - the trigger's function replaced between a call's check and its write, or while the
//!   caller holds the table locked, and a handover requested then: never a block written in
//!   place that an MVCC writer could lower or a dump taken after the handover does not hold;
//! - readers that follow `xmin` (an incremental sync by `xmin`, `pg_xact_commit_timestamp`):
//!   an advance in place leaves both as they were; the next row version carries it.
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

/// What a call in a thread ends with: its start, or its SQLSTATE and message.
type CallThread = std::thread::JoinHandle<Result<i64, (String, String)>>;

/// A session paused between its in-place checks and its write, calling `tso_seq(key, 5)` in a
/// thread; its pid.
fn paused_call(node: &Node, key: &'static str) -> (i32, CallThread) {
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

/// What `what` failed to decode of `ends`, if anything.
fn missing(ends: &[i64], decoded: &[i64], what: &str) -> Option<String> {
    let missed = ends.iter().filter(|end| !decoded.contains(end)).count();
    (missed > 0).then(|| format!("{what}: {missed} of {} not decoded", ends.len()))
}

/// Wait until `primary`'s physical slot `slot` shows a `catalog_xmin` (`held`) or none.
fn wait_catalog_xmin(primary: &mut Client, slot: &str, held: bool) {
    wait_for(&format!("{slot}'s catalog_xmin held: {held}"), Duration::from_secs(30), || {
        primary
            .query_one(
                "SELECT catalog_xmin IS NOT NULL FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .unwrap()
            .get::<_, bool>(0)
            == held
    });
}

/// A `test_decoding` slot made on hot standby `standby`, while `primary` logs the
/// running-transactions records its creation waits for.
fn standby_slot(primary: &mut Client, standby: &Node, slot: &'static str) {
    let mut s = standby.connect();
    let creating = std::thread::spawn(move || {
        s.batch_execute(&format!(
            "SELECT pg_create_logical_replication_slot('{slot}', 'test_decoding')"
        ))
        .map_err(|e| pg_error_string(&e))
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while !creating.is_finished() && Instant::now() < deadline {
        exec(primary, "SELECT pg_log_standby_snapshot()");
        std::thread::sleep(Duration::from_millis(100));
    }
    creating.join().unwrap().unwrap_or_else(|e| panic!("slot {slot} on {}: {e}", standby.name()));
}

/// 16 and later, where a hot standby decodes too: `test_decoding` slots on standbys decode
/// every one of 20 advances made on their primary, in each case where the primary cannot know
/// of them (docs/operations/in-place.md): a standby `s` (physical slot on the primary) whose
/// `hot_standby_feedback` is switched off, a standby `c` cascaded behind it with no slot and
/// no feedback, `s` again after the primary crashed before a checkpoint saved the slot's
/// `catalog_xmin`, and `c` after `s` is promoted, through a new slot on it that has had no
/// feedback yet.
#[test]
fn standbys_that_decode_see_every_advance() {
    let mut primary = serving_node("readers-sb-p", NodeOpts::new().setting("wal_level", "logical"));
    let mut p = primary.connect();
    let version: i32 =
        p.query_one("SHOW server_version_num", &[]).unwrap().get::<_, String>(0).parse().unwrap();
    if version < 160_000 {
        eprintln!("skipped: logical decoding on a standby came with PostgreSQL 16");
        return;
    }
    assert_eq!(seq_ok(&mut p, "s", 1), 0, "a new key starts at 0");
    exec(&mut p, "SELECT pg_create_physical_replication_slot('s_slot')");
    let mut s = Node::base_backup_from(&primary, "readers-sb-s").expect("pg_basebackup");
    s.set_conf("primary_slot_name", "s_slot").unwrap();
    s.set_conf("hot_standby_feedback", "on").unwrap();
    s.set_conf("wal_receiver_status_interval", "1s").unwrap();
    s.start().expect("start the standby");
    wait_replayed(&primary, &s).expect("replayed");
    let mut c = Node::base_backup_from(&s, "readers-sb-c").expect("pg_basebackup of the standby");
    // No slot and no feedback of its own (it has the standby's settings).
    c.unset_conf("primary_slot_name").unwrap();
    c.set_conf("hot_standby_feedback", "off").unwrap();
    c.start().expect("start the cascaded standby");
    wait_replayed(&primary, &c).expect("replayed on the cascaded standby");
    standby_slot(&mut p, &s, "cdc");
    standby_slot(&mut p, &c, "cdc");
    wait_catalog_xmin(&mut p, "s_slot", true);

    // The standby's DBA switches its feedback off (to spare the primary bloat).
    s.set_conf("hot_standby_feedback", "off").unwrap();
    wait_catalog_xmin(&mut p, "s_slot", false);
    let ends = twenty_blocks(&mut p, "s");
    wait_replayed(&primary, &c).expect("replayed");
    let mut sc = s.connect();
    // Each case is checked, and all are reported together at the end.
    let mut missed = Vec::new();
    missed.push(missing(&ends, &decoded_nexts(&mut sc, "cdc", "s"), "feedback off: the standby"));
    let mut cc = c.connect();
    missed.push(missing(&ends, &decoded_nexts(&mut cc, "cdc", "s"), "the cascaded standby"));

    // Feedback on again; the primary crashes before a checkpoint saved the slot's
    // catalog_xmin, and serves before the standby is back.
    s.set_conf("hot_standby_feedback", "on").unwrap();
    wait_catalog_xmin(&mut p, "s_slot", true);
    drop((sc, cc, p));
    s.stop(StopMode::Fast).unwrap();
    primary.restart(StopMode::Immediate).expect("crash and restart");
    primary.wait_serving().expect("serving after the crash");
    let mut p = primary.connect();
    let ends = twenty_blocks(&mut p, "s");
    s.start().expect("the standby back");
    wait_replayed(&primary, &s).expect("replayed");
    let mut sc = s.connect();
    missed.push(missing(&ends, &decoded_nexts(&mut sc, "cdc", "s"), "after the crash"));

    // Failover: the standby is promoted (its own slot dropped first); the cascaded one gets a
    // new slot on it, and the new primary serves before that slot has had any feedback.
    wait_replayed(&primary, &c).expect("replayed on the cascaded standby");
    exec(&mut sc, "SELECT pg_drop_replication_slot('cdc')");
    drop((sc, p));
    primary.stop(StopMode::Fast).unwrap();
    s.promote().expect("promote");
    s.wait_serving().expect("the new primary serves");
    let mut sc = s.connect();
    exec(&mut sc, "SELECT pg_create_physical_replication_slot('c_slot')");
    c.stop(StopMode::Fast).unwrap();
    c.set_conf("primary_slot_name", "c_slot").unwrap();
    c.set_conf("hot_standby_feedback", "on").unwrap();
    let ends = twenty_blocks(&mut sc, "s");
    c.start().expect("the cascaded standby back");
    wait_replayed(&s, &c).expect("replayed from the new primary");
    let mut cc = c.connect();
    missed.push(missing(&ends, &decoded_nexts(&mut cc, "cdc", "s"), "after the failover"));
    let missed: Vec<String> = missed.into_iter().flatten().collect();
    assert!(missed.is_empty(), "advances not decoded:\n{}", missed.join("\n"));
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

/// A trigger function that lets a lowered counter through (an MVCC writer's statement).
const LAX_FUNCTION: &str = "CREATE OR REPLACE FUNCTION tsoracle.keep_what_was_issued() \
    RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp \
    AS $$ BEGIN RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END; END $$";

/// `CREATE OR REPLACE FUNCTION` of the trigger's function as it is now (to put it back).
fn function_as_now(c: &mut Client) -> String {
    c.query_one("SELECT pg_get_functiondef('tsoracle.keep_what_was_issued()'::regprocedure)", &[])
        .unwrap()
        .get(0)
}

/// The trigger's function replaced while a call is paused between its check and its write
/// (no lock of the table conflicts with that): the block written in place is a gap, and the
/// call returns the worker's block after it, never the one written in place.
#[test]
fn a_function_replaced_between_the_check_and_the_write_makes_the_block_a_gap() {
    let node = serving_node("readers-late", NodeOpts::new());
    let mut su = node.connect();
    assert_eq!(seq_ok(&mut su, "l", 1), 0, "a new key starts at 0");
    let original = function_as_now(&mut su);
    let commits = group_commits(&mut su);
    let (pid, caller) = paused_call(&node, "l");
    wait_holding_the_table(&mut su, pid);
    exec(&mut su, LAX_FUNCTION);
    let start = caller.join().unwrap().unwrap_or_else(|e| panic!("the paused call: {e:?}"));
    exec(&mut su, &original);
    // The caller may hold the table before its check: then it sees the replacement there
    // and writes nothing in place (the worker's block starts at 1); past the check, what it
    // wrote in place is a gap (6). Either way the worker served it.
    assert!(group_commits(&mut su) > commits, "a block written in place returned ({start})");
    assert!(start == 1 || start == 6, "the worker's block starts at {start}");
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
/// no invalidations): the trigger's function replaced meanwhile sends its next call to the
/// worker.
#[test]
fn a_function_replaced_while_the_caller_holds_the_table_sends_it_to_the_worker() {
    let node = serving_node("readers-held", NodeOpts::new());
    let mut su = node.connect();
    assert_eq!(seq_ok(&mut su, "t", 1), 0, "a new key starts at 0");
    let original = function_as_now(&mut su);
    let mut holder = node.connect();
    exec(&mut holder, "BEGIN; LOCK TABLE tsoracle.seq IN ROW EXCLUSIVE MODE");
    let commits = group_commits(&mut su);
    assert_eq!(seq_ok(&mut holder, "t", 1), 1);
    assert_eq!(group_commits(&mut su), commits, "served in place to begin with");
    exec(&mut su, LAX_FUNCTION);
    assert_eq!(seq_ok(&mut holder, "t", 5), 2);
    exec(&mut holder, "COMMIT");
    assert!(group_commits(&mut su) > commits, "the function replaced: served by the worker");
    exec(&mut su, &original);
}

// ------------------------------------------------------------------------------------ 7

/// The row of key `m` as a reader that follows `xmin` sees it: its `xmin`, its commit
/// timestamp (`track_commit_timestamp`) and `next`.
fn xmin_view(c: &mut Client) -> (i64, String, i64) {
    let row = c
        .query_one(
            "SELECT xmin::text::bigint, pg_xact_commit_timestamp(xmin)::text, next \
               FROM tsoracle.seq WHERE key = 'm'",
            &[],
        )
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

/// Readers that follow `xmin` (docs/operations/in-place.md, "Readers that follow xmin"): an
/// incremental sync that copies the rows whose `xmin` is past its cursor, and
/// `pg_xact_commit_timestamp(xmin)`. An advance made in place leaves the row's `xmin` and
/// commit timestamp as they were, so such a reader copies nothing until the row gets a new
/// version; an advance through the worker is one, and the reader then copies the counter as
/// it is, past every advance made in place before.
#[test]
fn readers_that_follow_xmin_see_only_row_versions() {
    let node =
        serving_node("readers-xmin", NodeOpts::new().setting("track_commit_timestamp", "on"));
    let mut su = node.connect();
    assert_eq!(seq_ok(&mut su, "m", 1), 0, "a new key starts at 0");
    let (xmin, committed, next) = xmin_view(&mut su);
    let commits = group_commits(&mut su);
    let ends = twenty_blocks(&mut su, "m");
    assert_eq!(group_commits(&mut su), commits, "served in place");
    let (xmin_after, committed_after, next_after) = xmin_view(&mut su);
    assert_eq!(next_after, *ends.last().unwrap(), "the counter advanced");
    assert_eq!(
        (xmin_after, &committed_after),
        (xmin, &committed),
        "an advance in place left xmin and its commit timestamp as they were (next {next} -> {next_after})"
    );
    let copied: i64 = su
        .query_one("SELECT count(*) FROM tsoracle.seq WHERE xmin::text::bigint > $1", &[&xmin])
        .unwrap()
        .get(0);
    assert_eq!(copied, 0, "an incremental sync by xmin copies nothing new");
    // Through the worker: a row version, which the reader copies with every advance before it.
    exec(&mut su, "SET tsoracle.seq_in_place = off");
    let start = seq_ok(&mut su, "m", 1);
    let (xmin_worker, committed_worker, next_worker) = xmin_view(&mut su);
    assert_eq!((start, next_worker), (next_after, next_after + 1));
    assert!(xmin_worker > xmin, "a row version has a new xmin");
    assert_ne!(committed_worker, committed, "and a new commit timestamp");
    let copied: Vec<i64> = su
        .query("SELECT next FROM tsoracle.seq WHERE xmin::text::bigint > $1", &[&xmin])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(copied, vec![next_worker], "the sync copies the counter as it is");
}
