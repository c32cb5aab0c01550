//! Where DBAs run tsoracle: behind PgBouncer, watched by Prometheus.
//!
//! * PgBouncer 1.18 with the repository's `contrib/pgbouncer/pgbouncer.ini`
//!   ([`tsoracle_tests::pooler`]): a load of timestamps and sequence blocks from 16 clients
//!   over 4 server connections in transaction pooling keeps uniqueness, real-time order and
//!   tiling; a cancel sent through the pooler ends a waiting `tso_seq` (57014) and never hands
//!   out its block, and ends a waiting `tso_wait_resolved`; every SQL function of the
//!   extension works through transaction and session pooling, with the session-state caveats
//!   of docs/operations/pgbouncer.md (`SET LOCAL ROLE`, `DISCARD ALL`, `tso_wait_resolved`
//!   holding its server connection).
//! * postgres_exporter 0.11 with `contrib/prometheus/queries.yaml`
//!   ([`tsoracle_tests::exporter`]) on a primary and a standby: every metric of
//!   docs/operations/monitoring.md appears with its type and a value that matches
//!   `tso_status()`, `tso_clock()`, `tso_resolved_status()` and the standby's replay state,
//!   and the serving metric drops to 0 in the first scrape after the oracle refuses. The
//!   alert rules pass `promtool check rules` and their unit tests.
//!
//! Run with: `cargo test -p tsoracle-tests --test pooler -- --test-threads=2`

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::types::{ToSql, Type};
use postgres::{Client, Row};
use tsoracle_tests::exporter::{promtool, Exporter, Metrics, ALERT_RULES, ALERT_RULES_TEST};
use tsoracle_tests::pooler::{
    create_role, section_settings, PgBouncer, PgBouncerOpts, Psql, LOCAL_SETTINGS, PGBOUNCER_INI,
};
use tsoracle_tests::seqlease::{alter_system, seq_totals, seq_unnamed, SeqLoad, SeqLoadOptions};
use tsoracle_tests::tso::{self, uuid_timestamp};
use tsoracle_tests::{
    logical, ops, pg_error_string, physical, poll_until, serving_node, wait_for, DenseHistory,
    History, Load, LoadOptions, Node, NodeOpts, Workers,
};

const APP: &str = "app";
const APP_PASSWORD: &str = "app-secret";
const SUPERUSER_PASSWORD: &str = "postgres-secret";
/// The role postgres_exporter connects as: no superuser, no pg_monitor; only what
/// docs/operations/monitoring.md asks for.
const EXPORTER_ROLE: &str = "tsoracle_exporter";
/// The last millisecond a timestamp can be issued in (the allocator's `MAX_SQL_PHYSICAL_MS`).
const MAX_SQL_PHYSICAL_MS: i64 = (1 << 45) - 1;
/// The metrics table of the monitoring guide.
const MONITORING_MD: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/operations/monitoring.md");

// ============================================================================ helpers

/// A serving node with the role `app` (sequences, leases, and the group role `app_group` it
/// may `SET ROLE` to) that the pooler's clients use.
fn app_node(name: &str) -> Node {
    app_node_with(name, NodeOpts::new())
}

/// [`app_node`] with settings of its own.
fn app_node_with(name: &str, opts: NodeOpts) -> Node {
    let node = serving_node(name, opts);
    let mut su = node.connect();
    su.batch_execute(
        "CREATE ROLE app_group NOLOGIN; GRANT tsoracle_seq_user, tsoracle_lease_holder TO app_group",
    )
    .unwrap();
    create_role(&mut su, APP, &["tsoracle_seq_user", "tsoracle_lease_holder", "app_group"])
        .unwrap_or_else(|e| panic!("create role {APP}: {e}"));
    node
}

fn bouncer(name: &str, node: &Node, databases: &[(&str, &str)]) -> PgBouncer {
    let mut opts =
        PgBouncerOpts::new().user(APP, APP_PASSWORD).user("postgres", SUPERUSER_PASSWORD);
    for (db, options) in databases {
        opts = opts.database(db, node, options);
    }
    PgBouncer::start(name, opts).unwrap_or_else(|e| panic!("start pgbouncer {name}: {e}"))
}

#[track_caller]
fn pooled(b: &PgBouncer, db: &str, user: &str) -> Client {
    let password = if user == APP { APP_PASSWORD } else { SUPERUSER_PASSWORD };
    b.connect(db, user, password)
        .unwrap_or_else(|e| panic!("connect to {db} as {user} through pgbouncer: {e}"))
}

/// One row of an unnamed statement (transaction pooling: see tsoracle_tests::load::ops::unnamed).
#[track_caller]
fn one(c: &mut Client, sql: &str, params: &[(&(dyn ToSql + Sync), Type)]) -> Row {
    c.query_typed_one(sql, params).unwrap_or_else(|e| panic!("{sql}: {}", pg_error_string(&e)))
}

#[track_caller]
fn int8(c: &mut Client, sql: &str, params: &[(&(dyn ToSql + Sync), Type)]) -> i64 {
    one(c, sql, params).get(0)
}

/// Wait (bounded) until exactly one backend of `app` other than `except` runs a statement
/// containing `what` and sleeps in the extension (waiting for the worker, or for `R`);
/// returns its pid.
#[track_caller]
fn wait_waiting_backend(su: &mut Client, what: &str, except: &[i32]) -> i32 {
    poll_until(&format!("a backend of {APP} waiting in {what}"), Duration::from_secs(20), || {
        let pids: Vec<i32> = su
            .query(
                "SELECT pid FROM pg_stat_activity WHERE usename = $1 AND state = 'active' \
                     AND wait_event_type = 'Extension' AND strpos(query, $2) > 0",
                &[&APP, &what],
            )
            .unwrap()
            .iter()
            .map(|r| r.get::<_, i32>(0))
            .filter(|p| !except.contains(p))
            .collect();
        (pids.len() == 1).then(|| pids[0])
    })
}

/// Wait (bounded) until the worker (pid `wpid`) holds a group commit open: it holds a lock
/// on `tsoracle.seq` (the test build's `tsoracle.test_worker_hold_key` keeps it there).
#[track_caller]
fn wait_worker_blocked(su: &mut Client, wpid: i32) {
    wait_for(
        &format!("the worker (pid {wpid}) held in its group commit"),
        Duration::from_secs(20),
        || {
            su.query_one(
                "SELECT count(*) FROM pg_locks WHERE pid = $1 AND granted \
                    AND relation = 'tsoracle.seq'::regclass",
                &[&wpid],
            )
            .unwrap()
            .get::<_, i64>(0)
                > 0
        },
    );
}

