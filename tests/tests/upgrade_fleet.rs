//! `pg_upgrade` of a fleet's clusters (docs/operations/fleet/pg-upgrade.md), under load.
//!
//! - The oracle, on the old major with a synchronous standby and two members attached (on the
//!   new major), is upgraded with `pg_upgrade`, `synchronous_standby_names` carried over, and
//!   started where the members look for it. It serves nothing (its fence waits for a
//!   synchronous standby) until the page's step 2 rebuilds the standby from it; step 3 waits
//!   until it serves with synchronous replication. Its new system identifier
//!   is refused by every member until the page's step 4 names it (`tsoracle.oracle_successor`,
//!   run from the page as written); the members then serve again without a restart, every
//!   history is unique and in order across it, the counters go on above every block granted
//!   through the members, and `R_f` never goes down. Before the step, the members refuse
//!   the upgraded oracle ("another cluster"): the test checks that they serve nothing then.
//!   Its admissions (`tsoracle.fleet_admission`) come across, each for its role.
//! - A member, on the old major with the fleet serving, is upgraded: it registers again under
//!   its old entry (the oracle lists the same members), serves again, and `R_f` moves on.
//! - An oracle that had failed over (timeline 2, epoch 2) is upgraded: its timeline starts
//!   again at 1 and it keeps epoch 2 (`tsoracle.epoch_base` 1); its standby, promoted after,
//!   fences at epoch 3, where the timeline alone gave 2 again: a deposed primary of the
//!   upgraded oracle answers a lower epoch than its successor.
//!
//! The two installations come from `TSORACLE_UPGRADE_FROM_BIN` (the old major) and
//! `TSORACLE_PG_BIN` (the new one), as for `tests/tests/upgrade.rs`: `make test-upgrade`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tsoracle_tests::cluster::{make_sync, promote, wait_replayed};
use tsoracle_tests::fleet::{admit_members, member, member_opts, oracle_conninfo, MEMBER_ROLE};
use tsoracle_tests::fleet_load::{
    check_histories, fleet_resolved, load_members, members_listed, system_identifier,
    wait_resolved_above, ResolvedWatch,
};
use tsoracle_tests::node::pg_bin_dir;
use tsoracle_tests::runbook::{run_sh, run_sh_as_server, Runbook, PG_UPGRADE_ORACLE_STEPS};
use tsoracle_tests::{
    pg_error_string, poll_until, serving_node, tso, DenseHistory, History, Node, NodeOpts, StopMode,
};

fn old_bin() -> PathBuf {
    assert!(
        std::env::var_os("TSORACLE_PG_BIN").is_some(),
        "TSORACLE_PG_BIN names the new major's binaries (make test-upgrade)"
    );
    PathBuf::from(
        std::env::var_os("TSORACLE_UPGRADE_FROM_BIN")
            .expect("TSORACLE_UPGRADE_FROM_BIN names the old major's binaries (make test-upgrade)"),
    )
}

/// The new major's options for a cluster `pg_upgrade` makes (no data checksums, as the old),
/// with the old cluster's `tsoracle.*` settings and `synchronous_standby_names` (as
/// `pg_upgradecluster` carries the configuration over).
fn upgraded_opts(settings: &BTreeMap<String, String>) -> NodeOpts {
    let mut opts = NodeOpts::new().bin(pg_bin_dir()).initdb_arg("--no-data-checksums");
    for (k, v) in settings {
        if k.starts_with("tsoracle.") || k == "synchronous_standby_names" {
            opts = opts.setting(k, v);
        }
    }
    opts
}

/// `node` stopped and upgraded to the new major, started at its address.
fn upgrade(node: &mut Node, name: &str) -> Node {
    node.stop(StopMode::Fast).expect("stop the old cluster");
    let mut new = Node::upgrade_from(node, name, upgraded_opts(node.settings()))
        .unwrap_or_else(|e| panic!("pg_upgrade: {e}"));
    new.take_port(node.port()).expect("the old cluster's address");
    new.start().expect("start the upgraded cluster");
    new
}

