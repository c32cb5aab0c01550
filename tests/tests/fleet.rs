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
//!   at itself or at another member, a role that is not `tsoracle_member`; the connection
//!   string is hidden from non-superusers; what a member's role may do on the oracle;
//! - a block whose answer was lost fails `40003` and is never granted twice; a call whose
//!   caller gave up is never sent;
//! - a deposed primary that still answers is refused (its epoch is older), also after the
//!   member restarts (`tsoracle.member_oracle` keeps the epoch); another cluster than the
//!   oracle that served the member is refused until a superuser deletes that memory;
//! - an oracle that handed over (epoch 0) is not serving, not a deposed primary;
//! - TLS with `sslmode=verify-full`: served when the member trusts the oracle's certificate,
//!   refused with libpq's reason when it does not, or when it does not use TLS.
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