// ============================================================================ 1

/// 16 clients through PgBouncer in transaction pooling with `pool_size=4`, for at least 4 s
/// and until every key has been served 10 times: 8 call
/// `tso_next()`, `tso_next_batch(k)` and `tso_next_uuid()`, 8 call `tso_seq`/`tso_seq_batch`
/// on shared keys. No call fails; the server never sees more than 4 backends of the role
/// while all 16 clients stay connected; the timestamps are unique and in real-time order and
/// every key's blocks tile `[0, counter)` without a gap.
#[test]
fn transaction_pooling_keeps_order_and_tiles_blocks() {
    let node = app_node("pool-load");
    let b = bouncer("load", &node, &[("tx", "pool_size=4")]);
    let mut su = node.connect();

    let sampler = Workers::spawn("backends", 1, |_| {
        let mut c = node.connect();
        move |stop: Arc<AtomicBool>| {
            let (mut max, mut samples) = (0i64, 0u64);
            while !stop.load(Ordering::SeqCst) {
                let n: i64 = c
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity WHERE usename = $1 \
                         AND backend_type = 'client backend'",
                        &[&APP],
                    )
                    .unwrap()
                    .get(0);
                max = max.max(n);
                samples += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            (max, samples)
        }
    });
    let history = History::new();
    let dense = DenseHistory::new();
    let ep = b.endpoint("tx", APP, APP_PASSWORD);
    // At least 4 s, and on until every key has been served ENOUGH_CALLS times (a slow machine
    // may need longer), then stop both loads.
    const ENOUGH_CALLS: u64 = 10;
    let (least, most) = (Duration::from_secs(4), Duration::from_secs(50));
    let started = Instant::now();
    let load = Load::start(
        vec![ep.clone()],
        LoadOptions::new(8, most),
        ops::unnamed::mixed_with_uuid(64),
        history.clone(),
    );
    let seq = SeqLoad::start(
        ep,
        SeqLoadOptions::new(8, most, &["a", "b", "c"]).batches(&["b", "c", "d"], 0.2),
        dense.clone(),
    );
    let served = |key: &str| {
        dense.with_calls(|calls| calls.iter().filter(|c| c.key == key && c.result.is_ok()).count())
            as u64
    };
    wait_for("every key served through the pooler", most, || {
        started.elapsed() >= least
            && history.len() as u64 >= ENOUGH_CALLS
            && ["a", "b", "c", "d"].iter().all(|k| served(k) >= ENOUGH_CALLS)
    });
    let stopping = Instant::now();
    let stats = load.stop_and_join();
    let seq_stats = seq.stop_and_join();
    assert!(
        stopping.elapsed() < Duration::from_secs(20),
        "the loads took {:?} to stop",
        stopping.elapsed()
    );
    sampler.stop();
    let (max_backends, samples) = sampler.join()[0];

    assert_eq!(stats.err_calls, 0, "timestamp calls failed through the pooler: {stats:?}");
    assert_eq!(
        seq_stats.load.err_calls, 0,
        "sequence calls failed through the pooler: {seq_stats:?}"
    );
    assert_eq!(
        stats.connects + seq_stats.load.connects,
        16,
        "each of the 16 clients connected once and stayed: {stats:?} {seq_stats:?}"
    );
    assert!(stats.ok_calls > 0 && seq_stats.single_ok > 0 && seq_stats.batch_ok > 0);
    assert!(samples > 0);
    assert!(
        (1..=4).contains(&max_backends),
        "16 clients used {max_backends} server backends (pool_size=4)"
    );
    let report = history.assert_valid();
    assert_eq!(report.ok_calls as u64, stats.ok_calls);
    let totals = seq_totals(&mut su).unwrap();
    let dense_report = dense
        .check(Some(&totals))
        .unwrap_or_else(|v| panic!("dense check failed: {v}\ntotals {totals:?}"));
    for key in ["a", "b", "c", "d"] {
        let k = &dense_report.keys[key];
        assert!(k.ok_calls > 0, "key {key}: {k:?}");
        assert!(k.gaps.is_empty(), "key {key}: no call failed, so no gap: {k:?}");
        assert_eq!(k.covered, k.total, "key {key}: {k:?}");
    }
}

// ============================================================================ 2

/// Interrupt a psql whose statement waits on server backend `pid`, and wait (bounded) for
/// it; its error, checked: the statement failed with 57014 (the cancel reached the server
/// backend), and that backend lives on, back in the pool (idle).
#[track_caller]
fn cancelled(su: &mut Client, what: &str, run: Psql, pid: i32) -> String {
    run.interrupt().unwrap_or_else(|e| panic!("interrupt {what}: {e}"));
    let out = run.wait(Duration::from_secs(60)).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.stderr.contains("ERROR:  57014: canceling statement due to user request"),
        "{what}, cancelled through the pooler: {out:?}"
    );
    wait_for(&format!("{what}'s server backend {pid} idle again"), Duration::from_secs(20), || {
        su.query_opt("SELECT state FROM pg_stat_activity WHERE pid = $1", &[&pid])
            .unwrap()
            .is_some_and(|r| r.get::<_, Option<String>>(0).as_deref() == Some("idle"))
    });
    out.stderr
}

