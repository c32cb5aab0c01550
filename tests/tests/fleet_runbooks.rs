//! The fleet's runbooks (docs/operations/fleet/join.md, leave.md, oracle-pitr.md), each run
//! from its page's own code blocks (`tsoracle_tests::runbook`: the blocks marked
//! `<!-- runbook: NAME step=N -->`, run as written, with `$CLUSTER`, `$ORACLE` and `$OLD` set
//! to connection strings), under load. The steps a page writes in prose (a restart, a
//! restore) are the harness's. Each test first checks that the page has exactly the blocks it
//! drives, so a block added, dropped or moved on the page fails it:
//!
//! - a standalone cluster joins a fleet: `tso_handover()` on it, the oracle seeded above its
//!   high-water and its counters copied there, then `tsoracle.oracle` set and a restart. Its
//!   own history is one order before and after (every timestamp unique, each call above every
//!   call that ended before it began), the fleet's history with it after the join too, and
//!   each of its counters continues without a block granted twice;
//! - a cluster that joined without the oracle seeded or its counters copied (the runbook's
//!   dangerous steps skipped) refuses to hand out what would repeat its own values (`55000`,
//!   with the HINT that fixes it), and serves once the oracle is seeded and the counters
//!   copied;
//! - a member leaves: `tso_handover()` on it, the oracle's high-water and counters copied into
//!   its own tables, the mark of a member (`tsoracle.member_oracle`) deleted,
//!   `tsoracle.oracle` deleted from its configuration file and a restart. As a standalone
//!   cluster it goes on above everything it handed out as a member (the fleet runs a minute
//!   ahead of the clock, so a leave without the copy would go back), and its counters
//!   continue above its blocks;
//! - the oracle is restored to a point in time while the old one is still readable:
//!   `tso_handover()` on the old oracle, the restored one started with `tsoracle.database`
//!   naming a database without the extension, so that it serves nothing — no timestamp, no
//!   block — until the old one's high-water and counters are copied in and it restarts; the
//!   members pointed at it. The fleet goes on above everything it handed out;
//! - every runbook page parses (docs/operations/*.md and fleet/*.md: the switchover of
//!   logical-replication.md, uninstalling.md, replication.md's failover and relay.md's
//!   configuration file are run by bluegreen.rs, drops.rs, replication.rs and relay.rs), and a
//!   page whose blocks drift from what its test drives
//!   (a step dropped, renumbered, swapped, or of another language) is refused.
//!
//! Run with: `cargo test -p tsoracle-tests --test fleet_runbooks -- --test-threads=2`

use std::time::{Duration, Instant};

use postgres::error::SqlState;
use tsoracle_tests::backup::{
    prepare_archive_recovery, switch_and_archive, wait_recovery_end, RecoveryTarget, WalArchive,
};
use tsoracle_tests::fleet::{admit_members, copy_between, member, oracle_conninfo, MEMBER_ROLE};
use tsoracle_tests::history::check_calls;
use tsoracle_tests::runbook::{
    blocks_on, one_i64, pages, pages_dir, parse, printed_number, run_step, settings, timestamps_on,
    vars, Runbook, AHEAD, BOOKS, JOIN_STEPS, LEAVE_STEPS, PITR_STEPS,
};
use tsoracle_tests::{
    expect_sqlstate, pg_error_string, poll_until, serving_node, DenseHistory, History, Node,
    NodeOpts, StopMode,
};

/// The runbooks' copy of the counters, from the cluster that has them to the one that
/// continues them: merged (`GREATEST`) into what is there.
/// The joining cluster's own role on the oracle.
const JOIN_ROLE: &str = "member_join";

const COUNTERS: (&str, &str) = ("SELECT key, next FROM tsoracle.seq", "tsoracle.seq (key, next)");

