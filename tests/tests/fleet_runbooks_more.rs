//! More of the fleet's runbooks run from their pages (as tests/tests/fleet_runbooks.rs does:
//! `tsoracle_tests::runbook`, the blocks marked `<!-- runbook: NAME step=N -->`, run as
//! written), under load. The steps a page writes in prose are the harness's:
//!
//! - a fleet set up (docs/operations/fleet/set-up.md): the page's `psql` block on the oracle
//!   (the members' role, its password through `\password`, its grant), the passfile and the
//!   `postgresql.conf` settings on a member (the test's own host, port, paths and CA in
//!   `tsoracle.oracle`, the rest as the page has it). The member serves through the password,
//!   over TLS, under load, one order with the oracle's own calls;
//! - a member gone for good removed (docs/operations/fleet/remove-a-member.md): a member
//!   rebuilt under a new identity (a clone promoted beside its live original, so that its
//!   identity is not its system identifier), stopped; the page's query names it as what holds
//!   `R_f`, its identity is read on it, it is removed and `R_f` moves again; it is refused once
//!   back, listed among the removed, re-admitted, and registers anew above everything the
//!   fleet handed out;
//! - the fleet moved to a new oracle (docs/operations/fleet/oracle-failover.md, "Moving the
//!   fleet to a new oracle"): `tso_handover()` on the old oracle and the new one seeded above
//!   it, the counters carried, on each member its memory of the old oracle deleted,
//!   `tsoracle.oracle` set to the new one and a restart, the page's check. Under load on two
//!   members: one order across the move, every block after it above every block before, the
//!   members served by and remembering the new oracle, the old one serving nothing.
//!
//! A mutation of a dangerous step on the page (the grant or the password dropped, the
//! passfile readable by others, TLS off, the identity read as the system identifier, the
//! removal or the re-admission skipped) fails these tests. The move's are run here: its
//! counters not carried grant a block again, which the move's check catches; its seed
//! dropped has the member refuse the new oracle's timestamps (`55000`) or hand out one below
//! the old high-water. The passfile's is checked by the
//! set-up test itself: a mutant of step 2 (`-m 644`) leaves a passfile that the page's
//! `tsoracle.oracle` cannot connect through.
//!
//! Run with: `cargo test -p tsoracle-tests --test fleet_runbooks_more -- --test-threads=2`

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use tsoracle_tests::fleet::{admit_members, member, oracle_conninfo, MEMBER_ROLE};
use tsoracle_tests::fleet_load::{members_listed, system_identifier};
use tsoracle_tests::history::DenseCall;
use tsoracle_tests::runbook::{
    blocks_on, one_i64, printed_number, run_sh, run_sql_vars, run_step, settings, timestamps_on,
    vars, Runbook, AHEAD, MOVE_ORACLE_STEPS, REMOVE_STEPS, SETUP_STEPS,
};
use tsoracle_tests::tls::TestCa;
use tsoracle_tests::{
    expect_sqlstate, pg_error_string, poll_until, serving_node, DenseHistory, History, Node,
    NodeOpts, StopMode,
};

/// The members' password in the set-up test (what `\password` is answered).
const PASSWORD: &str = "runbook-Secret-56";
/// The member's own role in the set-up runbook.
const PAGE_ROLE: &str = "member_a";

