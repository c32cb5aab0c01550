//! pg_repack, as DBAs run it from cron, on the extension's own tables under load
//! (docs/operations/maintenance.md, "Tools that follow a table"). pg_repack copies a table
//! under a snapshot and replays the changes its row trigger logged meanwhile; while that
//! trigger is on a table, every advance of it is a row version the trigger sees.
//!
//! `make test` runs this suite on the majors whose pg_repack the project's scripts install
//! (Debian's `postgresql-15-repack`): the test fails if the binary or the extension is
//! missing from the installation it runs against.
//!
//! Run with: `TSORACLE_PG_BIN=… cargo test -p tsoracle-tests --test repack`

use std::process::Command;
use std::time::{Duration, Instant};

use tsoracle_tests::backup::run_as_postgres;
use tsoracle_tests::node::pg_bin_dir;
use tsoracle_tests::seqlease::{seq, seq_totals, SeqLoad, SeqLoadOptions};
use tsoracle_tests::tso::assert_high_water_covers;
use tsoracle_tests::{
    ops, pg_error_string, serving_node, DenseHistory, History, Load, LoadOptions, NodeOpts,
    StopMode,
};

/// `pg_repack -t tsoracle.<table>` of `node`'s database, as the postgres OS user; whether it
/// exited 0, and its output.
fn repack(port: u16, table: &str) -> Result<String, String> {
    let mut cmd = Command::new(pg_bin_dir().join("pg_repack"));
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres", "-d", "postgres"])
        .args(["--no-kill-backend", "--wait-timeout=30", "-t", &format!("tsoracle.{table}")]);
    run_as_postgres(cmd, Duration::from_secs(120)).map_err(|e| e.to_string())
}

/// `pg_repack` of `tsoracle.seq`, `tsoracle.high_water` and `tsoracle.lease` in turn for 20 s,
/// under 8 sessions of `tso_seq` on two hot keys (blocks of 1 to 3) and 3 of `tso_next()`.
/// Every repack succeeds; after each, the table's high-water is at or above every timestamp
/// served before it was read. Then the server restarts (fast), both loads go on for 2 s, and:
/// every block of every key was granted once (the blocks tile the counter with no overlap),
/// the timestamps are unique and in real-time order across the restart.
#[test]
fn pg_repack_of_the_extensions_tables_loses_no_advance() {
    assert!(
        pg_bin_dir().join("pg_repack").exists(),
        "pg_repack is not installed in {} (scripts/install-deps.sh --test installs it)",
        pg_bin_dir().display()
    );
    let mut node = serving_node("repack", NodeOpts::new());
    let mut su = node.connect();
    su.batch_execute("CREATE EXTENSION pg_repack")
        .unwrap_or_else(|e| panic!("CREATE EXTENSION pg_repack: {}", pg_error_string(&e)));
    su.batch_execute("SELECT tso_lease_acquire('repack-holder', 1, 60000)").unwrap();
    let keys = ["k", "j"];
    let dense = DenseHistory::new();
    let mut opts = SeqLoadOptions::new(8, Duration::from_secs(600), &keys);
    opts.max_count = 3;
    let seq_load = SeqLoad::start(node.endpoint(), opts, dense.clone());
    let history = History::new();
    let next_load = Load::start(
        vec![node.endpoint()],
        LoadOptions::new(3, Duration::from_secs(600)),
        ops::tso_next(),
        history.clone(),
    );
    let started = Instant::now();
    let mut runs = 0;
    while started.elapsed() < Duration::from_secs(20) {
        for table in ["seq", "high_water", "lease"] {
            let served = history.max_value();
            if let Err(e) = repack(node.port(), table) {
                panic!("pg_repack -t tsoracle.{table}: {e}");
            }
            runs += 1;
            assert_high_water_covers(&mut su, served, &format!("repacking tsoracle.{table}"));
        }
    }
    let before_restart = history.max_value().expect("tso_next() served");
    node.restart(StopMode::Fast).expect("restart");
    node.wait_serving().expect("serving after the restart");
    std::thread::sleep(Duration::from_secs(2));
    let seq_stats = seq_load.stop_and_join();
    let next_stats = next_load.stop_and_join();
    assert!(runs >= 6, "only {runs} pg_repack runs in 20 s");
    assert!(seq_stats.single_ok >= 200, "too few tso_seq calls: {seq_stats:?}");
    // The swap's brief ACCESS EXCLUSIVE delays calls, as it delays an INSERT: none fails.
    assert_eq!(
        seq_stats.errors_by_sqlstate.get("55P03").copied().unwrap_or(0),
        0,
        "tso_seq calls failed on pg_repack's lock: {seq_stats:?}"
    );
    assert!(
        history.max_value().is_some_and(|v| v > before_restart),
        "tso_next() served nothing above {before_restart} after the restart: {next_stats:?}"
    );
    let mut su = node.connect();
    let totals = seq_totals(&mut su).unwrap();
    let report = dense
        .check(Some(&totals))
        .unwrap_or_else(|v| panic!("a block granted twice: {v}\ntotals {totals:?}\n{seq_stats:?}"));
    let report_next = history.assert_valid();
    for k in keys {
        let next = seq(&mut su, k, 1).unwrap();
        assert_eq!(next, totals[k], "key {k} continues from its counter");
    }
    eprintln!(
        "{runs} pg_repack runs; tso_seq {:?}; tso_next {report_next:?}; {seq_stats:?}",
        report.keys
    );
}
