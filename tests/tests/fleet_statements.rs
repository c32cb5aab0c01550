//! A member's statements take their values from reservations (docs/fleet.md, "One
//! statement, few round trips"):
//!
//! - a `COPY` and an `INSERT … SELECT` of many rows cost a few dozen round trips, not one a
//!   row, and their values increase in row order; `tsoracle.member_reservation_max = 1` gives
//!   one round trip a call again;
//! - what a statement leaves unused is a gap: the next statement's values are above the whole
//!   of its last fetch, also when it ended normally, failed, or was cancelled mid-way;
//! - a procedure's transactions never share a reservation (its `COMMIT` is a boundary), nor
//!   does work at commit (a deferred trigger) share its statement's;
//! - errors pass through the statement hooks whole (constraint name, CONTEXT);
//! - the member's `R` stays below the first value of a transaction whose statement reserved;
//! - a member cut off from its oracle still commits, so its standbys do not page;
//! - a member whose own schema is missing or outdated pages `TsoracleNotServing`, not
//!   `TsoracleMemberDisconnected` (its oracle is not to blame).
//!
//! The values a statement takes are seen as they are taken through `RAISE NOTICE`, which a
//! client receives before the statement ends.
//!
//! Run with: `cargo test -p tsoracle-tests --test fleet_statements -- --test-threads=2`

use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::{Client, NoTls};
use tsoracle_tests::alerts::record;
use tsoracle_tests::exporter::Exporter;
use tsoracle_tests::fleet::{admit_members, member, member_opts, oracle_conninfo, MEMBER_ROLE};
use tsoracle_tests::{
    expect_sqlstate, ops, poll_until, serving_node, Got, History, Node, NodeOpts, SplitMix64,
    StopMode,
};

/// A function that takes one value and tells it (a NOTICE) before returning it.
const TELL: &str = "CREATE FUNCTION tell(i int) RETURNS bigint LANGUAGE plpgsql AS $$
    DECLARE v bigint := tso_next();
    BEGIN RAISE NOTICE 'took %', v; RETURN v; END $$";

fn round_trips(c: &mut Client) -> i64 {
    c.query_one("SELECT round_trips FROM tso_member_status()", &[]).unwrap().get(0)
}

/// A connection whose NOTICEs `took N` are collected, in order.
fn telling(node: &Node) -> (Client, Arc<Mutex<Vec<i64>>>) {
    let told = Arc::new(Mutex::new(Vec::new()));
    let sink = told.clone();
    let client = postgres::Config::from_str(&node.conninfo())
        .expect("conninfo")
        .notice_callback(move |n| {
            if let Some(v) = n.message().strip_prefix("took ").and_then(|v| v.parse().ok()) {
                sink.lock().unwrap().push(v);
            }
        })
        .connect(NoTls)
        .expect("connect");
    (client, told)
}

/// The fetches of one statement with `tsoracle.member_reservation_max = cap`: the first
/// call's place (0-based) and size of each, in order, for `calls` calls.
fn fetches(calls: usize, cap: usize) -> Vec<(usize, usize)> {
    let (mut out, mut at, mut size) = (Vec::new(), 0, 1);
    while at < calls {
        out.push((at, size));
        at += size;
        size = (size * 2).min(cap);
    }
    out
}

/// The values a statement was told are its fetches' (consecutive within each); returns one
/// past the end of its last fetch: no later statement may get a value below it.
fn reserved_end(told: &[i64], cap: usize) -> i64 {
    let mut end = 0;
    for (at, size) in fetches(told.len(), cap) {
        let first = told[at];
        for (j, v) in told[at..told.len().min(at + size)].iter().enumerate() {
            assert_eq!(*v, first + j as i64, "a fetch's values are handed out in order: {told:?}");
        }
        end = first + size as i64;
    }
    end
}

fn next(c: &mut Client) -> i64 {
    c.query_one("SELECT tso_next()", &[]).unwrap().get(0)
}