/// A cancel sent to PgBouncer — psql's Ctrl-C (libpq's `PQcancel`) on the pooler's port —
/// is forwarded to the server backend the client is linked to:
///
/// * Z's `tso_seq('c', 7)` is held by the worker, which stays in its group commit (the test
///   build's `tsoracle.test_worker_hold_key`, as a worker stuck in its commit would);
///   B's `tso_seq('c', 3)` waits in the queue behind it. Both cancelled through the
///   pooler: 57014, and their server connections go back to the pool. Once the worker goes on Z's block is burnt
///   (committed for nobody) and B's was never committed: the next block starts after Z's,
///   and the only gap of the key is Z's block.
/// * A `tso_wait_resolved` for a value an hour ahead, cancelled through the pooler: 57014.
#[test]
fn a_cancel_through_the_pooler_never_hands_out_the_block() {
    // Held by the worker: this is about calls the worker takes (`tso_seq` on an existing key
    // would otherwise advance it in place, which a row lock does not stop).
    let node =
        app_node_with("pool-cancel", NodeOpts::new().setting("tsoracle.seq_in_place", "off"));
    let b = bouncer("cancel", &node, &[("tx", "pool_size=4")]);
    let mut su = node.connect();
    let history = DenseHistory::new();
    let record = |c: &mut Client, key: &str, count: i32| {
        let start = Instant::now();
        let r = seq_unnamed(c, key, count);
        let end = Instant::now();
        match &r {
            Ok(s) => history.record_ok(start, end, "pooler", key, *s, count as i64),
            Err(e) => {
                history.record_err(start, end, "pooler", key, pg_error_string(e), count as i64)
            }
        }
        r
    };
    let mut app = pooled(&b, "tx", APP);
    assert_eq!(record(&mut app, "c", 1).unwrap(), 0);
    let wpid: i32 = su.query_one("SELECT worker_pid FROM tso_status()", &[]).unwrap().get(0);

    alter_system(&node, "tsoracle.test_worker_hold_key", Some("c")).expect("hold the worker");
    let psql = |sql: &str| {
        b.psql("tx", APP, APP_PASSWORD, &[sql])
            .unwrap_or_else(|e| panic!("psql through pgbouncer: {e}"))
    };

    // Z: taken by the worker, which then stays in its group commit.
    let z_start = Instant::now();
    let z = psql("SELECT tso_seq('c', 7)");
    wait_worker_blocked(&mut su, wpid);
    let zpid = wait_waiting_backend(&mut su, "tso_seq", &[]);
    // B: queued behind it, never taken by the stuck worker.
    let b_start = Instant::now();
    let bq = psql("SELECT tso_seq('c', 3)");
    let bpid = wait_waiting_backend(&mut su, "tso_seq", &[zpid]);
    assert_ne!(bpid, zpid, "B and Z hold a server connection each");

    for (what, run, start, count, pid) in [("B", bq, b_start, 3, bpid), ("Z", z, z_start, 7, zpid)]
    {
        let error = cancelled(&mut su, what, run, pid);
        history.record_err(start, Instant::now(), "pooler", "c", error, count);
    }
    alter_system(&node, "tsoracle.test_worker_hold_key", None).expect("release the worker");
    wait_for("the worker commits Z's block once it goes on", Duration::from_secs(20), || {
        seq_totals(&mut su).unwrap().get("c") == Some(&8)
    });
    assert_eq!(record(&mut app, "c", 1).unwrap(), 8, "Z's block [1, 8) is burnt, B's never taken");
    let totals = seq_totals(&mut su).unwrap();
    let report = history.check(Some(&totals)).unwrap_or_else(|v| panic!("dense check: {v}"));
    assert_eq!(report.keys["c"].gaps, vec![(1, 8)], "the only gap is Z's burnt block");

    // tso_wait_resolved for a value an hour ahead (2^40 = 2^22 ms), cancelled.
    let w = psql("SELECT tso_wait_resolved(tso_resolved() + (1::bigint << 40), 50000)");
    let waiter = wait_waiting_backend(&mut su, "tso_wait_resolved", &[]);
    cancelled(&mut su, "tso_wait_resolved", w, waiter);
}

// ============================================================================ 3

