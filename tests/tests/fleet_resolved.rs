//! The fleet's resolved timestamp `R_f` and the relay (docs/fleet.md, "Reading a fleet in
//! order").
//!
//! - three clusters — an oracle with a synchronous standby, and two members — have an outbox
//!   each (`ts bigint DEFAULT tso_next()`), written by 4 writers per cluster in transactions
//!   of random length, of statements of 1 to 20 rows (10 % roll back, some stay idle for
//!   seconds), while the oracle's primary
//!   is killed (`kill -9`) and its standby promoted, a member restarts and the relay is
//!   killed and started again. The relay (`tsoracle-relay`, to a file) and a consumer that
//!   follows the documented protocol by hand each emit every committed row exactly once, in
//!   timestamp order, and no row that rolled back; `R_f` never decreases;
//! - an idle transaction on a member holds `R_f`, and `tso_fleet_status()` names its process;
//! - a member that stops reporting holds `R_f`, `tso_fleet_status()` names it, and once a
//!   superuser removes it `R_f` goes on; a removed member stays out until a superuser
//!   re-admits it (`tso_fleet_admit()`);
//! - a clone of a member promoted beside its live original takes an identity of its own,
//!   refused `42501` until a superuser admits it, then gets an entry of its own, and `R_f`
//!   waits for both; a member's promoted standby keeps the member's entry;
//! - who may do what: a role speaking for another role's member, a report without a hello,
//!   a removal by a non-superuser or of a connected member, a write to the tables.
//!
//! Run with: `cargo test -p tsoracle-tests --test fleet_resolved -- --test-threads=2`

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::{Client, NoTls};
use tsoracle_tests::cluster::{make_sync, promote};
use tsoracle_tests::fleet::{
    admit_members, member, oracle_conninfo, relay_binary, relay_output, MEMBER_ROLE,
};
use tsoracle_tests::rng::SplitMix64 as Rng;
use tsoracle_tests::{
    expect_sqlstate, pg_error_string, poll_until, serving_node, Node, NodeOpts, StopMode,
};

const WRITERS: usize = 4;
const OUTBOX: &str =
    "CREATE TABLE outbox (id bigint PRIMARY KEY, ts bigint NOT NULL DEFAULT tso_next(), writer int NOT NULL, note text)";

/// A row of an outbox: its cluster, its id there, its timestamp.
type RowId = (String, i64);

#[derive(Default)]
struct Outcomes {
    committed: BTreeMap<RowId, i64>,
    rolled_back: BTreeSet<RowId>,
    /// The commit's answer was lost (a failover, a restart): in the outbox or not.
    unknown: BTreeSet<RowId>,
    transactions: u64,
}

/// A cluster's connection string that follows a port that may change (the oracle's primary).
#[derive(Clone)]
struct Target {
    name: String,
    port: Arc<AtomicU16>,
}

impl Target {
    fn of(node: &Node) -> Target {
        Target { name: node.name().to_string(), port: Arc::new(AtomicU16::new(node.port())) }
    }

    fn conninfo(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=2",
            self.port.load(Ordering::SeqCst)
        )
    }

    fn connect(&self) -> Option<Client> {
        Client::connect(&self.conninfo(), NoTls).ok()
    }
}

/// One writer: transactions of 1 to 3 statements of 1 to 20 rows, mostly short, some idle for up to 2 s, 10 % rolled
/// back; every outcome recorded. Each row's id is the writer's own (its number, then a count):
/// a sequence would not do, since a promoted standby may hand out again a value that a rolled-
/// back transaction took on the old primary.
fn writer(target: Target, writer: i32, stop: Arc<AtomicBool>, out: Arc<Mutex<Outcomes>>) {
    let mut rng =
        Rng::new(0xF1EE7 + writer as u64 * 7919 + target.port.load(Ordering::SeqCst) as u64);
    let mut client: Option<Client> = None;
    let mut next_id = i64::from(writer) * 1_000_000_000;
    while !stop.load(Ordering::SeqCst) {
        let Some(c) = client.as_mut() else {
            client = target.connect();
            if client.is_none() {
                thread::sleep(Duration::from_millis(50));
            }
            continue;
        };
        let mut rows: Vec<(i64, i64)> = Vec::new();
        let began = c.batch_execute("BEGIN").is_ok();
        let mut ok = began;
        for _ in 0..rng.range_inclusive(1, 3) {
            if !ok {
                break;
            }
            // A third of the statements write 2 to 20 rows (a member's reservation).
            let k = if rng.chance(0.33) { rng.range_inclusive(2, 20) } else { 1 };
            match c.query(
                "INSERT INTO outbox (id, writer, note) \
                 SELECT $1::bigint + g, $2, 'x' FROM generate_series(1, $3::int) g RETURNING id, ts",
                &[&next_id, &writer, &(k as i32)],
            ) {
                Ok(r) => rows.extend(r.iter().map(|r| (r.get(0), r.get(1)))),
                Err(_) => ok = false,
            }
            next_id += k;
        }
        let pause = if rng.chance(0.03) {
            rng.range_inclusive(1000, 2000)
        } else if rng.chance(0.15) {
            rng.range_inclusive(50, 300)
        } else {
            rng.range_inclusive(0, 20)
        };
        thread::sleep(Duration::from_millis(pause as u64));
        let ids = |rows: &[(i64, i64)]| -> Vec<(RowId, i64)> {
            rows.iter().map(|&(id, ts)| ((target.name.clone(), id), ts)).collect()
        };
        if !ok {
            // Nothing of it can have committed.
            let _ = c.batch_execute("ROLLBACK");
            let mut o = out.lock().unwrap();
            o.rolled_back.extend(ids(&rows).into_iter().map(|(r, _)| r));
            client = None;
            continue;
        }
        let rollback = rng.chance(0.10);
        let end = c.batch_execute(if rollback { "ROLLBACK" } else { "COMMIT" });
        let mut o = out.lock().unwrap();
        o.transactions += 1;
        match (rollback, end) {
            (true, _) => o.rolled_back.extend(ids(&rows).into_iter().map(|(r, _)| r)),
            (false, Ok(())) => o.committed.extend(ids(&rows)),
            (false, Err(_)) => {
                o.unknown.extend(ids(&rows).into_iter().map(|(r, _)| r));
                client = None;
            }
        }
    }
}