#[test]
fn a_statement_takes_its_values_in_few_round_trips_and_leaves_the_rest_a_gap() {
    let oracle = serving_node("fleet-st-oracle", NodeOpts::new());
    admit_members(&oracle);
    let m = member("fleet-st-m", &oracle_conninfo(&[oracle.port()], MEMBER_ROLE));
    let mut c = m.connect();
    c.batch_execute(ops::STAMPED).unwrap();
    c.batch_execute(TELL).unwrap();

    // A COPY of 20,000 rows: a few dozen round trips (heartbeats included), values in row order.
    let before = round_trips(&mut c);
    {
        use std::io::Write;
        let mut w = c.copy_in("COPY stamped (batch, i) FROM STDIN").unwrap();
        let data: String = (1..=20_000).map(|i| format!("1\t{i}\n")).collect();
        w.write_all(data.as_bytes()).unwrap();
        assert_eq!(w.finish().unwrap(), 20_000);
    }
    let copy_trips = round_trips(&mut c) - before;
    eprintln!("COPY of 20,000 rows: {copy_trips} round trips");
    assert!(copy_trips < 60, "a COPY of 20,000 rows took {copy_trips} round trips");
    let increasing = |c: &mut Client, batch: i64| -> bool {
        c.query_one(
            "SELECT bool_and(ts > prev) FROM (SELECT ts, lag(ts) OVER (ORDER BY i) AS prev \
             FROM stamped WHERE batch = $1) s WHERE prev IS NOT NULL",
            &[&batch],
        )
        .unwrap()
        .get(0)
    };
    assert!(increasing(&mut c, 1), "the COPY's values increase in row order");
    let after_copy = next(&mut c);
    let copy_max: i64 =
        c.query_one("SELECT max(ts) FROM stamped WHERE batch = 1", &[]).unwrap().get(0);
    assert!(
        after_copy > copy_max,
        "the next statement's {after_copy} is above the COPY's {copy_max}"
    );

    // Every kind of statement the fleet suite's load runs (ops::statements) is served here,
    // and their history checks: unique, increasing within each, later statements above.
    let history = History::default();
    let op = ops::statements(50);
    let mut rng = SplitMix64::new(42);
    for i in 0..60 {
        let start = Instant::now();
        let got = op(&mut c, &mut rng).unwrap_or_else(|e| panic!("statement {i}: {e}"));
        let end = Instant::now();
        match got {
            Got::Statement(values) => history.record_statement(start, end, "m", &values),
            Got::Batch(first, count) => history.record_ok(start, end, "m", first, count),
        }
    }
    assert_eq!(history.check().unwrap().calls, history.len());

    // INSERT … SELECT, the same.
    let before = round_trips(&mut c);
    c.batch_execute("INSERT INTO stamped (batch, i) SELECT 2, g FROM generate_series(1, 20000) g")
        .unwrap();
    let insert_trips = round_trips(&mut c) - before;
    assert!(insert_trips < 60, "an INSERT … SELECT of 20,000 rows took {insert_trips} round trips");
    assert!(increasing(&mut c, 2), "the INSERT's values increase in row order");

    // One round trip a call again with a cap of 1 (a backend alone: nothing to coalesce with).
    c.batch_execute("SET tsoracle.member_reservation_max = 1").unwrap();
    let before = round_trips(&mut c);
    c.batch_execute("INSERT INTO stamped (batch, i) SELECT 3, g FROM generate_series(1, 500) g")
        .unwrap();
    let per_call = round_trips(&mut c) - before;
    assert!(per_call >= 500, "500 rows with a cap of 1 took {per_call} round trips");
    assert!(increasing(&mut c, 3));

    // What a statement leaves is a gap: with a cap of 8, 10 calls fetch 1, 2, 4 and 8 values;
    // the next statement starts above all 15.
    let cap = 8;
    let (mut t, told) = telling(&m);
    t.batch_execute(&format!("SET tsoracle.member_reservation_max = {cap}")).unwrap();
    t.batch_execute("SELECT tell(g) FROM generate_series(1, 10) g").unwrap();
    let seen = told.lock().unwrap().clone();
    assert_eq!(seen.len(), 10);
    let end = reserved_end(&seen, cap);
    let after = next(&mut t);
    assert!(
        after >= end,
        "the next statement's {after} is in the last one's reservation (< {end}): {seen:?}"
    );

    // A statement that fails mid-reservation: 5 calls (fetches of 1, 2 and 4), then 22012.
    told.lock().unwrap().clear();
    let failed = t.batch_execute(
        "SELECT CASE WHEN g < 6 THEN tell(g) ELSE 1 / (g - 6) END FROM generate_series(1, 10) g",
    );
    expect_sqlstate(failed, &SqlState::DIVISION_BY_ZERO, "a statement failing mid-reservation");
    let seen = told.lock().unwrap().clone();
    assert_eq!(seen.len(), 5, "{seen:?}");
    let end = reserved_end(&seen, cap);
    let after = next(&mut t);
    assert!(after >= end, "after a failed statement: {after} < {end}: {seen:?}");

    // A statement cancelled mid-way (statement_timeout), the same. The statement would run
    // for over half an hour: 2 s leave its first round trip time on a loaded machine (400 ms
    // once passed with no value taken, on a CI run of two lanes at once).
    told.lock().unwrap().clear();
    t.batch_execute("SET statement_timeout = 2000").unwrap();
    let cancelled =
        t.batch_execute("SELECT tell(g), pg_sleep(0.002) FROM generate_series(1, 1000000) g");
    expect_sqlstate(cancelled, &SqlState::QUERY_CANCELED, "a statement cancelled mid-reservation");
    t.batch_execute("SET statement_timeout = 0").unwrap();
    let seen = told.lock().unwrap().clone();
    assert!(seen.len() > 10, "the cancelled statement took {} values", seen.len());
    let end = reserved_end(&seen, cap);
    let after = next(&mut t);
    assert!(after >= end, "after a cancelled statement: {after} < {end}");

    // Errors raised inside the executor's and a utility's start pass through the hooks as
    // errors (the backend goes on): a table the role may not read, a table that exists.
    t.batch_execute("CREATE ROLE plain LOGIN; CREATE TABLE secret (x int)").unwrap();
    t.batch_execute("SET ROLE plain").unwrap();
    expect_sqlstate(
        t.batch_execute("SELECT * FROM secret"),
        &SqlState::INSUFFICIENT_PRIVILEGE,
        "ExecutorStart through the hook",
    );
    t.batch_execute("RESET ROLE").unwrap();
    expect_sqlstate(
        t.batch_execute(ops::STAMPED),
        &SqlState::DUPLICATE_TABLE,
        "ProcessUtility through the hook",
    );
    assert!(next(&mut t) > after, "the backend serves after errors in its hooks");
    // ... whole: a unique violation inside DO keeps its constraint name and its CONTEXT.
    t.batch_execute("CREATE TABLE u (x int PRIMARY KEY); INSERT INTO u VALUES (1)").unwrap();
    let e = t.batch_execute("DO $$ BEGIN INSERT INTO u VALUES (1); END $$").unwrap_err();
    let db = e.as_db_error().expect("a server error");
    assert_eq!(db.code(), &SqlState::UNIQUE_VIOLATION);
    assert_eq!(db.constraint(), Some("u_pkey"), "{db:?}");
    assert!(db.where_().is_some_and(|w| w.contains("PL/pgSQL")), "{db:?}");

    // Work at commit, after the statement returned (a deferred trigger, a simple expression:
    // no hook runs), takes no reservation: 4 calls fetch 1, 2 and 4 values; the trigger's
    // first call, at commit, is above all 7.
    t.batch_execute(
        "CREATE TABLE d (x bigint);
         CREATE FUNCTION at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
           DECLARE v bigint; BEGIN v := tell(0); RETURN NULL; END $$;
         CREATE CONSTRAINT TRIGGER at_commit AFTER INSERT ON d DEFERRABLE INITIALLY DEFERRED
           FOR EACH ROW EXECUTE FUNCTION at_commit()",
    )
    .unwrap();
    told.lock().unwrap().clear();
    t.batch_execute("INSERT INTO d SELECT tell(g) FROM generate_series(1, 4) g").unwrap();
    let seen = told.lock().unwrap().clone();
    assert_eq!(seen.len(), 8, "4 in the statement, 4 at commit: {seen:?}");
    assert!(
        seen[4] >= seen[3] + 4,
        "a trigger at commit used the statement's reservation: {seen:?}"
    );

    // A procedure's COMMIT is a boundary: its second transaction fetches afresh.
    told.lock().unwrap().clear();
    t.batch_execute(
        "CREATE PROCEDURE two_transactions() LANGUAGE plpgsql AS $$
         DECLARE v bigint;
         BEGIN
           v := tell(1); v := tell(2);
           COMMIT;
           v := tell(3);
         END $$",
    )
    .unwrap();
    t.batch_execute("CALL two_transactions()").unwrap();
    let seen = told.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    // The first transaction fetched 1, then 2 (one of them unused).
    assert!(
        seen[2] >= seen[1] + 2,
        "the second transaction used the first one's reservation: {seen:?}"
    );

    // The member's R stays below a transaction whose statement reserved values.
    t.batch_execute("BEGIN").unwrap();
    told.lock().unwrap().clear();
    t.batch_execute("SELECT tell(g) FROM generate_series(1, 20) g").unwrap();
    let held = told.lock().unwrap()[0];
    for _ in 0..20 {
        next(&mut c);
    }
    std::thread::sleep(Duration::from_millis(500));
    let r: i64 = c.query_one("SELECT tso_resolved()", &[]).unwrap().get(0);
    assert!(r < held, "R {r} passed {held}, the open transaction's first value");
    t.batch_execute("COMMIT").unwrap();
    poll_until("R passes the committed values", Duration::from_secs(10), || {
        let r: i64 = c.query_one("SELECT tso_resolved()", &[]).unwrap().get(0);
        (r >= held).then_some(())
    });
}

