//! A member's own life in a fleet (issue 54, docs/fleet.md): what a member hands out is never
//! handed out again by a cluster that has been that member.
//!
//! - a member's streaming standby, promoted without `tsoracle.oracle` in its own
//!   configuration (only the primary was set up), refuses to serve on its own (`55000`, the
//!   HINT naming the runbook to leave a fleet; `tso_status()` says `refused`), and hands out no
//!   block the fleet granted through the member; once the runbook to leave a fleet is followed
//!   on it (the oracle's high-water and counters copied in, `tsoracle.member_oracle` emptied),
//!   it serves on its own, above every block handed out;
//! - a member whose commit of a lease grant is cut short during its wait for the synchronous
//!   standbys (`pg_terminate_backend` of its worker) never hands that lease out;
//! - a member that missed the oracle's failover (its `tsoracle.member_oracle` row deleted, then
//!   restarted), served by the deposed primary brought back by hand, hands out nothing at or
//!   below what it handed out before: the deposed primary's answers, below the member's own
//!   past (kept in its own `tsoracle.high_water`, and its counters' last blocks in
//!   `tsoracle.member_counter`), are refused `55000`, each with its HINT whole (over 240
//!   bytes, where the member's shared memory used to cut it);
//! - a counter dropped on the oracle, or through the member, starts again at 0 on a member
//!   that handed out blocks of it, after the member's restart too (the key's incarnation,
//!   `tsoracle.seq.made`, is higher);
//! - a lease whose answer was lost (the oracle's worker paused past the member's
//!   `tsoracle.extension_timeout_ms`: `40003`, granted later), acquired again by its holder at
//!   the same epoch once the member's `R` has passed its lowest stamp, comes back renewed: its
//!   `ts_lower_bound` above the member's `R`.
//!
//! - an unpromoted copy of a member (its files copied while it runs, started as a primary on
//!   the same timeline) that takes the member's entry over while the original's session is
//!   silent and the original holds a value: the entry is held, `R_f` stays below the value
//!   until a superuser releases it, across the oracle's restart (the hold is kept in
//!   `tsoracle.fleet_member`); a clean restart of the member is not held;
//! - clean restarts of a member while its oracle is down, which the oracle never hears of,
//!   hold nothing once it is back;
//! - a member whose identity a promoted copy captured while it was down is refused `55006`,
//!   and takes its entry back by docs/operations/fleet/take-back.md, run as written.
//!
//! Run with: `cargo test -p tsoracle-tests --test fleet_members -- --test-threads=2`

use std::time::{Duration, Instant};

use postgres::error::SqlState;
use tsoracle_tests::cluster::{make_sync, promote, wait_replayed};
use tsoracle_tests::debian::DebianCluster;
use tsoracle_tests::fleet::{
    admit_members, copy_between, member, member_opts, oracle_conninfo, MEMBER_ROLE,
};
use tsoracle_tests::fleet_load::system_identifier;
use tsoracle_tests::runbook::{run_step, vars, Runbook, TAKE_BACK_STEPS};
use tsoracle_tests::tso::now_ms;
use tsoracle_tests::{pg_error_string, poll_until, serving_node, Node, NodeOpts, StopMode};

