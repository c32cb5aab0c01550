//! A fleet (docs/fleet.md): member clusters (`tsoracle.oracle = <conninfo>`) served by one
//! oracle cluster, so that `tso_next()` on any cluster of the fleet is in one order.
//!
//! - one order under faults: an oracle with a synchronous standby and two members, 16 clients
//!   on each of the three clusters taking timestamps (and blocks through the members) and 3
//!   running statements of many rows (multi-row `INSERT`s, `COPY`s), while
//!   the oracle's primary is killed (`kill -9`) and its standby promoted, a member restarts and
//!   a member's connection to the oracle is terminated: across every cluster's history no
//!   value is issued twice, a call or statement that began after another returned got greater
//!   values, values increase within every statement, and
//!   no block of a counter is granted twice;
//! - the resolved timestamp of a member stays below what its open transactions hold;
//! - what is wrong is refused with a clear error, and the member serves nothing: a bad
//!   connection string, an unreachable oracle, an oracle without tsoracle, a member pointing
//!   at itself or at another member, a role that is not `tsoracle_member`; what a member's
//!   role may do on the oracle;
//! - nothing of the connection string reaches a role that may not `SHOW` it: every function
//!   of the extension, the exporter's queries, errors and HINTs, with the oracle up and down;
//! - a block whose answer was lost fails `40003` and is never granted twice; a call whose
//!   caller gave up is never sent;
//! - a deposed primary that still answers is refused (its epoch is older), also after the
//!   member restarts (`tsoracle.member_oracle` keeps the epoch); another cluster than the
//!   oracle that served the member is refused until a superuser deletes that memory;
//! - an oracle that handed over (epoch 0) is not serving, not a deposed primary;
//! - TLS with `sslmode=verify-full`: served when the member trusts the oracle's certificate,
//!   refused with libpq's reason when it does not, or when it does not use TLS;
//! - a member across a slow, lossy link (5 ms round trips; connections dropped, refused,
//!   stalled) recovers, its calls fail only within their bound and to be retried, nothing is
//!   handed out twice, and `R_f` never passes a value the member holds.
//!
//! Run with: `cargo test -p tsoracle-tests --test fleet -- --test-threads=2`

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::Client;
use tsoracle_tests::cluster::{make_sync, promote};
use tsoracle_tests::exporter::Exporter;
use tsoracle_tests::fleet::{
    admit_members, end_member_sessions, member, member_opts, oracle_conninfo, MEMBER_ROLE,
};
use tsoracle_tests::fleet_load::{check_histories, load_members, HoldWatch};
use tsoracle_tests::link::Link;
use tsoracle_tests::load::{SeqLoad, SeqLoadOptions};
use tsoracle_tests::seqlease::alter_system;
use tsoracle_tests::tls::TestCa;
use tsoracle_tests::{
    expect_sqlstate, ops, pg_error_string, poll_until, serving_node, DenseHistory, Endpoint,
    History, Load, LoadOptions, Node, NodeOpts, StopMode,
};

const KEYS: [&str; 3] = ["invoice", "order", "ticket"];
/// The clusters of the fleet, as the history names them.
const NODES: [&str; 3] = ["oracle", "fleet-m1", "fleet-m2"];

fn member_status(c: &mut Client) -> (bool, i64, i64, Option<String>) {
    let r = c
        .query_one(
            "SELECT connected, round_trips, values_fetched, last_error FROM tso_member_status()",
            &[],
        )
        .unwrap_or_else(|e| panic!("tso_member_status(): {}", pg_error_string(&e)));
    (r.get(0), r.get(1), r.get(2), r.get(3))
}

