//! A fleet upgraded to this version one cluster at a time, under load
//! (docs/operations/fleet/member-upgrade.md, run from the page).
//!
//! The fleet starts on the previous release, as it shipped (`scripts/test-previous.sh` builds
//! it from its commit): an oracle and two members, timestamps and blocks taken through both
//! members. Then:
//!
//! - a member of this version started against the old oracle is refused, and its callers hear
//!   why at once (the oracle's SQLSTATE, its message, a HINT to upgrade the oracle first);
//! - the oracle is restarted on this version and updated by the page's step: the old members
//!   are served again (it speaks their version), and so is the new member;
//!   The members it registered before count as admitted, bound to the role they used; the
//!   new member, never registered, is refused `42501` until a superuser admits it;
//! - each member in turn is restarted on this version and updated by the page's step, while
//!   the other keeps serving;
//! - the members' shared role is split: one member gets a role of its own, admitted for it,
//!   and a restart, while the other keeps serving;
//! - a hello two minor versions older, or newer, is refused `0A000` with its HINT.
//!
//! At the end every history is unique and in order across the whole, every block below the
//! oracle's counters, `R_f` never went down and moves on past a timestamp issued after.
//!
//! Environment (set by `make test-upgrade`): `TSORACLE_PREVIOUS_BIN`, the binaries of a
//! private installation with the previous release; `TSORACLE_PG_BIN`, the same major's with
//! this tree's build.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tsoracle_tests::fleet::{admit, admit_members, member_opts, oracle_conninfo, MEMBER_ROLE};
use tsoracle_tests::fleet_load::{
    check_histories, load_members, system_identifier, wait_resolved_above, ResolvedWatch,
};
use tsoracle_tests::node::pg_bin_dir;
use tsoracle_tests::runbook::{run_sh, Runbook, MINOR_UPGRADE_STEPS};
use tsoracle_tests::{
    pg_error_string, poll_until, serving_node, tso, DenseHistory, History, Node, StopMode,
};

fn previous_bin() -> PathBuf {
    PathBuf::from(
        std::env::var_os("TSORACLE_PREVIOUS_BIN").expect(
            "TSORACLE_PREVIOUS_BIN names the previous release's binaries (make test-upgrade)",
        ),
    )
}

/// The version this tree builds, as `pg_available_extensions` of its installation says.
fn new_version(node: &Node) -> String {
    node.connect()
        .query_one(
            "SELECT default_version FROM pg_available_extensions WHERE name = 'tsoracle'",
            &[],
        )
        .expect("pg_available_extensions")
        .get(0)
}

fn extversion(node: &Node) -> String {
    node.connect()
        .query_one("SELECT extversion FROM pg_extension WHERE extname = 'tsoracle'", &[])
        .expect("pg_extension")
        .get(0)
}

/// `node` stopped, started on this tree's build, and updated by the page's step 3.
fn upgrade(node: &mut Node, book: &Runbook, version: &str) {
    node.stop(StopMode::Fast).unwrap_or_else(|e| panic!("stop {}: {e}", node.name()));
    node.set_bin(pg_bin_dir()).expect("the new build's binaries");
    node.start().unwrap_or_else(|e| panic!("start {} on the new build: {e}", node.name()));
    // The page's step 2: from its restart until step 3, the new library serves nothing.
    let mut c = node.connect();
    let state = poll_until("the worker past its start", Duration::from_secs(30), || {
        let state: String =
            c.query_one("SELECT state FROM tso_status()", &[]).expect("tso_status()").get(0);
        (state != "starting").then_some(state)
    });
    assert_eq!(state, "outdated_schema", "{}: before ALTER EXTENSION UPDATE", node.name());
    drop(c);
    let out = run_sh(book.step(3), node.bin_dir(), &[("CLUSTER", node.conninfo())])
        .unwrap_or_else(|e| panic!("{}: step 3: {e}", node.name()));
    assert!(
        out.lines().any(|l| l.trim() == format!("{version}|serving")),
        "{}: step 3 printed {out:?}, not {version}|serving",
        node.name()
    );
}