/// A member cut off from its oracle still commits (its worker, every half
/// `tsoracle.window_ahead_ms`), so its standby's replay age — the exporter's
/// `tsoracle_standby_replay_age_seconds`, by the same expression — stays within that: in an
/// oracle outage `TsoracleStandbyNotReplaying` does not page every member's standby, only
/// `TsoracleMemberDisconnected` each member (docs/operations/monitoring.md): checked on what
/// real exporters of both read in that state (`tsoracle_tests::alerts`).
#[test]
fn a_member_cut_off_from_its_oracle_still_commits_for_its_standbys_and_pages_once() {
    let mut oracle = serving_node("stmt-beat-oracle", NodeOpts::new());
    admit_members(&oracle);
    // The same oracle first serves a member held back by its own schema (about 4 s).
    a_member_whose_schema_is_not_ready_pages_not_serving(&oracle);
    let m = member("stmt-beat-member", &oracle_conninfo(&[oracle.port()], MEMBER_ROLE));
    let mut standby = Node::base_backup_from(&m, "stmt-beat-standby").expect("pg_basebackup");
    standby.start().expect("start the member's standby");
    tsoracle_tests::cluster::wait_replayed(&m, &standby).expect("the standby replays");
    oracle.stop(StopMode::Fast).expect("stop the oracle");
    let mut mc = m.connect();
    poll_until("the member sees its oracle gone", Duration::from_secs(20), || {
        let connected: bool =
            mc.query_one("SELECT connected FROM tso_member_status()", &[]).unwrap().get(0);
        (!connected).then_some(())
    });
    // Three half windows (1.5 s each by default) with no value fetched, nothing published:
    // without the beat the standby's replay age would be 4.5 s at least.
    std::thread::sleep(Duration::from_millis(4_500));
    let age: f64 = standby
        .connect()
        .query_one(
            "SELECT extract(epoch FROM clock_timestamp() - COALESCE(pg_last_xact_replay_timestamp(), \
                 pg_postmaster_start_time()))::float8",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(
        age < 3.5,
        "the member's standby replayed no commit for {age} s while its member was cut off"
    );
    // What the exporters of the member and of its standby read in that state, held for
    // 8 minutes on promtool's clock: the member pages once (disconnected, not also "not
    // serving"), its standby not at all.
    for (node, expected) in [(&m, &["TsoracleMemberDisconnected"][..]), (&standby, &[][..])] {
        let exporter = Exporter::start(node.name(), node, "postgres").expect("start the exporter");
        record(&exporter, 2, Duration::from_millis(300), 4)
            .expect("scrape")
            .assert_firing(expected);
    }
}

/// A member whose own schema is not ready never connects (its worker waits for it first):
/// `tso_member_status().last_error` names the missing step, and what its exporter reads pages
/// `TsoracleNotServing` (`tso_status().state` says which step), not
/// `TsoracleMemberDisconnected`, whose page is about the oracle (docs/operations/alerts.md).
/// Each state is recorded from a real exporter and held for 8 minutes on promtool's clock:
/// no `CREATE EXTENSION` in `tsoracle.database`, read there (no tsoracle series: only
/// `TsoracleStatusMissing`) and from a database that has the extension
/// (`waiting_for_extension`); the extension at 0.5.0, as after a new library before `ALTER
/// EXTENSION tsoracle UPDATE` (`outdated_schema`, read through 0.5.0's functions); updated,
/// nothing pages.
fn a_member_whose_schema_is_not_ready_pages_not_serving(oracle: &Node) {
    let conninfo = oracle_conninfo(&[oracle.port()], MEMBER_ROLE);
    let m = Node::start_new("stmt-schema-member", member_opts(&conninfo)).expect("start member");
    m.connect().batch_execute("CREATE DATABASE watch").expect("CREATE DATABASE");
    let mut watch = m.try_connect_as("postgres", "watch", Duration::from_secs(10)).expect("watch");
    watch.batch_execute("CREATE EXTENSION tsoracle").expect("CREATE EXTENSION in watch");
    let pages = |dbname: &str, expected: &[&str]| {
        let exporter = Exporter::start_in(&format!("schema-{dbname}"), &m, "postgres", dbname)
            .expect("start the exporter");
        record(&exporter, 2, Duration::from_millis(300), 4)
            .expect("scrape")
            .assert_firing(expected);
    };
    let waits_for = |c: &mut Client, state: &str, why: &str| {
        poll_until(&format!("the member {state}"), Duration::from_secs(20), || {
            let st: String = c.query_one("SELECT state FROM tso_status()", &[]).ok()?.get(0);
            let last: Option<String> =
                c.query_one("SELECT last_error FROM tso_member_status()", &[]).ok()?.get(0);
            (st == state && last.as_deref().is_some_and(|l| l.contains(why))).then_some(())
        })
    };
    waits_for(&mut watch, "waiting_for_extension", "CREATE EXTENSION tsoracle");
    pages("postgres", &["TsoracleStatusMissing"]);
    pages("watch", &["TsoracleNotServing"]);

    let mut c = m.connect();
    c.batch_execute("CREATE EXTENSION tsoracle VERSION '0.5.0'").expect("the 0.5.0 schema");
    waits_for(&mut c, "outdated_schema", "ALTER EXTENSION tsoracle UPDATE");
    pages("postgres", &["TsoracleNotServing"]);

    c.batch_execute("ALTER EXTENSION tsoracle UPDATE").expect("ALTER EXTENSION UPDATE");
    m.wait_serving().expect("the member serves once its schema is the library's");
    pages("postgres", &[]);
}
