//! A blue/green switchover through logical replication (docs/operations/logical-replication.md):
//! an old cluster serves an application — counters, timestamps stamped on its rows — while a
//! new cluster with tsoracle subscribes to it; then the application's writes move to the new
//! one. Across both clusters' histories: no block of any counter is granted twice, and every
//! timestamp the new cluster issues is above every one the old cluster issued.
//!
//! - through a subscription alone (the old cluster publishes `FOR ALL TABLES`, which includes
//!   tsoracle's tables): its initial copy merges into the new cluster's own rows instead of
//!   colliding with them, the counters follow through the worker's MVCC path while the table is
//!   published, the high-water through the update that follows each raise;
//! - through the documented procedure, way (b), with only the application's tables subscribed:
//!   `tso_handover()` on the old primary, its tables dumped and restored into the new one;
//! - through the documented procedure, way (a), with the counters and leases subscribed but not
//!   the high-water (the worst case of a last raise that did not reach green): `tso_handover()`,
//!   then `tso_seed()` of the value it returned plus one on the new one, which alone carries
//!   the high-water over;
//! - through `pg_createsubscriber` (PostgreSQL 17 and later), which turns a physical standby of
//!   the old cluster into a subscriber: `tso_handover()` then `tso_seed()` on the new one.
//!
//! The procedure's steps are the page's own blocks (`<!-- runbook: switchover step=N -->`,
//! `tsoracle_tests::runbook`), run as written with `$BLUE`, `$GREEN` and `$HANDED_OVER` set,
//! while the application still calls the old cluster (its calls answer `57P03` once handed
//! over). A page that drops the "plus one", the seed or the dump fails these tests.
//!
//! Run with: `cargo test -p tsoracle-tests --test bluegreen -- --test-threads=2`

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use postgres::{Client, NoTls};
use tsoracle_tests::backup::{run_as_postgres, PgDir, TOOL_TIMEOUT};
use tsoracle_tests::runbook::{
    printed_number, run_sh_in, run_step, Runbook, AHEAD, SWITCHOVER_STEPS,
};
use tsoracle_tests::seqlease::sqlstate_of;
use tsoracle_tests::{pg_error_string, poll_until, serving_node, Node, NodeOpts};

const KEYS: [&str; 3] = ["invoice", "order", "ticket"];

/// What the application got from one cluster: blocks per key, and timestamps.
#[derive(Default, Debug)]
struct Granted {
    blocks: BTreeMap<String, Vec<(i64, i64)>>,
    timestamps: Vec<i64>,
}

/// The application: 4 sessions taking blocks of the counters and inserting rows stamped with
/// `DEFAULT tso_next()` into `orders`, until stopped. Retryable errors are retried.
struct App {
    stop: Arc<AtomicBool>,
    granted: Arc<Mutex<Granted>>,
    handles: Vec<JoinHandle<()>>,
}

impl App {
    fn start(node: &Node) -> App {
        let stop = Arc::new(AtomicBool::new(false));
        let granted = Arc::new(Mutex::new(Granted::default()));
        let handles = (0..4usize)
            .map(|t| {
                let (stop, granted, conninfo) = (stop.clone(), granted.clone(), node.conninfo());
                thread::spawn(move || {
                    let mut c = Client::connect(&conninfo, NoTls).expect("app connects");
                    let mut i = 0usize;
                    while !stop.load(Ordering::Relaxed) {
                        let key = KEYS[(i + t) % KEYS.len()];
                        let count = 1 + (i % 4) as i64;
                        i += 1;
                        match c.query_one("SELECT tso_seq($1, $2::int)", &[&key, &(count as i32)]) {
                            Ok(r) => granted
                                .lock()
                                .unwrap()
                                .blocks
                                .entry(key.to_string())
                                .or_default()
                                .push((r.get(0), count)),
                            Err(e) => assert!(
                                ["55P03", "57P03"].contains(&sqlstate_of(&e).as_str()),
                                "tso_seq: {}",
                                pg_error_string(&e)
                            ),
                        }
                        match c.query_one(
                            "INSERT INTO orders (n) VALUES ($1) RETURNING ts",
                            &[&(i as i64)],
                        ) {
                            Ok(r) => granted.lock().unwrap().timestamps.push(r.get(0)),
                            Err(e) => assert_eq!(
                                sqlstate_of(&e),
                                "57P03",
                                "insert: {}",
                                pg_error_string(&e)
                            ),
                        }
                        thread::sleep(Duration::from_millis(5));
                    }
                })
            })
            .collect();
        App { stop, granted, handles }
    }

    fn stop(self) -> Granted {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.handles {
            h.join().expect("an app session panicked");
        }
        Arc::try_unwrap(self.granted).expect("app joined").into_inner().unwrap()
    }
}