/// A standalone cluster with timestamps and counters of its own joins a fleet by the runbook,
/// under load on itself, on the oracle and on another member.
#[test]
fn a_cluster_joins_a_fleet_by_the_runbook_under_load() {
    let book = Runbook::load("fleet/join.md", "join");
    book.expect_steps(JOIN_STEPS);
    let oracle = serving_node("join-oracle", NodeOpts::new());
    admit_members(&oracle);
    let conninfo = oracle_conninfo(&[oracle.port()], MEMBER_ROLE);
    let other = member("join-m2", &conninfo);
    let mut joining = serving_node("join-c", NodeOpts::new());
    // Its own timestamps run a minute ahead of the fleet's: without the oracle seeded above
    // them, the fleet would hand them out again.
    let mut c = joining.connect();
    one_i64(&mut c, &format!("SELECT tso_seed({AHEAD})"));

    let own = History::default();
    let fleet = History::default();
    let dense = DenseHistory::default();
    let keys = ["join-a", "join-b"];
    let loads = [timestamps_on(&oracle, &fleet), timestamps_on(&other, &fleet)];
    let own_load = timestamps_on(&joining, &own);
    let own_blocks = blocks_on(&joining, &keys, &dense);
    own.wait_progress(Instant::now(), 100, "the joining cluster serves on its own");

    drop(c);
    let vars = vars(&[("CLUSTER", &joining), ("ORACLE", &oracle)]);
    // 1. On the joining cluster: it issues nothing more, and the oracle is seeded above the
    //    high-water H that bounds all it issued.
    run_step(book.step(1), &joining, &vars);
    let high_water = one_i64(&mut joining.connect(), "SELECT physical_ms FROM tsoracle.high_water");
    expect_sqlstate(
        joining.connect().query_one("SELECT tso_next()", &[]),
        &SqlState::CANNOT_CONNECT_NOW,
        "a handed-over cluster",
    );
    let seeded = one_i64(&mut oracle.connect(), "SELECT physical_ms FROM tsoracle.high_water");
    assert!(seeded > high_water, "the oracle's high-water {seeded} is above {high_water}");
    // 2. The cluster's counters copied to the oracle.
    run_step(book.step(2), &joining, &vars);
    // 3. Admitted on the oracle, bound to a role of its own.
    oracle
        .connect()
        .batch_execute(&format!("CREATE ROLE {JOIN_ROLE} LOGIN IN ROLE tsoracle_member"))
        .unwrap();
    let mut with_role = vars.clone();
    with_role.push(("ROLE", JOIN_ROLE.to_string()));
    run_step(book.step(3), &joining, &with_role);
    // 4. tsoracle.oracle set, with its role, and a restart.
    let conninfo = oracle_conninfo(&[oracle.port()], JOIN_ROLE);
    joining.set_conf("tsoracle.oracle", &conninfo).expect("set tsoracle.oracle");
    joining.set_conf("tsoracle.extension_timeout_ms", 3000).expect("set the timeout");
    joining.restart(StopMode::Fast).expect("restart as a member");
    let joined = Instant::now();
    own.wait_progress_on(&["join-c"], joined, 200, "the cluster serves as a member");
    fleet.wait_progress(joined, 200, "the fleet serves on");
    std::thread::sleep(Duration::from_secs(2));

    own_load.stop_and_join();
    own_blocks.stop_and_join();
    for l in loads {
        l.stop_and_join();
    }
    let report = own.assert_valid();
    eprintln!("the joining cluster's own history: {report:?}");
    // The fleet with the member it gained: one order from the join on.
    let mut after: Vec<_> = fleet.calls();
    after.extend(own.calls().into_iter().filter(|call| call.start > joined));
    let report = check_calls(&after).unwrap_or_else(|v| panic!("the fleet after the join: {v}"));
    eprintln!("the fleet after the join: {report:?}");
    let dense_report = dense.check(None).unwrap_or_else(|v| panic!("counters: {v}"));
    for key in keys {
        let k = &dense_report.keys[key];
        assert!(k.ok_calls > 0, "{key}: no block granted: {k:?}");
    }
    let on_member =
        dense.calls().into_iter().filter(|call| call.start > joined && call.result.is_ok()).count();
    assert!(on_member > 0, "no block was granted through the oracle after the join");
    let errors: Vec<String> = own
        .calls()
        .into_iter()
        .filter(|call| call.start > joined)
        .filter_map(|call| call.result.err())
        .filter(|e| e.contains("55000"))
        .collect();
    assert!(errors.is_empty(), "refused after a join by the runbook: {errors:?}");
}

