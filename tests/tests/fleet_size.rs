//! A fleet's size (issue 55): `tsoracle.max_members` sets how many members an oracle admits.
//!
//! - an oracle with `tsoracle.max_members = 128` admits more than 64 members: 100 simulated
//!   ones (a session each, saying hello and fetching values through `tsoracle.member_next`,
//!   as a member's worker does) and a real member cluster; each is served (its values unique
//!   and increasing) and listed in `tso_fleet_status()`; the slots in use are what
//!   `contrib/prometheus/queries.yaml` exports (rows of `tsoracle.fleet_member`, removed ones
//!   included);
//! - with every slot taken, the 129th hello is refused `53400` with a HINT naming
//!   `tsoracle.max_members`; a removed member keeps its slot (still refused) until it is
//!   re-admitted;
//! - a real member that finds the fleet full: its callers get `53400` and the oracle's message
//!   and HINT whole (the HINT is longer than the 240 bytes a member used to keep), not `57P03`
//!   after `tsoracle.extension_timeout_ms`; once a place is freed it is served; restarted
//!   with its schema outdated, it says so in `tso_member_status().last_error`.
//!
//! - a member's statements run only on the oracle session that said its hello: through
//!   PgBouncer in transaction mode, with one server connection for two members, the second
//!   one's hello does not let the first speak for it (its reports never land in the
//!   second's entry), and the first says why.
//!
//! - a hello that fails (the oracle's worker paused, its wait cut short) leaves its session
//!   speaking for no member, not for the one an earlier hello registered there.
//!
//! Run with: `cargo test -p tsoracle-tests --test fleet_size -- --test-threads=2`

use std::time::Duration;

use postgres::error::SqlState;
use postgres::Client;
use tsoracle_tests::exporter::Exporter;
use tsoracle_tests::fleet::{
    admit, admit_members, admitted_member, member, member_opts, oracle_conninfo, MEMBER_ROLE,
};
use tsoracle_tests::fleet_load::system_identifier;
use tsoracle_tests::pooler::{create_role, PgBouncer, PgBouncerOpts};
use tsoracle_tests::{
    expect_sqlstate, pg_error_string, poll_until, serving_node, Node, NodeOpts, StopMode,
};

const MAX_MEMBERS: i64 = 128;
const SIMULATED: i64 = 100;
/// The simulated members' identities: far from any cluster's system identifier.
const FIRST_ID: i64 = 55_000;
/// Clusters nobody admitted.
const MADE_UP: i64 = 77_000;

/// A simulated member: a session on the oracle that said hello as `id` (again while the oracle
/// answers `57P03`, not serving yet, as a member's worker does).
fn hello(oracle: &Node, id: i64, version: &str) -> Result<Client, postgres::Error> {
    let mut c = oracle.connect_as(MEMBER_ROLE);
    let sql = "SELECT * FROM tsoracle.member_hello($1, $2, 0)";
    poll_until("a hello answered", Duration::from_secs(30), || {
        match c.query(sql, &[&id, &version]) {
            Err(e) if e.code() == Some(&SqlState::CANNOT_CONNECT_NOW) => None,
            r => Some(r.map(|_| ())),
        }
    })?;
    Ok(c)
}

/// `count` values through a simulated member's session, once its registration is durable
/// (before that the oracle answers `57P03`, and the member's worker tries again): the first.
fn next(c: &mut Client, count: i32) -> i64 {
    poll_until("a simulated member is served", Duration::from_secs(30), || {
        match c.query_one("SELECT tsoracle.member_next($1)", &[&count]) {
            Ok(row) => Some(row.get::<_, Vec<i64>>(0)[0]),
            Err(_) => None,
        }
    })
}

fn slots_in_use(oracle: &Node) -> i64 {
    oracle.connect().query_one("SELECT count(*) FROM tsoracle.fleet_member", &[]).unwrap().get(0)
}