#[test]
fn pg_upgrade_of_the_oracle_with_members_attached_by_the_runbook() {
    let old_bin = old_bin();
    let book = Runbook::load("fleet/pg-upgrade.md", "pg-upgrade-oracle");
    book.expect_steps(PG_UPGRADE_ORACLE_STEPS);

    let mut oracle = serving_node("upf-oracle", NodeOpts::new().bin(&old_bin));
    let mut old_standby = Node::base_backup_from(&oracle, "standby1").expect("pg_basebackup");
    old_standby.start().expect("start the oracle's standby");
    make_sync(&mut oracle, "standby1").unwrap_or_else(|e| panic!("synchronous standby: {e}"));
    admit_members(&oracle);
    let old_id = system_identifier(&mut oracle.connect());
    let conninfo = oracle_conninfo(&[oracle.port()], MEMBER_ROLE);
    let m1 = member("upf-m1", &conninfo);
    let m2 = member("upf-m2", &conninfo);
    let names = [m1.name(), m2.name()];
    let history = History::default();
    let dense = DenseHistory::default();
    let (loads, seqs) = load_members(&[&m1, &m2], &history, &dense);
    let started = Instant::now();
    history.wait_progress_on(&names, started, 100, "the members serve");
    let resolved_before = wait_resolved_above(&oracle, 0, "R_f published before the upgrade");
    let watch = ResolvedWatch::start(oracle.conninfo());
    let listed_before = members_listed(&mut oracle.connect());
    assert_eq!(listed_before.len(), 2, "both members registered: {listed_before:?}");
    let max_before = history.max_value().expect("timestamps before the upgrade");

    // ---- step 1 and the start of 2: the oracle and its standby stopped, the oracle upgraded
    //      and started at its address, synchronous_standby_names carried over
    old_standby.stop(StopMode::Fast).expect("stop the old standby");
    let new_oracle = upgrade(&mut oracle, "upf-oracle-18");
    let mut c = new_oracle.connect();
    // Its fence's commit waits for a synchronous standby it does not have yet.
    poll_until("the worker waits for a synchronous standby", Duration::from_secs(30), || {
        let waiting: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                  WHERE backend_type = 'tsoracle worker' AND wait_event = 'SyncRep'",
                &[],
            )
            .expect("pg_stat_activity")
            .get(0);
        (waiting == 1).then_some(())
    });
    let state: String =
        c.query_one("SELECT state FROM tso_status()", &[]).expect("tso_status()").get(0);
    assert_ne!(state, "serving", "the upgraded oracle served before its synchronous standby");
    // Step 2: the standby rebuilt from it, as the page writes it, then started.
    let vars = vec![("ORACLE", new_oracle.conninfo())];
    let mut new_standby = Node::base_backup_by(&new_oracle, "upf-standby1", |data| {
        let mut vars = vars.clone();
        vars.push(("STANDBY_DATA", data.display().to_string()));
        run_sh_as_server(book.step(2), &new_oracle, &vars).map(|_| ())
    })
    .unwrap_or_else(|e| panic!("pg-upgrade.md step 2: {e}\n{}", book.step(2).text));
    new_standby.start().expect("start the upgraded oracle's standby");
    // Step 3: it serves, with synchronous replication.
    let out = run_sh(book.step(3), new_oracle.bin_dir(), &vars)
        .unwrap_or_else(|e| panic!("pg-upgrade.md step 3: {e}"));
    assert_eq!(out.lines().last().map(str::trim), Some("serving|t"), "step 3 printed {out:?}");
    tso::wait_serving(&mut c).unwrap_or_else(|e| panic!("the upgraded oracle serving: {e}"));
    let new_id = system_identifier(&mut c);
    assert_ne!(new_id, old_id, "pg_upgrade gave the oracle a new system identifier");
    let r = fleet_resolved(&mut c);
    assert!(r.is_none_or(|r| r >= resolved_before), "R_f went down across pg_upgrade: {r:?}");
    // The admissions came across with the cluster, each for the role it was made for.
    let admitted: BTreeMap<i64, String> = c
        .query("SELECT system_id, pg_get_userbyid(role)::text FROM tsoracle.fleet_admission", &[])
        .expect("tsoracle.fleet_admission")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert!(
        admitted.keys().copied().eq(listed_before.iter().copied())
            && admitted.values().all(|r| r == MEMBER_ROLE),
        "the admissions after pg_upgrade: {admitted:?}, members {listed_before:?}"
    );

    // Without the page's step the members refuse it: another cluster.
    let upgraded = Instant::now();
    std::thread::sleep(Duration::from_secs(8));
    for m in [&m1, &m2] {
        let err: Option<String> = m
            .connect()
            .query_one("SELECT last_error FROM tso_member_status()", &[])
            .expect("tso_member_status()")
            .get(0);
        let err = err.unwrap_or_default();
        assert!(err.contains("another cluster"), "{}: {err}", m.name());
    }
    for name in names {
        assert_eq!(
            history.ok_calls_on_started_after(name, upgraded),
            0,
            "{name} served through an oracle it refuses"
        );
    }

    // ---- step 4, from the page, on each member
    let oracle_vars = new_oracle.conninfo();
    for m in [&m1, &m2] {
        run_sh(
            book.step(4),
            m.bin_dir(),
            &[("ORACLE", oracle_vars.clone()), ("CLUSTER", m.conninfo())],
        )
        .unwrap_or_else(|e| panic!("{}: step 4: {e}", m.name()));
    }
    let t = Instant::now();
    history.wait_progress_on(&names, t, 100, "the members serve after the upgrade");
    let fresh = tso::tso_next(&mut new_oracle.connect()).expect("tso_next() on the oracle");
    wait_resolved_above(&new_oracle, fresh, "R_f moves on past every member");
    assert_eq!(members_listed(&mut new_oracle.connect()), listed_before, "the same members");
    for m in [&m1, &m2] {
        let kept: i64 = m
            .connect()
            .query_one("SELECT system_id FROM tsoracle.member_oracle", &[])
            .expect("tsoracle.member_oracle")
            .get(0);
        assert_eq!(kept, new_id, "{}: remembers the upgraded oracle", m.name());
    }
    let after = history.value_range_within(t, Instant::now()).expect("served after").0;
    assert!(after > max_before, "{after} after the upgrade <= {max_before} before");
    check_histories(loads, seqs, &history, &dense, &new_oracle);
    watch.check(20);

    // The old oracle started again (pg_upgrade --copy leaves it startable) is refused.
    drop(c);
    let mut new_oracle = new_oracle;
    new_oracle.stop(StopMode::Fast).expect("stop the upgraded oracle");
    old_standby.start().expect("the old standby started again");
    oracle.start().expect("the old oracle started again");
    std::thread::sleep(Duration::from_secs(8));
    let mut c = m1.connect();
    let err: Option<String> =
        c.query_one("SELECT last_error FROM tso_member_status()", &[]).unwrap().get(0);
    assert!(err.unwrap_or_default().contains("another cluster"), "the old oracle is refused");
    assert!(tso::tso_next(&mut c).is_err(), "nothing served through the old oracle");
}