/// A cluster that joined without the oracle seeded above it, or without its counters copied:
/// nothing that repeats its own values is handed out; once the runbook's step 2 is done, it
/// serves above them.
#[test]
fn a_cluster_that_joined_without_the_runbook_hands_out_nothing_of_its_own_again() {
    let oracle = serving_node("join-bad-oracle", NodeOpts::new());
    admit_members(&oracle);
    let conninfo = oracle_conninfo(&[oracle.port()], MEMBER_ROLE);
    let mut joining = serving_node("join-bad-c", NodeOpts::new());
    let mut c = joining.connect();
    one_i64(&mut c, &format!("SELECT tso_seed({AHEAD})"));
    let own_last = one_i64(&mut c, "SELECT tso_next()");
    let own_next = one_i64(&mut c, "SELECT tso_seq('joined', 1000)") + 1000;
    drop(c);
    // Straight to steps 3 and 4.
    joining.stop(StopMode::Fast).expect("stop");
    tsoracle_tests::fleet::admit(&oracle, &joining, MEMBER_ROLE);
    joining.set_conf("tsoracle.oracle", &conninfo).expect("set tsoracle.oracle");
    joining.set_conf("tsoracle.extension_timeout_ms", 3000).expect("set the timeout");
    joining.start().expect("start as a member");
    let mut c = joining.connect();
    let e = expect_sqlstate(
        c.query_one("SELECT tso_next()", &[]),
        &SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
        "a timestamp the oracle issued below the cluster's own",
    );
    let text = pg_error_string(&e);
    assert!(text.contains("tso_seed("), "the HINT says how to seed the oracle: {text}");
    let e = expect_sqlstate(
        c.query_one("SELECT tso_seq('joined', 10)", &[]),
        &SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
        "a block below the cluster's own counter",
    );
    assert!(pg_error_string(&e).contains("tsoracle.seq"), "the HINT says what to copy");
    let e = expect_sqlstate(
        c.query_one("SELECT lease_id FROM tso_lease_acquire('h', 1, 5000)", &[]),
        &SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
        "a lease whose holder would stamp below the cluster's own timestamps",
    );
    drop(e);
    // A key the cluster never had is served.
    let fresh: i64 = one_i64(&mut c, "SELECT tso_seq('never-here', 5)");
    assert_eq!(fresh, 0, "a key of the fleet's own starts where the oracle has it");

    // The runbook's step 2, late: the member serves above its own values.
    let mut o = oracle.connect();
    let high_water: i64 =
        one_i64(&mut joining.connect(), "SELECT physical_ms FROM tsoracle.high_water");
    one_i64(&mut o, &format!("SELECT tso_seed({})", high_water + 1));
    copy_between(&joining, COUNTERS.0, &oracle, COUNTERS.1).expect("copy the counters");
    let ts = one_i64(&mut c, "SELECT tso_next()");
    assert!(ts > own_last, "the member's {ts} is above the cluster's own {own_last}");
    let block = one_i64(&mut c, "SELECT tso_seq('joined', 10)");
    assert!(block >= own_next, "block {block} starts at or above the own counter's {own_next}");
}

