//! Self-tests of the harness on vanilla clusters (no tsoracle needed): lifecycle, crashes,
//! configuration, replicas, and the load helper with the history checker.

use std::time::{Duration, Instant};

use tsoracle_tests::{ops, History, Load, LoadOptions, Node, NodeOpts, StopMode};

fn select_1(node: &Node) {
    let mut c = node.connect();
    let v: i32 = c.query_one("SELECT 1", &[]).unwrap().get(0);
    assert_eq!(v, 1);
}

#[test]
fn vanilla_lifecycle_and_crashes() {
    let mut node = Node::init("vanilla", NodeOpts::new().without_preload()).unwrap();
    let base = node.basedir().to_path_buf();
    assert!(node.datadir().join("PG_VERSION").exists());
    node.start().unwrap();
    select_1(&node);
    assert_eq!(node.psql("SELECT 40 + 2").unwrap().trim(), "42");
    assert!(node.psql("SELECT * FROM no_such_table").is_err());
    let mut c = node.connect();
    let listen: String = c.query_one("SHOW listen_addresses", &[]).unwrap().get(0);
    assert_eq!(listen, "127.0.0.1");
    let port: String = c.query_one("SHOW port", &[]).unwrap().get(0);
    assert_eq!(port, node.port().to_string());
    let fsync: String = c.query_one("SHOW fsync", &[]).unwrap().get(0);
    assert_eq!(fsync, "on");
    drop(c);

    // A sighup setting through set_conf + reload.
    node.set_conf("work_mem", "7MB").unwrap();
    let mut c = node.connect();
    let wm: String = c.query_one("SHOW work_mem", &[]).unwrap().get(0);
    assert_eq!(wm, "7MB");
    c.batch_execute("CREATE TABLE t (x int); INSERT INTO t VALUES (1)").unwrap();
    drop(c);

    let pm0 = node.postmaster_pid().unwrap();
    node.restart(StopMode::Fast).unwrap();
    select_1(&node);
    node.restart(StopMode::Immediate).unwrap();
    select_1(&node);

    // kill -9 of the postmaster with a client connected and a busy backend.
    let busy = node.connect();
    let busy_thread = std::thread::spawn(move || {
        let mut busy = busy;
        let _ = busy.batch_execute("SELECT pg_sleep(30)");
    });
    std::thread::sleep(Duration::from_millis(200));
    let killed = node.kill9_postmaster().unwrap();
    assert!(!killed.is_empty(), "the postmaster had children");
    busy_thread.join().unwrap();
    node.start().unwrap();
    assert_ne!(node.postmaster_pid(), Some(pm0));
    let mut c = node.connect();
    let n: i64 = c.query_one("SELECT count(*) FROM t", &[]).unwrap().get(0);
    assert_eq!(n, 1, "committed data survives kill -9");

    // kill -9 of one backend: crash restart, the postmaster stays.
    let pm = node.postmaster_pid().unwrap();
    let victim: i32 = c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    assert!(node.child_pids().contains(&victim));
    node.kill9_pid(victim).unwrap();
    assert!(c.query_one("SELECT 1", &[]).is_err(), "killed backend's session is gone");
    select_1(&node); // connect() retries through the crash restart
    assert_eq!(node.postmaster_pid(), Some(pm));
    assert!(node.kill9_pid(std::process::id() as i32).is_err(), "refuses foreign pids");
    assert!(node.kill9_pid(0).is_err());
    assert!(node.log_contents().contains("terminated by signal 9"), "crash is in the log");

    node.stop(StopMode::Fast).unwrap();
    assert!(node.stop(StopMode::Fast).is_err(), "already stopped");
    node.start().unwrap();
    drop(node);
    assert!(!base.exists(), "drop removes the node directory");
}

#[test]
fn replica_base_backup_and_promote() {
    let primary = Node::start_new("primary", NodeOpts::new().without_preload()).unwrap();
    let mut c = primary.connect();
    c.batch_execute("CREATE TABLE t (x int); INSERT INTO t VALUES (1)").unwrap();

    let mut replica = Node::base_backup_from(&primary, "replica1").unwrap();
    assert_ne!(replica.port(), primary.port());
    let auto = std::fs::read_to_string(replica.datadir().join("postgresql.auto.conf")).unwrap();
    assert!(auto.contains("application_name=replica1"), "primary_conninfo: {auto}");
    assert!(replica.datadir().join("standby.signal").exists());
    replica.start().unwrap();
    assert!(replica.is_in_recovery().unwrap());

    c.batch_execute("INSERT INTO t VALUES (2)").unwrap();
    let mut r = replica.connect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n: i64 = r.query_one("SELECT count(*) FROM t", &[]).unwrap().get(0);
        if n == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "row not replicated in 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let e = r.batch_execute("INSERT INTO t VALUES (3)").unwrap_err();
    assert_eq!(e.code(), Some(&postgres::error::SqlState::READ_ONLY_SQL_TRANSACTION));

    replica.promote().unwrap();
    assert!(!replica.is_in_recovery().unwrap());
    let mut r = replica.connect();
    r.batch_execute("INSERT INTO t VALUES (3)").unwrap();
    let tli: i32 =
        r.query_one("SELECT timeline_id FROM pg_control_checkpoint()", &[]).unwrap().get(0);
    assert!(tli >= 1);
}

/// The load helper and the history checker on a real server: a sequence is unique and
/// increasing; a fast restart in the middle produces errors that are recorded as errors, and
/// the clients reconnect.
#[test]
fn load_reconnects_across_restart() {
    let mut node = Node::start_new("load", NodeOpts::new().without_preload()).unwrap();
    node.psql("CREATE SEQUENCE s").unwrap();
    let history = History::new();
    let load = Load::start(
        vec![node.endpoint()],
        LoadOptions::new(4, Duration::from_secs(60)),
        ops::statement("SELECT nextval('s')"),
        history.clone(),
    );
    let t0 = Instant::now();
    while history.ok_calls_started_after(t0) < 50 && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let down = Instant::now();
    node.restart(StopMode::Fast).unwrap();
    let up = Instant::now();
    while history.ok_calls_started_after(up) < 50 && up.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let stats = load.stop_and_join();
    let report = history.assert_valid();
    assert!(history.ok_calls_within(t0, down) >= 50, "{stats:?}");
    assert!(history.ok_calls_started_after(up) >= 50, "{stats:?}");
    assert_eq!(report.ok_calls as u64, stats.ok_calls);
    assert!(stats.connects > 4, "reconnected after the restart: {stats:?}");
}