/// One order across an oracle that fails over and two members, one of which restarts and the
/// other of which loses its connection.
#[test]
fn a_fleet_issues_one_order_through_failover_restarts_and_lost_connections() {
    let mut oracle = serving_node("fleet-oracle", NodeOpts::new());
    admit_members(&oracle);
    oracle.connect().batch_execute(ops::STAMPED).expect("the stamped table");
    let mut standby = Node::base_backup_from(&oracle, "fleet-standby").expect("pg_basebackup");
    standby.start().expect("start the oracle's standby");
    make_sync(&mut oracle, standby.name()).expect("synchronous standby");
    let conninfo = oracle_conninfo(&[oracle.port(), standby.port()], MEMBER_ROLE);
    let mut m1 = member("fleet-m1", &conninfo);
    let m2 = member("fleet-m2", &conninfo);
    for m in [&m1, &m2] {
        m.connect()
            .batch_execute("CREATE ROLE app LOGIN; GRANT tsoracle_seq_user TO app")
            .expect("app role");
        m.connect().batch_execute(ops::STAMPED).expect("the stamped table");
    }

    // 16 clients on each cluster; the oracle's clients follow its primary.
    let primary_port = Arc::new(AtomicU16::new(oracle.port()));
    let port = primary_port.clone();
    let oracle_endpoint = Endpoint::new("oracle", move || {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=2",
            port.load(Ordering::SeqCst)
        )
    });
    let history = History::default();
    let run = Duration::from_secs(40);
    // Beside them, 3 clients on each cluster run statements of many rows (multi-row
    // INSERTs, COPYs, SELECTs over many rows), recorded with their values in row order.
    let loads: Vec<Load> = [oracle_endpoint, m1.endpoint(), m2.endpoint()]
        .into_iter()
        .flat_map(|endpoint| {
            [
                Load::start(
                    vec![endpoint.clone()],
                    LoadOptions::new(16, run),
                    ops::mixed(50),
                    history.clone(),
                ),
                Load::start(
                    vec![endpoint],
                    LoadOptions::new(3, run),
                    ops::statements(100),
                    history.clone(),
                ),
            ]
        })
        .collect();
    // Blocks through both members, of the same keys: one set of counters, the oracle's.
    let dense = DenseHistory::default();
    let seq_loads: Vec<SeqLoad> = [&m1, &m2]
        .into_iter()
        .map(|m| {
            SeqLoad::start(
                Endpoint::fixed(m.name(), &m.conninfo_for("app", "postgres")),
                SeqLoadOptions::new(2, run, &KEYS),
                dense.clone(),
            )
        })
        .collect();

    let started = Instant::now();
    history.wait_progress_on(&NODES, started, 100, "the fleet serves");
    // kill -9 of the oracle's primary, then its standby promoted: the members find it.
    oracle.kill9_postmaster().expect("kill -9 the oracle's primary");
    promote(&standby).expect("promote the oracle's standby");
    primary_port.store(standby.port(), Ordering::SeqCst);
    let t = Instant::now();
    history.wait_progress_on(&NODES, t, 100, "the fleet serves after the oracle's failover");
    // A member restarted.
    m1.restart(StopMode::Fast).expect("restart member 1");
    let t = Instant::now();
    history.wait_progress_on(&NODES, t, 100, "the fleet serves after a member's restart");
    // A member's connection to the oracle terminated, under load.
    let terminated = end_member_sessions(&standby);
    assert!(terminated >= 2, "both members were connected to the new primary ({terminated})");
    let t = Instant::now();
    history.wait_progress_on(
        &NODES,
        t,
        100,
        "the fleet serves after its connections were terminated",
    );

    for l in loads {
        l.stop_and_join();
    }
    for l in seq_loads {
        l.stop_and_join();
    }
    let report = history.assert_valid();
    for node in NODES {
        let ok = report.per_node.get(node).map_or(0, |n| n.ok_calls);
        assert!(ok > 100, "{node} served {ok} calls: {report:?}");
        // Statements of many values were served on each cluster, across the faults.
        let statements = history.with_calls(|c| {
            c.iter()
                .filter(|c| c.node == node && c.is_ok())
                .filter_map(|c| c.statement)
                .collect::<std::collections::BTreeSet<u64>>()
                .len()
        });
        assert!(statements >= 5, "{node} served {statements} statements of several values");
        eprintln!("{node}: {statements} statements of several values");
    }
    // The counters on the oracle: every block granted through a member tiles below them.
    let mut c = standby.connect();
    let totals: BTreeMap<String, i64> = KEYS
        .iter()
        .map(|k| {
            let v: Option<i64> = c.query_one("SELECT tso_seq_peek($1)", &[k]).unwrap().get(0);
            (k.to_string(), v.unwrap_or(0))
        })
        .collect();
    let blocks = dense.check(Some(&totals)).unwrap_or_else(|v| panic!("blocks: {v}"));
    let granted: usize = blocks.keys.values().map(|k| k.ok_calls).sum();
    assert!(granted > 50, "blocks granted through the members: {blocks:?}");
    // The members coalesced: more values than round trips.
    let (connected, round_trips, values, _) = member_status(&mut m2.connect());
    assert!(connected, "member 2 is connected again");
    assert!(values > round_trips, "member 2 fetched {values} values in {round_trips} round trips");

    // The shipped Prometheus queries on a member: its tsoracle_member_* metrics.
    let exporter = Exporter::start("member", &m2, "postgres").expect("postgres_exporter");
    let m = exporter.scrape().expect("scrape");
    let member_metrics = m.names_with_prefix("tsoracle_member_");
    for name in [
        "tsoracle_member_connected",
        "tsoracle_member_oracle_epoch",
        "tsoracle_member_connects_total",
        "tsoracle_member_round_trips_total",
        "tsoracle_member_calls_total",
        "tsoracle_member_values_total",
        "tsoracle_member_last_round_trip_seconds",
    ] {
        assert!(member_metrics.contains(name), "{name} in {member_metrics:?}");
    }
    assert_eq!(m.value("tsoracle_member_connected").unwrap(), 1.0);
    assert!(m.value("tsoracle_member_round_trips_total").unwrap() >= round_trips as f64);
    // A member: no window of its own, so the alerts on the window leave it alone.
    assert_eq!(m.value("tsoracle_member").unwrap(), 1.0);
    assert_eq!(m.value("tsoracle_primary").unwrap(), 0.0);
    assert_eq!(m.value("tsoracle_fleet_members").unwrap(), 0.0);
    // The oracle's standby (the promoted one serves now): both members registered, R_f published.
    let exporter = Exporter::start("oracle", &standby, "postgres").expect("postgres_exporter");
    let o = exporter.scrape().expect("scrape");
    assert_eq!(o.value("tsoracle_fleet_members").unwrap(), 2.0);
    assert!(o.value("tsoracle_fleet_resolved_physical_seconds").unwrap() > 0.0);
}

/// A member's resolved timestamp: below the value an open transaction on it holds, and past
/// it once that transaction has committed.
#[test]
fn a_members_resolved_timestamp_stays_below_its_open_transactions() {
    let oracle = serving_node("fleet-r-oracle", NodeOpts::new());
    admit_members(&oracle);
    let m = member("fleet-r-m", &oracle_conninfo(&[oracle.port()], MEMBER_ROLE));
    let mut holder = m.connect();
    holder.batch_execute("BEGIN").unwrap();
    let held: i64 = holder.query_one("SELECT tso_next()", &[]).unwrap().get(0);
    let mut c = m.connect();
    // Others go on meanwhile, on the member and on the oracle.
    for _ in 0..50 {
        let _: i64 = c.query_one("SELECT tso_next()", &[]).unwrap().get(0);
        let _: i64 = oracle.connect().query_one("SELECT tso_next()", &[]).unwrap().get(0);
    }
    thread::sleep(Duration::from_millis(500));
    let r: i64 = c.query_one("SELECT tso_resolved()", &[]).unwrap().get(0);
    assert!(r < held, "R {r} passed {held}, which an open transaction holds");
    holder.batch_execute("COMMIT").unwrap();
    poll_until("R passes the committed value", Duration::from_secs(10), || {
        let r: i64 = c.query_one("SELECT tso_resolved()", &[]).unwrap().get(0);
        (r >= held).then_some(())
    });
}

/// A started member with the extension created, not waited on: it may be refused.
fn start_member(name: &str, conninfo: &str) -> Node {
    let n = Node::start_new(name, member_opts(conninfo)).expect("start");
    n.connect().batch_execute("CREATE EXTENSION tsoracle").expect("CREATE EXTENSION");
    n
}