/// A member leaves its fleet by the runbook, under load on itself and on another member.
#[test]
fn a_member_leaves_its_fleet_by_the_runbook_under_load() {
    let book = Runbook::load("fleet/leave.md", "leave");
    book.expect_steps(LEAVE_STEPS);
    let oracle = serving_node("leave-oracle", NodeOpts::new());
    admit_members(&oracle);
    let conninfo = oracle_conninfo(&[oracle.port()], MEMBER_ROLE);
    let other = member("leave-m2", &conninfo);
    let mut leaving = member("leave-m1", &conninfo);
    // The fleet's timestamps run a minute ahead of the clock: a cluster that left without
    // the oracle's high-water would go on below what it handed out as a member.
    one_i64(&mut oracle.connect(), &format!("SELECT tso_seed({AHEAD})"));

    let own = History::default();
    let fleet = History::default();
    let dense = DenseHistory::default();
    let keys = ["leave-a", "leave-b"];
    let fleet_load = timestamps_on(&other, &fleet);
    let own_load = timestamps_on(&leaving, &own);
    let own_blocks = blocks_on(&leaving, &keys, &dense);
    own.wait_progress(Instant::now(), 200, "the member serves");
    // The member keeps the last block of each counter it handed out (when it publishes R).
    let counters = "SELECT count(*) FROM tsoracle.member_counter";
    poll_until("the member keeps its blocks", Duration::from_secs(20), || {
        (one_i64(&mut leaving.connect(), counters) > 0).then_some(())
    });

    let vars = vars(&[("CLUSTER", &leaving), ("ORACLE", &oracle)]);
    // 1. On the member: it hands out nothing more.
    let handed_over = printed_number(&run_step(book.step(1), &leaving, &vars));
    let mut c = leaving.connect();
    let left = Instant::now();
    let last_as_member = own.max_value().expect("the member issued");
    assert!(
        handed_over >= last_as_member >> 18,
        "tso_handover() on a member ({handed_over}) bounds what it handed out ({})",
        last_as_member >> 18
    );
    expect_sqlstate(
        c.query_one("SELECT tso_next()", &[]),
        &SqlState::CANNOT_CONNECT_NOW,
        "a handed-over member",
    );
    drop(c);
    // 2. The oracle's high-water and counters, copied into the member's own tables.
    run_step(book.step(2), &leaving, &vars);
    let own_high_water = one_i64(
        &mut leaving.connect(),
        "SELECT COALESCE(max(physical_ms), 0) FROM tsoracle.high_water",
    );
    assert!(
        own_high_water >= last_as_member >> 18,
        "the copied high-water bounds the member's values"
    );
    // 3. The mark of a member deleted (without it, the cluster refuses to serve on its own).
    //    And the counters' last blocks it kept as a member, which its own counters now hold.
    run_step(book.step(3), &leaving, &vars);
    let marks = one_i64(&mut leaving.connect(), "SELECT count(*) FROM tsoracle.member_oracle");
    assert_eq!(marks, 0, "the mark of a member is deleted");
    assert_eq!(one_i64(&mut leaving.connect(), counters), 0, "its kept blocks are deleted");
    // 4. tsoracle.oracle deleted from the configuration file that set it (the harness's), and
    //    a restart: a standalone cluster.
    leaving.unset_conf("tsoracle.oracle").expect("delete tsoracle.oracle");
    leaving.restart(StopMode::Fast).expect("restart standalone");
    let mut c = leaving.connect();
    let oracle_setting: String = c.query_one("SHOW tsoracle.oracle", &[]).unwrap().get(0);
    assert_eq!(oracle_setting, "", "tsoracle.oracle is cleared");
    let role: String = c.query_one("SELECT role FROM tso_status()", &[]).unwrap().get(0);
    assert_eq!(role, "primary", "the cluster left the fleet");
    drop(c);
    own.wait_progress(left, 200, "the cluster serves on its own");
    std::thread::sleep(Duration::from_secs(2));

    own_load.stop_and_join();
    own_blocks.stop_and_join();
    fleet_load.stop_and_join();
    let report = own.assert_valid();
    eprintln!("the leaving cluster's history: {report:?}");
    fleet.assert_valid();
    let first_own = own
        .calls()
        .into_iter()
        .filter(|call| call.start > left)
        .filter_map(|call| call.first())
        .min()
        .expect("served after the leave");
    assert!(first_own > last_as_member, "{first_own} after the leave, {last_as_member} before");
    let dense_report = dense.check(None).unwrap_or_else(|v| panic!("counters: {v}"));
    for key in keys {
        assert!(dense_report.keys[key].ok_calls > 0, "{key}: no block granted");
    }
    let after = dense.calls().into_iter().filter(|c| c.start > left && c.result.is_ok()).count();
    assert!(after > 0, "no block was granted after the leave");
}