/// The functions of the extension the smoke calls, by name.
fn extension_functions(su: &mut Client) -> BTreeSet<String> {
    su.query(
        "SELECT p.proname::text FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid \
           JOIN pg_namespace n ON n.oid = p.pronamespace \
          WHERE d.classid = 'pg_proc'::regclass AND d.deptype = 'e' AND n.nspname <> 'tsoracle' \
            AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'tsoracle')",
        &[],
    )
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// Every SQL function of the extension through `db`, as `app` (the superuser for `tso_seed`),
/// each on a pooled connection with unnamed statements; returns the names called. Leases and
/// keys are used from other pooled connections than the ones that made them: nothing is
/// kept per session.
fn smoke(b: &PgBouncer, db: &str) -> BTreeSet<&'static str> {
    let mut called = BTreeSet::new();
    let mut c = pooled(b, db, APP);
    let mut other = pooled(b, db, APP);
    let mut su = pooled(b, db, "postgres");

    let a = int8(&mut c, "SELECT tso_next()", &[]);
    let first = int8(&mut other, "SELECT tso_next_batch($1)", &[(&10i32, Type::INT4)]);
    let text: String = one(&mut c, "SELECT tso_next_uuid()::text", &[]).get(0);
    let u = uuid_timestamp(&text).unwrap();
    assert!(a < first && first + 9 < u, "{db}: {a} < [{first}, {first} + 10) < {u}");
    called.extend(["tso_next", "tso_next_batch", "tso_next_uuid"]);

    let (p, l): (i64, i32) = {
        let r = one(&mut c, "SELECT tso_physical($1), tso_logical($1)", &[(&u, Type::INT8)]);
        (r.get(0), r.get(1))
    };
    assert_eq!((p, i64::from(l)), (physical(u), logical(u)), "{db}");
    let back =
        int8(&mut c, "SELECT tso_from_timestamptz(tso_to_timestamptz($1))", &[(&u, Type::INT8)]);
    assert_eq!(back, physical(u) << tso::LOGICAL_BITS, "{db}: the millisecond's first timestamp");
    let roundtrip = int8(&mut other, "SELECT tso_from_uuid(tso_uuid($1))", &[(&u, Type::INT8)]);
    assert_eq!(roundtrip, u, "{db}");
    called.extend([
        "tso_physical",
        "tso_logical",
        "tso_to_timestamptz",
        "tso_from_timestamptz",
        "tso_uuid",
        "tso_from_uuid",
    ]);

    let seeded = int8(&mut su, "SELECT tso_seed($1)", &[(&physical(u), Type::INT8)]);
    assert!(seeded >= physical(u), "{db}: tso_seed returns the committed high-water {seeded}");
    called.insert("tso_seed");

    let r = int8(&mut c, "SELECT tso_resolved()", &[]);
    assert!(r >= u, "{db}: nothing holds R: it is at the last value issued ({r} < {u})");
    let waited = int8(&mut other, "SELECT tso_wait_resolved($1, 1000)", &[(&r, Type::INT8)]);
    assert!(waited >= r, "{db}: tso_wait_resolved({r}) = {waited}");
    let holders: i32 = one(&mut c, "SELECT holders FROM tso_resolved_status()", &[]).get(0);
    assert!(holders >= 0);
    called.extend(["tso_resolved", "tso_wait_resolved", "tso_resolved_status"]);

    let key = format!("smoke-{db}");
    assert_eq!(seq_unnamed(&mut c, &key, 5).unwrap(), 0, "{db}: a new key starts at 0");
    let rows = c
        .query_typed(
            "SELECT key, start, count FROM tso_seq_batch($1, $2)",
            &[(&vec![key.clone()], Type::TEXT_ARRAY), (&vec![3i32], Type::INT4_ARRAY)],
        )
        .unwrap();
    assert_eq!((rows[0].get::<_, String>(0), rows[0].get::<_, i64>(1)), (key.clone(), 5));
    let peek: Option<i64> =
        one(&mut other, "SELECT tso_seq_peek($1)", &[(&key, Type::TEXT)]).get(0);
    assert_eq!(peek, Some(8), "{db}: peek from another pooled connection");
    let dropped: bool = one(&mut other, "SELECT tso_seq_drop($1)", &[(&key, Type::TEXT)]).get(0);
    assert!(dropped, "{db}");
    called.extend(["tso_seq", "tso_seq_batch", "tso_seq_peek", "tso_seq_drop"]);

    let holder = format!("holder-{db}");
    let acquire = "SELECT lease_id, ts_upper_bound FROM tso_lease_acquire($1, 1, 10000)";
    let grant = one(&mut c, acquire, &[(&holder, Type::TEXT)]);
    let (id, bound): (i64, i64) = (grant.get(0), grant.get(1));
    let again = one(&mut other, acquire, &[(&holder, Type::TEXT)]);
    assert_eq!(again.get::<_, i64>(0), id, "{db}: the same live lease, from another connection");
    let frontier = int8(&mut c, "SELECT tso_safe_frontier()", &[]);
    assert!(frontier <= bound, "{db}: the lease holds the frontier: {frontier} > {bound}");
    let renewed =
        int8(&mut other, "SELECT ts_upper_bound FROM tso_lease_renew($1)", &[(&id, Type::INT8)]);
    assert!(renewed >= bound, "{db}");
    c.query_typed("SELECT tso_lease_release($1)", &[(&id, Type::INT8)]).unwrap();
    let e = other
        .query_typed("SELECT * FROM tso_lease_renew($1)", &[(&id, Type::INT8)])
        .expect_err("renew after release");
    assert_eq!(e.code(), Some(&SqlState::NO_DATA_FOUND), "{db}: {}", pg_error_string(&e));
    let bounded = one(
        &mut c,
        "SELECT lease_id, ts_lower_bound, ts_upper_bound FROM tso_lease_acquire_bounds($1, 2, 10000)",
        &[(&holder, Type::TEXT)],
    );
    let (id2, lower, upper): (i64, i64, i64) = (bounded.get(0), bounded.get(1), bounded.get(2));
    assert!(lower <= upper, "{db}: [{lower}, {upper}]");
    let renewed = one(
        &mut other,
        "SELECT ts_lower_bound, ts_upper_bound FROM tso_lease_renew_bounds($1)",
        &[(&id2, Type::INT8)],
    );
    assert!(renewed.get::<_, i64>(1) >= upper, "{db}");
    c.query_typed("SELECT tso_lease_release($1)", &[(&id2, Type::INT8)]).unwrap();
    called.extend([
        "tso_lease_acquire",
        "tso_lease_renew",
        "tso_lease_release",
        "tso_safe_frontier",
        "tso_lease_acquire_bounds",
        "tso_lease_renew_bounds",
    ]);

    // A superuser's handover, refused to the application's role; a member's status, empty on
    // a cluster that is its own oracle.
    let e = c.query_typed("SELECT tso_handover()", &[]).expect_err("tso_handover() as app");
    assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{db}: {}", pg_error_string(&e));
    let rows = other.query_typed("SELECT * FROM tso_member_status()", &[]).unwrap();
    assert!(rows.is_empty(), "{db}: not a member");
    called.extend(["tso_handover", "tso_member_status"]);

    // The fleet's functions on a cluster with no member: R_f is published, no member is
    // listed, and removing or re-admitting one is for superusers.
    assert!(int8(&mut c, "SELECT tso_fleet_resolved()", &[]) > 0, "{db}: R_f");
    assert!(other.query_typed("SELECT * FROM tso_fleet_status()", &[]).unwrap().is_empty());
    called.extend(["tso_fleet_resolved", "tso_fleet_status"]);
    for f in ["tso_fleet_remove", "tso_fleet_admit"] {
        let e = c.query_typed(&format!("SELECT {f}(1)"), &[]).expect_err(f);
        assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{db} {f}: {e}");
        called.insert(f);
    }
    let state: String = one(&mut c, "SELECT state FROM tso_status()", &[]).get(0);
    assert_eq!(state, "serving", "{db}");
    assert!(int8(&mut other, "SELECT wall_ms FROM tso_clock()", &[]) > 0);
    called.extend(["tso_status", "tso_clock"]);
    called
}

