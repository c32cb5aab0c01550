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
//!   standbys (`pg_terminate_backend` of its worker) never hands that lease out.
//!
//! Run with: `cargo test -p tsoracle-tests --test fleet_members -- --test-threads=2`

use std::time::{Duration, Instant};

use postgres::error::SqlState;
use tsoracle_tests::cluster::{make_sync, promote, wait_replayed};
use tsoracle_tests::fleet::{admit_members, copy_between, member, oracle_conninfo, MEMBER_ROLE};
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