/// The oracle of a fleet restored from its base backup and WAL archive to a point in time
/// (PITR), while the old oracle is still readable (a bad change is being undone): the fleet
/// goes on through the restored oracle above everything it handed out, and its counters above
/// every block, though the restored WAL lacks the last of them.
#[test]
fn the_oracle_restored_to_a_point_in_time_serves_its_fleet_above_everything() {
    let book = Runbook::load("fleet/oracle-pitr.md", "oracle-pitr");
    book.expect_steps(PITR_STEPS);
    let keep_off = settings(book.step(2)).unwrap_or_else(|e| panic!("{e}"));
    assert!(!keep_off.is_empty(), "step 2 sets something");
    let archive = WalArchive::new("pitr-oracle-archive").expect("archive directory");
    let mut oracle =
        Node::start_new("pitr-oracle", archive.archiving(NodeOpts::new())).expect("the oracle");
    oracle.create_extension().expect("CREATE EXTENSION on the oracle");
    admit_members(&oracle);
    let mut restored = Node::base_backup_from(&oracle, "pitr-restored").expect("pg_basebackup");
    let mut m = member("pitr-m", &oracle_conninfo(&[oracle.port()], MEMBER_ROLE));

    let history = History::default();
    let dense = DenseHistory::default();
    let keys = ["pitr-a", "pitr-b"];
    let load = timestamps_on(&m, &history);
    let blocks = blocks_on(&m, &keys, &dense);
    history.wait_progress(Instant::now(), 200, "the member serves");
    let target_time: String = oracle
        .connect()
        .query_one("SELECT clock_timestamp()::text", &[])
        .expect("the target time")
        .get(0);
    let noted = Instant::now();
    // Values handed out after the target, a minute ahead of the clock: the restored WAL does
    // not have them, and a restored oracle left at the target would issue them again. (After
    // blocks were committed past the target: recovery stops at the first commit past it,
    // and replays the high-water's in-place raises written before that commit.)
    std::thread::sleep(Duration::from_millis(500));
    one_i64(&mut oracle.connect(), &format!("SELECT tso_seed({AHEAD})"));
    history.wait_progress(noted, 300, "the member serves past the target");
    std::thread::sleep(Duration::from_secs(2));

    // 1. The old oracle stops: the whole fleet hands out nothing more.
    let high_water = printed_number(&run_step(
        book.step(1),
        &oracle,
        &vars(&[("OLD", &oracle), ("ORACLE", &restored)]),
    ));
    let stopped = Instant::now();
    // 2. The oracle restored to the target, beside it, with the settings of the page's step 2
    //    in its configuration before it starts.
    switch_and_archive(&oracle).expect("archive the WAL");
    prepare_archive_recovery(&mut restored, &archive, &RecoveryTarget::Time(target_time))
        .expect("prepare the recovery");
    for (name, value) in &keep_off {
        restored.set_conf(name, value).expect("step 2's setting");
    }
    restored.start().expect("start the recovery");
    wait_recovery_end(&restored).expect("the recovery ends");
    // Until the copy, the restored oracle serves nothing: its WAL lacks the blocks granted
    // after the target, and a block granted now would be granted twice.
    let mut r = restored.connect();
    let state: String = r.query_one("SELECT state FROM tso_status()", &[]).unwrap().get(0);
    assert_ne!(state, "serving", "the restored oracle serves before the copy");
    expect_sqlstate(
        r.query_one("SELECT tso_next()", &[]),
        &SqlState::CANNOT_CONNECT_NOW,
        "tso_next() before the copy",
    );
    let before: i64 = one_i64(&mut r, "SELECT next FROM tsoracle.seq WHERE key = 'pitr-a'");
    let e = r.query_one("SELECT tso_seq('pitr-a', 1)", &[]).expect_err("a block before the copy");
    let code = e.code().cloned();
    assert!(
        code == Some(SqlState::CANNOT_CONNECT_NOW) || code == Some(SqlState::from_code("40003")),
        "a block before the copy: {}",
        pg_error_string(&e)
    );
    let after: i64 = one_i64(&mut r, "SELECT next FROM tsoracle.seq WHERE key = 'pitr-a'");
    assert_eq!(after, before, "no block of pitr-a was granted before the copy");
    drop(r);
    // 3. The old oracle's high-water (and epoch) and counters, merged into the restored one.
    run_step(book.step(3), &oracle, &vars(&[("OLD", &oracle), ("ORACLE", &restored)]));
    // Step 2's settings deleted again, and a restart: the fence starts above the copy.
    for (name, _) in &keep_off {
        restored.unset_conf(name).expect("delete step 2's setting");
    }
    restored.restart(StopMode::Fast).expect("restart the restored oracle");
    restored.wait_serving().expect("the restored oracle serves");
    poll_until(
        &format!("the restored oracle's high-water above the old one's {high_water}"),
        Duration::from_secs(30),
        || {
            let row = restored.connect().query_one("SELECT high_water_ms FROM tso_status()", &[]);
            let restored_high_water: Option<i64> =
                row.unwrap_or_else(|e| panic!("tso_status(): {}", pg_error_string(&e))).get(0);
            restored_high_water.filter(|&hw| hw > high_water)
        },
    );
    // 5. The old oracle stopped; the members pointed at the restored one, and restarted.
    oracle.stop(StopMode::Fast).expect("stop the old oracle");
    m.set_conf("tsoracle.oracle", oracle_conninfo(&[restored.port()], MEMBER_ROLE))
        .expect("point the member at the restored oracle");
    m.restart(StopMode::Fast).expect("restart the member");
    history.wait_progress(stopped, 200, "the member serves through the restored oracle");
    std::thread::sleep(Duration::from_secs(1));

    load.stop_and_join();
    blocks.stop_and_join();
    let report = history.assert_valid();
    eprintln!("the member across the oracle's PITR: {report:?}");
    let dense_report = dense.check(None).unwrap_or_else(|v| panic!("counters: {v}"));
    for key in keys {
        assert!(dense_report.keys[key].ok_calls > 0, "{key}: no block granted");
    }
    let after = dense.calls().into_iter().filter(|c| c.start > stopped && c.result.is_ok()).count();
    assert!(after > 0, "no block was granted through the restored oracle");
}

