//! Security: each attack a hostile or careless role could make, on a real cluster, and the
//! proof that it fails with the right SQLSTATE while the oracle keeps serving.
//!
//! Run with: `cargo test -p tsoracle-tests --test security -- --test-threads=2`

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::{Client, NoTls};
use tsoracle_tests::seqlease::alter_system;
use tsoracle_tests::tso::{durable_high_water, status, tso_next, tso_seed};
use tsoracle_tests::{
    expect_sqlstate, now_ms, pg_error_string, physical, poll_until, serving_node, wait_for, Node,
    NodeOpts, StopMode,
};

/// The last millisecond a timestamp can be issued in (the allocator's `MAX_SQL_PHYSICAL_MS`).
const MAX_SQL_PHYSICAL_MS: i64 = (1 << 45) - 1;

fn ok<T>(r: Result<T, postgres::Error>, what: &str) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {}", pg_error_string(&e)))
}

fn seq(c: &mut Client, key: &str, count: i32) -> Result<i64, postgres::Error> {
    c.query_one("SELECT tso_seq($1, $2)", &[&key, &count]).map(|r| r.get(0))
}

fn worker_pid(c: &mut Client) -> Option<i32> {
    ok(status(c), "tso_status()").worker_pid
}

// ---------------------------------------------------------------------------------------- 1