fn exec(c: &mut Client, sql: &str) {
    c.batch_execute(sql).unwrap_or_else(|e| panic!("{sql}: {}", pg_error_string(&e)));
}

const ORDERS: &str =
    "CREATE TABLE orders (ts bigint PRIMARY KEY DEFAULT tso_next(), n bigint NOT NULL)";

/// The old cluster (logical WAL), with the application's table and counters in use.
fn old_cluster(name: &str) -> Node {
    let node = serving_node(
        name,
        NodeOpts::new()
            .setting("wal_level", "logical")
            .setting("max_replication_slots", 10)
            .setting("max_wal_senders", 10),
    );
    exec(&mut node.connect(), ORDERS);
    node
}

/// Wait (bounded) until subscription `sub` of `new` has copied every table and applied all of
/// `old`'s WAL written so far.
fn wait_caught_up(old: &Node, new: &Node, sub: &str) {
    let mut o = old.connect();
    let mut n = new.connect();
    poll_until("the initial copy", Duration::from_secs(60), || {
        let pending: i64 = n
            .query_one("SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'", &[])
            .unwrap()
            .get(0);
        (pending == 0).then_some(())
    });
    let target: String = o.query_one("SELECT pg_current_wal_lsn()::text", &[]).unwrap().get(0);
    poll_until("the subscriber caught up", Duration::from_secs(60), || {
        n.query_one(
            "SELECT coalesce(bool_and(latest_end_lsn >= $1::text::pg_lsn), false) FROM pg_stat_subscription WHERE subname = $2",
            &[&target, &sub],
        )
        .unwrap()
        .get::<_, bool>(0)
        .then_some(())
    });
}

/// The switchover runbook of docs/operations/logical-replication.md, checked to have the blocks
/// these tests run.
fn switchover() -> Runbook {
    let book = Runbook::load("logical-replication.md", "switchover");
    book.expect_steps(SWITCHOVER_STEPS);
    book
}

/// `$BLUE`, `$GREEN` (and `$HANDED_OVER`) of the runbook.
fn page_vars(blue: &Node, green: &Node, handed: Option<i64>) -> Vec<(&'static str, String)> {
    let mut v = vec![("BLUE", blue.conninfo()), ("GREEN", green.conninfo())];
    v.extend(handed.map(|h| ("HANDED_OVER", h.to_string())));
    v
}

/// Step 1 of the runbook, as written, on `blue` while `app` still calls it: the value it
/// printed (`$HANDED_OVER`), and what the application got from blue.
fn hand_over(book: &Runbook, blue: &Node, green: &Node, app: App) -> (i64, Granted) {
    let out = run_step(book.step(1), blue, &page_vars(blue, green, None));
    let handed = printed_number(&out);
    // Under load: the application's calls go on until they answer 57P03.
    thread::sleep(Duration::from_millis(500));
    let on_old = app.stop();
    let mut o = blue.connect();
    let e = o.query_one("SELECT tso_next()", &[]).expect_err("a handed-over oracle issues");
    assert_eq!(sqlstate_of(&e), "57P03", "{}", pg_error_string(&e));
    let e = o.query_one("SELECT tso_seq('invoice')", &[]).expect_err("a handed-over oracle grants");
    assert_eq!(sqlstate_of(&e), "57P03", "{}", pg_error_string(&e));
    assert!(
        on_old.timestamps.iter().all(|&ts| ts >> 18 <= handed),
        "a timestamp above the handed-over high-water {handed}"
    );
    (handed, on_old)
}

/// Green's first timestamp is in a millisecond after `handed`, the last one blue may have
/// issued in (what the runbook's "plus one" and its dump protect).
fn assert_above_handed(on_new: &Granted, handed: i64) {
    let first = on_new.timestamps.iter().min().copied().expect("green issued");
    assert!(
        first >> 18 > handed,
        "green issued {first} in millisecond {}, not above {handed}",
        first >> 18
    );
}

/// No block granted twice across both clusters; every timestamp of `new` above `old`'s.
fn assert_one_order(old: &Granted, new: &Granted) {
    for key in KEYS {
        let mut all: Vec<(i64, i64, &str)> = Vec::new();
        for (g, side) in [(old, "old"), (new, "new")] {
            all.extend(g.blocks.get(key).into_iter().flatten().map(|&(s, n)| (s, n, side)));
        }
        all.sort_unstable();
        for w in all.windows(2) {
            assert!(
                w[0].0 + w[0].1 <= w[1].0,
                "key {key}: block {:?} and {:?} overlap (granted twice)",
                w[0],
                w[1]
            );
        }
        assert!(
            new.blocks.get(key).is_some_and(|b| !b.is_empty()),
            "the new cluster granted no block of {key}"
        );
    }
    let old_max = old.timestamps.iter().max().copied().expect("the old cluster issued");
    let new_min = new.timestamps.iter().min().copied().expect("the new cluster issued");
    assert!(
        new_min > old_max,
        "the new cluster issued {new_min}, at or below the old cluster's {old_max}"
    );
    eprintln!(
        "old: {} blocks, {} timestamps; new: {} blocks, {} timestamps; new starts {} ms above",
        old.blocks.values().map(Vec::len).sum::<usize>(),
        old.timestamps.len(),
        new.blocks.values().map(Vec::len).sum::<usize>(),
        new.timestamps.len(),
        (new_min >> 18) - (old_max >> 18)
    );
}