/// `R_f` on the oracle's primary now, if it answers.
fn fleet_resolved(oracle: &Target) -> Option<i64> {
    oracle.connect()?.query_one("SELECT tso_fleet_resolved()", &[]).ok().map(|r| r.get(0))
}

/// The documented protocol, by hand: `R_f` in a statement of its own, then every cluster's
/// rows in `(cursor, R_f]`, merged in timestamp order; then `R_f` is the cursor.
fn consumer(
    oracle: Target,
    clusters: Vec<Target>,
    until: Arc<Mutex<Option<i64>>>,
) -> Vec<(RowId, i64)> {
    let mut cursor = 0i64;
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        assert!(Instant::now() < deadline, "the consumer did not reach its end");
        if until.lock().unwrap().is_some_and(|u| cursor >= u) {
            return out;
        }
        thread::sleep(Duration::from_millis(100));
        let Some(rf) = fleet_resolved(&oracle) else { continue };
        if rf <= cursor {
            continue;
        }
        let mut round = Vec::new();
        let mut complete = true;
        for t in &clusters {
            let rows = t.connect().and_then(|mut c| {
                c.query(
                    "SELECT id, ts FROM outbox WHERE ts > $1 AND ts <= $2 ORDER BY ts",
                    &[&cursor, &rf],
                )
                .ok()
            });
            match rows {
                Some(rows) => round.extend(
                    rows.iter().map(|r| ((t.name.clone(), r.get::<_, i64>(0)), r.get::<_, i64>(1))),
                ),
                None => {
                    complete = false;
                    break;
                }
            }
        }
        if !complete {
            continue;
        }
        round.sort_by_key(|(_, ts)| *ts);
        out.extend(round);
        cursor = rf;
    }
}