/// A member's standby promoted without the setting refuses to serve alone until the cluster
/// has left the fleet by the runbook.
#[test]
fn a_members_standby_promoted_without_the_setting_serves_nothing_alone() {
    let oracle = serving_node("alone-oracle", NodeOpts::new());
    admit_members(&oracle);
    let conninfo = oracle_conninfo(&[oracle.port()], MEMBER_ROLE);
    let mut m = member("alone-m", &conninfo);
    // Its standby's own configuration lacks tsoracle.oracle: only the primary was set up.
    let mut standby = Node::base_backup_from(&m, "alone-ms").expect("pg_basebackup");
    standby.unset_conf("tsoracle.oracle").expect("the standby's own configuration");
    standby.start().expect("start the member's standby");

    // 20 blocks through the member: 0..200, granted by the oracle.
    let mut c = m.connect();
    let mut handed_out = 0i64;
    for _ in 0..20 {
        let start: i64 = c
            .query_one("SELECT tso_seq('k', 10)", &[])
            .unwrap_or_else(|e| panic!("tso_seq on the member: {}", pg_error_string(&e)))
            .get(0);
        handed_out = handed_out.max(start + 10);
    }
    let last_ts: i64 = c.query_one("SELECT tso_next()", &[]).expect("tso_next").get(0);
    drop(c);
    wait_replayed(&m, &standby).expect("the standby replays the member's tables");
    m.stop(StopMode::Fast).expect("stop the member's primary");
    promote(&standby).expect("promote the member's standby");

    // Every call refused, none returning a value, until the worker's refusal is 55000.
    let mut s = standby.connect();
    let refused = poll_until("the promoted standby refuses 55000", Duration::from_secs(30), || {
        match s.query_one("SELECT tso_seq('k', 10)", &[]) {
            Ok(row) => {
                let start: i64 = row.get(0);
                panic!("the promoted standby of a member handed out block {start} on its own");
            }
            Err(e) if e.code() == Some(&SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE) => Some(e),
            Err(_) => {
                std::thread::sleep(Duration::from_millis(100));
                None
            }
        }
    });
    let db = refused.as_db_error().expect("a server error");
    assert!(db.message().contains("member of a fleet"), "{}", pg_error_string(&refused));
    let hint = db.hint().unwrap_or_default();
    assert!(hint.contains("Leaving a fleet") && hint.contains("tsoracle.oracle"), "hint: {hint}");
    // The runbook's step 3 whole: its last blocks forgotten as well as its mark.
    assert!(
        hint.contains("docs/operations/fleet/leave.md")
            && hint.contains("DELETE FROM tsoracle.member_oracle")
            && hint.contains("DELETE FROM tsoracle.member_counter"),
        "hint: {hint}"
    );
    for sql in [
        "SELECT tso_next()",
        "SELECT tso_seq('k', 10)",
        "SELECT tso_seq('never-seen', 1)",
        "SELECT lease_id FROM tso_lease_acquire_bounds('h', 1, 10000)",
    ] {
        match s.query_one(sql, &[]) {
            Ok(row) => panic!("{sql} on a former member's standby: {:?}", row),
            Err(e) => assert_eq!(
                e.code(),
                Some(&SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE),
                "{sql}: {}",
                pg_error_string(&e)
            ),
        }
    }
    let (role, state, detail): (String, String, Option<String>) = s
        .query_one("SELECT role, state, detail FROM tso_status()", &[])
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .expect("tso_status()");
    assert_eq!((role.as_str(), state.as_str()), ("primary", "refused"), "{detail:?}");
    assert!(detail.unwrap_or_default().contains("member of a fleet"), "tso_status().detail");
    // Still refused a few seconds later: no timeout lets it serve.
    std::thread::sleep(Duration::from_secs(3));
    assert!(s.query_one("SELECT tso_seq('k', 1)", &[]).is_err(), "refused for good");

    // The runbook to leave a fleet (its primary is down: nothing to hand over): the oracle's
    // high-water and counters copied in, then the mark deleted. It serves on its own, above
    // every block and timestamp the member handed out.
    copy_between(
        &oracle,
        "SELECT physical_ms, 0 FROM tsoracle.high_water",
        &standby,
        "tsoracle.high_water (physical_ms, epoch)",
    )
    .expect("copy the high-water");
    copy_between(
        &oracle,
        "SELECT key, next FROM tsoracle.seq",
        &standby,
        "tsoracle.seq (key, next)",
    )
    .expect("copy the counters");
    s.batch_execute("DELETE FROM tsoracle.member_oracle").expect("delete the mark");
    let left = Instant::now();
    let start: i64 = poll_until("it serves on its own", Duration::from_secs(30), || {
        s.query_one("SELECT tso_seq('k', 10)", &[]).ok().map(|r| r.get(0))
    });
    assert!(start >= handed_out, "block {start} after the leave, {handed_out} handed out before");
    let ts: i64 = s.query_one("SELECT tso_next()", &[]).expect("tso_next alone").get(0);
    assert!(ts > last_ts, "{ts} after the leave, {last_ts} handed out before");
    eprintln!("served on its own {:?} after the mark was deleted", left.elapsed());
}

/// A member's commit of a lease grant whose wait for its synchronous standby is cut short by
/// `pg_terminate_backend` of its worker: the lease is not handed out.
#[test]
fn a_members_grant_cut_short_in_its_sync_wait_is_not_handed_out() {
    let oracle = serving_node("syncw-oracle", NodeOpts::new());
    admit_members(&oracle);
    let conninfo = oracle_conninfo(&[oracle.port()], MEMBER_ROLE);
    // A publication of R is a commit too: once a minute only, so that the lease's is the one
    // that waits.
    let opts = tsoracle_tests::fleet::member_opts(&conninfo)
        .setting("tsoracle.resolved_interval_ms", 60000);
    let mut m = serving_node("syncw-m", opts);
    let mut standby = Node::base_backup_from(&m, "syncw-ms").expect("pg_basebackup");
    standby.start().expect("start the member's standby");
    make_sync(&mut m, standby.name()).expect("synchronous standby");
    let mut c = m.connect();
    c.query_one("SELECT lease_id FROM tso_lease_acquire_bounds('warm', 1, 10000)", &[])
        .expect("a lease while the standby is there");
    standby.stop(StopMode::Immediate).expect("stop the standby: commits wait for it");

    let conn = m.conninfo();
    let call = std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&conn, postgres::NoTls).expect("connect");
        c.query_one("SELECT lease_id FROM tso_lease_acquire_bounds('cut', 1, 10000)", &[])
            .map(|r| r.get::<_, i64>(0))
    });
    // The worker waits in the grant's commit; a terminate ends that wait with a WARNING.
    std::thread::sleep(Duration::from_millis(1500));
    let worker = m.worker_pid();
    let ended: bool = c
        .query_one("SELECT pg_terminate_backend($1)", &[&worker])
        .expect("terminate the member's worker")
        .get(0);
    assert!(ended, "the member's worker {worker} was there");
    match call.join().expect("the caller") {
        Ok(lease) => panic!("lease {lease} handed out from a commit its standby may lack"),
        Err(e) => eprintln!("refused: {}", pg_error_string(&e)),
    }
}