/// The new cluster subscribes to everything the old one publishes (`FOR ALL TABLES`,
/// tsoracle's tables included); once it has caught up the application moves to it. The new
/// cluster had counters of its own already (a key also used on the old one): the initial copy
/// merges instead of failing on the key.
#[test]
fn a_switchover_through_a_subscription_continues_every_counter_and_timestamp() {
    let old = old_cluster("bg-sub-old");
    let new = serving_node("bg-sub-new", NodeOpts::new());
    let mut n = new.connect();
    exec(&mut n, ORDERS);
    // The new cluster's own use before the switchover, on one of the same keys.
    exec(&mut n, "SELECT tso_seq('invoice', 7)");
    let app = App::start(&old);
    let mut o = old.connect();
    exec(&mut o, "SELECT tso_seq('gone', 50)");
    thread::sleep(Duration::from_secs(2));
    exec(&mut o, "CREATE PUBLICATION bg FOR ALL TABLES");
    exec(&mut n, &format!("CREATE SUBSCRIPTION bg CONNECTION '{}' PUBLICATION bg", old.conninfo()));
    thread::sleep(Duration::from_secs(4));
    // A key dropped on the old cluster (its row deleted, a delete the subscription carries)
    // stays on the new one: the subscriber never forgets a block it might have to continue.
    exec(&mut o, "SELECT tso_seq_drop('gone')");
    // The switchover: the application stops writing to the old cluster ...
    let on_old = app.stop();
    wait_caught_up(&old, &new, "bg");
    // ... and the new one stops following it, and takes the writes.
    exec(&mut n, "ALTER SUBSCRIPTION bg DISABLE");
    new.wait_serving().expect("the new cluster serves");
    let app = App::start(&new);
    thread::sleep(Duration::from_secs(3));
    let on_new = app.stop();
    assert_one_order(&on_old, &on_new);
    // The new cluster's own block before the switchover is not granted again either.
    let first_invoice = on_new.blocks["invoice"].iter().map(|b| b.0).min().unwrap();
    assert!(first_invoice >= 7, "the new cluster's own block [0, 7) granted again");
    let gone: i64 = n.query_one("SELECT tso_seq('gone', 1)", &[]).unwrap().get(0);
    assert!(gone >= 50, "the dropped key's blocks [0, 50) granted again from {gone}");
}

/// The documented procedure, way (b), with only the application's table subscribed, blue a
/// minute ahead of the clock, run from the page: `tso_handover()` on the old primary under the application's load (it then issues
/// nothing), tsoracle's tables dumped from it and restored into the new cluster, the
/// application moves.
#[test]
fn a_switchover_by_the_documented_procedure_continues_every_counter_and_timestamp() {
    let book = switchover();
    let old = old_cluster("bg-proc-old");
    // Blue a minute ahead of the clock: without its high-water dumped, green would go back.
    exec(&mut old.connect(), &format!("SELECT tso_seed({AHEAD})"));
    let new = serving_node("bg-proc-new", NodeOpts::new());
    let mut n = new.connect();
    exec(&mut n, ORDERS);
    exec(&mut old.connect(), "CREATE PUBLICATION bg FOR TABLE orders");
    exec(&mut n, &format!("CREATE SUBSCRIPTION bg CONNECTION '{}' PUBLICATION bg", old.conninfo()));
    let app = App::start(&old);
    thread::sleep(Duration::from_secs(4));
    let (handed, on_old) = hand_over(&book, &old, &new, app);
    // Its tables, as the page says (step 3): pg_dump --data-only of the three, psql into the
    // new one.
    let dir = PgDir::new("bg-proc-dump").expect("dump dir");
    let step = book.step(3);
    run_sh_in(step, old.bin_dir(), &page_vars(&old, &new, Some(handed)), Some(dir.path()))
        .unwrap_or_else(|e| panic!("runbook step 3 (line {}): {e}\n{}", step.line, step.text));
    wait_caught_up(&old, &new, "bg");
    exec(&mut n, "ALTER SUBSCRIPTION bg DISABLE");
    new.wait_serving().expect("the new cluster serves after the restore's fence");
    let high_water: i64 =
        n.query_one("SELECT high_water_ms FROM tso_status()", &[]).unwrap().get(0);
    assert!(high_water > handed, "the new high-water {high_water} is not above {handed}");
    let app = App::start(&new);
    thread::sleep(Duration::from_secs(3));
    let on_new = app.stop();
    assert_above_handed(&on_new, handed);
    assert_one_order(&on_old, &on_new);
}

