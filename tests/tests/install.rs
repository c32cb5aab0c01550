//! Installing a new build never harms a running server.
//!
//! A cluster serves 4 sessions of `tso_next()`/`tso_next_batch()` from the private test
//! installation while `scripts/install-ext.sh` (what `make install` runs) installs a
//! different build of tsoracle (the debug profile) into that same installation. The server
//! has the old library mapped, preloaded: copied over in place, the file would change under
//! it (SIGBUS, SIGSEGV, and the postmaster restarts every backend); renamed into place, the
//! server keeps the old file. The test asserts that no call failed, no session had to
//! reconnect, the postmaster and the worker are the same processes, the server log records
//! no crash, and that the file really was replaced. A restart then loads the new build, which
//! serves above everything issued before. The release build is installed back at the end.
//!
//! Environment (set by `make test-install`): `TSORACLE_PG_BIN` (the private installation's
//! binaries, with tsoracle installed) and `TSORACLE_BUILD_PG_CONFIG` (the pg_config to build
//! against, see scripts/install-ext.sh).
//!
//! Run with: `make test-install`

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tsoracle_tests::node::pg_bin_dir;
use tsoracle_tests::tso;
use tsoracle_tests::{ops, serving_node, History, Load, LoadOptions, NodeOpts, StopMode};

/// Run `scripts/<script>` with `args` and INSTALL_PROFILE=`profile`; it must succeed.
fn script(script: &str, profile: &str, args: &[&Path]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let status = Command::new(root.join("scripts").join(script))
        .args(args)
        .env("INSTALL_PROFILE", profile)
        .current_dir(&root)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("run scripts/{script}: {e}"));
    assert!(status.success(), "scripts/{script} ({profile}) failed: {status}");
}

fn install(profile: &str, build_pg_config: &Path, dest_pg_config: &Path) {
    script("install-ext.sh", profile, &[build_pg_config, dest_pg_config]);
}

fn worker_pid(node: &tsoracle_tests::Node) -> i32 {
    tso::status(&mut node.connect()).expect("tso_status()").worker_pid.expect("a worker pid")
}

#[test]
fn installing_a_new_build_under_load_keeps_the_server_serving() {
    let build_pg_config = PathBuf::from(std::env::var_os("TSORACLE_BUILD_PG_CONFIG").expect(
        "TSORACLE_BUILD_PG_CONFIG names the pg_config to build against (make test-install)",
    ));
    assert!(
        std::env::var_os("TSORACLE_PG_BIN").is_some(),
        "TSORACLE_PG_BIN names the private installation (make test-install)"
    );
    let dest_pg_config = pg_bin_dir().join("pg_config");
    let pkglibdir = Command::new(&dest_pg_config).arg("--pkglibdir").output().expect("pg_config");
    let library =
        PathBuf::from(String::from_utf8_lossy(&pkglibdir.stdout).trim()).join("tsoracle.so");
    let before = std::fs::metadata(&library).expect("tsoracle.so installed");
    let before_bytes = std::fs::read(&library).expect("read tsoracle.so");

    // Build the debug package first: under the load, the install only re-checks the build
    // (cargo finds it fresh) and renames files, and the load's duration need not cover a
    // compilation on a busy machine.
    script("build-ext.sh", "debug", &[&build_pg_config]);

    let mut node = serving_node("install-under-load", NodeOpts::new());
    let postmaster = node.postmaster_pid().expect("postmaster pid");
    let worker = worker_pid(&node);
    let history = History::new();
    let threads = 4;
    let load = Load::start(
        vec![node.endpoint()],
        LoadOptions::new(threads, Duration::from_secs(600)),
        ops::mixed(64),
        history.clone(),
    );
    let started = Instant::now();
    history.wait_progress(started, 50, "load before the install");

    install("debug", &build_pg_config, &dest_pg_config);

    // Keep the load going a while on the old, replaced library.
    let after_install = Instant::now();
    history.wait_progress(after_install, 200, "load after the install");
    let stats = load.stop_and_join();

    let after = std::fs::metadata(&library).expect("tsoracle.so still installed");
    let after_bytes = std::fs::read(&library).expect("read tsoracle.so");
    assert_ne!(before_bytes, after_bytes, "the install wrote a different build");
    assert_ne!(before.ino(), after.ino(), "the library was renamed into place, not overwritten");
    assert_eq!(stats.err_calls, 0, "calls failed during the install: {stats:?}");
    assert_eq!(
        stats.connects, threads as u64,
        "sessions reconnected during the install: {stats:?}"
    );
    assert_eq!(node.postmaster_pid(), Some(postmaster), "the postmaster changed");
    assert_eq!(worker_pid(&node), worker, "the worker was restarted");
    let log = node.log_contents();
    for crash in ["terminated by signal", "server process", "was terminated", "reinitializ"] {
        assert!(!log.contains(crash), "the server log records a crash ({crash:?})");
    }
    let report = history.check().unwrap_or_else(|v| panic!("history check failed: {v}"));
    assert!(report.ok_calls > 0);

    // The next restart loads the new build, and it serves above everything before.
    let last = history.max_value().expect("values issued");
    node.restart(StopMode::Fast).expect("restart");
    node.wait_serving().expect("serving after the restart");
    let mut c = node.connect();
    let ts: i64 = c.query_one("SELECT tso_next()", &[]).expect("tso_next()").get(0);
    assert!(ts > last, "after loading the new build: {ts} <= {last}");
    drop(c);
    node.stop(StopMode::Fast).expect("stop");

    install("release", &build_pg_config, &dest_pg_config);
}
