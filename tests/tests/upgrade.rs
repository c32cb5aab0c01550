//! `pg_upgrade` from the oldest supported major to the newest keeps every guarantee.
//!
//! A PostgreSQL 15 cluster with tsoracle serving (its high-water seeded an hour ahead of the
//! clock, so that the clock cannot hide a lost high-water), two `tso_seq` counters and a live
//! lease, is stopped and upgraded with `pg_upgrade --copy` into a PostgreSQL 18 cluster with
//! tsoracle preloaded. During the upgrade the server runs in binary-upgrade mode, where the
//! extension starts no worker (nothing may write the tables whose files pg_upgrade then
//! replaces). The upgraded cluster must serve above every timestamp and lease bound issued
//! before, continue each counter exactly where it stopped, and keep the lease.
//!
//! The two installations come from the environment: `TSORACLE_UPGRADE_FROM_BIN` (the old
//! major's binaries, with tsoracle installed) and `TSORACLE_PG_BIN` (the new major's). `make
//! test` (target `test-upgrade`) sets both; the test fails, rather than passing vacuously,
//! when either is missing.
//!
//! Run with: `make test-upgrade`

use std::path::PathBuf;

use postgres::Client;
use tsoracle_tests::node::pg_bin_dir;
use tsoracle_tests::seqlease::{lease_rows, peek, seq};
use tsoracle_tests::tso::{self, durable_high_water};
use tsoracle_tests::{now_ms, pg_error_string, physical, serving_node, NodeOpts, StopMode};

fn server_major(c: &mut Client) -> i32 {
    let num = tso::show(c, "server_version_num")
        .unwrap_or_else(|e| panic!("SHOW server_version_num: {}", pg_error_string(&e)));
    num.parse::<i32>().expect("server_version_num is a number") / 10000
}

fn next(c: &mut Client) -> i64 {
    tso::tso_next(c).unwrap_or_else(|e| panic!("tso_next(): {}", pg_error_string(&e)))
}

#[test]
fn pg_upgrade_keeps_the_high_water_counters_and_leases() {
    let old_bin = PathBuf::from(
        std::env::var_os("TSORACLE_UPGRADE_FROM_BIN")
            .expect("TSORACLE_UPGRADE_FROM_BIN names the old major's binaries (make test-upgrade)"),
    );
    let new_bin = pg_bin_dir();
    assert!(
        std::env::var_os("TSORACLE_PG_BIN").is_some(),
        "TSORACLE_PG_BIN names the new major's binaries (make test-upgrade)"
    );

    // ---- the old cluster, with state in every table
    let mut old = serving_node("upgrade-old", NodeOpts::new().bin(&old_bin));
    let mut c = old.connect();
    let old_major = server_major(&mut c);
    let seeded_ms = now_ms() + 3_600_000;
    tso::tso_seed(&mut c, seeded_ms)
        .unwrap_or_else(|e| panic!("tso_seed: {}", pg_error_string(&e)));
    let mut last_issued = 0;
    for _ in 0..200 {
        let ts = next(&mut c);
        assert!(ts > last_issued);
        last_issued = ts;
    }
    assert!(physical(last_issued) >= seeded_ms, "the seed took effect before the upgrade");
    let mut last_block = std::collections::BTreeMap::new();
    for (key, count) in [("orders", 100), ("invoices", 7)] {
        for _ in 0..5 {
            let start = seq(&mut c, key, count)
                .unwrap_or_else(|e| panic!("tso_seq({key}): {}", pg_error_string(&e)));
            last_block.insert(key, start + i64::from(count));
        }
    }
    let lease = c
        .query_one(
            "SELECT lease_id, ts_upper_bound FROM tso_lease_acquire('upgrader', 1, 300000)",
            &[],
        )
        .unwrap_or_else(|e| panic!("tso_lease_acquire: {}", pg_error_string(&e)));
    let (lease_id, lease_bound): (i64, i64) = (lease.get(0), lease.get(1));
    let leases_before = lease_rows(&mut c);
    let high_water_before =
        durable_high_water(&mut c).expect("high-water").expect("a committed high-water");
    drop(c);
    old.stop(StopMode::Fast).expect("stop the old cluster");

    // ---- pg_upgrade into the new major
    let mut new = tsoracle_tests::Node::upgrade_from(
        &old,
        "upgrade-new",
        // The harness's clusters have no data checksums; since PostgreSQL 18 initdb enables
        // them by default, and pg_upgrade needs both clusters alike.
        NodeOpts::new().bin(&new_bin).initdb_arg("--no-data-checksums"),
    )
    .unwrap_or_else(|e| panic!("pg_upgrade: {e}"));
    new.start().expect("start the upgraded cluster");
    let mut c = new.connect();
    let status =
        tso::wait_serving(&mut c).unwrap_or_else(|e| panic!("upgraded cluster serving: {e}"));
    let new_major = server_major(&mut c);
    assert!(new_major > old_major, "upgraded from {old_major} to {new_major}");
    assert_eq!(status.state, "serving");

    // ---- everything issued before stays below what the upgraded cluster serves
    let high_water_after =
        durable_high_water(&mut c).expect("high-water").expect("a committed high-water");
    assert!(
        high_water_after >= high_water_before,
        "high-water went back from {high_water_before} to {high_water_after}"
    );
    let first = next(&mut c);
    assert!(
        first > last_issued,
        "after pg_upgrade tso_next() = {first} <= {last_issued} issued before"
    );
    assert!(
        first > lease_bound,
        "after pg_upgrade tso_next() = {first} <= lease bound {lease_bound}"
    );
    let safe = c
        .query_one("SELECT tso_safe_frontier()", &[])
        .and_then(|r| r.try_get::<_, i64>(0))
        .unwrap_or_else(|e| panic!("tso_safe_frontier(): {}", pg_error_string(&e)));
    assert!(safe < first, "the safe frontier {safe} is below what is served ({first})");

    // ---- counters continue exactly, leases are kept and still renewable
    for (key, next_start) in &last_block {
        assert_eq!(peek(&mut c, key).expect("peek"), Some(*next_start), "counter {key}");
        let start = seq(&mut c, key, 3)
            .unwrap_or_else(|e| panic!("tso_seq({key}): {}", pg_error_string(&e)));
        assert_eq!(start, *next_start, "counter {key} continues where it stopped");
    }
    assert_eq!(lease_rows(&mut c), leases_before, "the lease table survives pg_upgrade");
    let renewed = c
        .query_one("SELECT ts_upper_bound FROM tso_lease_renew($1)", &[&lease_id])
        .and_then(|r| r.try_get::<_, i64>(0))
        .unwrap_or_else(|e| panic!("tso_lease_renew after pg_upgrade: {}", pg_error_string(&e)));
    assert!(renewed >= lease_bound, "renewed bound {renewed} < {lease_bound}");

    // ---- and the guarantee holds across the upgraded cluster's own crash
    drop(c);
    new.kill9_postmaster().expect("kill -9");
    new.start().expect("restart after kill -9");
    let mut c = new.connect();
    tso::wait_serving(&mut c).unwrap_or_else(|e| panic!("serving after the crash: {e}"));
    let after_crash = next(&mut c);
    assert!(after_crash > first, "after the crash {after_crash} <= {first}");
}