/// A member that missed the oracle's failover (its memory of the epoch gone: its
/// `tsoracle.member_oracle` row deleted and the member restarted) is served by the deposed
/// primary brought back by hand. The new primary ran an hour ahead, so the deposed one answers
/// below what the member handed out: refused, nothing handed out at or below it.
#[test]
fn a_member_that_missed_the_epoch_hands_out_nothing_below_its_past() {
    let mut old = serving_node("past-old", NodeOpts::new());
    admit_members(&old);
    let mut new = Node::base_backup_from(&old, "past-new").expect("pg_basebackup");
    new.start().expect("start the oracle's standby");
    let mut m = member("past-m", &oracle_conninfo(&[old.port(), new.port()], MEMBER_ROLE));
    let mut c = m.connect();
    let before: i64 = c.query_one("SELECT tso_next()", &[]).expect("tso_next").get(0);
    let seq = |c: &mut postgres::Client| -> i64 {
        c.query_one("SELECT tso_seq('k', 10)", &[]).expect("tso_seq").get(0)
    };
    // Blocks of counter k from the old primary, the deposed primary's counter ends there.
    for _ in 0..3 {
        seq(&mut c);
    }
    tsoracle_tests::cluster::wait_replayed(&old, &new).expect("replayed");
    old.stop(StopMode::Fast).expect("stop the oracle's primary");
    promote(&new).expect("promote the oracle's standby");
    let ahead = now_ms() + 3_600_000;
    new.connect().execute("SELECT tso_seed($1::bigint)", &[&ahead]).expect("tso_seed");
    let mut highest: i64 =
        poll_until("the member serves from the new primary", Duration::from_secs(30), || {
            c.query_one("SELECT tso_next()", &[]).ok().map(|r| r.get(0))
        });
    assert!(highest > before && highest >> 18 >= ahead, "{highest} from the seeded primary");
    for _ in 0..10 {
        highest = highest.max(c.query_one("SELECT tso_next()", &[]).expect("tso_next").get(0));
    }
    // Blocks from the new primary, above the deposed one's counter.
    let mut counter_end = 0;
    for _ in 0..3 {
        counter_end = seq(&mut c) + 10;
    }
    // The member keeps a bound of what it handed out in its own high-water (it lags by an
    // interval of tsoracle.resolved_interval_ms). Waited for, not asserted: what is checked is
    // what the member hands out below.
    let waited = Instant::now();
    while waited.elapsed() < Duration::from_secs(10) {
        let kept: Option<i64> = c
            .query_opt("SELECT physical_ms FROM tsoracle.high_water", &[])
            .expect("the member's high-water")
            .map(|r| r.get(0));
        let counter: Option<i64> = c
            .query_opt("SELECT next FROM tsoracle.member_counter WHERE key = 'k'", &[])
            .expect("the member's counters")
            .map(|r| r.get(0));
        if kept.is_some_and(|k| k >= (highest >> 18) - 1) && counter == Some(counter_end) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    // The new primary gone, the member's memory of its epoch deleted, the old primary back
    // read-write at its old epoch, the member restarted.
    new.stop(StopMode::Fast).expect("stop the new primary");
    c.batch_execute("DELETE FROM tsoracle.member_oracle").expect("forget the epoch");
    drop(c);
    old.start().expect("start the deposed primary, as a primary");
    old.wait_serving().expect("the deposed primary serves its own clients");
    m.restart(StopMode::Fast).expect("restart the member");
    let mut c = m.connect();
    let started = Instant::now();
    let mut refused = None;
    let mut counter_refused = None;
    while started.elapsed() < Duration::from_secs(10) {
        match c.query_one("SELECT tso_seq('k', 10)", &[]) {
            Ok(row) => {
                let start: i64 = row.get(0);
                assert!(start >= counter_end, "block {start} of k, below {counter_end} handed out");
            }
            Err(e) if e.code() == Some(&SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE) => {
                counter_refused = Some(message_and_hint(&e));
            }
            Err(_) => {}
        }
        for sql in [
            "SELECT tso_next()",
            "SELECT ts_lower_bound FROM tso_lease_acquire_bounds('p', 1, 10000)",
        ] {
            match c.query_one(sql, &[]) {
                Ok(row) => {
                    let v: i64 = row.get(0);
                    let v = if sql.contains("lease") { v << 18 } else { v };
                    panic!("{sql} handed out {v}, at or below {highest} handed out before");
                }
                Err(e) => {
                    if e.code() == Some(&SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE) {
                        refused = Some(message_and_hint(&e));
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let (refused, hint) = refused.expect("the deposed primary's answers refused 55000");
    assert!(refused.contains("high-water"), "{refused}");
    // Each HINT whole (longer than 240 bytes, where a member's shared memory used to cut it).
    let high_water: u64 = number_after(&refused, "own high-water ");
    assert_eq!(
        hint,
        format!("If the oracle answering is a deposed primary brought back, stop it: only the oracle's current primary may serve. Otherwise seed the oracle above this cluster's own values: SELECT tso_seed({}) on the oracle (docs/operations/fleet/join.md, \"Joining a fleet\").", high_water + 1),
        "the HINT of timestamps below the member's own past, whole"
    );
    let (counter_refused, hint) =
        counter_refused.expect("the deposed primary's block of k refused 55000");
    assert!(counter_refused.contains("handed out as a member"), "{counter_refused}");
    let end: u64 = number_after(&counter_refused, "up to ");
    assert_eq!(
        hint,
        format!("If the oracle answering is a deposed primary brought back, or a copy restored from a backup, stop it: only the oracle's current primary may serve. If it was restored on purpose, raise its counter above every block the members handed out (this member's ends at {end}; take the highest next of the key in every member's tsoracle.member_counter: UPDATE tsoracle.seq SET next = GREATEST(next, <highest>) WHERE key = 'k' on the oracle), then delete the key's row here (DELETE FROM tsoracle.member_counter WHERE key = 'k') and restart this member."),
        "the HINT of a block below what the member handed out, whole"
    );
    // The deposed primary's epoch is below the new one's, which the member no longer knows:
    // only its own past refuses it.
    let epoch: i64 =
        c.query_one("SELECT oracle_epoch FROM tso_member_status()", &[]).expect("status").get(0);
    eprintln!("refused at the deposed primary's epoch {epoch}: {refused}");
}

/// An error's message and HINT (empty if none).
fn message_and_hint(e: &postgres::Error) -> (String, String) {
    let db = e.as_db_error().unwrap_or_else(|| panic!("not a server's error: {e}"));
    (db.message().to_string(), db.hint().unwrap_or_default().to_string())
}

/// The number that follows `after` in `text`.
fn number_after(text: &str, after: &str) -> u64 {
    let at = text.find(after).unwrap_or_else(|| panic!("no {after:?} in {text}")) + after.len();
    let digits: String = text[at..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().unwrap_or_else(|_| panic!("no number after {after:?} in {text}"))
}

/// The lost lease: a member's `tso_lease_acquire_bounds('lost', 1, 60000)` while the
/// oracle's worker is paused 2.3 s (the member's `tsoracle.extension_timeout_ms` is 2 s) fails
/// `40003`, and the oracle grants it once its worker goes on. Acquired again by its holder at
/// the same epoch 7 s later, once the member's `R` has passed that grant's lowest stamp, it
/// comes back with its lowest stamp above `R`: a row its holder stamps at it is never missed
/// by a reader of everything up to `R`.
#[test]
fn a_lease_whose_answer_was_lost_comes_back_above_r() {
    let oracle = serving_node("lostl-oracle", NodeOpts::new());
    admit_members(&oracle);
    let conninfo = oracle_conninfo(&[oracle.port()], MEMBER_ROLE);
    let m = serving_node(
        "lostl-m",
        member_opts(&conninfo).setting("tsoracle.extension_timeout_ms", 2000),
    );
    let mut c = m.connect();
    c.query_one("SELECT tso_next()", &[]).expect("warm");
    let worker = oracle.worker_pid();
    oracle.pause_pid(worker, true);
    let conn = m.conninfo();
    let call = std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&conn, postgres::NoTls).expect("connect");
        c.query_one("SELECT ts_lower_bound FROM tso_lease_acquire_bounds('lost', 1, 60000)", &[])
            .map(|r| r.get::<_, i64>(0))
    });
    std::thread::sleep(Duration::from_millis(2300));
    oracle.pause_pid(worker, false);
    match call.join().expect("the caller") {
        Ok(lb) => eprintln!("the first acquire was answered after all (lower bound {lb} ms)"),
        Err(e) => assert_eq!(
            e.code(),
            Some(&SqlState::T_R_STATEMENT_COMPLETION_UNKNOWN),
            "{}",
            pg_error_string(&e)
        ),
    }
    // The oracle granted it.
    let granted: i64 = poll_until("the oracle grants the lease", Duration::from_secs(10), || {
        let n: i64 = oracle
            .connect()
            .query_one("SELECT count(*) FROM tsoracle.lease WHERE holder = 'lost'", &[])
            .expect("the oracle's leases")
            .get(0);
        (n > 0).then_some(n)
    });
    assert_eq!(granted, 1);
    std::thread::sleep(Duration::from_secs(7));
    let r: i64 = c.query_one("SELECT tso_resolved()", &[]).expect("tso_resolved").get(0);
    let (lease, lb): (i64, i64) = c
        .query_one(
            "SELECT lease_id, ts_lower_bound FROM tso_lease_acquire_bounds('lost', 1, 60000)",
            &[],
        )
        .map(|row| (row.get(0), row.get(1)))
        .unwrap_or_else(|e| panic!("the holder acquires again: {}", pg_error_string(&e)));
    let r_after: i64 = c.query_one("SELECT tso_resolved()", &[]).expect("tso_resolved").get(0);
    assert!(
        lb << 18 > r,
        "lease {lease}: ts_lower_bound {lb} ms at or below the member's R {r} ({} ms)",
        r >> 18
    );
    assert!(lb << 18 > r_after, "R {r_after} passed the lease's lowest stamp {lb} ms");
}

/// An unpromoted copy of a member (its files copied while it runs, started as a primary on
/// the same timeline) takes the member's entry over once the original's session falls silent
/// (its worker paused past `tsoracle.extension_timeout_ms`), while the original holds a value
/// in an open transaction: the entry is held at the original's last report, so `R_f` never
/// passes that value, across the original coming back; a superuser releases the hold
/// (`tso_fleet_admit`) once the copy is gone. A clean restart of the member is not held.
#[test]
fn an_unpromoted_copy_never_lets_r_f_pass_what_its_original_holds() {
    let mut oracle = serving_node("copy-oracle", NodeOpts::new());
    admit_members(&oracle);
    let mut m = member("copy-m", &oracle_conninfo(&[oracle.port()], MEMBER_ROLE));
    let id = system_identifier(&mut m.connect());
    let mut o = oracle.connect();
    let rf = |o: &mut postgres::Client| -> i64 {
        o.query_one("SELECT tso_fleet_resolved()", &[]).unwrap().get(0)
    };
    // A clean restart: its entry moves past what it takes afterwards (not held).
    let _: i64 = m.connect().query_one("SELECT tso_next()", &[]).unwrap().get(0);
    m.restart(StopMode::Fast).expect("a clean restart of the member");
    let after: i64 = poll_until("served after a clean restart", Duration::from_secs(30), || {
        m.connect().query_one("SELECT tso_next()", &[]).ok().map(|r| r.get(0))
    });
    poll_until("R_f passes a value taken after the restart", Duration::from_secs(20), || {
        let _: i64 = m.connect().query_one("SELECT tso_next()", &[]).unwrap().get(0);
        (rf(&mut o) >= after).then_some(())
    });

    let mut holder = m.connect();
    holder.batch_execute("BEGIN").unwrap();
    let held: i64 = holder.query_one("SELECT tso_next()", &[]).unwrap().get(0);
    let mut copy = Node::base_backup_from(&m, "copy-c").expect("pg_basebackup of the member");
    // Started as a primary, not as a standby: the snapshot's crash recovery, same timeline.
    std::fs::remove_file(copy.datadir().join("standby.signal")).expect("no standby.signal");
    let worker = m.worker_pid();
    m.pause_pid(worker, true);
    std::thread::sleep(Duration::from_millis(3500));
    copy.start().expect("start the copy as a primary");
    let timeline: i32 = copy
        .connect()
        .query_one("SELECT timeline_id FROM pg_control_checkpoint()", &[])
        .unwrap()
        .get(0);
    assert_eq!(timeline, 1, "the copy was not promoted");
    let served: i64 = poll_until("the copy is served", Duration::from_secs(30), || {
        copy.connect().query_one("SELECT tso_next()", &[]).ok().map(|r| r.get(0))
    });
    assert!(served > held);
    for _ in 0..12 {
        let _: i64 = copy.connect().query_one("SELECT tso_next()", &[]).unwrap().get(0);
        let now = rf(&mut o);
        assert!(now < held, "R_f {now} passed {held}, which the original still holds");
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        oracle.log_contents().contains("does not prove that the run before it"),
        "the oracle says why the entry is held: {}",
        oracle.log_tail(20)
    );
    // The hold is kept on the oracle, not only in its memory: its restart forgets neither
    // the hold nor which run speaks.
    let kept = held_at(&mut o, id).expect("tsoracle.fleet_member.held_at is set");
    assert!(kept < held, "held at {kept}, not below the value {held} the original holds");
    // The copy gone, the oracle restarted, the original back: still held, until a superuser
    // releases it.
    copy.stop(StopMode::Immediate).expect("stop the copy");
    drop(o);
    oracle.restart(StopMode::Fast).expect("restart the oracle");
    let mut o = oracle.connect();
    assert_eq!(held_at(&mut o, id), Some(kept), "the hold after the oracle's restart");
    m.pause_pid(worker, false);
    holder.batch_execute("COMMIT").unwrap();
    poll_until("the original is served again", Duration::from_secs(30), || {
        m.connect().query_one("SELECT tso_next()", &[]).ok().map(|r| r.get::<_, i64>(0))
    });
    for _ in 0..4 {
        let _: i64 = m.connect().query_one("SELECT tso_next()", &[]).unwrap().get(0);
        let now = rf(&mut o);
        assert!(now < held, "R_f {now} moved past the hold before a superuser released it");
        std::thread::sleep(Duration::from_millis(250));
    }
    let released: bool =
        o.query_one("SELECT tso_fleet_admit($1)", &[&id]).expect("tso_fleet_admit").get(0);
    assert!(released, "tso_fleet_admit() releases a held entry");
    assert_eq!(held_at(&mut o, id), None, "the release is durable when tso_fleet_admit() returns");
    poll_until("R_f passes the value once released", Duration::from_secs(20), || {
        let _: i64 = m.connect().query_one("SELECT tso_next()", &[]).unwrap().get(0);
        (rf(&mut o) >= held).then_some(())
    });
}

/// Where member `id`'s entry is held, as the oracle keeps it (`None`: not held).
fn held_at(o: &mut postgres::Client, id: i64) -> Option<i64> {
    o.query_one("SELECT held_at FROM tsoracle.fleet_member WHERE system_id = $1", &[&id])
        .expect("tsoracle.fleet_member")
        .get(0)
}

/// Clean restarts of a member while its oracle is down (none of them heard by the oracle, which
/// keeps the run it knew) hold nothing once the oracle is back: each start proved the one before
/// it ended, so the member names the last run the oracle knew, and `R_f` passes what the member
/// takes afterwards, its entry never held.
#[test]
fn clean_restarts_while_the_oracle_is_down_hold_nothing() {
    let mut oracle = serving_node("quiet-oracle", NodeOpts::new());
    admit_members(&oracle);
    let mut m = member("quiet-m", &oracle_conninfo(&[oracle.port()], MEMBER_ROLE));
    let id = system_identifier(&mut m.connect());
    let _: i64 = m.connect().query_one("SELECT tso_next()", &[]).unwrap().get(0);
    oracle.stop(StopMode::Fast).expect("stop the oracle");
    for _ in 0..2 {
        m.restart(StopMode::Fast).expect("a clean restart of the member");
        // Its worker started (and read and kept its run) before the next restart.
        poll_until("the member tried its oracle", Duration::from_secs(30), || {
            let row = m.connect().query_one("SELECT last_error FROM tso_member_status()", &[]);
            row.ok()?.get::<_, Option<String>>(0).filter(|e| e.contains("connect")).map(|_| ())
        });
    }
    oracle.start().expect("start the oracle again");
    let mut o = oracle.connect();
    let after: i64 = poll_until("served once the oracle is back", Duration::from_secs(30), || {
        m.connect().query_one("SELECT tso_next()", &[]).ok().map(|r| r.get(0))
    });
    assert_eq!(held_at(&mut o, id), None, "a clean restart holds nothing: {}", oracle.log_tail(20));
    poll_until("R_f passes a value taken after the restarts", Duration::from_secs(20), || {
        let _: i64 = m.connect().query_one("SELECT tso_next()", &[]).unwrap().get(0);
        let rf: i64 = o.query_one("SELECT tso_fleet_resolved()", &[]).unwrap().get(0);
        (rf >= after).then_some(())
    });
    assert!(!oracle.log_contents().contains("does not prove that the run before it"));
}

/// A member whose identity a promoted copy captured while it was down for a restart is
/// refused `55006` while the copy speaks; docs/operations/fleet/take-back.md, run as written,
/// gives it its entry back: the copy stopped, the member served again, its entry released.
#[test]
fn a_member_whose_identity_a_promoted_copy_captured_takes_it_back_by_the_runbook() {
    let book = Runbook::load("fleet/take-back.md", "take-back");
    book.expect_steps(TAKE_BACK_STEPS);
    let oracle = serving_node("tb-oracle", NodeOpts::new());
    admit_members(&oracle);
    let mut m = member("tb-m", &oracle_conninfo(&[oracle.port()], MEMBER_ROLE));
    let before: i64 = m.connect().query_one("SELECT tso_next()", &[]).unwrap().get(0);
    let mut copy = Node::base_backup_from(&m, "tb-copy").expect("pg_basebackup");
    copy.start().expect("start the copy");
    wait_replayed(&m, &copy).expect("replayed");
    m.stop(StopMode::Fast).expect("the member stops for a restart");
    promote(&copy).expect("promote the copy");
    poll_until("the copy is served under the member's identity", Duration::from_secs(60), || {
        copy.connect().query_one("SELECT tso_next()", &[]).ok().map(|r| r.get::<_, i64>(0))
    });
    m.start().expect("the member starts again");
    poll_until("the member is refused 55006", Duration::from_secs(30), || {
        let e: Option<String> = m
            .connect()
            .query_one("SELECT last_error FROM tso_member_status()", &[])
            .unwrap()
            .get(0);
        e.filter(|e| e.contains("55006"))
    });
    assert!(m.connect().query_one("SELECT tso_next()", &[]).is_err(), "not served");

    // Its identity, as the page says to read it on the member.
    let id: i64 = m
        .connect()
        .query_one("SELECT member_id FROM tsoracle.member_identity", &[])
        .unwrap()
        .get(0);
    let mut v = vars(&[("ORACLE", &oracle), ("MEMBER", &m)]);
    v.push(("MEMBER_ID", id.to_string()));
    let speaking = run_step(book.step(1), &oracle, &v);
    assert!(speaking.contains(&id.to_string()), "{speaking}");
    // Step 2, as root on the copy's host: Debian's pg_ctlcluster, the copy registered for it.
    let registered = DebianCluster::register(&copy).expect("register the copy");
    v.push(registered.var());
    run_step(&registered.typed(book.step(2), "pg_ctlcluster 15 main", &copy), &copy, &v);
    poll_until("the copy stopped", Duration::from_secs(30), || (!copy.is_running()).then_some(()));
    poll_until("the member is served again", Duration::from_secs(30), || {
        (run_step(book.step(3), &m, &v).trim() == "t").then_some(())
    });
    let after: i64 = poll_until("it hands out values again", Duration::from_secs(30), || {
        m.connect().query_one("SELECT tso_next()", &[]).ok().map(|r| r.get(0))
    });
    assert!(after > before);
    let released = run_step(book.step(4), &oracle, &v);
    assert!(released.contains(" t"), "its entry was held, and is released: {released}");
    let mut o = oracle.connect();
    poll_until("R_f passes what the member took", Duration::from_secs(20), || {
        let _: i64 = m.connect().query_one("SELECT tso_next()", &[]).unwrap().get(0);
        let rf: i64 = o.query_one("SELECT tso_fleet_resolved()", &[]).unwrap().get(0);
        (rf >= after).then_some(())
    });
}

/// A counter dropped on the oracle (`tso_seq_drop()` there, or through the member) starts
/// again at 0 on a member that handed out blocks of it, after the member's restart too: the
/// key's new incarnation (`tsoracle.seq.made`) is above the one the member kept. The member
/// keeps the incarnation the oracle has (read with the counter, in place or by the worker).
#[test]
fn a_counter_dropped_on_the_oracle_starts_again_on_a_member() {
    let oracle = serving_node("drop-oracle", NodeOpts::new());
    admit_members(&oracle);
    let mut m = member("drop-m", &oracle_conninfo(&[oracle.port()], MEMBER_ROLE));
    let mut c = m.connect();
    let mut o = oracle.connect();
    let seq = |c: &mut postgres::Client| -> i64 {
        c.query_one("SELECT tso_seq('d', 5)", &[])
            .unwrap_or_else(|e| panic!("tso_seq('d', 5): {}", pg_error_string(&e)))
            .get(0)
    };
    // The incarnation kept with end `want`, once it is above `after`.
    let kept = |c: &mut postgres::Client, want: i64, after: i64| -> i64 {
        poll_until("the member keeps the block's end", Duration::from_secs(20), || {
            c.query_opt("SELECT made, next FROM tsoracle.member_counter WHERE key = 'd'", &[])
                .expect("the member's counters")
                .filter(|r| r.get::<_, i64>(1) == want && r.get::<_, i64>(0) > after)
                .map(|r| r.get::<_, i64>(0))
        })
    };
    let made = |o: &mut postgres::Client| -> i64 {
        o.query_one("SELECT made FROM tsoracle.seq WHERE key = 'd'", &[]).expect("made").get(0)
    };
    assert_eq!((seq(&mut c), seq(&mut c)), (0, 5));
    let first = kept(&mut c, 10, 0);
    assert_eq!(first, made(&mut o), "the member keeps the oracle's incarnation");

    o.execute("SELECT tso_seq_drop('d')", &[]).expect("drop the key on the oracle");
    assert_eq!(seq(&mut c), 0, "the key made again starts at 0 on the member");
    let second = kept(&mut c, 5, first);
    assert_eq!(second, made(&mut o));
    drop(c);
    m.restart(StopMode::Fast).expect("restart the member");
    let mut c = m.connect();
    assert_eq!(
        poll_until("the member serves", Duration::from_secs(30), || {
            c.query_one("SELECT tso_seq('d', 5)", &[]).ok().map(|r| r.get::<_, i64>(0))
        }),
        5
    );

    // Dropped through the member: the same.
    c.execute("SELECT tso_seq_drop('d')", &[]).expect("drop the key through the member");
    assert_eq!(seq(&mut c), 0, "made again through the member, from 0");
    let third = kept(&mut c, 5, second);
    assert_eq!(third, made(&mut o));
}

/// An oracle whose epoch was carried above its WAL timeline (here by a restored high-water
/// row at epoch 5; `pg_upgrade` of an oracle that had failed over does the same, the
/// timeline starting again at 1) fails over: the promoted standby fences at a higher epoch
/// (6, where the timeline alone gave 5 again), and the deposed primary brought back by hand
/// answers 5, which the member refuses.
#[test]
fn a_promotion_raises_the_epoch_once_it_was_carried_above_the_timeline() {
    let mut old = serving_node("ebase-old", NodeOpts::new());
    admit_members(&old);
    let epoch_of = |n: &Node| -> Option<i64> {
        n.connect().query_one("SELECT epoch FROM tso_status()", &[]).ok().and_then(|r| r.get(0))
    };
    old.connect()
        .execute(
            "INSERT INTO tsoracle.high_water (id, physical_ms, epoch) VALUES (true, 0, 5)",
            &[],
        )
        .unwrap_or_else(|e| panic!("a restored high-water at epoch 5: {}", pg_error_string(&e)));
    poll_until("the oracle fences at epoch 5", Duration::from_secs(20), || {
        (epoch_of(&old) == Some(5)).then_some(())
    });
    let base: i64 =
        old.connect().query_one("SELECT base FROM tsoracle.epoch_base", &[]).unwrap().get(0);
    assert_eq!(base, 4, "epoch 5 on timeline 1");
    let mut new = Node::base_backup_from(&old, "ebase-new").expect("pg_basebackup");
    new.start().expect("start the oracle's standby");
    let m = member("ebase-m", &oracle_conninfo(&[old.port(), new.port()], MEMBER_ROLE));
    let mut c = m.connect();
    c.query_one("SELECT tso_next()", &[]).expect("served at epoch 5");
    wait_replayed(&old, &new).expect("replayed");
    old.stop(StopMode::Fast).expect("stop the oracle's primary");
    promote(&new).expect("promote the oracle's standby");
    poll_until("the member serves from the new primary", Duration::from_secs(30), || {
        c.query_one("SELECT tso_next()", &[]).ok()
    });
    assert_eq!(epoch_of(&new), Some(6), "the promotion raised the epoch");
    let seen: i64 =
        c.query_one("SELECT oracle_epoch FROM tso_member_status()", &[]).unwrap().get(0);
    assert_eq!(seen, 6);

    // The deposed primary back, as a primary: epoch 5, refused.
    new.stop(StopMode::Fast).expect("stop the new primary");
    old.start().expect("start the deposed primary");
    old.wait_serving().expect("the deposed primary serves its own clients");
    assert_eq!(epoch_of(&old), Some(5), "the deposed primary's epoch");
    let started = Instant::now();
    let mut said = std::collections::BTreeSet::new();
    while started.elapsed() < Duration::from_secs(8) {
        if let Ok(row) = c.query_one("SELECT tso_next()", &[]) {
            panic!("the deposed primary served the member: {}", row.get::<_, i64>(0));
        }
        let last: Option<String> = c
            .query_one("SELECT last_error FROM tso_member_status()", &[])
            .expect("tso_member_status()")
            .get(0);
        said.extend(last);
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        said.iter().any(|e| e.contains("from epoch 5, older than epoch 6")),
        "refused for its epoch: {said:?}"
    );
}