#[test]
fn pg_upgrade_of_a_member_with_the_fleet_serving() {
    let old_bin = old_bin();
    let oracle = serving_node("upm-oracle", NodeOpts::new());
    admit_members(&oracle);
    let conninfo = oracle_conninfo(&[oracle.port()], MEMBER_ROLE);
    let mut m1 = serving_node("upm-m1", member_opts(&conninfo).bin(&old_bin));
    let m2 = member("upm-m2", &conninfo);
    let names = [m1.name().to_string(), m2.name().to_string()];
    let names: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
    let history = History::default();
    let dense = DenseHistory::default();
    let (loads, seqs) = load_members(&[&m1, &m2], &history, &dense);
    history.wait_progress_on(&names, Instant::now(), 100, "the members serve");
    let listed_before = members_listed(&mut oracle.connect());
    assert_eq!(listed_before.len(), 2, "both members registered: {listed_before:?}");
    let old_id = system_identifier(&mut m1.connect());

    let resolved_before = wait_resolved_above(&oracle, 0, "R_f published before the upgrade");
    let watch = ResolvedWatch::start(oracle.conninfo());
    let new_m1 = upgrade(&mut m1, "upm-m1-18");
    tso::wait_serving(&mut new_m1.connect()).unwrap_or_else(|e| panic!("the upgraded member: {e}"));
    assert_ne!(system_identifier(&mut new_m1.connect()), old_id, "a new system identifier");
    let t = Instant::now();
    history.wait_progress_on(&names, t, 100, "both members serve after the upgrade");
    assert_eq!(
        members_listed(&mut oracle.connect()),
        listed_before,
        "the upgraded member registered under its old entry"
    );
    // R_f passes a timestamp issued after the upgrade: no entry of the old member holds it.
    let mut c = oracle.connect();
    let r = fleet_resolved(&mut c);
    assert!(r.is_none_or(|r| r >= resolved_before), "R_f went down: {r:?}");
    let fresh = tso::tso_next(&mut c).unwrap_or_else(|e| panic!("{}", pg_error_string(&e)));
    wait_resolved_above(&oracle, fresh, "R_f moves on past the upgraded member");
    check_histories(loads, seqs, &history, &dense, &oracle);
    watch.check(20);
}