/// Every SQL function of the extension works through transaction pooling and session
/// pooling (the smoke covers every function `CREATE EXTENSION` made: checked against the
/// catalog). Then the session-state caveats of docs/operations/pgbouncer.md:
///
/// * transaction pooling: `SET LOCAL ROLE app_group` in a transaction makes `app_group` the
///   owner of the key the transaction creates;
/// * session pooling: a `SET ROLE` lasts across the session's transactions; when the client
///   leaves, the shipped `server_reset_query` (`DISCARD ALL`) resets the server connection, so
///   the next client of the same backend (`pool_size=1`) is itself again;
/// * transaction pooling with `pool_size=1`: a `tso_wait_resolved` holds the only server
///   connection while it waits: another client's statement runs on that same backend, and
///   only after the wait returned.
#[test]
fn every_function_through_transaction_and_session_pooling() {
    let node = app_node("pool-smoke");
    let b = bouncer(
        "smoke",
        &node,
        &[
            ("tx", "pool_size=2"),
            ("session", "pool_mode=session pool_size=2"),
            ("one", "pool_size=1"),
            ("session1", "pool_mode=session pool_size=1"),
        ],
    );
    let mut su = node.connect();
    let functions = extension_functions(&mut su);
    assert!(functions.contains("tso_next") && functions.len() > 20, "{functions:?}");
    for db in ["tx", "session"] {
        let called: BTreeSet<String> = smoke(&b, db).into_iter().map(String::from).collect();
        assert_eq!(called, functions, "{db}: the smoke calls every function of the extension");
    }

    let owner = |su: &mut Client, key: &str| -> String {
        su.query_one("SELECT owner::regrole::text FROM tsoracle.seq WHERE key = $1", &[&key])
            .unwrap_or_else(|e| panic!("owner of {key}: {}", pg_error_string(&e)))
            .get(0)
    };
    let mut tx = pooled(&b, "tx", APP);
    tx.batch_execute("BEGIN; SET LOCAL ROLE app_group; SELECT tso_seq('owned-tx'); COMMIT")
        .unwrap();
    assert_eq!(owner(&mut su, "owned-tx"), "app_group", "SET LOCAL ROLE in the transaction");
    let me: String = one(&mut tx, "SELECT current_user::text", &[]).get(0);
    assert_eq!(me, APP, "SET LOCAL ended with its transaction");

    let mut s = pooled(&b, "session1", APP);
    s.batch_execute("SET ROLE app_group").unwrap();
    assert_eq!(seq_unnamed(&mut s, "owned-session", 1).unwrap(), 0);
    assert_eq!(owner(&mut su, "owned-session"), "app_group", "SET ROLE lasts in session pooling");
    let pid: i32 = one(&mut s, "SELECT pg_backend_pid()", &[]).get(0);
    drop(s);
    let mut next = pooled(&b, "session1", APP);
    let (next_pid, user): (i32, String) = {
        let r = one(&mut next, "SELECT pg_backend_pid(), current_user::text", &[]);
        (r.get(0), r.get(1))
    };
    assert_eq!(next_pid, pid, "pool_size=1: the next client gets the same server connection");
    assert_eq!(user, APP, "server_reset_query (DISCARD ALL) reset the role");

    let mut waiter = pooled(&b, "one", APP);
    let mut other = pooled(&b, "one", APP);
    // When each statement ran, on the server's clock (the two clients' threads read their
    // answers in either order): the waiter's clock_timestamp() is read after
    // tso_wait_resolved returned, the other's when its statement began.
    let w = std::thread::spawn(move || {
        let r = waiter
            .query_typed_one(
                "SELECT tso_wait_resolved(tso_resolved() + (1::bigint << 40), 1500), pg_backend_pid(), \
                        extract(epoch FROM clock_timestamp())::float8",
                &[],
            )
            .unwrap_or_else(|e| panic!("tso_wait_resolved: {}", pg_error_string(&e)));
        (r.get::<_, i32>(1), r.get::<_, f64>(2))
    });
    let waiting = wait_waiting_backend(&mut su, "tso_wait_resolved", &[]);
    let r = other
        .query_typed_one(
            "SELECT pg_backend_pid(), extract(epoch FROM clock_timestamp())::float8",
            &[],
        )
        .unwrap();
    let (wait_pid, wait_done) = w.join().unwrap();
    assert_eq!(wait_pid, waiting);
    assert_eq!(r.get::<_, i32>(0), wait_pid, "pool_size=1: one server connection");
    let other_began = r.get::<_, f64>(1);
    assert!(
        wait_done <= other_began,
        "the other client's statement, sent while tso_wait_resolved waited, ran only after it \
         returned ({other_began} < {wait_done})"
    );
}

// ============================================================================ 4

/// One documented metric: its name, type and where it appears (`primary`, `standby`).
#[derive(Debug)]
struct Documented {
    name: String,
    kind: String,
    on: Vec<String>,
}

/// The metrics table of docs/operations/monitoring.md: rows `| \`name\` | type | on | meaning |`.
fn documented_metrics() -> Vec<Documented> {
    let text = std::fs::read_to_string(MONITORING_MD).unwrap();
    let rows: Vec<Documented> = text
        .lines()
        .filter(|l| l.starts_with("| `tsoracle_"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            Documented {
                name: cells[1].trim_matches('`').to_string(),
                kind: cells[2].to_string(),
                on: cells[3].split(',').map(|s| s.trim().to_string()).collect(),
            }
        })
        .collect();
    assert!(rows.len() > 20, "the metrics table of {MONITORING_MD}: {rows:?}");
    rows
}

/// Every documented metric for `role` is in `m` with its type, and `m` has no undocumented
/// `tsoracle_` metric.
#[track_caller]
fn assert_documented(m: &Metrics, role: &str, documented: &[Documented]) {
    let want: BTreeSet<String> = documented
        .iter()
        .filter(|d| d.on.iter().any(|o| o == role))
        .map(|d| d.name.clone())
        .collect();
    assert_eq!(m.names_with_prefix("tsoracle_"), want, "{role}: the scrape's tsoracle metrics");
    for d in documented.iter().filter(|d| want.contains(&d.name)) {
        assert_eq!(m.kind(&d.name), Some(d.kind.as_str()), "{role}: TYPE of {}", d.name);
    }
}

/// Everything the metrics are computed from, read on the server in one statement.
#[derive(Debug)]
struct ServerView {
    status: tso::TsoStatus,
    counters: BTreeMap<&'static str, i64>,
    live_leases: i64,
    clock_wall_ms: i64,
    issued_lead_ms: Option<i64>,
    serve_left_ms: Option<i64>,
    reference_lead_ms: Option<i64>,
    lag_ms: Option<i64>,
    holders: i32,
    oldest_since_ms: Option<i64>,
    keys: i64,
}

const COUNTERS: &[&str] = &[
    "timestamps_issued",
    "window_extensions",
    "fences",
    "worker_commits",
    "group_commits",
    "grouped_requests",
    "steps_back",
    "steps_forward",
];