/// A member that cannot be served serves nothing, and says why.
#[track_caller]
fn expect_refusal(node: &Node, needle: &str) {
    let mut c = node.connect();
    let e = expect_sqlstate(
        c.query_one("SELECT tso_next()", &[]),
        &SqlState::CANNOT_CONNECT_NOW,
        &format!("{}: tso_next()", node.name()),
    );
    let text = pg_error_string(&e);
    assert!(text.contains(needle), "{}: expected {needle:?} in: {text}", node.name());
    let role: String = c.query_one("SELECT role FROM tso_status()", &[]).unwrap().get(0);
    assert_eq!(role, "member");
}

#[test]
fn what_is_wrong_with_a_member_is_refused_with_a_clear_error() {
    let oracle = serving_node("fleet-e-oracle", NodeOpts::new());
    admit_members(&oracle);
    oracle
        .connect()
        .batch_execute("CREATE ROLE not_a_member LOGIN")
        .expect("a role without tsoracle_member");
    let plain =
        Node::start_new("fleet-e-plain", NodeOpts::new()).expect("a cluster without the extension");

    let bad = start_member("fleet-e-bad", "host=127.0.0.1 port");
    expect_refusal(&bad, "not a valid connection string");
    let state: String =
        bad.connect().query_one("SELECT state FROM tso_status()", &[]).unwrap().get(0);
    assert_eq!(
        state, "refused",
        "a connection string libpq cannot read is refused until a restart"
    );
    let bad_port = start_member("fleet-e-port", "host=127.0.0.1 port=notaport");
    expect_refusal(&bad_port, "invalid integer value \"notaport\"");
    let unreachable = start_member("fleet-e-gone", &oracle_conninfo(&[1], MEMBER_ROLE));
    expect_refusal(&unreachable, "cannot connect to the oracle");
    let no_extension = start_member("fleet-e-noext", &oracle_conninfo(&[plain.port()], "postgres"));
    expect_refusal(&no_extension, "has no tsoracle");
    let wrong_role =
        start_member("fleet-e-role", &oracle_conninfo(&[oracle.port()], "not_a_member"));
    expect_refusal(&wrong_role, "tsoracle_member");
    let good = member("fleet-e-good", &oracle_conninfo(&[oracle.port()], MEMBER_ROLE));
    admit_members(&good);
    let chained = start_member("fleet-e-chain", &oracle_conninfo(&[good.port()], MEMBER_ROLE));
    expect_refusal(&chained, "itself a member");
    // A member pointing at itself.
    let mut myself = Node::init("fleet-e-self", member_opts("host=127.0.0.1")).expect("init");
    let own = oracle_conninfo(&[myself.port()], "postgres");
    myself.set_conf("tsoracle.oracle", own).expect("point it at itself");
    myself.start().expect("start");
    myself.connect().batch_execute("CREATE EXTENSION tsoracle").expect("CREATE EXTENSION");
    expect_refusal(&myself, "itself a member");

    // The connection string is for superusers only (a passfile keeps the password out).
    let mut g = good.connect();
    g.batch_execute("CREATE ROLE plain_user LOGIN").unwrap();
    let mut u = good.connect_as("plain_user");
    let visible: Option<String> = u
        .query_one("SELECT setting FROM pg_settings WHERE name = 'tsoracle.oracle'", &[])
        .ok()
        .and_then(|r| r.get(0));
    assert!(
        visible.as_deref().is_none_or(|v| !v.contains("port=")),
        "a non-superuser reads tsoracle.oracle: {visible:?}"
    );
    expect_sqlstate(
        u.query_one("SHOW tsoracle.oracle", &[]),
        &SqlState::INSUFFICIENT_PRIVILEGE,
        "SHOW tsoracle.oracle as a non-superuser",
    );

    // On the oracle, the member's role may call the member functions and nothing that lowers
    // or resets the oracle; no one else may call them.
    let mut as_member = oracle.connect_as(MEMBER_ROLE);
    // Timestamps only for a session that registered its member (the hello), once durable.
    expect_sqlstate(
        as_member.query("SELECT * FROM tsoracle.member_next(10)", &[]),
        &SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
        "member_next before the hello",
    );
    oracle.connect().query_one("SELECT tso_fleet_admit(4242, $1)", &[&MEMBER_ROLE]).unwrap();
    as_member
        .query(
            "SELECT * FROM tsoracle.member_hello(4242, (SELECT extversion FROM pg_extension WHERE extname = 'tsoracle'), 0)",
            &[],
        )
        .expect("hello as a made-up member");
    poll_until("the made-up member is served", Duration::from_secs(10), || {
        as_member.query("SELECT * FROM tsoracle.member_next(1)", &[]).ok()
    });
    expect_sqlstate(
        as_member.query("SELECT * FROM tsoracle.member_next(1000000)", &[]),
        &SqlState::INVALID_PARAMETER_VALUE,
        "a member asks for more than a batch holds",
    );
    expect_sqlstate(
        as_member.query_one("SELECT tso_seed(1)", &[]),
        &SqlState::INSUFFICIENT_PRIVILEGE,
        "a member calls tso_seed() on the oracle",
    );
    let mut outsider = oracle.connect_as("not_a_member");
    expect_sqlstate(
        outsider.query("SELECT * FROM tsoracle.member_next(1)", &[]),
        &SqlState::INSUFFICIENT_PRIVILEGE,
        "a role without tsoracle_member calls member_next",
    );
    let ok = as_member.query("SELECT * FROM tsoracle.member_next(10)", &[]).unwrap();
    assert_eq!(ok.len(), 1);

    // A member of 0.6.0 names its connection: answered (the array's text) only on the session
    // whose hello named it; elsewhere NULL, having done nothing (not even refused 22023 a
    // count no call may take).
    let named = |c: &mut Client, count: i32, session: &str| -> Option<Vec<i64>> {
        let sql = "SELECT tsoracle.member_next($1, $2)::pg_catalog.int8[]";
        c.query_one(sql, &[&count, &session]).map_err(|e| pg_error_string(&e)).unwrap().get(0)
    };
    assert_eq!(named(&mut as_member, i32::MAX, "conn-a"), None, "before a session is named");
    as_member
        .batch_execute("SELECT pg_catalog.set_config('tsoracle_member.session', 'conn-a', false)")
        .unwrap();
    let before: Vec<i64> =
        as_member.query_one("SELECT tsoracle.member_next(1)", &[]).unwrap().get(0);
    assert_eq!(named(&mut as_member, i32::MAX, "conn-b"), None, "for another connection's name");
    expect_sqlstate(
        as_member.query("SELECT tsoracle.member_next($1, 'conn-a')", &[&i32::MAX]),
        &SqlState::INVALID_PARAMETER_VALUE,
        "too many values asked for on the named session",
    );
    let got = named(&mut as_member, 10, "conn-a").expect("an answer where the connection is named");
    assert!(got[0] > before[0] && got[1] >= before[1], "{got:?} after {before:?}");
    expect_sqlstate(
        outsider.query("SELECT tsoracle.member_next(1, 'conn-a')", &[]),
        &SqlState::INSUFFICIENT_PRIVILEGE,
        "a role without tsoracle_member calls member_next(count, session)",
    );
}