/// The error a member's caller gets from `tso_next()`: (SQLSTATE, message, HINT).
fn caller_error(node: &Node) -> Option<(String, String, String)> {
    let mut c = node.connect();
    c.batch_execute("SET statement_timeout = '20s'").expect("statement_timeout");
    match c.query_one("SELECT tso_next()", &[]) {
        Ok(_) => None,
        Err(e) => {
            let db = e.as_db_error().unwrap_or_else(|| panic!("{}", pg_error_string(&e)));
            Some((
                db.code().code().to_string(),
                db.message().to_string(),
                db.hint().unwrap_or_default().to_string(),
            ))
        }
    }
}

/// A hello as a member of `version` would say it, on the oracle as the members' role.
fn hello_as(oracle: &Node, version: &str) -> Result<(), (String, String)> {
    let mut c =
        postgres::Client::connect(&oracle.conninfo_for(MEMBER_ROLE, "postgres"), postgres::NoTls)
            .expect("connect as the members' role");
    c.query_one("SELECT * FROM tsoracle.member_hello(4242, $1, 0)", &[&version])
        .map(|_| ())
        .map_err(|e| {
            let db = e.as_db_error().unwrap_or_else(|| panic!("{}", pg_error_string(&e)));
            (db.code().code().to_string(), db.hint().unwrap_or_default().to_string())
        })
}