fn listed(oracle: &Node) -> Vec<i64> {
    oracle
        .connect()
        .query(
            "SELECT system_id FROM tso_fleet_status() WHERE resolved IS NOT NULL ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// The version of tsoracle installed on `node`, which a simulated member's hello names.
fn extension_version(node: &Node) -> String {
    node.connect()
        .query_one("SELECT extversion FROM pg_extension WHERE extname = 'tsoracle'", &[])
        .unwrap()
        .get(0)
}

/// The version of tsoracle `node`'s catalog says is installed, set by hand.
fn set_version(node: &Node, version: &str) {
    node.connect()
        .execute("UPDATE pg_extension SET extversion = $1 WHERE extname = 'tsoracle'", &[&version])
        .expect("set extversion");
}

fn message(e: &postgres::Error) -> String {
    e.as_db_error().map(|d| d.message()).unwrap_or_default().to_string()
}

fn hint(e: &postgres::Error) -> String {
    e.as_db_error().and_then(|d| d.hint()).unwrap_or_default().to_string()
}

#[test]
fn an_oracle_admits_max_members_and_refuses_the_next_with_its_reason() {
    let oracle = serving_node(
        "fs-oracle",
        NodeOpts::new()
            .setting("tsoracle.max_members", MAX_MEMBERS)
            .setting("max_connections", 200),
    );
    admit_members(&oracle);
    let version = extension_version(&oracle);
    let shown: String =
        oracle.connect().query_one("SHOW tsoracle.max_members", &[]).unwrap().get(0);
    assert_eq!(shown, MAX_MEMBERS.to_string());

    // More made-up hellos than there are slots, from a member's role: each refused 42501 with
    // what to ask the oracle's DBA for; none registers, takes a slot or holds R_f.
    let mut su = oracle.connect();
    poll_until("R_f published: the fleet read", Duration::from_secs(30), || {
        su.query_one("SELECT tso_fleet_resolved()", &[]).ok().map(|_| ())
    });
    let mut fake = oracle.connect_as(MEMBER_ROLE);
    for id in MADE_UP..MADE_UP + MAX_MEMBERS + 10 {
        let hello = "SELECT * FROM tsoracle.member_hello($1, $2, 0)";
        let e = expect_sqlstate(
            fake.query(hello, &[&id, &version]),
            &SqlState::INSUFFICIENT_PRIVILEGE,
            "a hello from a cluster nobody admitted",
        );
        let wanted = format!("tso_fleet_admit({id}, '{MEMBER_ROLE}')");
        assert!(hint(&e).contains(&wanted), "HINT names {wanted}: {}", hint(&e));
    }
    assert_eq!(slots_in_use(&oracle), 0, "a made-up hello took a slot");
    assert_eq!(listed(&oracle), Vec::<i64>::new(), "a made-up hello is listed");
    // A row in a child of the admissions table (only the table's owner can make one) admits
    // nobody: the hello reads the extension's own table, ONLY.
    su.batch_execute(&format!(
        "CREATE TABLE public.planted_admission () INHERITS (tsoracle.fleet_admission); \
         INSERT INTO public.planted_admission (system_id, role) \
         VALUES ({MADE_UP}, '{MEMBER_ROLE}'::regrole)"
    ))
    .unwrap();
    expect_sqlstate(
        fake.query("SELECT * FROM tsoracle.member_hello($1, $2, 0)", &[&MADE_UP, &version]),
        &SqlState::INSUFFICIENT_PRIVILEGE,
        "a hello admitted only by a child table's row",
    );
    su.batch_execute("DROP TABLE public.planted_admission").unwrap();
    let issued: i64 = su.query_one("SELECT tso_next()", &[]).unwrap().get(0);
    poll_until("R_f passes a value issued after the hellos", Duration::from_secs(10), || {
        let rf: i64 = su.query_one("SELECT tso_fleet_resolved()", &[]).ok()?.get(0);
        (rf >= issued).then_some(())
    });
    // Only a superuser admits; each member is bound to its role: another role speaking for
    // it is refused 42501, before anything registers.
    su.batch_execute("CREATE ROLE other_member LOGIN; GRANT tsoracle_member TO other_member")
        .unwrap();
    let mut other = oracle.connect_as("other_member");
    for sql in [
        "SELECT tso_fleet_admit(55000, 'other_member')",
        "SELECT tso_fleet_admit(55000)",
        "SELECT tso_fleet_remove(55000)",
        "SELECT tso_seed(1)",
        "SELECT tso_handover()",
        "INSERT INTO tsoracle.fleet_admission (system_id, role) VALUES (1, 10)",
    ] {
        expect_sqlstate(other.query(sql, &[]), &SqlState::INSUFFICIENT_PRIVILEGE, sql);
    }
    let admitted: i64 = su
        .query_one(
            "SELECT count(*) FILTER (WHERE tso_fleet_admit(id, $2)) \
             FROM generate_series($1::bigint, $1 + $3) id",
            &[&FIRST_ID, &MEMBER_ROLE, &MAX_MEMBERS],
        )
        .unwrap()
        .get(0);
    assert_eq!(admitted, MAX_MEMBERS + 1, "admitted, each once");
    // A regrole that names no role ('-' is 0, a bare number any OID) admits nothing.
    for sql in [
        "SELECT tso_fleet_admit(55001, '-'::regrole)",
        "SELECT tso_fleet_admit(55001, 4000000000::oid::regrole)",
    ] {
        expect_sqlstate(su.query(sql, &[]), &SqlState::INVALID_PARAMETER_VALUE, sql);
    }
    let e = expect_sqlstate(
        other.query("SELECT * FROM tsoracle.member_hello($1, $2, 0)", &[&FIRST_ID, &version]),
        &SqlState::INSUFFICIENT_PRIVILEGE,
        "a hello for a member admitted for another role",
    );
    assert!(
        pg_error_string(&e).contains("admitted for role fleet_member"),
        "{}",
        pg_error_string(&e)
    );
    // PUBLIC reads who is admitted, for which role; it neither admits nor says hello.
    su.batch_execute("CREATE ROLE watcher LOGIN").unwrap();
    let mut watcher = oracle.connect_as("watcher");
    let seen: i64 = watcher
        .query_one("SELECT count(*) FROM tso_fleet_status() WHERE role = $1", &[&MEMBER_ROLE])
        .unwrap()
        .get(0);
    assert_eq!(seen, MAX_MEMBERS + 1, "PUBLIC sees the admissions");
    let rows: i64 =
        watcher.query_one("SELECT count(*) FROM tsoracle.fleet_admission", &[]).unwrap().get(0);
    assert_eq!(rows, MAX_MEMBERS + 1, "PUBLIC reads tsoracle.fleet_admission");
    for sql in [
        "SELECT tso_fleet_admit(1, 'watcher')",
        "SELECT tso_fleet_remove(1)",
        "SELECT * FROM tsoracle.member_hello(1, '0.6.0', 0)",
    ] {
        expect_sqlstate(watcher.query(sql, &[]), &SqlState::INSUFFICIENT_PRIVILEGE, sql);
    }
    let unregistered: Option<i64> = su
        .query_one("SELECT resolved FROM tso_fleet_status() WHERE system_id = $1", &[&FIRST_ID])
        .unwrap()
        .get(0);
    assert_eq!(unregistered, None, "admitted, listed, and registered by no one yet");

    // More than 64 members, each served and listed.
    let mut sessions: Vec<(i64, Client)> = (0..SIMULATED)
        .map(|i| {
            let id = FIRST_ID + i;
            let c = hello(&oracle, id, &version)
                .unwrap_or_else(|e| panic!("hello of member {i}: {}", pg_error_string(&e)));
            (id, c)
        })
        .collect();
    let mut last = 0i64;
    for round in 0..2 {
        for (id, c) in &mut sessions {
            let first = next(c, 16);
            assert!(first > last, "member {id}, round {round}: {first} after {last}");
            last = first + 15;
        }
    }
    let ids: Vec<i64> = (FIRST_ID..FIRST_ID + SIMULATED).collect();
    assert_eq!(listed(&oracle), ids, "every simulated member listed");

    // A real member cluster among them.
    let conninfo = oracle_conninfo(&[oracle.port()], MEMBER_ROLE);
    let real = member("fs-real", &conninfo);
    let a: i64 = real.connect().query_one("SELECT tso_next()", &[]).unwrap().get(0);
    assert!(a > last, "the real member's value {a} after the simulated ones' {last}");
    assert_eq!(listed(&oracle).len() as i64, SIMULATED + 1);

    // Fill every slot; the next hello is refused 53400 with its HINT.
    for i in SIMULATED..MAX_MEMBERS - 1 {
        let id = FIRST_ID + i;
        let mut c = hello(&oracle, id, &version)
            .unwrap_or_else(|e| panic!("hello of member {i}: {}", pg_error_string(&e)));
        next(&mut c, 1);
        sessions.push((id, c));
    }
    poll_until("every slot in use, durably", Duration::from_secs(10), || {
        (slots_in_use(&oracle) == MAX_MEMBERS).then_some(())
    });
    let e = expect_sqlstate(
        hello(&oracle, FIRST_ID + MAX_MEMBERS, &version).map(|_| ()),
        &SqlState::CONFIGURATION_LIMIT_EXCEEDED,
        "the 129th member's hello",
    );
    assert!(pg_error_string(&e).contains("at most 128 members"), "{}", pg_error_string(&e));
    assert!(hint(&e).contains("tsoracle.max_members"), "HINT: {}", hint(&e));
    let (oracle_message, oracle_hint) = (message(&e), hint(&e));
    assert!(oracle_hint.len() > 240, "a HINT longer than a member used to keep: {oracle_hint}");

    // A removed member keeps its slot: the fleet stays full until it is re-admitted.
    let (gone, c) = sessions.pop().expect("a session");
    drop(c);
    let mut su = oracle.connect();
    poll_until("the member's session ended", Duration::from_secs(10), || {
        su.query_one("SELECT tso_fleet_remove($1)", &[&gone]).ok().map(|_| ())
    });
    assert!(!listed(&oracle).contains(&gone), "a removed member is not listed");
    assert_eq!(slots_in_use(&oracle), MAX_MEMBERS, "a removed member keeps its slot");
    expect_sqlstate(
        hello(&oracle, FIRST_ID + MAX_MEMBERS, &version).map(|_| ()),
        &SqlState::CONFIGURATION_LIMIT_EXCEEDED,
        "a hello while a removed member holds the last slot",
    );

    // A real member that finds the fleet full: its callers hear why, as the oracle said it.
    let mut full = Node::start_new("fs-full", member_opts(&conninfo)).expect("start the member");
    full.connect().batch_execute("CREATE EXTENSION tsoracle").expect("CREATE EXTENSION");
    let e = poll_until("the full fleet's refusal on the member", Duration::from_secs(30), || {
        match full.connect().query_one("SELECT tso_next()", &[]) {
            Ok(_) => panic!("a member beyond tsoracle.max_members was served"),
            Err(e) if e.code() == Some(&SqlState::CONFIGURATION_LIMIT_EXCEEDED) => Some(e),
            // Before its worker's first hello, or (without the fix) after the timeout.
            Err(_) => None,
        }
    });
    // The oracle's message and HINT whole, whatever their length.
    assert_eq!(message(&e), format!("the oracle refused this member: {oracle_message}"));
    assert_eq!(hint(&e), oracle_hint, "the oracle's HINT, whole, on the member");
    let last_error: Option<String> =
        full.connect().query_one("SELECT last_error FROM tso_member_status()", &[]).unwrap().get(0);
    assert!(last_error.unwrap_or_default().contains("53400"), "tso_member_status().last_error");

    // Its place freed, the member is served.
    let readmitted: bool = su.query_one("SELECT tso_fleet_admit($1)", &[&gone]).unwrap().get(0);
    assert!(readmitted);
    full.wait_serving().expect("the member served once a place is free");
    let b: i64 = full.connect().query_one("SELECT tso_next()", &[]).unwrap().get(0);
    assert!(b > a, "{b} after {a}");
    assert_eq!(slots_in_use(&oracle), MAX_MEMBERS);

    // Its schema outdated (the catalog says an older version, as after a new library before
    // ALTER EXTENSION UPDATE): the member says so in tso_member_status().last_error, which
    // its alert points at, instead of nothing while it waits (the oracle is not to blame).
    let installed = extension_version(&full);
    set_version(&full, "0.5.0");
    full.restart(StopMode::Fast).expect("restart the member");
    let (connected, why) =
        poll_until("the member names its outdated schema", Duration::from_secs(30), || {
            let row = full
                .connect()
                .query_one("SELECT connected, last_error FROM tso_member_status()", &[])
                .ok()?;
            let why: Option<String> = row.get(1);
            why.filter(|w| w.contains("ALTER EXTENSION tsoracle UPDATE"))
                .map(|w| (row.get::<_, bool>(0), w))
        });
    assert!(!connected && why.contains("0.5.0"), "{why}");
    set_version(&full, &installed);
    full.wait_serving().expect("the member served once its schema is the library's");
    // A member stopped, another killed (kill -9 of its postmaster): neither is connected in
    // tso_fleet_status(), nor counted so by the exporter.
    let (mut real, mut full) = (real, full);
    let ids = [system_identifier(&mut real.connect()), system_identifier(&mut full.connect())];
    real.stop(StopMode::Fast).expect("stop a member");
    full.kill9_postmaster().expect("kill -9 a member");
    poll_until("both members shown not connected", Duration::from_secs(15), || {
        let rows = su
            .query(
                "SELECT session_pid, connected FROM tso_fleet_status() WHERE system_id = ANY($1)",
                &[&ids.to_vec()],
            )
            .unwrap();
        (rows.len() == 2
            && rows.iter().all(|r| r.get::<_, Option<i32>>(0).is_none() && !r.get::<_, bool>(1)))
        .then_some(())
    });
    let exporter = Exporter::start("fs-oracle", &oracle, "postgres").expect("postgres_exporter");
    let m = exporter.scrape().expect("scrape");
    let connected: i64 = su
        .query_one("SELECT count(*) FROM tso_fleet_status() WHERE connected", &[])
        .unwrap()
        .get(0);
    assert_eq!(m.value("tsoracle_fleet_members_connected").unwrap(), connected as f64);
    assert!(
        m.value("tsoracle_fleet_members").unwrap()
            >= m.value("tsoracle_fleet_members_connected").unwrap() + 2.0,
        "two members away"
    );
    // What the oracle's exporter reads in that state, held for 8 minutes on promtool's clock:
    // TsoracleFleetMemberAway pages (it waited for a session_pid that was never cleared, so
    // the members still counted as connected); its slots all taken, TsoracleFleetNearCap too.
    tsoracle_tests::alerts::record(&exporter, 2, Duration::from_millis(300), 4)
        .expect("scrape")
        .assert_firing(&["TsoracleFleetMemberAway", "TsoracleFleetNearCap"]);
}

#[test]
fn through_a_transaction_pooler_no_member_speaks_for_another() {
    const ROLE: &str = "pooled_member";
    const PASSWORD: &str = "pooled-member-password";
    let oracle = serving_node("fs-pool-oracle", NodeOpts::new());
    create_role(&mut oracle.connect(), ROLE, &["tsoracle_member"]).expect("the members' role");
    // One server connection for every client of the pool, released at each transaction's end.
    let bouncer = PgBouncer::start(
        "fs-pool-bouncer",
        PgBouncerOpts::new().user(ROLE, PASSWORD).database(
            "postgres",
            &oracle,
            "pool_size=1 pool_mode=transaction",
        ),
    )
    .expect("start pgbouncer");
    let conninfo = bouncer.conninfo("postgres", ROLE, PASSWORD);
    // Alone, every statement of the first member runs on that connection: it is served. An
    // open transaction holds its R, so its reports name that backend (`held_by_pid`).
    let a = admitted_member("fs-pool-a", &conninfo, &oracle, ROLE);
    let mut holder = a.connect();
    holder.batch_execute("BEGIN; SELECT tso_next()").expect("the first member is served");
    let holder_pid: i32 = holder.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    poll_until("the first member's report names its holder", Duration::from_secs(30), || {
        let held: Option<i32> = oracle
            .connect()
            .query_one(
                "SELECT held_by_pid FROM tso_fleet_status() WHERE held_by_pid = $1",
                &[&holder_pid],
            )
            .ok()?
            .get(0);
        held.map(|_| ())
    });

    // The second says hello on the same server connection, while the first keeps reporting
    // (every tsoracle.resolved_interval_ms): none of its reports may land in the second's
    // entry, whichever member said the last hello on that connection.
    let b = Node::start_new("fs-pool-b", member_opts(&conninfo).unadmitted())
        .expect("start the member");
    admit(&oracle, &b, ROLE);
    b.connect().batch_execute("CREATE EXTENSION tsoracle").expect("CREATE EXTENSION");
    let b_id = system_identifier(&mut b.connect());
    poll_until("the second member's hello", Duration::from_secs(30), || {
        listed(&oracle).contains(&b_id).then_some(())
    });
    let mut watch = oracle.connect();
    for _ in 0..250 {
        let held: Option<i32> = watch
            .query_one("SELECT held_by_pid FROM tso_fleet_status() WHERE system_id = $1", &[&b_id])
            .unwrap()
            .get(0);
        assert_ne!(
            held,
            Some(holder_pid),
            "the first member's report landed in the second's entry"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    holder.batch_execute("COMMIT").ok();
    let log = a.log_contents();
    assert!(
        log.contains("a session this member's hello did not name, and did nothing"),
        "the first member did not say why it stopped:\n{}",
        a.log_tail(40)
    );
}

#[test]
fn a_hello_that_failed_leaves_its_session_speaking_for_no_member() {
    let oracle = serving_node(
        "fs-hello-oracle",
        NodeOpts::new().setting("tsoracle.extension_timeout_ms", 1000),
    );
    admit_members(&oracle);
    let version = extension_version(&oracle);
    let (first, second) = (FIRST_ID + 1_000, FIRST_ID + 1_001);
    // The role as a name, or as a regrole.
    let mut su = oracle.connect();
    su.query_one("SELECT tso_fleet_admit($1, $2)", &[&first, &MEMBER_ROLE]).unwrap();
    let by_oid = format!("SELECT tso_fleet_admit({second}, '{MEMBER_ROLE}'::regrole)");
    assert!(su.query_one(&by_oid, &[]).unwrap().get::<_, bool>(0), "{by_oid}");
    let mut s = hello(&oracle, first, &version).expect("the first member's hello");
    next(&mut s, 1);
    let report = "SELECT tsoracle.member_report(1, 0)";
    s.query_one(report, &[]).expect("the first member reports on its session");

    // The second member's hello on the same session cannot be made durable: it fails.
    let worker = oracle.worker_pid();
    oracle.pause_pid(worker, true);
    let failed = s.query("SELECT * FROM tsoracle.member_hello($1, $2, 0)", &[&second, &version]);
    oracle.pause_pid(worker, false);
    assert!(failed.is_err(), "a hello answered while the oracle's worker was paused");

    // The session speaks for neither: not for the second, whose hello failed, nor for the
    // first (its member's later statements run only where its hello's name holds).
    let e = s.query_one(report, &[]).expect_err("a report counted after a failed hello");
    assert_eq!(
        e.code(),
        Some(&SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE),
        "{}",
        pg_error_string(&e)
    );
    let reported: Option<std::time::SystemTime> = oracle
        .connect()
        .query_one("SELECT reported_at FROM tso_fleet_status() WHERE system_id = $1", &[&second])
        .unwrap()
        .get(0);
    assert_eq!(reported, None, "a report landed in the entry of a member whose hello failed");
}