/// A block whose answer was lost: the oracle's worker is held in the group commit of a new key
/// (the test build's `tsoracle.test_worker_hold_key`) while the member's connection to the
/// oracle is terminated. The call fails with `40003` and is not sent again; once the oracle's
/// worker goes on, the block it committed is a gap, and the next block starts above it.
#[test]
fn a_block_whose_answer_was_lost_fails_40003_and_is_never_granted_twice() {
    let oracle = serving_node("fleet-l-oracle", NodeOpts::new());
    admit_members(&oracle);
    let m = member("fleet-l-m", &oracle_conninfo(&[oracle.port()], MEMBER_ROLE));
    alter_system(&oracle, "tsoracle.test_worker_hold_key", Some("lost"))
        .expect("hold the oracle's worker");
    let conninfo = m.conninfo();
    let call = thread::spawn(move || {
        let mut c = Client::connect(&conninfo, postgres::NoTls).expect("connect to the member");
        c.query_one("SELECT tso_seq('lost', 5)", &[])
    });
    let mut o = oracle.connect();
    let pid: i32 =
        poll_until("the member's call waits on the oracle", Duration::from_secs(20), || {
            o.query_opt(
            "SELECT pid FROM pg_stat_activity WHERE usename = $1 AND wait_event_type = 'Extension' \
                AND strpos(query, 'member_seq') > 0",
            &[&MEMBER_ROLE],
        )
        .unwrap()
        .map(|r| r.get(0))
        });
    let _: bool = o.query_one("SELECT pg_terminate_backend($1)", &[&pid]).unwrap().get(0);
    let e = expect_sqlstate(
        call.join().expect("the call's thread"),
        &SqlState::T_R_STATEMENT_COMPLETION_UNKNOWN,
        "tso_seq whose answer was lost",
    );
    assert!(
        pg_error_string(&e).contains("tso_seq_peek"),
        "the HINT says how to check: {}",
        pg_error_string(&e)
    );
    alter_system(&oracle, "tsoracle.test_worker_hold_key", None)
        .expect("release the oracle's worker");
    let mut c = m.connect();
    let next: i64 = poll_until("the member serves blocks again", Duration::from_secs(20), || {
        c.query_one("SELECT tso_seq('lost', 1)", &[]).ok().map(|r| r.get(0))
    });
    let peek: Option<i64> = o.query_one("SELECT tso_seq_peek('lost')", &[]).unwrap().get(0);
    assert!(next == 0 || next >= 5, "the lost block [0, 5) granted again from {next}");
    assert_eq!(peek, Some(next + 1), "the oracle's counter is the member's");
}

/// A deposed primary that still answers is refused: after the oracle's standby was promoted
/// and served the member (epoch 2), the old primary comes back read-write (epoch 1) and is
/// the first host of the member's connection string. The member refuses its answers, serves
/// nothing (57P03 naming the deposed primary), and serves again, above everything before,
/// once only the new primary answers.
#[test]
fn a_member_refuses_a_deposed_primary() {
    let mut old = serving_node("fleet-d-old", NodeOpts::new());
    admit_members(&old);
    let mut new = Node::base_backup_from(&old, "fleet-d-new").expect("pg_basebackup");
    new.start().expect("start the standby");
    let mut m = member("fleet-d-m", &oracle_conninfo(&[old.port(), new.port()], MEMBER_ROLE));
    let mut c = m.connect();
    let before: i64 = c.query_one("SELECT tso_next()", &[]).unwrap().get(0);
    tsoracle_tests::cluster::wait_replayed(&old, &new).expect("replayed");
    old.stop(StopMode::Fast).expect("stop the old primary");
    promote(&new).expect("promote the standby");
    let mut highest: i64 =
        poll_until("the member serves from the new primary", Duration::from_secs(30), || {
            c.query_one("SELECT tso_next()", &[]).ok().map(|r| r.get(0))
        });
    assert!(highest > before);
    let epoch: i64 =
        c.query_one("SELECT oracle_epoch FROM tso_member_status()", &[]).unwrap().get(0);
    assert!(epoch >= 2, "the new primary's epoch: {epoch}");

    // The old primary back, read-write, at its old epoch; the member's connection broken.
    old.start().expect("start the old primary again, as a primary");
    old.wait_serving().expect("the old primary serves its own clients");
    end_member_sessions(&new);
    let refused =
        poll_until("the member refuses the deposed primary", Duration::from_secs(30), || {
            match c.query_one("SELECT tso_next()", &[]) {
                Ok(r) => {
                    let v: i64 = r.get(0);
                    assert!(
                        v > highest,
                        "a value {v} at or below {highest}: from the deposed primary?"
                    );
                    highest = v;
                    None
                }
                Err(e) => Some(e),
            }
        });
    assert_eq!(
        refused.code(),
        Some(&SqlState::CANNOT_CONNECT_NOW),
        "{}",
        pg_error_string(&refused)
    );
    assert!(pg_error_string(&refused).contains("deposed"), "{}", pg_error_string(&refused));

    // The member restarted, the deposed primary still first in its connection string: it
    // remembers the epoch (tsoracle.member_oracle), and still refuses it.
    let kept: i64 = c.query_one("SELECT epoch FROM tsoracle.member_oracle", &[]).unwrap().get(0);
    assert_eq!(kept, epoch, "the member keeps the new primary's epoch");
    drop(c);
    m.restart(StopMode::Fast).expect("restart the member");
    let mut c = m.connect();
    let refused = poll_until(
        "the restarted member refuses the deposed primary",
        Duration::from_secs(30),
        || match c.query_one("SELECT tso_next()", &[]) {
            Ok(r) => {
                let v: i64 = r.get(0);
                panic!("the restarted member handed out {v} (highest before {highest})");
            }
            Err(e) => {
                let text = pg_error_string(&e);
                text.contains("deposed").then_some(text)
            }
        },
    );
    assert!(refused.contains("57P03"), "{refused}");

    // Only the new primary left: served again, above everything before.
    old.stop(StopMode::Fast).expect("stop the old primary for good");
    let after: i64 = poll_until("the member serves again", Duration::from_secs(30), || {
        c.query_one("SELECT tso_next()", &[]).ok().map(|r| r.get(0))
    });
    assert!(after > highest, "{after} <= {highest}");
}