#[test]
fn a_fleet_upgraded_one_cluster_at_a_time_under_load_by_the_runbook() {
    let previous = previous_bin();
    let book = Runbook::load("fleet/member-upgrade.md", "minor-upgrade");
    book.expect_steps(MINOR_UPGRADE_STEPS);

    let mut oracle = serving_node("roll-oracle", tsoracle_tests::NodeOpts::new().bin(&previous));
    admit_members(&oracle);
    let old_version = extversion(&oracle);
    let conninfo = oracle_conninfo(&[oracle.port()], MEMBER_ROLE);
    let mut m1 = serving_node("roll-m1", member_opts(&conninfo).bin(&previous));
    let mut m2 = serving_node("roll-m2", member_opts(&conninfo).bin(&previous));
    let names = [m1.name().to_string(), m2.name().to_string()];
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let history = History::default();
    let dense = DenseHistory::default();
    let (loads, seqs) = load_members(&[&m1, &m2], &history, &dense);
    history.wait_progress_on(&names, Instant::now(), 100, "the members of the old release serve");
    let resolved_before = wait_resolved_above(&oracle, 0, "R_f published before the upgrade");
    let watch = ResolvedWatch::start(oracle.conninfo());

    // ---- a member upgraded before its oracle: refused, its callers told why at once
    let early = Node::start_new("roll-early", member_opts(&conninfo))
        .unwrap_or_else(|e| panic!("start the early member: {e}"));
    early.connect().batch_execute("CREATE EXTENSION tsoracle").expect("CREATE EXTENSION");
    let version = new_version(&early);
    assert_ne!(version, old_version, "the previous release is another version");
    let (code, message, hint) =
        poll_until("the early member refused", Duration::from_secs(60), || {
            caller_error(&early).filter(|(code, ..)| code != "57P03")
        });
    assert_eq!(code, "22023", "the old oracle's refusal, as it said it: {message}");
    assert!(message.contains("minor version"), "{message}");
    assert!(hint.contains("Upgrade the oracle before its members"), "HINT {hint:?}");

    // ---- the oracle first
    let t = Instant::now();
    upgrade(&mut oracle, &book, &version);
    history.wait_progress_on(&names, t, 100, "the old members served by the upgraded oracle");
    assert_eq!(extversion(&m1), old_version, "m1 still runs the previous release");
    // The members the old oracle registered count as admitted, for the role they used; the
    // early member, which it never registered, is refused until a superuser admits it.
    let ids = [system_identifier(&mut m1.connect()), system_identifier(&mut m2.connect())];
    for id in ids {
        let role: String = oracle
            .connect()
            .query_one("SELECT role FROM tso_fleet_status() WHERE system_id = $1", &[&id])
            .unwrap_or_else(|e| {
                panic!("member {id} admitted by the update: {}", pg_error_string(&e))
            })
            .get(0);
        assert_eq!(role, MEMBER_ROLE, "member {id} admitted for the role it used");
    }
    let (code, _, hint) =
        poll_until("the early member not admitted", Duration::from_secs(60), || {
            caller_error(&early).filter(|(code, ..)| code == "42501")
        });
    assert!(hint.contains("tso_fleet_admit("), "HINT {hint:?} ({code})");
    admit(&oracle, &early, MEMBER_ROLE);
    tso::wait_serving(&mut early.connect())
        .unwrap_or_else(|e| panic!("the early member served by the upgraded oracle: {e}"));
    tso::tso_next(&mut early.connect())
        .unwrap_or_else(|e| panic!("tso_next() on the early member: {}", pg_error_string(&e)));

    // ---- each member in turn; the other serves throughout
    for (i, m) in [&mut m1, &mut m2].into_iter().enumerate() {
        let other = names[1 - i];
        let down = Instant::now();
        upgrade(m, &book, &version);
        let up = Instant::now();
        let served = history.ok_calls_on_within(other, down, up);
        assert!(served > 0, "{other} served nothing while {} was upgraded", m.name());
        eprintln!("{other} served {served} calls while {} was upgraded", m.name());
        history.wait_progress_on(&names, up, 100, "both members serve after the upgrade");
        assert_eq!(extversion(m), version);
    }

    // ---- the shared role split (docs/operations/fleet/set-up.md, "A role per member"): m1
    //      gets a role of its own, admitted for it just before its restart; m2 serves on
    let own_role = "member_roll1";
    oracle
        .connect()
        .batch_execute(&format!("CREATE ROLE {own_role} LOGIN IN ROLE tsoracle_member"))
        .expect("m1's own role");
    m1.set_conf("tsoracle.oracle", oracle_conninfo(&[oracle.port()], own_role))
        .expect("m1 logs in as its own role");
    let down = Instant::now();
    admit(&oracle, &m1, own_role);
    m1.restart(StopMode::Fast).expect("restart m1");
    let up = Instant::now();
    history.wait_progress_on(&names, up, 100, "both members serve after the split");
    assert!(history.ok_calls_on_within(names[1], down, up) > 0, "m2 served during the split");
    let role: String = oracle
        .connect()
        .query_one("SELECT role FROM tso_fleet_status() WHERE system_id = $1", &[&ids[0]])
        .unwrap()
        .get(0);
    assert_eq!(role, own_role, "m1 bound to its own role");
    let shared: i64 = oracle
        .connect()
        .query_one("SELECT count(*) FROM pg_stat_activity WHERE usename = $1", &[&own_role])
        .unwrap()
        .get(0);
    assert!(shared > 0, "m1 speaks as its own role");

    // ---- more than one minor version apart, or newer than the oracle: refused, with a HINT
    let (major, minor) = {
        let mut parts = version.split('.').map(|p| p.parse::<u32>().expect("a version"));
        (parts.next().expect("major"), parts.next().expect("minor"))
    };
    if minor >= 2 {
        let (code, hint) =
            hello_as(&oracle, &format!("{major}.{}.0", minor - 2)).expect_err("two minors older");
        assert_eq!(code, "0A000");
        assert!(hint.contains("one minor version at a time"), "HINT {hint:?}");
    }
    let (code, hint) = hello_as(&oracle, &format!("{major}.{}.0", minor + 1)).expect_err("newer");
    assert_eq!(code, "0A000");
    assert!(hint.contains("Upgrade the oracle before its members"), "HINT {hint:?}");

    let mut c = oracle.connect();
    let fresh = tso::tso_next(&mut c).unwrap_or_else(|e| panic!("{}", pg_error_string(&e)));
    let r = wait_resolved_above(&oracle, fresh, "R_f moves on past every member");
    assert!(r >= resolved_before);
    check_histories(loads, seqs, &history, &dense, &oracle);
    watch.check(20);
}