/// CVE-2018-1058 against the worker: the owner of `tsoracle.database` plants functions and
/// operators named like those the worker calls, puts its schema first on the database's
/// search_path, and sets database defaults that would make the worker read-only, time out
/// or run as the owner. After a restart the worker still serves every path (fence, window
/// extension, sequences, leases, lease expiry) and the owner gained nothing.
#[test]
fn database_owner_cannot_take_over_the_worker() {
    let mut node =
        Node::start_new("sec-owner", NodeOpts::new().setting("tsoracle.database", "appdb"))
            .expect("start");
    let mut su = node.connect();
    // The functions in database postgres too, for tso_status() (the worker serves appdb).
    ok(su.batch_execute("CREATE EXTENSION tsoracle"), "CREATE EXTENSION in postgres");
    ok(
        su.batch_execute("CREATE ROLE app LOGIN IN ROLE tsoracle_seq_user, tsoracle_lease_holder"),
        "create the owner",
    );
    ok(su.batch_execute("CREATE DATABASE appdb OWNER app"), "create its database");
    let mut app =
        node.try_connect_as("app", "appdb", Duration::from_secs(30)).expect("connect as app");
    // Every function the planted objects call escalates; what they return does not matter.
    ok(
        app.batch_execute(
            r#"
            CREATE FUNCTION public.escalate() RETURNS void LANGUAGE plpgsql AS
                $$ BEGIN EXECUTE 'ALTER ROLE app SUPERUSER'; END $$;
            CREATE FUNCTION public.unnest(text[]) RETURNS SETOF text LANGUAGE plpgsql AS
                $$ BEGIN PERFORM public.escalate(); RETURN QUERY SELECT x FROM pg_catalog.unnest($1) x; END $$;
            CREATE FUNCTION public.unnest(bigint[]) RETURNS SETOF bigint LANGUAGE plpgsql AS
                $$ BEGIN PERFORM public.escalate(); RETURN QUERY SELECT x FROM pg_catalog.unnest($1) x; END $$;
            CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE plpgsql AS
                $$ BEGIN PERFORM public.escalate(); RETURN pg_catalog.now(); END $$;
            CREATE FUNCTION public.count(text) RETURNS bigint LANGUAGE plpgsql AS
                $$ BEGIN PERFORM public.escalate(); RETURN 0; END $$;
            CREATE FUNCTION public.convert_to(text, name) RETURNS bytea LANGUAGE plpgsql AS
                $$ BEGIN PERFORM public.escalate(); RETURN pg_catalog.convert_to($1, $2); END $$;
            CREATE FUNCTION public.to_regclass(text) RETURNS regclass LANGUAGE plpgsql AS
                $$ BEGIN PERFORM public.escalate(); RETURN pg_catalog.to_regclass($1); END $$;
            CREATE FUNCTION public.eq_escalate(bigint, bigint) RETURNS boolean LANGUAGE plpgsql AS
                $$ BEGIN PERFORM public.escalate(); RETURN $1 OPERATOR(pg_catalog.=) $2; END $$;
            CREATE OPERATOR public.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = public.eq_escalate);
            CREATE FUNCTION public.le_escalate(bigint, bigint) RETURNS boolean LANGUAGE plpgsql AS
                $$ BEGIN PERFORM public.escalate(); RETURN $1 OPERATOR(pg_catalog.<=) $2; END $$;
            CREATE OPERATOR public.<= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = public.le_escalate);
            ALTER DATABASE appdb SET search_path = public, pg_catalog;
            ALTER DATABASE appdb SET default_transaction_read_only = on;
            ALTER DATABASE appdb SET statement_timeout = 1;
            ALTER DATABASE appdb SET lock_timeout = 1;
            ALTER DATABASE appdb SET default_transaction_isolation = 'serializable';
            ALTER DATABASE appdb SET exit_on_error = on;
            ALTER DATABASE appdb SET role = app;
            "#,
        ),
        "plant the objects and the database defaults",
    );
    drop(app);
    // The superuser creates the extension in appdb, as the README says.
    let mut su_app = node
        .try_connect_as("postgres", "appdb", Duration::from_secs(30))
        .expect("connect to appdb");
    for sql in [
        "SET role = none",
        "SET default_transaction_read_only = off",
        "SET statement_timeout = 0",
        "SET exit_on_error = off",
    ] {
        ok(su_app.batch_execute(sql), sql);
    }
    ok(su_app.batch_execute("CREATE EXTENSION tsoracle"), "CREATE EXTENSION in appdb");
    drop(su_app);
    drop(su);

    node.restart(StopMode::Fast).expect("restart");
    node.wait_serving().expect("the worker serves in the hostile database");
    let pid = worker_pid(&mut node.connect());
    // The owner's own sessions get its defaults too; it turns them off for itself.
    let mut app =
        node.try_connect_as("app", "appdb", Duration::from_secs(30)).expect("connect as app");
    for sql in [
        "SET exit_on_error = off",
        "SET statement_timeout = 0",
        "SET lock_timeout = 0",
        "SET default_transaction_read_only = off",
    ] {
        ok(app.batch_execute(sql), sql);
    }
    // The trap is live: under the database's search_path, unqualified names find the
    // planted objects (which fail here only because app is not a superuser).
    expect_sqlstate(
        app.query("SELECT count(*) FROM unnest(ARRAY['x']::text[])", &[]),
        &SqlState::INSUFFICIENT_PRIVILEGE,
        "the planted unnest(text[]) runs for an unqualified call",
    );
    expect_sqlstate(
        app.query("SELECT 1::bigint = 1::bigint", &[]),
        &SqlState::INSUFFICIENT_PRIVILEGE,
        "the planted =",
    );
    let mut last = 0;
    for i in 0..20 {
        let key = format!("k{}", i % 3);
        let start = ok(
            app.query_one("SELECT tso_seq($1, 5)", &[&key]).map(|r| r.get::<_, i64>(0)),
            "tso_seq as app",
        );
        assert!(start >= 0);
        let ts = ok(
            app.query_one("SELECT tso_next()", &[]).map(|r| r.get::<_, i64>(0)),
            "tso_next as app",
        );
        assert!(ts > last, "timestamps increase");
        last = ts;
    }
    let lease: i64 = ok(
        app.query_one("SELECT lease_id FROM tso_lease_acquire('app-holder', 1, 5000)", &[])
            .map(|r| r.get(0)),
        "lease acquire",
    );
    ok(app.query("SELECT * FROM tso_lease_renew($1)", &[&lease]), "lease renew");
    ok(app.execute("SELECT tso_lease_release($1)", &[&lease]), "lease release");
    // Force window extensions and a fence with the planted objects in place.
    let mut su = node.connect();
    let fences_before = ok(status(&mut su), "status").fences.unwrap_or(0);
    ok(
        su.batch_execute(
            "SELECT tso_seed((extract(epoch from clock_timestamp()) * 1000)::bigint + 60000)",
        ),
        "tso_seed",
    );
    assert!(
        ok(status(&mut su), "status").fences.unwrap_or(0) > fences_before,
        "tso_seed ran a fence"
    );
    ok(su.batch_execute("SELECT tso_next()"), "tso_next after the seed");

    let superuser: bool =
        ok(su.query_one("SELECT rolsuper FROM pg_roles WHERE rolname = 'app'", &[]), "pg_roles")
            .get(0);
    assert!(!superuser, "the database owner became superuser through the worker");
    let st = ok(status(&mut su), "status");
    assert_eq!(st.state, "serving", "{st:?}");
    assert_eq!(worker_pid(&mut su), pid, "the worker never died");
}