/// The relay, writing to `dir/out.jsonl`, reading every cluster (the oracle through both its
/// hosts, the primary first found).
fn start_relay(
    bin: &std::path::Path,
    dir: &std::path::Path,
    oracle: &str,
    clusters: &[(String, String)],
) -> Child {
    let mut cmd = Command::new(bin);
    cmd.arg("--oracle").arg(oracle);
    for (name, conninfo) in clusters {
        cmd.arg("--cluster").arg(format!("{name}={conninfo}"));
    }
    cmd.arg("--output")
        .arg(dir.join("out.jsonl"))
        .args(["--interval-ms", "100"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd.spawn().expect("start tsoracle-relay")
}

/// Keep the relay's last progress line (its rows per second); show what else it says.
fn progress_of(child: &mut Child) -> Arc<Mutex<String>> {
    let last = Arc::new(Mutex::new(String::new()));
    if let Some(err) = child.stderr.take() {
        let keep = last.clone();
        thread::spawn(move || {
            for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                if line.contains("rows/s") {
                    *keep.lock().unwrap() = line;
                } else {
                    eprintln!("{line}");
                }
            }
        });
    }
    last
}

fn relay_cursor(dir: &std::path::Path) -> i64 {
    std::fs::read_to_string(dir.join("out.jsonl.cursor"))
        .ok()
        .and_then(|t| t.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// What the relay wrote: (cluster, id) and ts, in file order.
fn relay_rows(dir: &std::path::Path) -> Vec<(RowId, i64)> {
    relay_output(&dir.join("out.jsonl"), "ts")
}

/// `emitted` holds every row of `truth` exactly once, nothing else, in timestamp order.
#[track_caller]
fn assert_exactly_once_in_order(who: &str, emitted: &[(RowId, i64)], truth: &BTreeMap<RowId, i64>) {
    let mut seen = BTreeSet::new();
    for (row, _) in emitted {
        assert!(seen.insert(row.clone()), "{who} emitted {row:?} twice");
    }
    let missing: Vec<_> = truth.keys().filter(|r| !seen.contains(*r)).take(5).collect();
    assert!(missing.is_empty(), "{who} missed committed rows, e.g. {missing:?}");
    let extra: Vec<_> = seen.iter().filter(|r| !truth.contains_key(*r)).take(5).collect();
    assert!(extra.is_empty(), "{who} emitted rows that are not committed, e.g. {extra:?}");
    for w in emitted.windows(2) {
        assert!(w[0].1 <= w[1].1, "{who} emitted {:?} before {:?}", w[0], w[1]);
    }
    for (row, ts) in emitted {
        assert_eq!(truth.get(row), Some(ts), "{who}: the timestamp of {row:?}");
    }
}

fn pct(sorted: &[i64], p: f64) -> i64 {
    sorted.get(((sorted.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0)
}

#[test]
fn the_relay_and_the_protocol_read_a_failing_fleet_exactly_once_in_order() {
    let mut oracle = serving_node("rf-oracle", NodeOpts::new());
    admit_members(&oracle);
    let mut standby = Node::base_backup_from(&oracle, "rf-standby").expect("pg_basebackup");
    standby.start().expect("start the oracle's standby");
    make_sync(&mut oracle, standby.name()).expect("synchronous standby");
    let conninfo = oracle_conninfo(&[oracle.port(), standby.port()], MEMBER_ROLE);
    let mut m1 = member("rf-m1", &conninfo);
    let m2 = member("rf-m2", &conninfo);
    for n in [&oracle, &m1, &m2] {
        n.connect().batch_execute(OUTBOX).expect("the outbox");
    }
    let oracle_t = Target::of(&oracle);
    let targets = vec![oracle_t.clone(), Target::of(&m1), Target::of(&m2)];
    let both_oracle_hosts = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=postgres target_session_attrs=read-write connect_timeout=2",
        oracle.port(),
        standby.port()
    );
    let relay_clusters: Vec<(String, String)> = vec![
        (oracle.name().to_string(), both_oracle_hosts.clone()),
        (m1.name().to_string(), m1.conninfo()),
        (m2.name().to_string(), m2.conninfo()),
    ];

    let stop = Arc::new(AtomicBool::new(false));
    let outcomes = Arc::new(Mutex::new(Outcomes::default()));
    let mut writers: Vec<JoinHandle<()>> = Vec::new();
    for t in &targets {
        for w in 0..WRITERS {
            let (t, stop, out) = (t.clone(), stop.clone(), outcomes.clone());
            writers.push(thread::spawn(move || writer(t, w as i32, stop, out)));
        }
    }
    // R_f sampled all along: it never decreases; its lag behind a new value is measured.
    let samples = Arc::new(Mutex::new(Vec::<(i64, i64)>::new()));
    let sampler = {
        let (t, stop, samples) = (oracle_t.clone(), stop.clone(), samples.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                if let Some(mut c) = t.connect() {
                    while !stop.load(Ordering::SeqCst) {
                        let Ok(rf) = c.query_one("SELECT tso_fleet_resolved()", &[]) else { break };
                        let Ok(next) = c.query_one("SELECT tso_next()", &[]) else { break };
                        samples.lock().unwrap().push((rf.get(0), next.get(0)));
                        thread::sleep(Duration::from_millis(50));
                    }
                }
                thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let until = Arc::new(Mutex::new(None));
    let by_hand = {
        let (o, ts, until) = (oracle_t.clone(), targets.clone(), until.clone());
        thread::spawn(move || consumer(o, ts, until))
    };
    let dir = std::env::temp_dir().join(format!("tsoracle-relay-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let _ = std::fs::remove_file(dir.join("out.jsonl"));
    let _ = std::fs::remove_file(dir.join("out.jsonl.cursor"));
    let bin = relay_binary();
    let mut relay = start_relay(&bin, &dir, &both_oracle_hosts, &relay_clusters);
    let _ = progress_of(&mut relay);

    let committed = |outcomes: &Arc<Mutex<Outcomes>>| outcomes.lock().unwrap().committed.len();
    // Each phase: at least 3 s, and 100 more committed rows.
    let progress = |what: &str| {
        let (before, began) = (committed(&outcomes), Instant::now());
        poll_until(what, Duration::from_secs(60), || {
            (committed(&outcomes) >= before + 100 && began.elapsed() >= Duration::from_secs(3))
                .then_some(())
        });
    };
    progress("the writers commit");
    poll_until("the relay moves", Duration::from_secs(30), || {
        (relay_cursor(&dir) > 0).then_some(())
    });
    // The oracle's hot standby serves R_f as far as it has replayed it.
    let on_standby = poll_until("R_f on the oracle's standby", Duration::from_secs(10), || {
        standby
            .connect()
            .query_one("SELECT tso_fleet_resolved()", &[])
            .ok()
            .map(|r| r.get::<_, i64>(0))
            .filter(|&rf| rf > 0)
    });
    let on_primary = fleet_resolved(&oracle_t).expect("R_f on the primary");
    assert!(on_standby <= on_primary, "the standby's R_f {on_standby} is ahead of {on_primary}");
    let listed: i64 =
        standby.connect().query_one("SELECT count(*) FROM tso_fleet_status()", &[]).unwrap().get(0);
    assert_eq!(listed, 2, "the standby lists both members");
    // kill -9 of the oracle's primary, then its standby promoted.
    oracle.kill9_postmaster().expect("kill -9 the oracle's primary");
    promote(&standby).expect("promote the oracle's standby");
    oracle_t.port.store(standby.port(), Ordering::SeqCst);
    progress("the writers commit after the oracle's failover");
    // A member restarted.
    m1.restart(StopMode::Fast).expect("restart member 1");
    progress("the writers commit after a member's restart");
    // The relay killed, and started again from its cursor.
    relay.kill().expect("kill the relay");
    let _ = relay.wait();
    let mut relay = start_relay(&bin, &dir, &both_oracle_hosts, &relay_clusters);
    let relay_progress = progress_of(&mut relay);
    progress("the writers commit after the relay's restart");
    stop.store(true, Ordering::SeqCst);
    for w in writers {
        w.join().expect("a writer panicked");
    }
    sampler.join().expect("the sampler panicked");

    // What is committed: each outbox as it is now.
    let mut truth: BTreeMap<RowId, i64> = BTreeMap::new();
    for t in &targets {
        let mut c = t.connect().expect("connect at the end");
        for r in c.query("SELECT id, ts FROM outbox", &[]).unwrap() {
            truth.insert((t.name.clone(), r.get(0)), r.get(1));
        }
    }
    let o = outcomes.lock().unwrap();
    for (row, ts) in &o.committed {
        assert_eq!(truth.get(row), Some(ts), "a committed row {row:?} is not in its outbox");
    }
    for row in &o.rolled_back {
        assert!(!truth.contains_key(row), "a rolled-back row {row:?} is in its outbox");
    }
    let clusters_written: BTreeSet<&str> = truth.keys().map(|(c, _)| c.as_str()).collect();
    assert_eq!(clusters_written.len(), 3, "every cluster's outbox has rows");
    let rolled_back = o.rolled_back.len();
    let unknown = o.unknown.len();
    let transactions = o.transactions;
    drop(o);
    let newest = truth.values().copied().max().unwrap();
    // R_f reaches every row once the writers have stopped; then both readers finish there.
    poll_until("R_f passes the newest row", Duration::from_secs(60), || {
        fleet_resolved(&oracle_t).filter(|&rf| rf >= newest)
    });
    *until.lock().unwrap() = Some(newest);
    poll_until("the relay passes the newest row", Duration::from_secs(60), || {
        (relay_cursor(&dir) >= newest).then_some(())
    });
    relay.kill().expect("stop the relay");
    let _ = relay.wait();
    let by_hand = by_hand.join().expect("the consumer panicked");

    assert_exactly_once_in_order("the relay", &relay_rows(&dir), &truth);
    assert_exactly_once_in_order("the consumer", &by_hand, &truth);
    let samples = samples.lock().unwrap().clone();
    assert!(samples.len() > 50, "R_f sampled {} times", samples.len());
    for w in samples.windows(2) {
        assert!(w[1].0 >= w[0].0, "R_f went down: {} then {}", w[0].0, w[1].0);
    }
    let mut lag: Vec<i64> = samples.iter().map(|&(rf, next)| (next >> 18) - (rf >> 18)).collect();
    lag.sort_unstable();
    println!(
        "fleet: {} rows committed in {transactions} transactions ({rolled_back} rolled back, {unknown} unknown); R_f behind a new value: p50 {} ms, p99 {} ms ({} samples); relay: {}",
        truth.len(),
        pct(&lag, 0.5),
        pct(&lag, 0.99),
        lag.len(),
        relay_progress.lock().unwrap()
    );

    // The relay's rate on a backlog: 30,000 more rows on each cluster, stamped from one batch
    // each, read by a new relay from the start to the newest row (`--until`).
    let mut newest = newest;
    for t in &targets {
        let mut c = t.connect().expect("connect");
        let rows = c
            .query(
                "INSERT INTO outbox (id, ts, writer, note) SELECT -1 - g, b + g, 0, 'backlog' \
                 FROM (SELECT tso_next_batch(30000) AS b) x, generate_series(0, 29999) g RETURNING id, ts",
                &[],
            )
            .expect("a backlog");
        for r in rows {
            truth.insert((t.name.clone(), r.get(0)), r.get(1));
            newest = newest.max(r.get(1));
        }
    }
    poll_until("R_f passes the backlog", Duration::from_secs(60), || {
        fleet_resolved(&oracle_t).filter(|&rf| rf >= newest)
    });
    let backlog = dir.join("backlog");
    std::fs::create_dir_all(&backlog).unwrap();
    let began = Instant::now();
    let status = Command::new(&bin)
        .arg("--oracle")
        .arg(&both_oracle_hosts)
        .args(
            relay_clusters.iter().flat_map(|(n, c)| ["--cluster".to_string(), format!("{n}={c}")]),
        )
        .arg("--output")
        .arg(backlog.join("out.jsonl"))
        .args(["--interval-ms", "10", "--until"])
        .arg(newest.to_string())
        .stderr(Stdio::null())
        .status()
        .expect("run the relay over the backlog");
    let took = began.elapsed();
    assert!(status.success(), "the relay over the backlog: {status}");
    assert_exactly_once_in_order("the relay over the backlog", &relay_rows(&backlog), &truth);
    println!(
        "relay over a backlog: {} rows in {:.2} s, {:.0} rows/s",
        truth.len(),
        took.as_secs_f64(),
        truth.len() as f64 / took.as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The row of `tso_fleet_status()` for the member of system identifier `id`:
/// (resolved, held_by_pid, holds_fleet).
fn status_of(oracle: &Node, id: i64) -> Option<(i64, Option<i32>, bool)> {
    oracle
        .connect()
        .query_opt(
            "SELECT resolved, held_by_pid, holds_fleet FROM tso_fleet_status() \
             WHERE system_id = $1 AND resolved IS NOT NULL",
            &[&id],
        )
        .unwrap()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
}

fn system_id(node: &Node) -> i64 {
    node.connect()
        .query_one("SELECT system_identifier FROM pg_control_system()", &[])
        .unwrap()
        .get(0)
}

#[test]
fn what_holds_the_fleet_is_named_and_a_silent_member_holds_it_until_removed() {
    let oracle = serving_node("rh-oracle", NodeOpts::new().setting("wal_level", "logical"));
    admit_members(&oracle);
    oracle
        .connect()
        .batch_execute("SELECT pg_create_logical_replication_slot('fleet', 'test_decoding')")
        .expect("a logical slot");
    let conninfo = oracle_conninfo(&[oracle.port()], MEMBER_ROLE);
    let m1 = member("rh-m1", &conninfo);
    let mut m2 = member("rh-m2", &conninfo);
    let (id1, id2) = (system_id(&m1), system_id(&m2));
    let mut o = oracle.connect();
    poll_until("R_f is published", Duration::from_secs(10), || {
        o.query_one("SELECT tso_fleet_resolved()", &[]).ok().map(|r| r.get::<_, i64>(0))
    });

    // An idle transaction on member 1 holds R_f; tso_fleet_status() names its process.
    let mut idle = m1.connect();
    idle.batch_execute("BEGIN").unwrap();
    let held: i64 = idle.query_one("SELECT tso_next()", &[]).unwrap().get(0);
    let pid: i32 = idle.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    for _ in 0..20 {
        let _: i64 = m2.connect().query_one("SELECT tso_next()", &[]).unwrap().get(0);
    }
    poll_until("tso_fleet_status() names the idle transaction", Duration::from_secs(10), || {
        status_of(&oracle, id1).filter(|&(_, by, holds)| by == Some(pid) && holds)
    });
    let rf: i64 = o.query_one("SELECT tso_fleet_resolved()", &[]).unwrap().get(0);
    assert!(rf < held, "R_f {rf} passed {held}, which an open transaction on member 1 holds");
    idle.batch_execute("COMMIT").unwrap();
    poll_until("R_f passes the committed value", Duration::from_secs(10), || {
        let rf: i64 = o.query_one("SELECT tso_fleet_resolved()", &[]).unwrap().get(0);
        (rf >= held).then_some(())
    });

    // Member 2 stops: it reports no more and holds R_f, however long; it is named.
    let (last, ..) = status_of(&oracle, id2).expect("member 2 is registered");
    m2.stop(StopMode::Immediate).expect("stop member 2");
    let ours: i64 = o.query_one("SELECT tso_next()", &[]).unwrap().get(0);
    thread::sleep(Duration::from_millis(1500));
    let (frozen, _, holds) = status_of(&oracle, id2).expect("member 2 is still registered");
    assert!(holds, "tso_fleet_status() names member 2 as what holds R_f");
    let rf: i64 = o.query_one("SELECT tso_fleet_resolved()", &[]).unwrap().get(0);
    assert!(rf <= frozen && frozen >= last, "R_f {rf} waits at member 2's last report {frozen}");
    assert!(rf < ours, "R_f {rf} stays below a value issued after member 2 stopped ({ours})");
    // Removed by a superuser (once its connection is gone), it holds R_f no more.
    poll_until("member 2 is removed", Duration::from_secs(15), || {
        match o.query_one("SELECT tso_fleet_remove($1)", &[&id2]) {
            Ok(r) => Some(r.get::<_, bool>(0)),
            Err(e) if e.code() == Some(&SqlState::OBJECT_IN_USE) => None,
            Err(e) => panic!("tso_fleet_remove: {}", pg_error_string(&e)),
        }
    });
    assert!(status_of(&oracle, id2).is_none(), "member 2 is gone from tso_fleet_status()");
    poll_until("R_f goes on without member 2", Duration::from_secs(10), || {
        let rf: i64 = o.query_one("SELECT tso_fleet_resolved()", &[]).unwrap().get(0);
        (rf >= ours).then_some(())
    });
    let remaining: i64 = o
        .query_one("SELECT count(*) FROM tsoracle.fleet_member WHERE removed_at IS NULL", &[])
        .unwrap()
        .get(0);
    assert_eq!(remaining, 1, "member 2's row is marked removed, member 1's kept");

    // Member 2 back: it stays out (a removal is deliberate) until a superuser re-admits it.
    m2.start().expect("start member 2 again");
    let refused = poll_until("member 2 is refused", Duration::from_secs(20), || {
        match m2.connect().query_one("SELECT tso_next()", &[]) {
            Ok(_) => panic!("a removed member was served"),
            Err(e) => {
                let text = pg_error_string(&e);
                text.contains("tso_fleet_admit").then_some(text)
            }
        }
    });
    assert!(refused.contains("57P03"), "{refused}");
    assert!(status_of(&oracle, id2).is_none(), "a removed member holds nothing");
    o.batch_execute("CREATE ROLE plain LOGIN").unwrap();
    expect_sqlstate(
        oracle.connect_as("plain").query("SELECT tso_fleet_admit($1)", &[&id2]),
        &SqlState::INSUFFICIENT_PRIVILEGE,
        "tso_fleet_admit as a plain role",
    );
    let admitted: bool = o.query_one("SELECT tso_fleet_admit($1)", &[&id2]).unwrap().get(0);
    assert!(admitted, "member 2 re-admitted");
    let again: bool = o.query_one("SELECT tso_fleet_admit($1)", &[&id2]).unwrap().get(0);
    assert!(!again, "a member not removed is not re-admitted");
    let served: i64 = poll_until("member 2 serves again", Duration::from_secs(30), || {
        m2.connect().query_one("SELECT tso_next()", &[]).ok().map(|r| r.get(0))
    });
    assert!(served > ours);
    poll_until("member 2 registered anew", Duration::from_secs(10), || {
        status_of(&oracle, id2).map(|_| ())
    });

    // R_f in the oracle's change stream: transactional messages, never decreasing, the
    // latest at or above what was read before.
    let rf: i64 = o.query_one("SELECT tso_fleet_resolved()", &[]).unwrap().get(0);
    let announced: Vec<i64> = o
        .query("SELECT data FROM pg_logical_slot_get_changes('fleet', NULL, NULL)", &[])
        .unwrap()
        .iter()
        .filter_map(|r| {
            let line: String = r.get(0);
            let rest =
                line.strip_prefix("message: transactional: 1 prefix: tsoracle.fleet_resolved, ")?;
            rest.split("content:").nth(1)?.trim().parse().ok()
        })
        .collect();
    assert!(announced.len() >= 3, "R_f announced {} times in the change stream", announced.len());
    assert!(announced.windows(2).all(|w| w[0] <= w[1]), "announced R_f went down: {announced:?}");
    assert!(*announced.last().unwrap() >= rf, "the stream carries R_f {rf}: {announced:?}");
}

#[test]
fn only_a_member_speaks_for_itself_and_only_a_superuser_removes_one() {
    let oracle = serving_node("rw-oracle", NodeOpts::new());
    admit_members(&oracle);
    let m = member("rw-m", &oracle_conninfo(&[oracle.port()], MEMBER_ROLE));
    let id = system_id(&m);
    let mut o = oracle.connect();
    o.batch_execute(
        "CREATE ROLE rogue LOGIN; GRANT tsoracle_member TO rogue; CREATE ROLE plain LOGIN",
    )
    .unwrap();
    poll_until("the member is registered", Duration::from_secs(10), || status_of(&oracle, id));
    let version: String = o
        .query_one("SELECT extversion FROM pg_extension WHERE extname = 'tsoracle'", &[])
        .unwrap()
        .get(0);

    // Another role cannot speak for the member (and so cannot raise its entry).
    let mut rogue = oracle.connect_as("rogue");
    expect_sqlstate(
        rogue.query("SELECT * FROM tsoracle.member_report($1, 0)", &[&i64::MAX]),
        &SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
        "a report without a hello",
    );
    expect_sqlstate(
        rogue.query("SELECT * FROM tsoracle.member_hello($1, $2, 0)", &[&id, &version]),
        &SqlState::INSUFFICIENT_PRIVILEGE,
        "a hello for another role's member",
    );
    // A role without tsoracle_member cannot report at all.
    expect_sqlstate(
        oracle.connect_as("plain").query("SELECT tsoracle.member_report(1, 0)", &[]),
        &SqlState::INSUFFICIENT_PRIVILEGE,
        "member_report without tsoracle_member",
    );
    // Only superusers remove, and not a member still connected.
    expect_sqlstate(
        oracle.connect_as("plain").query("SELECT tso_fleet_remove($1)", &[&id]),
        &SqlState::INSUFFICIENT_PRIVILEGE,
        "tso_fleet_remove as a plain role",
    );
    let e = expect_sqlstate(
        o.query("SELECT tso_fleet_remove($1)", &[&id]),
        &SqlState::OBJECT_IN_USE,
        "tso_fleet_remove of a connected member",
    );
    assert!(pg_error_string(&e).contains("gone for good"), "{}", pg_error_string(&e));
    let none: bool = o.query_one("SELECT tso_fleet_remove(12345)", &[]).unwrap().get(0);
    assert!(!none, "no such member");
    // Nobody writes the tables but the worker, not even a superuser.
    for sql in [
        "UPDATE tsoracle.fleet_member SET resolved = resolved + 1000000000",
        "DELETE FROM tsoracle.fleet_member",
        "UPDATE tsoracle.fleet_resolved SET ts = ts + 1000000000",
        "TRUNCATE tsoracle.fleet_member",
    ] {
        expect_sqlstate(o.batch_execute(sql), &SqlState::INSUFFICIENT_PRIVILEGE, sql);
    }
    // On a member, the fleet's R_f is the oracle's to tell.
    expect_sqlstate(
        m.connect().query_one("SELECT tso_fleet_resolved()", &[]),
        &SqlState::FEATURE_NOT_SUPPORTED,
        "tso_fleet_resolved() on a member",
    );
}

/// A member's worker that dies while a lease grant is in flight (its holder slot holds the
/// member's `R` below the grant's lowest stamp): the hold is released as it exits, so the
/// member's `R`, and the fleet's, move again once it is back.
#[test]
fn a_member_worker_that_dies_mid_grant_releases_its_hold() {
    let oracle = serving_node("fr-g-oracle", NodeOpts::new());
    admit_members(&oracle);
    let m = member("fr-g-m", &oracle_conninfo(&[oracle.port()], MEMBER_ROLE));
    let mut c = m.connect();
    let _: i64 = c.query_one("SELECT tso_next()", &[]).unwrap().get(0);
    // The oracle's worker paused: the member's grant stays in flight.
    let oracle_worker = oracle.worker_pid();
    oracle.pause_pid(oracle_worker, true);
    let conninfo = m.conninfo();
    let grant = thread::spawn(move || {
        let mut c = Client::connect(&conninfo, NoTls).expect("connect");
        c.query_one("SELECT lease_id FROM tso_lease_acquire('mid-grant', 1, 5000)", &[]).err()
    });
    thread::sleep(Duration::from_millis(800));
    let terminated: bool = c
        .query_one("SELECT pg_terminate_backend($1)", &[&m.worker_pid()])
        .expect("terminate the member's worker")
        .get(0);
    assert!(terminated);
    oracle.pause_pid(oracle_worker, false);
    let failed = grant.join().expect("the grant's client");
    assert!(failed.is_some(), "the grant in flight when the worker died was not answered");
    let after: i64 = poll_until("the member serves again", Duration::from_secs(30), || {
        c.query_one("SELECT tso_next()", &[]).ok().map(|r| r.get(0))
    });
    poll_until("the member's R moves past the worker's hold", Duration::from_secs(20), || {
        let _: i64 = c.query_one("SELECT tso_next()", &[]).unwrap().get(0);
        let r: i64 = c.query_one("SELECT tso_resolved()", &[]).unwrap().get(0);
        (r >= after).then_some(())
    });
}

/// The relay pointed at a standby of a member whose replay is paused: rows the member
/// committed are not there yet, but `R_f` passes them. The relay refuses the standby (it reads
/// primaries only), so its cursor never passes a row it has not emitted.
#[test]
fn the_relay_never_passes_a_row_a_standby_has_not_replayed() {
    let oracle = serving_node("fr-s-oracle", NodeOpts::new());
    admit_members(&oracle);
    let m = member("fr-s-m", &oracle_conninfo(&[oracle.port()], MEMBER_ROLE));
    let mut c = m.connect();
    c.batch_execute(OUTBOX).expect("the outbox");
    let mut standby = Node::base_backup_from(&m, "fr-s-standby").expect("pg_basebackup");
    standby.start().expect("start the member's standby");
    tsoracle_tests::cluster::wait_replayed(&m, &standby).expect("replayed");
    standby.connect().batch_execute("SELECT pg_wal_replay_pause()").expect("pause replay");
    for id in 0..20i64 {
        c.execute("INSERT INTO outbox (id, writer) VALUES ($1, 0)", &[&id]).expect("a row");
    }
    let last: i64 = c.query_one("SELECT max(ts) FROM outbox", &[]).unwrap().get(0);
    // R_f passes the rows: the fleet's reads would be complete on the member.
    poll_until("R_f passes the rows", Duration::from_secs(20), || {
        let _: i64 = c.query_one("SELECT tso_next()", &[]).unwrap().get(0);
        let rf: i64 =
            oracle.connect().query_one("SELECT tso_fleet_resolved()", &[]).unwrap().get(0);
        (rf > last).then_some(())
    });

    let dir = std::env::temp_dir().join(format!("tsoracle-relay-standby-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("the relay's directory");
    let mut relay = start_relay(
        &relay_binary(),
        &dir,
        &oracle.conninfo(),
        &[("m".to_string(), standby.conninfo())],
    );
    let said = Arc::new(Mutex::new(String::new()));
    if let Some(err) = relay.stderr.take() {
        let keep = said.clone();
        thread::spawn(move || {
            for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                keep.lock().unwrap().push_str(&line);
            }
        });
    }
    poll_until("the relay says why it reads nothing", Duration::from_secs(20), || {
        said.lock().unwrap().contains("is a standby").then_some(())
    });
    thread::sleep(Duration::from_secs(1));
    let _ = relay.kill();
    let _ = relay.wait();
    let cursor = relay_cursor(&dir);
    let emitted = std::fs::read_to_string(dir.join("out.jsonl")).unwrap_or_default();
    let mut missed = Vec::new();
    for row in c.query("SELECT id, ts FROM outbox ORDER BY id", &[]).unwrap() {
        let (id, ts): (i64, i64) = (row.get(0), row.get(1));
        if ts <= cursor && !emitted.contains(&format!("\"id\":{id},")) {
            missed.push(id);
        }
    }
    assert!(
        missed.is_empty(),
        "the relay's cursor {cursor} passed rows it never emitted: {missed:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A clone of a member (`pg_basebackup`, promoted) beside its live original, which holds a
/// timestamp in an open transaction: the clone shares the original's identity, so the oracle
/// refuses it while the original's session reports; then the clone takes an identity of its
/// own (`tsoracle.member_identity`) and is served under an entry of its own. The original keeps
/// its entry, and the fleet's `R_f` stays below the value the original holds.
#[test]
fn a_clone_beside_its_live_original_gets_an_entry_of_its_own_and_r_f_waits_for_both() {
    let oracle = serving_node("fr-c-oracle", NodeOpts::new());
    admit_members(&oracle);
    let m = member("fr-c-m", &oracle_conninfo(&[oracle.port()], MEMBER_ROLE));
    let original = system_id(&m);
    let mut holder = m.connect();
    holder.batch_execute("BEGIN").unwrap();
    let held: i64 = holder.query_one("SELECT tso_next()", &[]).unwrap().get(0);
    let mut clone = Node::base_backup_from(&m, "fr-c-clone").expect("pg_basebackup of the member");
    clone.start().expect("start the clone");
    assert_eq!(system_id(&clone), original, "a clone has its original's system identifier");
    promote(&clone).expect("promote the clone");
    let mut o = oracle.connect();
    // Its identity of its own is no member a superuser admitted: refused 42501 until one does.
    let identity = "SELECT member_id FROM tsoracle.member_identity";
    let own: i64 =
        poll_until("the clone takes an identity of its own", Duration::from_secs(60), || {
            let id: i64 = clone.connect().query_one(identity, &[]).ok()?.get(0);
            (id != original).then_some(id)
        });
    let e = poll_until("the clone refused, not admitted", Duration::from_secs(30), || match clone
        .connect()
        .query_one("SELECT tso_next()", &[])
    {
        Ok(_) => panic!("a clone served before it was admitted"),
        Err(e) => (e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE)).then_some(e),
    });
    let hint = e.as_db_error().and_then(|d| d.hint()).unwrap_or_default().to_string();
    assert!(hint.contains(&format!("tso_fleet_admit({own}, '{MEMBER_ROLE}')")), "HINT {hint}");
    o.query_one("SELECT tso_fleet_admit($1, $2)", &[&own, &MEMBER_ROLE]).unwrap();
    let served: i64 = poll_until("the clone is served", Duration::from_secs(60), || {
        clone.connect().query_one("SELECT tso_next()", &[]).ok().map(|r| r.get(0))
    });
    assert!(served > held);
    let log = clone.log_contents();
    assert!(
        log.contains("connected already") && log.contains("55006"),
        "the oracle refused the clone's first hello as in use: {}",
        clone.log_tail(30)
    );
    let kept: i64 = m.connect().query_one(identity, &[]).unwrap().get(0);
    assert_eq!(kept, original, "the original keeps its identity");
    let ids: Vec<i64> = o
        .query("SELECT system_id FROM tso_fleet_status() ORDER BY system_id", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut want = vec![original, own];
    want.sort();
    assert_eq!(ids, want, "two entries: the original's and the clone's");
    for _ in 0..15 {
        let _: i64 = clone.connect().query_one("SELECT tso_next()", &[]).unwrap().get(0);
        let rf: i64 = o.query_one("SELECT tso_fleet_resolved()", &[]).unwrap().get(0);
        assert!(rf < held, "R_f {rf} passed {held}, which the original still holds");
        thread::sleep(Duration::from_millis(200));
    }
    holder.batch_execute("COMMIT").unwrap();
    poll_until("R_f passes the value once it is committed", Duration::from_secs(20), || {
        let _: i64 = m.connect().query_one("SELECT tso_next()", &[]).unwrap().get(0);
        let _: i64 = clone.connect().query_one("SELECT tso_next()", &[]).unwrap().get(0);
        let rf: i64 = o.query_one("SELECT tso_fleet_resolved()", &[]).unwrap().get(0);
        (rf >= held).then_some(())
    });
}

/// A member's failover: its standby, promoted once the old primary is gone, keeps the member's
/// identity and so its entry on the oracle (one entry), registered on the new timeline.
#[test]
fn a_members_promoted_standby_keeps_its_entry() {
    let oracle = serving_node("fr-f-oracle", NodeOpts::new());
    admit_members(&oracle);
    let mut m = member("fr-f-m", &oracle_conninfo(&[oracle.port()], MEMBER_ROLE));
    let id = system_id(&m);
    let before: i64 = m.connect().query_one("SELECT tso_next()", &[]).unwrap().get(0);
    let identity = |n: &Node| -> (i64, i64) {
        let r = n
            .connect()
            .query_one("SELECT member_id, timeline FROM tsoracle.member_identity", &[])
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(identity(&m), (id, 1), "registered under its system identifier");
    let mut standby = Node::base_backup_from(&m, "fr-f-standby").expect("pg_basebackup");
    standby.start().expect("start the standby");
    tsoracle_tests::cluster::wait_replayed(&m, &standby).expect("replayed");
    m.stop(StopMode::Immediate).expect("the member's primary is gone");
    promote(&standby).expect("promote the member's standby");
    let after: i64 = poll_until("the promoted standby is served", Duration::from_secs(60), || {
        standby.connect().query_one("SELECT tso_next()", &[]).ok().map(|r| r.get(0))
    });
    assert!(after > before);
    let ids: Vec<i64> = oracle
        .connect()
        .query("SELECT system_id FROM tso_fleet_status()", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ids, vec![id], "one entry, the member's");
    assert_eq!(identity(&standby), (id, 2), "the same identity, on the new timeline");
}

/// A lease taken through a member holds the member's `R` below its lowest stamp until it is
/// released, across a restart of the member and a restart of its worker alone: the member
/// keeps it in `tsoracle.member_lease` and reloads it before it serves.
#[test]
fn a_lease_through_a_member_holds_its_r_across_restarts() {
    let oracle = serving_node("fr-l-oracle", NodeOpts::new());
    admit_members(&oracle);
    let mut m = member("fr-l-m", &oracle_conninfo(&[oracle.port()], MEMBER_ROLE));
    let mut c = m.connect();
    let row = c
        .query_one(
            "SELECT lease_id, ts_lower_bound FROM tso_lease_acquire_bounds('h', 1, 60000)",
            &[],
        )
        .expect("a lease through the member");
    let (lease, lower): (i64, i64) = (row.get(0), row.get(1));
    let held = |c: &mut Client, what: &str| {
        for _ in 0..8 {
            let _: i64 = c.query_one("SELECT tso_next()", &[]).unwrap().get(0);
            let r: i64 = c.query_one("SELECT tso_resolved()", &[]).unwrap().get(0);
            assert!(
                r >> 18 < lower,
                "{what}: R {r} (ms {}) passed the lease's lowest stamp {lower}",
                r >> 18
            );
            thread::sleep(Duration::from_millis(250));
        }
    };
    let serving = |m: &Node| -> Client {
        poll_until("the member serves", Duration::from_secs(30), || {
            let mut c = m.connect();
            c.query_one("SELECT tso_next()", &[]).ok().map(|_| c)
        })
    };
    held(&mut c, "before any restart");
    drop(c);
    m.restart(StopMode::Fast).expect("restart the member");
    let mut c = serving(&m);
    held(&mut c, "after the member restarted");
    let _: bool =
        c.query_one("SELECT pg_terminate_backend($1)", &[&m.worker_pid()]).unwrap().get(0);
    thread::sleep(Duration::from_millis(500));
    let mut c = serving(&m);
    held(&mut c, "after the member's worker restarted");
    let kept: i64 = c
        .query_one("SELECT count(*) FROM tsoracle.member_lease WHERE lease_id = $1", &[&lease])
        .unwrap()
        .get(0);
    assert!(kept >= 1, "the member keeps the lease");
    // Renewed and read through the member too (each kind of the member's statements runs on
    // the oracle session its hello named: src/worker/member/calls.rs).
    let upper: i64 = c
        .query_one("SELECT ts_upper_bound FROM tso_lease_renew($1)", &[&lease])
        .expect("renew the lease through the member")
        .get(0);
    assert!(upper >= lower, "renewed up to {upper}, below its lowest stamp {lower}");
    let frontier: i64 =
        c.query_one("SELECT tso_safe_frontier()", &[]).expect("the safe frontier").get(0);
    assert!(frontier > 0, "the safe frontier through the member: {frontier}");
    c.query_one("SELECT tso_lease_release($1)", &[&lease]).expect("release the lease");
    poll_until("R passes the lease's lowest stamp once released", Duration::from_secs(20), || {
        let _: i64 = c.query_one("SELECT tso_next()", &[]).unwrap().get(0);
        let r: i64 = c.query_one("SELECT tso_resolved()", &[]).unwrap().get(0);
        (r >> 18 >= lower).then_some(())
    });
}