/// A member pointed at another cluster than the oracle that served it (its system identifier
/// differs: not a failover) refuses it, across restarts, until a superuser deletes the
/// member's memory of its oracle; then it is served by the new one.
#[test]
fn a_member_refuses_another_oracle_until_told_it_is_new() {
    let first = serving_node("fleet-n-first", NodeOpts::new());
    admit_members(&first);
    let second = serving_node("fleet-n-second", NodeOpts::new());
    admit_members(&second);
    let mut m = member("fleet-n-m", &oracle_conninfo(&[first.port()], MEMBER_ROLE));
    let _: i64 = m.connect().query_one("SELECT tso_next()", &[]).unwrap().get(0);
    let kept: i64 =
        m.connect().query_one("SELECT system_id FROM tsoracle.member_oracle", &[]).unwrap().get(0);
    let first_id: i64 = first
        .connect()
        .query_one("SELECT system_identifier FROM pg_control_system()", &[])
        .unwrap()
        .get(0);
    assert_eq!(kept, first_id, "the member keeps its oracle's system identifier");

    // Admitted there too: what refuses it is the member's memory of its oracle.
    tsoracle_tests::fleet::admit(&second, &m, MEMBER_ROLE);
    m.set_conf("tsoracle.oracle", oracle_conninfo(&[second.port()], MEMBER_ROLE)).unwrap();
    m.restart(StopMode::Fast).expect("restart the member");
    expect_refusal(&m, "another cluster");
    expect_refusal(&m, "DELETE FROM tsoracle.member_oracle");
    // Nobody but the worker writes the memory; a superuser may delete it.
    let mut c = m.connect();
    expect_sqlstate(
        c.batch_execute("UPDATE tsoracle.member_oracle SET epoch = 0"),
        &SqlState::INSUFFICIENT_PRIVILEGE,
        "lowering the kept epoch by hand",
    );
    c.batch_execute("DELETE FROM tsoracle.member_oracle").expect("a superuser deletes it");
    drop(c);
    m.restart(StopMode::Fast).expect("restart the member");
    let served: i64 = poll_until("served by the new oracle", Duration::from_secs(30), || {
        m.connect().query_one("SELECT tso_next()", &[]).ok().map(|r| r.get(0))
    });
    assert!(served > 0);
    let second_id: i64 = second
        .connect()
        .query_one("SELECT system_identifier FROM pg_control_system()", &[])
        .unwrap()
        .get(0);
    let kept: i64 =
        m.connect().query_one("SELECT system_id FROM tsoracle.member_oracle", &[]).unwrap().get(0);
    assert_eq!(kept, second_id, "the member now keeps the new oracle's identifier");
}

/// A block whose caller gave up while the oracle did not serve it (its worker paused: the
/// oracle answers `57P03`, which the member retries) is never sent again once the caller was
/// told `40003` (check with `tso_seq_peek()`), however long the member's worker would still
/// have retried it: the caller's check stays true.
#[test]
fn a_call_whose_caller_gave_up_is_never_sent() {
    let oracle = serving_node("fleet-g-oracle", NodeOpts::new());
    admit_members(&oracle);
    // Every block through the oracle's worker, none in the calling backend.
    alter_system(&oracle, "tsoracle.seq_in_place", Some("off")).expect("no in-place blocks");
    let m = member("fleet-g-m", &oracle_conninfo(&[oracle.port()], MEMBER_ROLE));
    let mut c = m.connect();
    let first: i64 = c.query_one("SELECT tso_seq('given-up', 1)", &[]).unwrap().get(0);
    let oracle_worker = oracle.worker_pid();
    oracle.pause_pid(oracle_worker, true);
    let conninfo = m.conninfo();
    let started = std::time::Instant::now();
    let call = std::thread::spawn(move || {
        let mut c = Client::connect(&conninfo, postgres::NoTls).expect("connect");
        c.query_one("SELECT tso_seq('given-up', 5)", &[]).err()
    });
    // The caller waits 3 s (its timeout when it called); the member's worker, after the
    // reload, would retry the call for a minute.
    std::thread::sleep(Duration::from_millis(300));
    c.batch_execute("ALTER SYSTEM SET tsoracle.extension_timeout_ms = 60000").expect("set");
    c.batch_execute("SELECT pg_reload_conf()").expect("reload");
    let e = call.join().unwrap().expect("the call fails while the oracle does not serve it");
    assert_eq!(
        e.code(),
        Some(&SqlState::T_R_STATEMENT_COMPLETION_UNKNOWN),
        "{}",
        pg_error_string(&e)
    );
    // The oracle refuses the call in flight (57P03) once its own 5 s pass: the member would
    // send it again. Then the oracle's worker goes on.
    std::thread::sleep(Duration::from_secs(7).saturating_sub(started.elapsed()));
    oracle.pause_pid(oracle_worker, false);
    let _: i64 = poll_until("the member serves again", Duration::from_secs(30), || {
        c.query_one("SELECT tso_next()", &[]).ok().map(|r| r.get(0))
    });
    std::thread::sleep(Duration::from_millis(500));
    let next: i64 = c.query_one("SELECT tso_seq('given-up', 1)", &[]).unwrap().get(0);
    assert_eq!(next, first + 1, "a block was granted for a caller that had given up");
}