/// The page's `tsoracle.oracle`, with the site's own words in it: the test's oracle in
/// `host=` and `port=`, its passfile and CA in `passfile=` and `sslrootcert=`; every other
/// keyword as the page writes it.
fn at_this_site(page: &str, port: u16, passfile: &str, ca: &str) -> String {
    let words: Vec<(&str, &str)> = page
        .split_whitespace()
        .map(|w| w.split_once('=').unwrap_or_else(|| panic!("not key=value: {w:?} in {page}")))
        .collect();
    let keys: Vec<&str> = words.iter().map(|(k, _)| *k).collect();
    for k in ["host", "port"] {
        assert!(keys.contains(&k), "the page's tsoracle.oracle has no {k}=: {page}");
    }
    assert!(!keys.contains(&"password"), "a password in tsoracle.oracle: {page}");
    words
        .into_iter()
        .map(|(k, v)| match k {
            "host" => "host=127.0.0.1".to_string(),
            "port" => format!("port={port}"),
            "passfile" => format!("passfile={passfile}"),
            "sslrootcert" => format!("sslrootcert={ca}"),
            _ => format!("{k}={v}"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn a_member_set_up_by_the_runbook_serves_through_its_password_under_load() {
    let book = Runbook::load("fleet/set-up.md", "set-up");
    book.expect_steps(SETUP_STEPS);
    let mut oracle = serving_node("setup-oracle", NodeOpts::new());
    let ca = TestCa::new("setup-ca").expect("a CA");
    ca.serve_tls(&mut oracle, &[]).expect("TLS on the oracle");
    let fleet = History::default();
    let dense = DenseHistory::default();
    let oracle_load = timestamps_on(&oracle, &fleet);
    fleet.wait_progress(Instant::now(), 100, "the oracle serves");

    // 1. On the oracle, in psql: the member's own role, its password (\password reads it
    //    twice), its grant, and its cluster admitted, bound to it.
    let mut m = Node::init("setup-m", NodeOpts::new()).expect("initdb the member");
    let member_id = tsoracle_tests::fleet::system_identifier(&m).expect("its system identifier");
    let answers = format!("{PASSWORD}\n{PASSWORD}\n");
    let id_var = [("member_id", member_id.to_string())];
    run_sql_vars(book.step(1), oracle.bin_dir(), &oracle.conninfo(), &answers, &id_var)
        .unwrap_or_else(|e| panic!("runbook set-up step 1: {e}"));
    let stored: Option<String> = oracle
        .connect()
        .query_one("SELECT rolpassword FROM pg_authid WHERE rolname = $1", &[&PAGE_ROLE])
        .expect("the member's role")
        .get(0);
    assert!(
        stored.as_deref().is_some_and(|p| p.starts_with("SCRAM-SHA-256$")),
        "the password is stored hashed: {stored:?}"
    );
    // The pg_hba.conf line (the page's prose, the harness's): the members' role by its
    // password, over TLS only.
    let hba = oracle.datadir().join("pg_hba.conf");
    let old = std::fs::read_to_string(&hba).expect("read pg_hba.conf");
    let lines = format!(
        "hostssl all {PAGE_ROLE} 127.0.0.1/32 scram-sha-256\nhostnossl all {PAGE_ROLE} 127.0.0.1/32 reject\n"
    );
    std::fs::write(&hba, lines + &old).expect("write pg_hba.conf");
    oracle.reload().expect("reload the oracle");

    // 2. On the member: the passfile, readable by the postgres OS user only.
    let passfile = m.basedir().join("tsoracle.pgpass").display().to_string();
    run_step(
        book.step(2),
        &m,
        &[("PASSFILE", passfile.clone()), ("PASSWORD", PASSWORD.to_string())],
    );
    let page = settings(book.step(3)).unwrap_or_else(|e| panic!("{e}"));
    let root = ca.root_cert().display().to_string();
    // The page's tsoracle.oracle, as the member's worker will connect with it, reaches the
    // oracle through this passfile; a mutant of step 2 that leaves the passfile readable by
    // others is refused (libpq ignores such a file: no password).
    let oracle_setting = &page.iter().find(|(k, _)| k == "tsoracle.oracle").expect("step 3").1;
    let connect = |passfile: &str| {
        let conninfo = at_this_site(oracle_setting, oracle.port(), passfile, &root);
        let mut psql = std::process::Command::new(m.bin_dir().join("psql"));
        psql.args(["-XAtc", "SELECT current_user", &conninfo])
            .env_remove("PGPASSWORD")
            .env("HOME", m.basedir());
        psql.output().expect("run psql")
    };
    let ok = connect(&passfile);
    assert!(ok.status.success(), "through the page's passfile: {ok:?}");
    let open = m.basedir().join("open.pgpass").display().to_string();
    let mutant = book.step(2).mutated("-m 600", "-m 644");
    run_step(&mutant, &m, &[("PASSFILE", open.clone()), ("PASSWORD", PASSWORD.to_string())]);
    let refused = connect(&open);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && err.contains("no password supplied"),
        "a passfile readable by others is not used: {err}"
    );
    // 3. The settings in postgresql.conf (the harness's file), then a start and CREATE
    //    EXTENSION.
    for (name, value) in &page {
        let value = if name == "tsoracle.oracle" {
            at_this_site(value, oracle.port(), &passfile, &root)
        } else {
            value.clone()
        };
        m.set_conf(name, value).expect("the page's setting");
    }
    assert!(page.iter().any(|(k, _)| k == "tsoracle.oracle"), "step 3 sets tsoracle.oracle");
    m.set_conf("tsoracle.extension_timeout_ms", 3000).expect("the timeout");
    m.start().expect("start the member");
    m.create_extension().unwrap_or_else(|e| {
        panic!("the member set up by the page serves: {e}\n{}", m.log_tail(20))
    });
    let set_up = Instant::now();
    let role: String = m.connect().query_one("SELECT role FROM tso_status()", &[]).unwrap().get(0);
    assert_eq!(role, "member", "the member set up by the page is a member");
    let keys = ["setup-a", "setup-b"];
    let member_load = timestamps_on(&m, &fleet);
    let member_blocks = blocks_on(&m, &keys, &dense);
    fleet.wait_progress_on(&["setup-m"], set_up, 200, "the member serves under load");
    // It reached the oracle as the page's role, over TLS.
    let tls: bool = oracle
        .connect()
        .query_one(
            "SELECT bool_and(s.ssl) AND count(*) > 0 FROM pg_stat_activity a \
             JOIN pg_stat_ssl s USING (pid) WHERE a.usename = $1",
            &[&PAGE_ROLE],
        )
        .expect("the members' sessions")
        .get(0);
    assert!(tls, "the member's sessions on the oracle are over TLS");
    // Listed as admitted for its own role, and registered.
    let row = oracle
        .connect()
        .query_one(
            "SELECT role, resolved IS NOT NULL, admitted_at IS NOT NULL FROM tso_fleet_status() \
             WHERE system_id = $1",
            &[&member_id],
        )
        .expect("the member's row");
    let shown: (String, bool, bool) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(shown, (PAGE_ROLE.to_string(), true, true), "the member's row");
    std::thread::sleep(Duration::from_secs(1));

    member_load.stop_and_join();
    member_blocks.stop_and_join();
    oracle_load.stop_and_join();
    let report = fleet.assert_valid();
    eprintln!("the oracle and its new member: {report:?}");
    let dense_report = dense.check(None).unwrap_or_else(|v| panic!("counters: {v}"));
    for key in keys {
        assert!(dense_report.keys[key].ok_calls > 0, "{key}: no block granted");
    }
}

/// `tso_fleet_resolved()` on the oracle.
fn fleet_resolved(oracle: &Node) -> i64 {
    one_i64(&mut oracle.connect(), "SELECT tso_fleet_resolved()")
}

/// Whether `tso_fleet_status()` lists the member `id` as registered.
fn listed(oracle: &Node, id: i64) -> bool {
    let n = oracle
        .connect()
        .query_one(
            "SELECT count(*) FROM tso_fleet_status() WHERE system_id = $1 AND resolved IS NOT NULL",
            &[&id],
        )
        .expect("tso_fleet_status()")
        .get::<_, i64>(0);
    n > 0
}

#[test]
fn a_member_gone_for_good_is_removed_and_readmitted_by_the_runbook_under_load() {
    let book = Runbook::load("fleet/remove-a-member.md", "remove-a-member");
    book.expect_steps(REMOVE_STEPS);
    let oracle = serving_node("rm-oracle", NodeOpts::new());
    admit_members(&oracle);
    let original = member("rm-m", &oracle_conninfo(&[oracle.port()], MEMBER_ROLE));
    // The member rebuilt under a new identity: a clone promoted beside its live original
    // registers under an identity of its own, not its system identifier.
    let mut gone = Node::base_backup_from(&original, "rm-clone").expect("pg_basebackup");
    gone.start().expect("start the clone");
    gone.promote().expect("promote the clone");
    // A new member, as the oracle's superuser admits one: by the identity it says hello with.
    let sid = system_identifier(&mut original.connect());
    let identity = "SELECT member_id FROM tsoracle.member_identity";
    let new_id: i64 =
        poll_until("the clone's identity of its own", Duration::from_secs(60), || {
            let id: i64 = gone.connect().query_one(identity, &[]).ok()?.get(0);
            (id != sid).then_some(id)
        });
    oracle.connect().query_one("SELECT tso_fleet_admit($1, $2)", &[&new_id, &MEMBER_ROLE]).unwrap();

    let fleet = History::default();
    let dense = DenseHistory::default();
    let keys = ["rm-a", "rm-b"];
    let loads = [timestamps_on(&original, &fleet), timestamps_on(&gone, &fleet)];
    let blocks = blocks_on(&original, &keys, &dense);
    fleet.wait_progress_on(&["rm-clone"], Instant::now(), 100, "the clone serves");

    let base = vars(&[("ORACLE", &oracle), ("MEMBER", &gone)]);
    let vars = |extra: &[(&'static str, String)]| {
        let mut v = base.clone();
        v.extend_from_slice(extra);
        v
    };
    // 2. Its identity, read on it.
    let id = printed_number(&run_step(book.step(2), &gone, &vars(&[])));
    assert!(listed(&oracle, id), "tso_fleet_status() lists the identity read on the member");
    let with_id = vars(&[("MEMBER_ID", id.to_string())]);

    // Gone for good: it stops, and holds R_f from its last report on.
    gone.stop(StopMode::Immediate).expect("stop the member");
    let stopped = Instant::now();
    let ours = one_i64(&mut original.connect(), "SELECT tso_next()");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(fleet_resolved(&oracle) < ours, "R_f waits for the stopped member");
    // 1. Who holds R_f: the page's query names it.
    let holders = run_step(book.step(1), &oracle, &vars(&[]));
    assert!(holders.contains(&id.to_string()), "step 1 names {id} as holding R_f: {holders}");
    // 3. Removed by its identity (refused, 55006, while its session lingers on the oracle).
    let removed = poll_until("the member is removed", Duration::from_secs(20), || {
        run_sh(book.step(3), oracle.bin_dir(), &with_id).ok()
    });
    assert!(removed.lines().any(|l| l.trim() == "t"), "tso_fleet_remove() says t: {removed}");
    assert!(!listed(&oracle, id), "a removed member is not listed");
    poll_until("R_f moves again", Duration::from_secs(15), || {
        (fleet_resolved(&oracle) >= ours).then_some(())
    });
    // 5. Listed among the removed.
    let gone_list = run_step(book.step(5), &oracle, &vars(&[]));
    assert!(gone_list.contains(&id.to_string()), "step 5 lists {id}: {gone_list}");
    let last_before = fleet.max_value().expect("the fleet issued");

    // Back: refused until re-admitted.
    gone.start().expect("start the removed member");
    let refused =
        poll_until("the removed member is refused", Duration::from_secs(30), || {
            match gone.connect().query_one("SELECT tso_next()", &[]) {
                Ok(_) => panic!("a removed member was served"),
                Err(e) => Some(pg_error_string(&e)).filter(|t| t.contains("tso_fleet_admit")),
            }
        });
    assert!(refused.contains("57P03"), "{refused}");
    // 4. Re-admitted: it registers anew at its next connection.
    let admitted = run_step(book.step(4), &oracle, &with_id);
    assert!(admitted.lines().any(|l| l.trim() == "t"), "tso_fleet_admit() says t: {admitted}");
    let back = Instant::now();
    fleet.wait_progress_on(&["rm-clone"], back, 100, "the re-admitted member serves");
    poll_until("registered anew", Duration::from_secs(10), || listed(&oracle, id).then_some(()));
    let gone_list = run_step(book.step(5), &oracle, &vars(&[]));
    assert!(!gone_list.contains(&id.to_string()), "a re-admitted member is not removed");
    std::thread::sleep(Duration::from_secs(1));

    for l in loads {
        l.stop_and_join();
    }
    blocks.stop_and_join();
    let report = fleet.assert_valid();
    eprintln!("the fleet across the removal: {report:?}");
    let first_back = fleet
        .calls()
        .into_iter()
        .filter(|c| c.node == "rm-clone" && c.start > back)
        .filter_map(|c| c.first())
        .min()
        .expect("served after the re-admission");
    assert!(first_back > last_before, "{first_back} after the re-admission, {last_before} before");
    let during = fleet.ok_calls_within(stopped, back);
    assert!(during > 0, "the fleet served on while the member was out");
    let dense_report = dense.check(None).unwrap_or_else(|v| panic!("counters: {v}"));
    for key in keys {
        assert!(dense_report.keys[key].ok_calls > 0, "{key}: no block granted");
    }
}

/// The blocks of `calls` granted (per key: its blocks' `[first, end)`) to calls that started
/// before `t`, and to those that started after it.
fn blocks_split(calls: &[DenseCall], t: Instant) -> BTreeMap<String, (Vec<Block>, Vec<Block>)> {
    let mut out: BTreeMap<String, (Vec<Block>, Vec<Block>)> = BTreeMap::new();
    for c in calls {
        if let Ok(first) = c.result {
            let e = out.entry(c.key.clone()).or_default();
            let side = if c.start < t { &mut e.0 } else { &mut e.1 };
            side.push((first, first + c.count));
        }
    }
    out
}

/// A block `[first, end)`.
type Block = (i64, i64);

/// The move's promise for one key's blocks: every block granted after the move is above
/// every block granted before it (none is granted twice).
fn blocks_above(key: &str, before: &[Block], after: &[Block]) -> Result<(), String> {
    let Some(top) = before.iter().map(|b| b.1).max() else { return Ok(()) };
    match after.iter().find(|b| b.0 < top) {
        Some(b) => Err(format!("{key}: block {b:?} after the move, below {top} granted before")),
        None => Ok(()),
    }
}

/// The old oracle after `tso_handover()`: no timestamp and no block, its counter unmoved.
fn serves_nothing(old: &Node, key: &str) {
    let mut c = old.connect();
    let state: String = c.query_one("SELECT state FROM tso_status()", &[]).unwrap().get(0);
    assert_eq!(state, "refused", "the old oracle after its handover");
    expect_sqlstate(
        c.query_one("SELECT tso_next()", &[]),
        &SqlState::CANNOT_CONNECT_NOW,
        "tso_next() on the old oracle after its handover",
    );
    let next = format!("SELECT next FROM tsoracle.seq WHERE key = '{key}'");
    let before = one_i64(&mut c, &next);
    let refused = c.query_one(&format!("SELECT tso_seq('{key}', 1)"), &[]);
    assert!(refused.is_err(), "a block on the old oracle after its handover: {refused:?}");
    assert_eq!(one_i64(&mut c, &next), before, "{key}: the old oracle granted a block");
}

/// The fleet moved to a new oracle by docs/operations/fleet/oracle-failover.md ("Moving the
/// fleet to a new oracle"), its blocks run as written, under load on two members: one order
/// of timestamps across the move, each above the old oracle's high-water after it, every
/// block after the move above every block before, the members served by the new oracle and
/// remembering it, the old oracle serving nothing.
#[test]
fn the_fleet_moves_to_a_new_oracle_by_the_runbook_under_load() {
    let book = Runbook::load("fleet/oracle-failover.md", "move-oracle");
    book.expect_steps(MOVE_ORACLE_STEPS);
    let old = serving_node("move-old", NodeOpts::new());
    admit_members(&old);
    // The old fleet runs a minute ahead of the clock: a new oracle not seeded above it would
    // hand out its timestamps again.
    one_i64(&mut old.connect(), &format!("SELECT tso_seed({AHEAD})"));
    let new = serving_node("move-new", NodeOpts::new());
    admit_members(&new);
    let to_old = oracle_conninfo(&[old.port()], MEMBER_ROLE);
    let mut members = [member("move-m1", &to_old), member("move-m2", &to_old)];

    let fleet = History::default();
    let dense = DenseHistory::default();
    let keys = ["move-a", "move-b"];
    let loads: Vec<_> = members.iter().map(|m| timestamps_on(m, &fleet)).collect();
    let blocks: Vec<_> = members.iter().map(|m| blocks_on(m, &keys, &dense)).collect();
    fleet.wait_progress(Instant::now(), 200, "the members serve through the old oracle");
    poll_until("blocks through the old oracle", Duration::from_secs(20), || {
        (dense.calls().iter().filter(|c| c.result.is_ok()).count() >= 20).then_some(())
    });

    let base = vars(&[("OLD", &old), ("ORACLE", &new)]);
    // 1. The handover on the old oracle, the new one seeded above it.
    run_step(book.step(1), &old, &base);
    let handed_over = Instant::now();
    let high_water = one_i64(&mut old.connect(), "SELECT physical_ms FROM tsoracle.high_water");
    serves_nothing(&old, keys[0]);
    // 2. The counters carried.
    run_step(book.step(2), &old, &base);
    // 3. On each member: its memory of the old oracle deleted, tsoracle.oracle set to the new
    //    one, a restart (the page's prose, the harness's).
    let to_new = oracle_conninfo(&[new.port()], MEMBER_ROLE);
    for m in &mut members {
        let mut v = base.clone();
        v.push(("CLUSTER", m.conninfo()));
        run_step(book.step(3), m, &v);
        m.set_conf("tsoracle.oracle", &to_new).expect("point the member at the new oracle");
        m.restart(StopMode::Fast).expect("restart the member");
    }
    let moved = Instant::now();
    // 4. The page's check prints t|t on each member once it is connected.
    for m in &members {
        let mut v = base.clone();
        v.push(("CLUSTER", m.conninfo()));
        poll_until(&format!("step 4 prints t|t on {}", m.name()), Duration::from_secs(30), || {
            let out = run_sh(book.step(4), m.bin_dir(), &v).ok()?;
            (out.trim() == "t|t").then_some(())
        });
    }
    fleet.wait_progress_on(&["move-m1", "move-m2"], moved, 200, "the members serve on");
    poll_until("blocks through the new oracle", Duration::from_secs(20), || {
        let after = dense.calls().into_iter().filter(|c| c.start > moved && c.result.is_ok());
        (after.count() >= 20).then_some(())
    });
    std::thread::sleep(Duration::from_secs(1));
    for l in loads {
        l.stop_and_join();
    }
    for b in blocks {
        b.stop_and_join();
    }

    // One order across the move, on both members.
    let report = fleet.assert_valid();
    eprintln!("the fleet across the move: {report:?}");
    for call in fleet.calls().iter().filter(|c| c.is_ok()) {
        let (first, last) = (call.first().unwrap(), call.last().unwrap());
        if call.start > handed_over {
            assert!(first >> 18 > high_water, "{call:?} after the move, not above {high_water}");
        } else {
            assert!(last >> 18 <= high_water, "{call:?} before the move, above {high_water}");
        }
    }
    // No block granted twice; every block after the move above every block before it.
    let dense_report = dense.check(None).unwrap_or_else(|v| panic!("counters: {v}"));
    let split = blocks_split(&dense.calls(), handed_over);
    for key in keys {
        assert!(dense_report.keys[key].ok_calls > 0, "{key}: no block granted");
        let (before, after) = &split[key];
        assert!(!before.is_empty() && !after.is_empty(), "{key}: blocks on both sides");
        blocks_above(key, before, after).unwrap_or_else(|e| panic!("{e}"));
    }
    // The members are the new oracle's: served by it, remembering it, listed by it.
    let new_id = system_identifier(&mut new.connect());
    for m in &members {
        let mut c = m.connect();
        let row = c.query_one("SELECT oracle, connected FROM tso_member_status()", &[]).unwrap();
        let (oracle, connected): (String, bool) = (row.get(0), row.get(1));
        let at_new = oracle.split_whitespace().any(|w| w == format!("port={}", new.port()));
        assert!(connected && at_new, "{}: {oracle} connected={connected}", m.name());
        let kept = one_i64(&mut c, "SELECT system_id FROM tsoracle.member_oracle");
        assert_eq!(kept, new_id, "{} remembers the new oracle", m.name());
    }
    assert_eq!(members_listed(&mut new.connect()).len(), 2, "the new oracle lists both members");
    serves_nothing(&old, keys[1]);
}

/// The most dangerous steps mutated on the page, each on a member moved by it, no load: the
/// counters not carried (step 2 copies no row) hands a member a block granted before the move
/// (the check of the test above fails), the seed dropped (step 1 without `tso_seed()`) has a
/// member refuse the new oracle's timestamps (`55000`) or hand out one below the old
/// oracle's high-water.
#[test]
fn a_move_without_the_counters_or_the_seed_is_caught() {
    let book = Runbook::load("fleet/oracle-failover.md", "move-oracle");
    book.expect_steps(MOVE_ORACLE_STEPS);
    let old = serving_node("move-x-old", NodeOpts::new());
    admit_members(&old);
    one_i64(&mut old.connect(), &format!("SELECT tso_seed({AHEAD})"));
    let to_old = oracle_conninfo(&[old.port()], MEMBER_ROLE);
    let mut uncounted = member("move-x-m1", &to_old);
    let mut unseeded = member("move-x-m2", &to_old);
    let no_counters = serving_node("move-x-n1", NodeOpts::new());
    admit_members(&no_counters);
    let no_seed = serving_node("move-x-n2", NodeOpts::new());
    admit_members(&no_seed);
    let key = "move-x";
    let mut before = Vec::new();
    for _ in 0..5 {
        let first = one_i64(&mut uncounted.connect(), &format!("SELECT tso_seq('{key}', 10)"));
        before.push((first, first + 10));
    }
    one_i64(&mut unseeded.connect(), "SELECT tso_next()");

    let on = |oracle: &Node| vars(&[("OLD", &old), ("ORACLE", oracle)]);
    // Step 1 without the seed, towards one new oracle; as written towards the other (the
    // handover again: it returns the same high-water).
    run_step(&book.step(1).without_lines("tso_seed"), &old, &on(&no_seed));
    run_step(book.step(1), &old, &on(&no_counters));
    let high_water = one_i64(&mut old.connect(), "SELECT physical_ms FROM tsoracle.high_water");
    // Step 2 copying no row towards the one, as written towards the other.
    let carry_nothing =
        book.step(2).mutated("FROM tsoracle.seq)", "FROM tsoracle.seq WHERE false)");
    run_step(&carry_nothing, &old, &on(&no_counters));
    run_step(book.step(2), &old, &on(&no_seed));
    for (m, oracle) in [(&mut uncounted, &no_counters), (&mut unseeded, &no_seed)] {
        let mut v = on(oracle);
        v.push(("CLUSTER", m.conninfo()));
        run_step(book.step(3), m, &v);
        m.set_conf("tsoracle.oracle", oracle_conninfo(&[oracle.port()], MEMBER_ROLE)).unwrap();
        m.restart(StopMode::Fast).expect("restart the member");
    }

    // The counters not carried: a block granted again, which the check catches.
    let first: i64 = poll_until("a block through the new oracle", Duration::from_secs(30), || {
        uncounted.connect().query_one(&format!("SELECT tso_seq('{key}', 10)"), &[]).ok()
    })
    .get(0);
    let caught = blocks_above(key, &before, &[(first, first + 10)]);
    assert!(caught.is_err(), "the counters not carried: block {first} is not caught");
    eprintln!("the mutant of step 2 is caught: {}", caught.unwrap_err());

    // The seed dropped: the member refuses the new oracle's timestamps, or one is below the
    // old oracle's high-water.
    let got =
        poll_until("an answer through the new oracle", Duration::from_secs(30), || match unseeded
            .connect()
            .query_one("SELECT tso_next()", &[])
        {
            Ok(row) => Some(Ok(row.get::<_, i64>(0))),
            Err(e) if e.code() == Some(&SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE) => {
                Some(Err(pg_error_string(&e)))
            }
            Err(_) => None,
        });
    match got {
        Ok(ts) => assert!(ts >> 18 <= high_water, "the seed dropped: {ts} is not caught"),
        Err(e) => eprintln!("the mutant of step 1 is refused by the member: {e}"),
    }
}