/// Every runbook page parses; each runbook's blocks are the ones its test above drives; and
/// a page mutated in any of its dangerous steps — a block dropped, two steps swapped, a step
/// renumbered, a block of another language — is refused before anything runs.
#[test]
fn the_runbook_pages_are_what_the_tests_run_and_a_drifted_page_is_refused() {
    for path in pages() {
        let text = std::fs::read_to_string(&path).unwrap();
        parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    for &(page, name, want) in BOOKS {
        let path = pages_dir().join(page);
        let text = std::fs::read_to_string(&path).unwrap();
        Runbook::from_text(&text, name, path.clone()).expect_steps(want);
        for (i, &(step, lang)) in want.iter().enumerate() {
            let marker = format!("<!-- runbook: {name} step={step} -->");
            assert_eq!(text.matches(&marker).count(), 1, "{page}: {marker}");
            let drifted = |t: String, what: &str| {
                let book = Runbook::from_text(&t, name, path.clone());
                assert!(
                    book.check_steps(want).is_err(),
                    "{page}: step {step} {what} is not caught"
                );
            };
            drifted(text.replace(&marker, ""), "dropped");
            drifted(
                text.replace(&marker, &format!("<!-- runbook: {name} step={} -->", step + 10)),
                "renumbered",
            );
            let fences = ["", "   ", "     "].map(|indent| format!("{marker}\n{indent}```{lang}"));
            let fence = fences.iter().find(|f| text.contains(f.as_str()));
            let fence = fence.unwrap_or_else(|| panic!("{page}: {marker} is not on its fence"));
            drifted(
                text.replace(fence, &fence.replace(&format!("```{lang}"), "```text")),
                "of another language",
            );
            if let Some(&(next, _)) = want.get(i + 1) {
                let other = format!("<!-- runbook: {name} step={next} -->");
                let swapped =
                    text.replace(&marker, "@@").replace(&other, &marker).replace("@@", &other);
                drifted(swapped, "swapped with the next");
            }
        }
    }
}