fn server_view(c: &mut Client) -> ServerView {
    let status = tso::status(c).unwrap();
    let r = c
        .query_one(
            "SELECT s.timestamps_issued, s.window_extensions, s.fences, s.worker_commits, \
                    s.group_commits, s.grouped_requests, k.steps_back, k.steps_forward, \
                    s.live_leases, k.wall_ms, k.issued_lead_ms, k.serve_left_ms, k.reference_lead_ms, \
                    r.lag_ms, r.holders, (extract(epoch FROM r.oldest_holder_since) * 1000)::bigint, \
                    (SELECT count(*) FROM tsoracle.seq) \
               FROM tso_status() s, tso_clock() k, tso_resolved_status() r",
            &[],
        )
        .unwrap();
    ServerView {
        status,
        counters: COUNTERS.iter().enumerate().map(|(i, n)| (*n, r.get(i))).collect(),
        live_leases: r.get(8),
        clock_wall_ms: r.get(9),
        issued_lead_ms: r.get(10),
        serve_left_ms: r.get(11),
        reference_lead_ms: r.get(12),
        lag_ms: r.get(13),
        holders: r.get(14),
        oldest_since_ms: r.get(15),
        keys: r.get(16),
    }
}

/// `lo <= v <= hi` (seconds, with the metric's millisecond values: 1 ms of slack for the
/// decimal conversion).
#[track_caller]
fn assert_between(name: &str, v: f64, lo: f64, hi: f64) {
    assert!(
        v >= lo - 0.001 && v <= hi + 0.001,
        "{name} = {v}, outside [{lo}, {hi}] read on the server around the scrape"
    );
}

#[track_caller]
fn value(m: &Metrics, name: &str) -> f64 {
    m.value(name).unwrap_or_else(|e| panic!("{e}"))
}