#[test]
fn a_failover_after_pg_upgrade_of_a_failed_over_oracle_raises_the_epoch() {
    let old_bin = old_bin();
    let epoch_of = |n: &Node| -> i64 {
        let mut c = n.connect();
        tso::wait_serving(&mut c).unwrap_or_else(|e| panic!("{} serving: {e}", n.name()));
        c.query_one("SELECT epoch FROM tso_status()", &[]).expect("tso_status()").get(0)
    };
    let mut first = serving_node("upe-a", NodeOpts::new().bin(&old_bin));
    let mut second = Node::base_backup_from(&first, "upe-b").expect("pg_basebackup");
    second.start().expect("start the standby");
    wait_replayed(&first, &second).expect("replayed");
    first.stop(StopMode::Fast).expect("stop the first primary");
    promote(&second).expect("promote the standby");
    assert_eq!(epoch_of(&second), 2, "failed over once: timeline 2");

    let mut upgraded = upgrade(&mut second, "upe-b-18");
    assert_eq!(epoch_of(&upgraded), 2, "pg_upgrade keeps the epoch");
    let mut c = upgraded.connect();
    let timeline: i32 =
        c.query_one("SELECT timeline_id FROM pg_control_checkpoint()", &[]).unwrap().get(0);
    assert_eq!(timeline, 1, "pg_upgrade starts the timeline again");
    let base: i64 = c.query_one("SELECT base FROM tsoracle.epoch_base", &[]).unwrap().get(0);
    assert_eq!(base, 1, "epoch 2 on timeline 1");
    drop(c);
    let mut third = Node::base_backup_from(&upgraded, "upe-c").expect("pg_basebackup");
    third.start().expect("start the upgraded oracle's standby");
    wait_replayed(&upgraded, &third).expect("replayed");
    upgraded.stop(StopMode::Fast).expect("stop the upgraded oracle");
    promote(&third).expect("promote its standby");
    assert_eq!(epoch_of(&third), 3, "the promotion after pg_upgrade raised the epoch");
    // The deposed primary, brought back: the lower epoch.
    third.stop(StopMode::Fast).expect("stop the new primary");
    upgraded.start().expect("start the deposed primary");
    assert_eq!(epoch_of(&upgraded), 2, "the deposed primary's epoch");
}