/// The documented procedure, way (a), run from the page: the counters and leases subscribed,
/// the high-water not (the worst case of its last raise not reaching green), blue a minute
/// ahead of the clock; `tso_handover()` under load, then `tso_seed()` of its value plus one on
/// green, the only thing that carries blue's high-water over.
#[test]
fn a_switchover_by_the_documented_seed_continues_every_counter_and_timestamp() {
    let book = switchover();
    let old = old_cluster("bg-seed-old");
    let new = serving_node("bg-seed-new", NodeOpts::new());
    let mut n = new.connect();
    exec(&mut n, ORDERS);
    let mut o = old.connect();
    exec(&mut o, &format!("SELECT tso_seed({AHEAD})"));
    exec(&mut o, "CREATE PUBLICATION bg FOR TABLE orders, tsoracle.seq, tsoracle.lease");
    exec(&mut n, &format!("CREATE SUBSCRIPTION bg CONNECTION '{}' PUBLICATION bg", old.conninfo()));
    let app = App::start(&old);
    thread::sleep(Duration::from_secs(4));
    let (handed, on_old) = hand_over(&book, &old, &new, app);
    wait_caught_up(&old, &new, "bg");
    exec(&mut n, "ALTER SUBSCRIPTION bg DISABLE");
    new.wait_serving().expect("the new cluster serves");
    run_step(book.step(2), &new, &page_vars(&old, &new, Some(handed)));
    let app = App::start(&new);
    thread::sleep(Duration::from_secs(3));
    let on_new = app.stop();
    assert_above_handed(&on_new, handed);
    assert_one_order(&on_old, &on_new);
}

/// `pg_createsubscriber` (PostgreSQL 17 and later) turns a physical standby of the old
/// cluster into a subscriber of it; the old cluster goes on serving meanwhile; then
/// `tso_handover()` on the old primary and `tso_seed()` with its answer on the new one, and
/// the application moves. On 15 and 16 the tool does not exist: nothing to prove there.
#[test]
fn a_switchover_through_pg_createsubscriber_continues_every_counter_and_timestamp() {
    let old = old_cluster("bg-cs-old");
    let version: i32 = old
        .connect()
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .unwrap()
        .get(0);
    if version < 170_000 {
        eprintln!("pg_createsubscriber comes with PostgreSQL 17; this server is {version}");
        return;
    }
    let book = switchover();
    let app = App::start(&old);
    thread::sleep(Duration::from_secs(1));
    let mut standby = Node::base_backup_from(&old, "bg-cs-new").expect("pg_basebackup");
    standby.set_conf("max_replication_slots", 10).unwrap();
    standby.set_conf("max_logical_replication_workers", 4).unwrap();
    standby.set_conf("max_worker_processes", 16).unwrap();
    standby.start().expect("start the standby");
    poll_until("the standby streams", Duration::from_secs(30), || {
        standby.is_in_recovery().ok().filter(|&r| r).map(|_| ())
    });
    standby.stop(tsoracle_tests::StopMode::Fast).expect("stop the standby for pg_createsubscriber");
    let dir = PgDir::new("bg-cs").expect("work dir");
    let mut cmd = dir.command("pg_createsubscriber");
    cmd.arg("-D")
        .arg(standby.datadir())
        .arg("-P")
        .arg(old.conninfo())
        .args(["-d", "postgres", "-U", "postgres", "-p"])
        .arg(standby.port().to_string())
        .args(["--publication", "bg", "--subscription", "bg"]);
    run_as_postgres(cmd, TOOL_TIMEOUT).expect("pg_createsubscriber");
    standby.start().expect("start the new cluster");
    standby.wait_serving().expect("the new cluster serves");
    thread::sleep(Duration::from_secs(2));
    let (handed, on_old) = hand_over(&book, &old, &standby, app);
    wait_caught_up(&old, &standby, "bg");
    let mut n = standby.connect();
    exec(&mut n, "ALTER SUBSCRIPTION bg DISABLE");
    // The page's way (a): tso_seed() serves at or above its argument, and the old cluster
    // issued in `handed` itself: plus one.
    run_step(book.step(2), &standby, &page_vars(&old, &standby, Some(handed)));
    let app = App::start(&standby);
    thread::sleep(Duration::from_secs(3));
    let on_new = app.stop();
    assert_above_handed(&on_new, handed);
    assert_one_order(&on_old, &on_new);
}
