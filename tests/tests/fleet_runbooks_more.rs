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
//!   fleet handed out.
//!
//! A mutation of a dangerous step on the page (the grant or the password dropped, the
//! passfile readable by others, TLS off, the identity read as the system identifier, the
//! removal or the re-admission skipped) fails these tests. The passfile's is checked by the
//! set-up test itself: a mutant of step 2 (`-m 644`) leaves a passfile that the page's
//! `tsoracle.oracle` cannot connect through.
//!
//! Run with: `cargo test -p tsoracle-tests --test fleet_runbooks_more -- --test-threads=2`

use std::time::{Duration, Instant};

use tsoracle_tests::fleet::{admit_members, member, oracle_conninfo, MEMBER_ROLE};
use tsoracle_tests::runbook::{
    blocks_on, one_i64, printed_number, run_sh, run_sql, run_step, settings, timestamps_on, vars,
    Runbook, REMOVE_STEPS, SETUP_STEPS,
};
use tsoracle_tests::tls::TestCa;
use tsoracle_tests::{
    pg_error_string, poll_until, serving_node, DenseHistory, History, Node, NodeOpts, StopMode,
};

/// The members' password in the set-up test (what `\password` is answered).
const PASSWORD: &str = "runbook-Secret-56";

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

    // 1. On the oracle, in psql: the role, its password (\password reads it twice), its grant.
    let answers = format!("{PASSWORD}\n{PASSWORD}\n");
    run_sql(book.step(1), oracle.bin_dir(), &oracle.conninfo(), &answers)
        .unwrap_or_else(|e| panic!("runbook set-up step 1: {e}"));
    let stored: Option<String> = oracle
        .connect()
        .query_one("SELECT rolpassword FROM pg_authid WHERE rolname = $1", &[&MEMBER_ROLE])
        .expect("the members' role")
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
        "hostssl all {MEMBER_ROLE} 127.0.0.1/32 scram-sha-256\nhostnossl all {MEMBER_ROLE} 127.0.0.1/32 reject\n"
    );
    std::fs::write(&hba, lines + &old).expect("write pg_hba.conf");
    oracle.reload().expect("reload the oracle");

    // 2. On the member: the passfile, readable by the postgres OS user only.
    let mut m = Node::init("setup-m", NodeOpts::new()).expect("initdb the member");
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
            &[&MEMBER_ROLE],
        )
        .expect("the members' sessions")
        .get(0);
    assert!(tls, "the member's sessions on the oracle are over TLS");
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

/// Whether `tso_fleet_status()` lists the member `id`.
fn listed(oracle: &Node, id: i64) -> bool {
    let n = oracle
        .connect()
        .query_one("SELECT count(*) FROM tso_fleet_status() WHERE system_id = $1", &[&id])
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