/// TLS with `sslmode=verify-full`: the oracle admits the member's role over TLS only. A member
/// that does not use TLS, or does not trust the oracle's certificate, is refused with libpq's
/// reason; one that trusts it is served, in the oracle's order, over an encrypted connection.
#[test]
fn a_member_reaches_its_oracle_with_tls_verify_full() {
    let mut oracle = serving_node("fleet-t-oracle", NodeOpts::new());
    admit_members(&oracle);
    let ca = TestCa::new("fleet-t-ca").expect("a test CA");
    ca.serve_tls(&mut oracle, &[MEMBER_ROLE]).expect("TLS on the oracle");
    let other = TestCa::new("fleet-t-other").expect("a CA the oracle's certificate is not from");
    let base = oracle_conninfo(&[oracle.port()], MEMBER_ROLE);
    let verify = |ca: &TestCa| {
        format!("{base} sslmode=verify-full sslrootcert={}", ca.root_cert().display())
    };

    let plain = start_member("fleet-t-plain", &format!("{base} sslmode=disable"));
    expect_refusal(&plain, "no encryption");
    let untrusted = start_member("fleet-t-untrusted", &verify(&other));
    expect_refusal(&untrusted, "certificate verify failed");
    let m = member("fleet-t-m", &verify(&ca));
    let mut c = m.connect();
    let a: i64 = c.query_one("SELECT tso_next()", &[]).unwrap().get(0);
    let mut o = oracle.connect();
    let b: i64 = o.query_one("SELECT tso_next()", &[]).unwrap().get(0);
    let a2: i64 = c.query_one("SELECT tso_next()", &[]).unwrap().get(0);
    assert!(a < b && b < a2, "one order over TLS: {a} < {b} < {a2}");
    let encrypted: Option<bool> = o
        .query_one(
            "SELECT bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
                WHERE a.usename = $1",
            &[&MEMBER_ROLE],
        )
        .unwrap()
        .get(0);
    assert_eq!(encrypted, Some(true), "the member's connection to the oracle is TLS");
}