// ---------------------------------------------------------------------------------------- 2

/// A table that is not the extension's is never written: the owner of the database creates
/// schema tsoracle with tables of the right names (and a trigger that escalates) before the
/// extension exists. The worker refuses to touch them (`tso_status().state` says why),
/// never runs the trigger, and `CREATE EXTENSION` then fails on the existing schema.
#[test]
fn foreign_tables_named_like_the_extensions_are_not_touched() {
    let node =
        Node::start_new("sec-foreign", NodeOpts::new().setting("tsoracle.database", "ownerdb"))
            .expect("start");
    let mut su = node.connect();
    ok(su.batch_execute("CREATE EXTENSION tsoracle; CREATE ROLE owner LOGIN"), "setup");
    ok(su.batch_execute("CREATE DATABASE ownerdb OWNER owner"), "create the owner's database");
    let mut o =
        node.try_connect_as("owner", "ownerdb", Duration::from_secs(30)).expect("connect as owner");
    ok(
        o.batch_execute(
            r#"
            CREATE SCHEMA tsoracle;
            CREATE FUNCTION tsoracle.escalate() RETURNS trigger LANGUAGE plpgsql AS
                $$ BEGIN EXECUTE 'ALTER ROLE owner SUPERUSER'; RETURN NEW; END $$;
            CREATE TABLE tsoracle.high_water (id boolean PRIMARY KEY DEFAULT true, physical_ms bigint, epoch bigint, updated_at timestamptz);
            CREATE TABLE tsoracle.seq (key text PRIMARY KEY, next bigint, updated_at timestamptz, owner regrole);
            CREATE TABLE tsoracle.lease (lease_id bigint PRIMARY KEY, holder text, holder_epoch bigint, ts_upper_bound_ms bigint,
                expires_at_ms bigint, ttl_ms bigint, superseded boolean, granted_at timestamptz, renewed_at timestamptz, owner regrole);
            CREATE TRIGGER escalate BEFORE INSERT OR UPDATE ON tsoracle.high_water FOR EACH ROW EXECUTE FUNCTION tsoracle.escalate();
            "#,
        ),
        "plant look-alike tables",
    );
    // The worker connects every second until the database exists; give it time to look.
    thread::sleep(Duration::from_secs(3));
    let st = ok(status(&mut su), "status");
    assert_ne!(st.state, "serving", "{st:?}");
    expect_sqlstate(
        su.query_one("SELECT tso_next()", &[]),
        &SqlState::CANNOT_CONNECT_NOW,
        "tso_next",
    );
    let superuser: bool =
        ok(su.query_one("SELECT rolsuper FROM pg_roles WHERE rolname = 'owner'", &[]), "pg_roles")
            .get(0);
    assert!(!superuser, "the owner became superuser through the worker");
    let rows: i64 =
        ok(o.query_one("SELECT count(*) FROM tsoracle.high_water", &[]), "count").get(0);
    assert_eq!(rows, 0, "the worker wrote into a table that is not the extension's");
    let mut su_owner =
        node.try_connect_as("postgres", "ownerdb", Duration::from_secs(30)).expect("connect");
    expect_sqlstate(
        su_owner.batch_execute("CREATE EXTENSION tsoracle"),
        &SqlState::DUPLICATE_SCHEMA,
        "CREATE EXTENSION",
    );
}