/// postgres_exporter with the shipped queries, on a primary and an asynchronous standby, as
/// a role with only `SELECT` on `tsoracle.seq`: every metric of docs/operations/monitoring.md
/// appears on the servers it names, with its type, and nothing else; each value agrees with
/// the server read just before and just after the scrape (equal where nothing can change,
/// within the two reads for clocks and counters). On the standby, with replay paused, the
/// replay metrics agree with the standby's own replay state. Then the primary is seeded to
/// the top of the timestamp range and its worker terminated, so that the next one refuses
/// (the server itself keeps running): the first scrape after `tso_status()` says so shows
/// `tsoracle_serving` 0.
#[test]
fn the_exporter_reports_what_tso_status_says() {
    let documented = documented_metrics();
    let primary = serving_node("exp-primary", NodeOpts::new());
    let mut su = primary.connect();
    su.batch_execute(&format!(
        "CREATE ROLE {EXPORTER_ROLE} LOGIN; GRANT SELECT ON tsoracle.seq TO {EXPORTER_ROLE}; \
         SELECT tso_seq('k1'), tso_seq('k2', 5), tso_seq('k3'); \
         SELECT * FROM tso_lease_acquire('exporter-test', 1, 60000)"
    ))
    .unwrap();
    let mut standby = Node::base_backup_from(&primary, "exp-standby").unwrap();
    standby.start().unwrap();
    tsoracle_tests::cluster::wait_replayed(&primary, &standby).unwrap();
    // An open transaction that took a value holds R.
    let mut holder = primary.connect();
    holder.batch_execute("BEGIN; SELECT tso_next()").unwrap();
    std::thread::sleep(Duration::from_millis(50));

    let exp_p = Exporter::start("primary", &primary, EXPORTER_ROLE).unwrap();
    let exp_s = Exporter::start("standby", &standby, EXPORTER_ROLE).unwrap();

    // ---- the primary
    let before = server_view(&mut su);
    let m = exp_p.scrape().unwrap();
    let after = server_view(&mut su);
    assert_eq!(value(&m, "pg_up"), 1.0);
    assert_eq!(
        value(&m, "pg_exporter_last_scrape_error"),
        0.0,
        "every query ran: {}",
        exp_p.log_tail(20)
    );
    assert_documented(&m, "primary", &documented);
    let st = &before.status;
    assert_eq!((st.state.as_str(), after.status.state.as_str()), ("serving", "serving"));
    assert_eq!(value(&m, "tsoracle_serving"), 1.0);
    assert_eq!(value(&m, "tsoracle_primary"), 1.0);
    assert_eq!(value(&m, "tsoracle_member"), 0.0);
    // No fleet: no member, no R_f published, no slot in use.
    assert_eq!(value(&m, "tsoracle_fleet_members"), 0.0);
    assert_eq!(value(&m, "tsoracle_fleet_resolved_lag_seconds"), 0.0);
    assert_eq!(value(&m, "tsoracle_fleet_slots_used"), 0.0);
    let info = m.samples_of("tsoracle_status_info");
    assert_eq!(info.len(), 1);
    assert_eq!(
        (info[0].labels["role"].as_str(), info[0].labels["state"].as_str()),
        ("primary", "serving")
    );
    assert_eq!(info[0].value, 1.0);
    assert_eq!(Some(value(&m, "tsoracle_epoch") as i64), st.epoch);
    assert_eq!(Some(value(&m, "tsoracle_timeline") as i64), st.timeline);
    let (wall_lo, wall_hi) = (before.clock_wall_ms as f64, after.clock_wall_ms as f64);
    let (hw_lo, hw_hi) =
        (st.high_water_ms.unwrap() as f64, after.status.high_water_ms.unwrap() as f64);
    assert_between(
        "tsoracle_window_left_seconds",
        value(&m, "tsoracle_window_left_seconds"),
        ((hw_lo - wall_hi) / 1000.0).max(0.0),
        (hw_hi - wall_lo) / 1000.0,
    );
    let setting = |c: &mut Client, name: &str| -> f64 {
        let sql = "SELECT setting::float8 FROM pg_settings WHERE name = $1";
        c.query_one(sql, &[&name]).unwrap().get(0)
    };
    assert_eq!(value(&m, "tsoracle_fleet_slots_max"), setting(&mut su, "tsoracle.max_members"));
    let window_ahead = setting(&mut su, "tsoracle.window_ahead_ms") / 1000.0;
    assert_eq!(value(&m, "tsoracle_window_ahead_seconds"), window_ahead);
    let max_lead = setting(&mut su, "tsoracle.max_lead_ms") / 1000.0;
    assert_eq!(value(&m, "tsoracle_max_lead_seconds"), max_lead);
    let serve_left = value(&m, "tsoracle_serve_left_seconds");
    assert!(before.serve_left_ms.is_some() && after.serve_left_ms.is_some());
    assert_between("tsoracle_serve_left_seconds", serve_left, 0.0, window_ahead);
    // Nothing is issued around the scrape (the holder took its value before): the last
    // issued timestamp is fixed, and its lead shrinks with the clock.
    assert_eq!(st.last_issued, after.status.last_issued, "no timestamp issued around the scrape");
    let issued_ms = physical(st.last_issued.unwrap()) as f64;
    assert_eq!(before.issued_lead_ms.map(|l| l as f64), Some(issued_ms - wall_lo));
    assert_between(
        "tsoracle_issued_lead_seconds",
        value(&m, "tsoracle_issued_lead_seconds"),
        (issued_ms - wall_hi) / 1000.0,
        (issued_ms - wall_lo) / 1000.0,
    );
    assert_eq!(before.reference_lead_ms, Some(0));
    assert_eq!(value(&m, "tsoracle_reference_lead_seconds"), 0.0);
    assert_eq!(value(&m, "tsoracle_last_fence_seconds"), st.last_fence_ms.unwrap() / 1000.0);
    assert_eq!(value(&m, "tsoracle_live_leases") as i64, before.live_leases);
    assert_eq!(before.live_leases, 1);
    assert_eq!(value(&m, "tsoracle_sync_replication"), 0.0);
    assert_eq!(st.sync_replication, Some(false));
    for (column, metric) in [
        ("timestamps_issued", "tsoracle_timestamps_issued_total"),
        ("window_extensions", "tsoracle_window_extensions_total"),
        ("fences", "tsoracle_fences_total"),
        ("worker_commits", "tsoracle_worker_commits_total"),
        ("group_commits", "tsoracle_group_commits_total"),
        ("grouped_requests", "tsoracle_grouped_requests_total"),
        ("steps_back", "tsoracle_clock_steps_back_total"),
        ("steps_forward", "tsoracle_clock_steps_forward_total"),
    ] {
        let (lo, hi) = (before.counters[column], after.counters[column]);
        let v = value(&m, metric);
        assert!(
            v >= lo as f64 && v <= hi as f64,
            "{metric} = {v}, outside tso_status().{column} read around the scrape: [{lo}, {hi}]"
        );
    }
    assert_eq!(
        before.counters["grouped_requests"], 4,
        "the three tso_seq calls and the lease went through the queue"
    );
    assert_eq!(before.holders, 1, "the open transaction holds R");
    assert_eq!(value(&m, "tsoracle_resolved_holders"), 1.0);
    assert_eq!(before.lag_ms, after.lag_ms);
    assert_eq!(value(&m, "tsoracle_resolved_lag_seconds"), before.lag_ms.unwrap() as f64 / 1000.0);
    let since = before.oldest_since_ms.unwrap() as f64;
    let age = value(&m, "tsoracle_resolved_oldest_holder_age_seconds");
    assert_between(
        "tsoracle_resolved_oldest_holder_age_seconds",
        age,
        ((wall_lo - since) / 1000.0).max(0.0),
        (wall_hi - since) / 1000.0,
    );
    assert!(age > 0.0, "the holder took its value before the scrape");
    assert_eq!(value(&m, "tsoracle_seq_keys") as i64, before.keys);
    assert_eq!(before.keys, 3);
    assert_eq!(value(&m, "tsoracle_seq_keys_max"), setting(&mut su, "tsoracle.max_seq_keys"));

    // ---- the standby, replay paused
    let mut sc = standby.connect();
    sc.batch_execute("SELECT pg_wal_replay_pause()").unwrap();
    wait_for("replay paused", Duration::from_secs(20), || {
        let s: String = sc.query_one("SELECT pg_get_wal_replay_pause_state()", &[]).unwrap().get(0);
        s == "paused"
    });
    // As the metric is defined: since the standby started when it has replayed no commit yet
    // (the base backup may hold every commit made so far).
    let replay = |c: &mut Client| -> (f64, i64) {
        let r = c
            .query_one(
                "SELECT extract(epoch FROM clock_timestamp() \
                          - COALESCE(pg_last_xact_replay_timestamp(), pg_postmaster_start_time()))::float8, \
                        pg_wal_lsn_diff(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn())::bigint",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    let (age_lo, behind_lo) = replay(&mut sc);
    let s_status_before = tso::status(&mut sc).unwrap();
    let ms = exp_s.scrape().unwrap();
    let (age_hi, behind_hi) = replay(&mut sc);
    assert_eq!(value(&ms, "pg_exporter_last_scrape_error"), 0.0, "{}", exp_s.log_tail(20));
    assert_documented(&ms, "standby", &documented);
    assert_eq!(s_status_before.state, "standby");
    assert_eq!(value(&ms, "tsoracle_serving"), 0.0);
    assert_eq!(value(&ms, "tsoracle_primary"), 0.0);
    assert_eq!(value(&ms, "tsoracle_member"), 0.0);
    let info = ms.samples_of("tsoracle_status_info");
    assert_eq!(
        (info[0].labels["role"].as_str(), info[0].labels["state"].as_str()),
        ("standby", "standby")
    );
    assert_eq!(Some(value(&ms, "tsoracle_timeline") as i64), s_status_before.timeline);
    assert_eq!(value(&ms, "tsoracle_seq_keys"), 3.0, "the standby replayed the keys");
    assert_eq!(value(&ms, "tsoracle_standby_replay_paused"), 1.0);
    assert_between(
        "tsoracle_standby_replay_age_seconds",
        value(&ms, "tsoracle_standby_replay_age_seconds"),
        age_lo,
        age_hi,
    );
    let behind = value(&ms, "tsoracle_standby_replay_behind_bytes");
    assert!(
        behind >= behind_lo as f64 && behind <= behind_hi as f64,
        "tsoracle_standby_replay_behind_bytes = {behind}, outside [{behind_lo}, {behind_hi}]"
    );
    sc.batch_execute("SELECT pg_wal_replay_resume()").unwrap();
    let ms = exp_s.scrape().unwrap();
    assert_eq!(value(&ms, "tsoracle_standby_replay_paused"), 0.0, "resumed");
    drop(exp_s);
    drop(sc);
    drop(standby);

    // ---- the oracle stops serving
    holder.batch_execute("COMMIT").unwrap();
    tso::tso_seed(&mut su, MAX_SQL_PHYSICAL_MS).unwrap();
    let wpid = st.worker_pid.unwrap();
    let ok: bool = su.query_one("SELECT pg_terminate_backend($1)", &[&wpid]).unwrap().get(0);
    assert!(ok, "pg_terminate_backend(worker)");
    wait_for("the next worker to refuse", Duration::from_secs(30), || {
        tso::status(&mut su).unwrap().state == "refused"
    });
    assert!(
        !primary.log_contents().contains("terminated; reinitializing"),
        "terminating the worker did not crash-restart the server"
    );
    let m = exp_p.scrape().unwrap();
    assert_eq!(value(&m, "pg_up"), 1.0, "{}", exp_p.log_tail(20));
    assert_eq!(value(&m, "tsoracle_serving"), 0.0, "the first scrape after the refusal");
    assert_eq!(value(&m, "tsoracle_primary"), 1.0);
    let info = m.samples_of("tsoracle_status_info");
    assert_eq!(info[0].labels["state"], "refused");
    assert_eq!(value(&m, "tsoracle_window_left_seconds"), 0.0, "nothing left to serve");
}

// ============================================================================ 5

/// The example alert rules load (`promtool check rules`) and pass their unit tests
/// (`promtool test rules`), and every tsoracle metric they use is a documented one.
#[test]
fn the_alert_rules_check_and_pass_their_unit_tests() {
    let out = promtool(&["check", "rules", ALERT_RULES]).unwrap_or_else(|e| panic!("{e}"));
    assert!(out.contains("SUCCESS"), "{out}");
    let out = promtool(&["test", "rules", ALERT_RULES_TEST]).unwrap_or_else(|e| panic!("{e}"));
    assert!(out.contains("SUCCESS"), "{out}");

    let documented: BTreeSet<String> = documented_metrics().into_iter().map(|d| d.name).collect();
    let rules = std::fs::read_to_string(ALERT_RULES).unwrap();
    let mut used = BTreeSet::new();
    let bytes = rules.as_bytes();
    let mut i = 0;
    while let Some(at) = rules[i..].find("tsoracle_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        // Not a recording rule's name (level:metric:operations) nor a setting (tsoracle.x).
        let in_rule_name = start > 0 && bytes[start - 1] == b':';
        if !in_rule_name {
            used.insert(rules[start..end].to_string());
        }
        i = end;
    }
    assert!(used.len() >= 10, "{used:?}");
    let undocumented: Vec<&String> = used.difference(&documented).collect();
    assert!(undocumented.is_empty(), "the rules use undocumented metrics: {undocumented:?}");
}

/// The pooler runs the repository's pgbouncer.ini: every setting of the shipped file's
/// `[pgbouncer]` section but the machine-local ones is what the running PgBouncer reports in
/// `SHOW CONFIG` (transaction pooling, SCRAM, ...), and the file it was started with is the
/// shipped one with only those lines and the `[databases]` entries changed.
#[test]
fn the_pooler_runs_the_shipped_configuration() {
    let node = serving_node("pool-config", NodeOpts::new());
    let b = bouncer("config", &node, &[("tx", "")]);
    let shipped = std::fs::read_to_string(PGBOUNCER_INI).unwrap();
    let wanted: Vec<(String, String)> = section_settings(&shipped, "[pgbouncer]")
        .into_iter()
        .filter(|(k, _)| !LOCAL_SETTINGS.contains(&k.as_str()))
        .collect();
    for setting in ["pool_mode", "auth_type", "server_reset_query", "query_timeout"] {
        assert!(wanted.iter().any(|(k, _)| k == setting), "the shipped file sets {setting}");
    }
    let running = b.show_config().unwrap();
    for (k, v) in &wanted {
        assert_eq!(running.get(k), Some(v), "PgBouncer runs with the shipped {k}");
    }
    // The written file: the shipped one, but for the local settings, the database entries and
    // stats_users.
    let written = std::fs::read_to_string(b.config_path()).unwrap();
    let changed: BTreeSet<String> = section_settings(&written, "[pgbouncer]")
        .into_iter()
        .filter(|kv| !wanted.contains(kv))
        .map(|(k, _)| k)
        .collect();
    let allowed: BTreeSet<String> =
        LOCAL_SETTINGS.iter().chain(&["stats_users"]).map(|k| k.to_string()).collect();
    assert_eq!(changed, allowed, "only machine-local settings and stats_users differ");
    // A wrong password is refused by PgBouncer itself, in a SCRAM exchange against auth_file
    // (with md5, PgBouncer's default, the message is "password authentication failed").
    match b.connect("tx", APP, "wrong") {
        Ok(_) => panic!("PgBouncer accepted a wrong password"),
        Err(e) => assert!(e.to_string().contains("SASL authentication failed"), "{e}"),
    }
    drop(b);
    drop(node);
}

/// The harness's parser of the exporter's `/metrics`: types, labels with escapes, NaN and
/// infinities, timestamps; malformed lines are errors.
#[test]
fn the_scrape_parser_reads_the_text_format() {
    let m = Metrics::parse(
        "# HELP a_total A.\n# TYPE a_total counter\na_total{server=\"127.0.0.1:5\"} 3\n\
         # TYPE b gauge\nb 1.5e+03\nc{x=\"q\\\"u,o}te\",y=\"\"} NaN\nd -Inf 1700000000\n",
    )
    .unwrap();
    assert_eq!(m.kind("a_total"), Some("counter"));
    assert_eq!(m.value("a_total").unwrap(), 3.0);
    assert_eq!(m.samples_of("a_total")[0].labels["server"], "127.0.0.1:5");
    assert_eq!(m.value("b").unwrap(), 1500.0);
    let c = m.samples_of("c")[0];
    assert!(c.value.is_nan());
    assert_eq!(c.labels["x"], "q\"u,o}te");
    assert_eq!(c.labels["y"], "");
    assert_eq!(m.value("d").unwrap(), f64::NEG_INFINITY);
    assert!(m.value("e").is_err(), "no such metric");
    assert!(Metrics::parse("a{x=1} 2\n").is_err(), "unquoted label value");
    assert!(Metrics::parse("a two\n").is_err(), "value not a number");
}