/// An oracle that is not serving (after `tso_handover()` its epoch is 0) is told apart from a
/// deposed primary: the member says the oracle is not serving, keeps the epoch it saw, and
/// fails a block `57P03` (never sent), not `40003`.
#[test]
fn an_oracle_that_handed_over_is_not_serving_rather_than_deposed() {
    let oracle = serving_node("fleet-h-oracle", NodeOpts::new());
    admit_members(&oracle);
    let m = member("fleet-h-m", &oracle_conninfo(&[oracle.port()], MEMBER_ROLE));
    let mut c = m.connect();
    let _: i64 = c.query_one("SELECT tso_seq('k', 10)", &[]).unwrap().get(0);
    let epoch: i64 = c.query_one("SELECT epoch FROM tsoracle.member_oracle", &[]).unwrap().get(0);
    assert!(epoch > 0);
    // Blocks through the member while the oracle hands over: each is granted, or refused
    // before it was; none is reported lost (`40003`) for an answer at epoch 0.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let callers: Vec<_> = (0..4)
        .map(|_| {
            let (stop, mut c) = (stop.clone(), m.connect());
            thread::spawn(move || {
                let (mut granted, mut codes) = (0, Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    match c.query_one("SELECT tso_seq('k', 10)", &[]) {
                        Ok(_) => granted += 1,
                        Err(e) => codes.push(e.code().map(|c| c.code().to_string())),
                    }
                }
                (granted, codes)
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(500));
    let mut o = oracle.connect();
    o.batch_execute("SELECT tso_handover()").expect("hand the oracle over");
    thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    for h in callers {
        let (granted, codes) = h.join().expect("a caller");
        assert!(granted > 0, "blocks were granted before the handover");
        assert!(
            codes.iter().all(|c| c.as_deref() == Some("57P03")),
            "only 57P03 (not serving), never 40003: {codes:?}"
        );
    }
    // The member's connection made again: its hello is answered at epoch 0.
    end_member_sessions(&oracle);
    let refused =
        poll_until("the member says its oracle is not serving", Duration::from_secs(30), || {
            let e = expect_sqlstate(
                c.query_one("SELECT tso_next()", &[]),
                &SqlState::CANNOT_CONNECT_NOW,
                "tso_next() through an oracle that handed over",
            );
            let text = pg_error_string(&e);
            text.contains("not serving (epoch 0)").then_some(text)
        });
    assert!(!refused.contains("deposed"), "{refused}");
    let e = expect_sqlstate(
        c.query_one("SELECT tso_seq('k', 10)", &[]),
        &SqlState::CANNOT_CONNECT_NOW,
        "a block through an oracle that handed over",
    );
    assert!(pg_error_string(&e).contains("not serving"), "{}", pg_error_string(&e));
    let kept: i64 = c.query_one("SELECT epoch FROM tsoracle.member_oracle", &[]).unwrap().get(0);
    assert_eq!(kept, epoch, "the member keeps the epoch it saw");
}

/// Whether `part` occurs in `text` as a word of its own (a port inside a longer number, a
/// timestamp, is another number).
fn has_word(text: &str, part: &str) -> bool {
    let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    let (first, last) = (part.chars().next(), part.chars().next_back());
    text.match_indices(part).any(|(at, _)| {
        let joins_before = word(first) && word(text[..at].chars().next_back());
        let joins_after = word(last) && word(text[at + part.len()..].chars().next());
        !joins_before && !joins_after
    })
}

/// The queries of `contrib/prometheus/queries.yaml` (a `query: "…"` line, or a `query: |`
/// block of the lines indented below it).
fn exporter_queries() -> Vec<String> {
    let yaml =
        std::fs::read_to_string(tsoracle_tests::exporter::QUERIES_YAML).expect("queries.yaml");
    let mut queries = Vec::new();
    let mut block: Option<String> = None;
    for line in yaml.lines() {
        if let Some(q) = block.as_mut() {
            if line.starts_with("    ") || line.trim().is_empty() {
                q.push_str(line);
                q.push('\n');
                continue;
            }
            queries.push(block.take().unwrap_or_default());
        }
        match line.trim_start().strip_prefix("query: ") {
            Some("|") => block = Some(String::new()),
            Some(q) => queries.push(q.trim_matches('"').to_string()),
            None => {}
        }
    }
    queries.extend(block);
    assert!(queries.len() >= 7, "queries.yaml: {queries:?}");
    queries
}

/// Every function of the extension (from `pg_catalog`, so a new one is covered), called as the
/// connected role with made-up arguments, and every exporter query: each row and each error
/// (message, DETAIL, HINT) as text.
fn everything_a_role_reads(c: &mut Client) -> Vec<(String, String)> {
    let functions = c
        .query(
            "SELECT p.oid::regproc::text, p.proargtypes::regtype[]::text[] \
               FROM pg_proc p \
               JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e' \
               JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'tsoracle' \
              WHERE p.prorettype <> 'trigger'::regtype ORDER BY 1",
            &[],
        )
        .expect("the extension's functions");
    assert!(functions.len() > 30, "the extension's functions: {}", functions.len());
    let mut statements: Vec<String> = functions
        .iter()
        .map(|f| {
            let name: String = f.get(0);
            let types: Vec<String> = f.get(1);
            let args: Vec<String> = types
                .iter()
                .map(|t| match t.as_str() {
                    "text" => "'fleet-h'::text".to_string(),
                    "text[]" => "ARRAY['fleet-h']".to_string(),
                    "integer[]" | "bigint[]" => format!("ARRAY[1]::{t}"),
                    "boolean" => "false".to_string(),
                    "integer" | "bigint" | "smallint" | "double precision" => format!("1::{t}"),
                    other => format!("NULL::{other}"),
                })
                .collect();
            format!("SELECT t::text FROM {name}({}) AS t", args.join(", "))
        })
        .collect();
    statements.extend(exporter_queries().iter().map(|q| format!("SELECT q::text FROM ({q}) AS q")));
    let mut read = Vec::new();
    for sql in statements {
        match c.query(sql.as_str(), &[]) {
            Ok(rows) => {
                for r in rows {
                    let text: Option<String> = r.get(0);
                    read.push((sql.clone(), text.unwrap_or_default()));
                }
            }
            Err(e) => read.push((sql.clone(), pg_error_string(&e))),
        }
    }
    read
}

/// What a member knows of its oracle's connection string (its hosts, port, user and the path
/// of its key file) reaches only the roles that may `SHOW tsoracle.oracle`: a plain role reads
/// none of it from any function of the extension, from `tso_status().detail`, from the
/// exporter's queries, nor from the errors and HINTs of calls, with the oracle up and down;
/// `pg_monitor` (which may `SHOW` it, through `pg_read_all_settings`) and a superuser see it.
#[test]
fn a_plain_role_on_a_member_reads_no_connection_string() {
    let mut oracle = serving_node("fleet-h-oracle", NodeOpts::new());
    admit_members(&oracle);
    let secret_dir = "/nonexistent/fleet-h-secret-keys";
    let conninfo = format!(
        "{} sslmode=prefer sslkey={secret_dir}/member.key sslcert={secret_dir}/member.crt",
        oracle_conninfo(&[oracle.port()], MEMBER_ROLE)
    );
    let m = member("fleet-h-member", &conninfo);
    let port = oracle.port().to_string();
    let parts = ["127.0.0.1", port.as_str(), MEMBER_ROLE, secret_dir];
    let mut su = m.connect();
    su.batch_execute(
        "CREATE ROLE fleet_h_plain LOGIN; \
         CREATE ROLE fleet_h_app LOGIN IN ROLE tsoracle_seq_user, tsoracle_lease_holder; \
         CREATE ROLE fleet_h_monitor LOGIN IN ROLE pg_monitor",
    )
    .expect("roles");
    let leaks = |who: &str, read: &[(String, String)]| -> Vec<String> {
        read.iter()
            .filter(|(_, out)| parts.iter().any(|p| has_word(out, p)))
            .map(|(sql, out)| format!("{who}: {sql}: {out}"))
            .collect::<Vec<_>>()
    };
    let check = |phase: &str, down: bool| {
        let mut found = Vec::new();
        for role in ["fleet_h_plain", "fleet_h_app"] {
            let mut c = m.connect_as(role);
            expect_sqlstate(
                c.query_one("SHOW tsoracle.oracle", &[]),
                &SqlState::INSUFFICIENT_PRIVILEGE,
                &format!("SHOW tsoracle.oracle as {role}"),
            );
            let read = everything_a_role_reads(&mut c);
            // With the oracle down, the calls did fail with what libpq said, its parts hidden.
            let hidden = read.iter().any(|(sql, out)| {
                sql.contains("tso_next()")
                    && out.contains("cannot connect to the oracle")
                    && out.contains('…')
            });
            assert!(!down || hidden, "{phase}: {role}'s tso_next() did not fail as expected");
            found.extend(leaks(role, &read));
        }
        assert!(
            found.is_empty(),
            "{phase}: a role that may not SHOW tsoracle.oracle reads it:\n{}",
            found.join("\n")
        );
        // Those who may SHOW it read it, in tso_member_status() and tso_status() alike.
        for role in ["postgres", "fleet_h_monitor"] {
            let mut c = m.connect_as(role);
            let shown: String = c.query_one("SHOW tsoracle.oracle", &[]).expect("SHOW").get(0);
            assert!(has_word(&shown, secret_dir), "{role}: SHOW tsoracle.oracle = {shown}");
            let (oracle_text, detail): (String, String) = {
                let r = c
                    .query_one(
                        "SELECT oracle, (SELECT detail FROM tso_status()) FROM tso_member_status()",
                        &[],
                    )
                    .expect("tso_member_status()");
                (r.get(0), r.get(1))
            };
            assert!(
                has_word(&oracle_text, &port) && has_word(&detail, &port),
                "{phase}: {role} may read tsoracle.oracle: {oracle_text:?}, detail {detail:?}"
            );
        }
    };
    check("the oracle up", false);

    // The oracle down: calls fail with what libpq said, which names the host and the port.
    alter_system(&m, "tsoracle.extension_timeout_ms", Some("300")).expect("a short wait");
    oracle.stop(StopMode::Fast).expect("stop the oracle");
    let said = poll_until("the member finds its oracle down", Duration::from_secs(30), || {
        let e = su.query_one("SELECT tso_next()", &[]).err()?;
        let text = pg_error_string(&e);
        has_word(&text, &port).then_some(text)
    });
    assert!(has_word(&said, "127.0.0.1"), "a superuser reads what libpq said: {said}");
    check("the oracle down", true);
}

/// The SQLSTATE of a call the history recorded as failed (`pg_error_string`'s text).
fn sqlstate_of(error: &str) -> &str {
    error.strip_prefix("SQLSTATE ").and_then(|s| s.get(..5)).unwrap_or("none")
}

/// A member a network away, across a slow and lossy link (`tsoracle_tests::link`: 5 ms round
/// trips), under load: the link drops every connection, refuses new ones for a while, stalls
/// past `tsoracle.extension_timeout_ms` and for less. The member recovers each time; every
/// call that fails fails within `extension_timeout_ms` with a SQLSTATE to retry on (`57P03`;
/// `40003` for a block whose answer was lost); no value or block is handed out twice, and
/// the real-time order holds across the member and the oracle; `R_f` never passes a value a
/// transaction on the member holds, nor one handed out after it was read.
#[test]
fn a_member_across_a_slow_lossy_link_recovers_and_keeps_one_order() {
    const TIMEOUT_MS: u64 = 2000;
    let oracle = serving_node("fleet-link-oracle", NodeOpts::new());
    admit_members(&oracle);
    let link = Link::start(oracle.port(), Duration::from_micros(2500)).expect("the link");
    let m = serving_node(
        "fleet-link-m",
        member_opts(&oracle_conninfo(&[link.port()], MEMBER_ROLE))
            .setting("tsoracle.extension_timeout_ms", TIMEOUT_MS),
    );
    let history = History::default();
    let dense = DenseHistory::default();
    let (loads, seqs) = load_members(&[&m], &history, &dense);
    let on_oracle = Load::start(
        vec![Endpoint::fixed("fleet-link-oracle", &oracle.conninfo())],
        LoadOptions::new(2, Duration::from_secs(120)),
        ops::tso_next(),
        history.clone(),
    );
    let nodes = [m.name(), "fleet-link-oracle"];
    let hold = HoldWatch::start(m.conninfo(), oracle.conninfo());
    let progress = |what: &str| history.wait_progress_on(&nodes, Instant::now(), 100, what);
    progress("the member serves through the link");
    let connects = |m: &Node| -> i64 {
        m.connect().query_one("SELECT connects FROM tso_member_status()", &[]).unwrap().get(0)
    };
    let before = connects(&m);

    // Every connection dropped, under load.
    assert!(link.drop_all() >= 1, "the member's connection went through the link");
    progress("the member serves after its connection was dropped");
    // Dropped, and new connections refused for 1.5 s.
    link.drop_all();
    link.refuse_for(Duration::from_millis(1500));
    progress("the member serves after the link refused it");
    assert!(link.refused() >= 1, "the member tried to connect while refused");
    // A stall longer than the callers wait: the member gives the connection up, and again
    // the next it makes (held mid-handshake) until the stall ends.
    link.stall_for(Duration::from_millis(TIMEOUT_MS + 1000));
    progress("the member serves after a long stall");
    // A short stall: calls wait, and are served.
    link.stall_for(Duration::from_millis(TIMEOUT_MS / 4));
    progress("the member serves after a short stall");
    link.drop_all();
    progress("the member serves after a last drop");

    on_oracle.stop_and_join();
    check_histories(loads, seqs, &history, &dense, &oracle);
    hold.check(20, &history, m.name());
    assert!(connects(&m) >= before + 3, "the member connected again after each fault");
    // Every call on the member ended within its bound, and failed only to be retried.
    let bound = Duration::from_millis(TIMEOUT_MS + 1500);
    let mut failed: BTreeMap<String, usize> = BTreeMap::new();
    let calls: Vec<(Duration, Option<String>)> = history
        .calls()
        .into_iter()
        .filter(|c| c.node == m.name())
        .map(|c| (c.end - c.start, c.result.err()))
        .chain(
            dense
                .calls()
                .into_iter()
                .map(|c| (c.end - c.start, c.result.err().map(|e| format!("block: {e}")))),
        )
        .collect();
    for (took, error) in &calls {
        assert!(*took <= bound, "a call on the member took {took:?}: {error:?}");
        if let Some(e) = error {
            let block = e.starts_with("block: ");
            let state = sqlstate_of(e.trim_start_matches("block: "));
            assert!(
                state == "57P03" || (block && state == "40003"),
                "a call on the member failed with {e}"
            );
            *failed.entry(state.to_string()).or_default() += 1;
        }
    }
    assert!(!failed.is_empty(), "no call failed: the stall did not reach the callers");
    let longest = calls.iter().map(|(took, _)| *took).max().unwrap_or_default();
    eprintln!(
        "{} calls on the member, the longest {longest:?}; failed, by SQLSTATE: {failed:?}",
        calls.len()
    );
}