// ---------------------------------------------------------------------------------------- 3

/// 1,000 calls whose callers leave while they wait for the worker — terminated by
/// `pg_terminate_backend`, cancelled, or disconnected (the client process is killed) — half
/// of them `tso_seq_batch` with 64 keys (a quarter of the old shared queue each). The worker
/// is held inside a transaction meanwhile (the test build's `tsoracle.test_worker_hold_key`), so every
/// call waits. Then a normal `tso_seq` and a 64-key batch succeed at once: nothing leaked.
#[test]
fn callers_that_leave_mid_call_never_exhaust_the_queue() {
    let node = serving_node(
        "sec-leavers",
        NodeOpts::new()
            .setting("max_connections", 64)
            .setting("tsoracle.extension_timeout_ms", 600_000)
            .setting("client_connection_check_interval", 100),
    );
    let mut su = node.connect();
    ok(su.batch_execute("CREATE ROLE leaver LOGIN IN ROLE tsoracle_seq_user"), "setup");
    ok(seq(&mut node.connect_as("leaver"), "held", 1), "the leaver's key");
    // Hold the worker in any group that names 'held' (a worker stuck in its commit; the test
    // build's setting: a locked row would only get the calls a quick 55P03).
    alter_system(&node, "tsoracle.test_worker_hold_key", Some("held")).expect("hold the worker");

    let batch_keys: Vec<String> =
        std::iter::once("held".to_string()).chain((1..64).map(|i| format!("b{i}"))).collect();
    let batch_sql = format!(
        "SELECT * FROM tso_seq_batch(ARRAY[{}], array_fill(1, ARRAY[64]))",
        batch_keys.iter().map(|k| format!("'{k}'")).collect::<Vec<_>>().join(",")
    );
    let done = Arc::new(AtomicUsize::new(0));
    let threads = 8;
    let per_thread = 1000 / threads;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let conninfo = node.conninfo_for("leaver", "postgres");
            let su_conninfo = node.conninfo();
            let batch_sql = batch_sql.clone();
            let done = done.clone();
            thread::spawn(move || {
                let mut killer = Client::connect(&su_conninfo, NoTls).expect("killer connects");
                for i in 0..per_thread {
                    let sql = if i % 2 == 0 {
                        batch_sql.clone()
                    } else {
                        "SELECT tso_seq('held', 1)".to_string()
                    };
                    let app = format!("leaver-{t}-{i}");
                    leave_mid_call(&mut killer, &conninfo, &sql, &app, (t + i) % 3);
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("leaver thread");
    }
    assert_eq!(done.load(Ordering::Relaxed), threads * per_thread);
    alter_system(&node, "tsoracle.test_worker_hold_key", None).expect("release the worker");

    // Everything the leavers queued is answered or freed; a normal caller is served.
    let mut c = node.connect_as("leaver");
    ok(c.batch_execute("SET statement_timeout = '30s'"), "timeout");
    for _ in 0..5 {
        ok(seq(&mut c, "after", 1), "tso_seq after 1,000 leavers");
        let rows = ok(c.query(batch_sql.as_str(), &[]), "64-key batch");
        assert_eq!(rows.len(), 64);
    }
    let st = ok(status(&mut c), "status");
    assert_eq!(st.state, "serving", "{st:?}");
}

/// The backend of the session named `app` while it runs a query, if any.
fn active_backend(killer: &mut Client, app: &str) -> Option<i32> {
    killer
        .query_opt(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND state = 'active'",
            &[&app],
        )
        .expect("pg_stat_activity")
        .map(|r| r.get(0))
}

/// Run `sql` as a client session named `app` and make it leave while the call waits:
/// way 0 `pg_terminate_backend`, way 1 a query cancel, way 2 the client process dies (its
/// socket closes). Returns once the backend is gone or idle again.
fn leave_mid_call(killer: &mut Client, conninfo: &str, sql: &str, app: &str, way: usize) {
    let conninfo = format!("{conninfo} application_name={app}");
    let wait_active = |killer: &mut Client| {
        poll_until(&format!("session {app} in its call"), Duration::from_secs(20), || {
            active_backend(killer, app)
        })
    };
    let pid = if way == 2 {
        let mut child = std::process::Command::new(tsoracle_tests::node::pg_bin_dir().join("psql"))
            .args(["-X", "-q", "-c", sql, &conninfo])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn psql");
        let pid = wait_active(killer);
        child.kill().expect("kill psql");
        child.wait().expect("reap psql");
        pid
    } else {
        let mut c = Client::connect(&conninfo, NoTls).expect("caller connects");
        let cancel = c.cancel_token();
        let owned_sql = sql.to_string();
        let call = thread::spawn(move || {
            let r = c.batch_execute(&owned_sql);
            (r, c)
        });
        let pid = wait_active(killer);
        if way == 0 {
            killer.execute("SELECT pg_terminate_backend($1)", &[&pid]).expect("terminate");
        } else {
            cancel.cancel_query(NoTls).expect("cancel");
        }
        let (r, c) = call.join().expect("caller thread");
        assert!(r.is_err(), "a call whose caller left cannot have succeeded: the worker is held");
        drop(c);
        pid
    };
    wait_for(&format!("backend {pid} of {app} out of its call"), Duration::from_secs(20), || {
        let busy: bool = killer
            .query_one("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND state = 'active')", &[&pid])
            .expect("pg_stat_activity")
            .get(0);
        !busy
    });
}

// ---------------------------------------------------------------------------------------- 4

/// A plain role floods `tso_next_batch(262144)` from 4 sessions for 30 s: every timestamp
/// anyone gets stays within `tsoracle.max_lead_ms` of the clock (without the cap the same
/// flood ran minutes ahead). At the cap callers wait for the clock, then get 57P03.
#[test]
fn a_flood_never_pushes_the_oracle_past_max_lead() {
    let max_lead = 2_000i64;
    let node = serving_node(
        "sec-flood",
        NodeOpts::new()
            .setting("tsoracle.max_lead_ms", max_lead)
            .setting("tsoracle.extension_timeout_ms", 1000),
    );
    let mut su = node.connect();
    ok(su.batch_execute("CREATE ROLE flooder LOGIN"), "setup");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flooders: Vec<_> = (0..4)
        .map(|_| {
            let conninfo = node.conninfo_for("flooder", "postgres");
            let stop = stop.clone();
            thread::spawn(move || {
                let mut c = Client::connect(&conninfo, NoTls).expect("flooder connects");
                let (mut granted, mut refused, mut worst_lead) = (0u64, 0u64, i64::MIN);
                while !stop.load(Ordering::Relaxed) {
                    match c.query_one("SELECT tso_next_batch(262144)", &[]) {
                        Ok(row) => {
                            let ts: i64 = row.get(0);
                            worst_lead = worst_lead.max(physical(ts) - now_ms());
                            granted += 1;
                        }
                        Err(e) => {
                            assert_eq!(
                                e.code(),
                                Some(&SqlState::CANNOT_CONNECT_NOW),
                                "{}",
                                pg_error_string(&e)
                            );
                            refused += 1;
                        }
                    }
                }
                (granted, refused, worst_lead)
            })
        })
        .collect();
    let started = Instant::now();
    let mut samples = 0;
    while started.elapsed() < Duration::from_secs(30) {
        if let Ok(ts) = tso_next(&mut su) {
            let lead = physical(ts) - now_ms();
            assert!(
                lead <= max_lead,
                "tso_next() ran {lead} ms ahead of the clock (max_lead_ms = {max_lead})"
            );
            samples += 1;
        }
        thread::sleep(Duration::from_millis(250));
    }
    stop.store(true, Ordering::Relaxed);
    let mut total_granted = 0;
    for f in flooders {
        let (granted, _refused, worst_lead) = f.join().expect("flooder");
        total_granted += granted;
        assert!(
            worst_lead <= max_lead,
            "a flooder got a timestamp {worst_lead} ms ahead (max_lead_ms = {max_lead})"
        );
    }
    assert!(total_granted > 100, "the flood ran ({total_granted} batches)");
    assert!(samples > 10, "the oracle kept serving others ({samples} samples)");
    let ts = ok(tso_next(&mut su), "tso_next after the flood");
    let lead = physical(ts) - now_ms();
    assert!(lead <= max_lead, "after the flood: {lead} ms ahead");
}

// ---------------------------------------------------------------------------------------- 5

/// 1,000 renewals of one lease move the durable high-water no further than `now + ttl`
/// (they used to stack: `max(H + 1, now) + ttl` each time).
#[test]
fn lease_renewals_do_not_stack() {
    let node = serving_node("sec-renew", NodeOpts::new());
    let mut su = node.connect();
    let ttl = 10_000i64;
    let id: i64 = ok(
        su.query_one("SELECT lease_id FROM tso_lease_acquire('renewer', 1, $1)", &[&(ttl as i32)]),
        "acquire",
    )
    .get(0);
    let before = ok(durable_high_water(&mut su), "high-water").expect("a row");
    for _ in 0..1000 {
        ok(su.query("SELECT * FROM tso_lease_renew($1)", &[&id]), "renew");
    }
    let end = now_ms();
    let after = ok(durable_high_water(&mut su), "high-water").expect("a row");
    assert!(
        after <= before.max(end + ttl),
        "1,000 renewals moved the high-water to {after}, past max(before {before}, now + ttl {})",
        end + ttl
    );
}

// ---------------------------------------------------------------------------------------- 6

/// Who may do what with counters and leases, role by role: a plain role, two sequence users,
/// a member of one of them, two lease holders, and a superuser.
#[test]
fn counters_and_leases_belong_to_someone() {
    let node = serving_node("sec-owners", NodeOpts::new());
    let mut su = node.connect();
    ok(
        su.batch_execute(
            "CREATE ROLE plain LOGIN;
             CREATE ROLE alice LOGIN IN ROLE tsoracle_seq_user, tsoracle_lease_holder;
             CREATE ROLE bob LOGIN IN ROLE tsoracle_seq_user, tsoracle_lease_holder;
             CREATE ROLE carol LOGIN IN ROLE tsoracle_seq_user, alice;",
        ),
        "roles",
    );
    let denied = SqlState::INSUFFICIENT_PRIVILEGE;
    let (mut plain, mut alice, mut bob, mut carol) = (
        node.connect_as("plain"),
        node.connect_as("alice"),
        node.connect_as("bob"),
        node.connect_as("carol"),
    );

    // A role without the grant cannot create keys or advance counters.
    expect_sqlstate(seq(&mut plain, "orders", 1), &denied, "tso_seq as plain");
    expect_sqlstate(plain.query("SELECT tso_seq_peek('orders')", &[]), &denied, "peek as plain");
    expect_sqlstate(plain.query("SELECT tso_seq_drop('orders')", &[]), &denied, "drop as plain");
    for sql in [
        "INSERT INTO tsoracle.seq (key, next) VALUES ('x', 0)",
        "UPDATE tsoracle.seq SET next = 0",
        "DELETE FROM tsoracle.seq",
    ] {
        expect_sqlstate(plain.batch_execute(sql), &denied, sql);
        expect_sqlstate(alice.batch_execute(sql), &denied, sql);
    }

    // The creator owns a key; another sequence user may not advance, read or drop it.
    assert_eq!(ok(seq(&mut alice, "orders", 10), "alice creates orders"), 0);
    assert_eq!(ok(seq(&mut alice, "orders", 1), "alice advances orders"), 10);
    let e = expect_sqlstate(seq(&mut bob, "orders", 1), &denied, "bob advances alice's key");
    assert!(
        pg_error_string(&e).contains("alice"),
        "the error names the owner: {}",
        pg_error_string(&e)
    );
    expect_sqlstate(bob.query("SELECT tso_seq_peek('orders')", &[]), &denied, "bob peeks");
    expect_sqlstate(bob.query("SELECT tso_seq_drop('orders')", &[]), &denied, "bob drops");
    expect_sqlstate(
        bob.query("SELECT * FROM tso_seq_batch(ARRAY['bobs', 'orders'], ARRAY[1, 1])", &[]),
        &denied,
        "a batch naming alice's key",
    );
    let bobs: Option<i64> = ok(su.query_one("SELECT tso_seq_peek('bobs')", &[]), "peek").get(0);
    assert_eq!(bobs, None, "a refused batch creates nothing");
    // A member of the owner role uses it (as for PostgreSQL's own objects), but only the
    // owner or a superuser drops it.
    assert_eq!(ok(seq(&mut carol, "orders", 1), "carol, a member of alice"), 11);
    expect_sqlstate(carol.query("SELECT tso_seq_drop('orders')", &[]), &denied, "carol drops");
    assert_eq!(ok(seq(&mut bob, "bobs", 1), "bob's own key"), 0);
    let dropped: bool =
        ok(su.query_one("SELECT tso_seq_drop('bobs')", &[]), "superuser drops").get(0);
    assert!(dropped);
    let dropped: bool =
        ok(alice.query_one("SELECT tso_seq_drop('orders')", &[]), "alice drops her key").get(0);
    assert!(dropped);
    let left: i64 = ok(
        su.query_one("SELECT count(*) FROM tsoracle.seq WHERE key IN ('orders', 'bobs')", &[]),
        "count",
    )
    .get(0);
    assert_eq!(left, 0);

    // Leases: only the role that acquired one (or a superuser) renews or releases it, and
    // a holder name belongs to the role holding its live lease.
    let id: i64 = ok(
        alice.query_one("SELECT lease_id FROM tso_lease_acquire('indexer', 1, 10000)", &[]),
        "alice acquires",
    )
    .get(0);
    expect_sqlstate(
        bob.query("SELECT * FROM tso_lease_renew($1)", &[&id]),
        &denied,
        "bob renews alice's lease",
    );
    expect_sqlstate(
        bob.query("SELECT tso_lease_release($1)", &[&id]),
        &denied,
        "bob releases alice's lease",
    );
    expect_sqlstate(
        bob.query("SELECT * FROM tso_lease_acquire('indexer', 2, 10000)", &[]),
        &denied,
        "bob supersedes alice's holder",
    );
    expect_sqlstate(
        plain.query("SELECT * FROM tso_lease_renew($1)", &[&id]),
        &denied,
        "plain renews",
    );
    ok(su.query("SELECT * FROM tso_lease_renew($1)", &[&id]), "a superuser renews");
    ok(alice.query("SELECT * FROM tso_lease_renew($1)", &[&id]), "alice renews");
    let live: i64 = ok(
        su.query_one("SELECT count(*) FROM tsoracle.lease WHERE lease_id = $1", &[&id]),
        "count",
    )
    .get(0);
    assert_eq!(live, 1, "bob's attempts left alice's lease alone");
    ok(alice.execute("SELECT tso_lease_release($1)", &[&id]), "alice releases");
}

// ---------------------------------------------------------------------------------------- 7

/// `tso_seed` refuses what the allocator could not issue (22023); a seed at the very top
/// serves the last millisecond, and the next fence, which has nothing left above the
/// high-water, refuses to serve (tso_status says why) instead of failing in a loop.
#[test]
fn seeding_the_top_of_the_range_never_bricks_the_fence() {
    let mut node = serving_node("sec-seed-top", NodeOpts::new());
    let mut su = node.connect();
    expect_sqlstate(
        tso_seed(&mut su, MAX_SQL_PHYSICAL_MS + 1),
        &SqlState::INVALID_PARAMETER_VALUE,
        "seed above the top",
    );
    expect_sqlstate(
        tso_seed(&mut su, i64::MAX),
        &SqlState::INVALID_PARAMETER_VALUE,
        "seed i64::MAX",
    );
    ok(tso_seed(&mut su, MAX_SQL_PHYSICAL_MS), "seed the last millisecond");
    let ts = ok(tso_next(&mut su), "tso_next at the top");
    assert_eq!(physical(ts), MAX_SQL_PHYSICAL_MS);
    assert!(ts > 0, "still a non-negative bigint");
    drop(su);

    node.restart(StopMode::Fast).expect("restart");
    let mut su = node.try_connect(Duration::from_secs(60)).expect("connect");
    let mut st = ok(status(&mut su), "status");
    wait_for("the worker to refuse", Duration::from_secs(30), || {
        st = ok(status(&mut su), "status");
        st.state == "refused"
    });
    let detail = st.detail.clone().unwrap_or_default();
    assert!(
        detail.contains("top of the timestamp range"),
        "tso_status().detail says why: {detail:?}"
    );
    let e =
        expect_sqlstate(tso_next(&mut su), &SqlState::CANNOT_CONNECT_NOW, "tso_next after the top");
    assert!(pg_error_string(&e).contains("top of the timestamp range"), "{}", pg_error_string(&e));
    // The worker stays (no restart loop): the same process a few seconds later.
    let pid = worker_pid(&mut su);
    assert!(pid.is_some());
    thread::sleep(Duration::from_secs(3));
    assert_eq!(worker_pid(&mut su), pid, "the worker did not restart");
}

// ---------------------------------------------------------------------------------------- 8

/// `tsoracle.database` encoded LATIN1: non-ASCII keys and holders are refused with 22023
/// (they could not be read back), ASCII ones work, and a non-ASCII holder row planted by a
/// superuser does not make the fence fail after a restart.
#[test]
fn a_non_utf8_database_refuses_what_it_cannot_store() {
    let mut node =
        Node::start_new("sec-latin1", NodeOpts::new().setting("tsoracle.database", "latin"))
            .expect("start");
    let mut su = node.connect();
    ok(
        su.batch_execute("CREATE DATABASE latin TEMPLATE template0 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C'"),
        "create a LATIN1 database",
    );
    let mut latin = node
        .try_connect_as("postgres", "latin", Duration::from_secs(30))
        .expect("connect to latin");
    ok(latin.batch_execute("CREATE EXTENSION tsoracle"), "CREATE EXTENSION in latin");
    // Callers in the UTF8 database postgres (the functions exist there too).
    ok(su.batch_execute("CREATE EXTENSION tsoracle"), "CREATE EXTENSION in postgres");
    node.wait_serving().expect("serving");
    let pid = worker_pid(&mut su);
    expect_sqlstate(seq(&mut su, "clé", 1), &SqlState::INVALID_PARAMETER_VALUE, "a non-ASCII key");
    expect_sqlstate(
        su.query("SELECT * FROM tso_lease_acquire('hôte', 1, 10000)", &[]),
        &SqlState::INVALID_PARAMETER_VALUE,
        "a non-ASCII holder",
    );
    assert_eq!(ok(seq(&mut su, "key", 3), "an ASCII key"), 0);
    ok(su.query("SELECT * FROM tso_lease_acquire('host', 1, 10000)", &[]), "an ASCII holder");
    assert_eq!(worker_pid(&mut su), pid, "the worker did not die");

    // A superuser writes a non-ASCII holder straight into the table.
    let far = now_ms() + 600_000;
    ok(
        latin.execute(
            "INSERT INTO tsoracle.lease (lease_id, holder, holder_epoch, ts_upper_bound_ms, expires_at_ms, ttl_ms) VALUES ($1, 'hôte', 1, $1, $1, 10000)",
            &[&far],
        ),
        "plant a non-ASCII holder",
    );
    drop(latin);
    drop(su);
    node.restart(StopMode::Fast).expect("restart");
    node.wait_serving().expect("the fence reads the planted row and serves");
    let mut su = node.connect();
    let pid = worker_pid(&mut su);
    ok(tso_next(&mut su), "tso_next");
    assert_eq!(ok(seq(&mut su, "key", 1), "the counter continues"), 3);
    thread::sleep(Duration::from_secs(2));
    assert_eq!(worker_pid(&mut su), pid, "no restart loop");
}
