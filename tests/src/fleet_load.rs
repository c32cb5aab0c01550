//! A fleet under load across upgrades (tests/tests/upgrade_fleet.rs, `pg_upgrade`;
//! tests/tests/upgrade_rolling.rs, a new minor version one cluster at a time): timestamps and
//! blocks taken through the members, `R_f` watched on the oracle, and the checks at the end;
//! a member's held values against `R_f` ([`HoldWatch`], tests/tests/fleet.rs's lossy link).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use postgres::Client;

use crate::load::{SeqLoad, SeqLoadOptions};
use crate::{
    ops, pg_error_string, poll_until, DenseHistory, Endpoint, History, Load, LoadOptions, Node,
};

/// The counters the members' block load takes from.
pub const KEYS: [&str; 2] = ["invoice", "order"];

pub fn system_identifier(c: &mut Client) -> i64 {
    c.query_one("SELECT system_identifier FROM pg_control_system()", &[])
        .unwrap_or_else(|e| panic!("pg_control_system(): {}", pg_error_string(&e)))
        .get(0)
}

/// `R_f` on the oracle; `None` while it has none to publish (`57P03`: an upgraded oracle
/// before its members report again), never a lower one.
pub fn fleet_resolved(c: &mut Client) -> Option<i64> {
    match c.query_one("SELECT tso_fleet_resolved()", &[]) {
        Ok(row) => Some(row.get(0)),
        Err(e) if e.code().map(|s| s.code()) == Some("57P03") => None,
        Err(e) => panic!("tso_fleet_resolved(): {}", pg_error_string(&e)),
    }
}

/// The identities the oracle lists as registered members.
pub fn members_listed(c: &mut Client) -> BTreeSet<i64> {
    c.query("SELECT system_id FROM tso_fleet_status() WHERE resolved IS NOT NULL", &[])
        .unwrap_or_else(|e| panic!("tso_fleet_status(): {}", pg_error_string(&e)))
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// `R_f` read every 100 ms at `conninfo` (the oracle's address, the upgraded oracle's too)
/// until stopped: every value read, in order.
pub struct ResolvedWatch {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<i64>>,
}

impl ResolvedWatch {
    pub fn start(conninfo: String) -> ResolvedWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut client = None;
            while !stopped.load(Ordering::SeqCst) {
                if client.is_none() {
                    client = postgres::Client::connect(&conninfo, postgres::NoTls).ok();
                }
                if let Some(c) = client.as_mut() {
                    match c.query_one("SELECT tso_fleet_resolved()", &[]) {
                        Ok(row) => seen.push(row.get::<_, i64>(0)),
                        Err(e) if e.is_closed() || e.code().is_none() => client = None,
                        Err(_) => {}
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            seen
        });
        ResolvedWatch { stop, thread }
    }

    /// Stop; `R_f` never went down, and was read at least `min` times.
    pub fn check(self, min: usize) {
        self.stop.store(true, Ordering::SeqCst);
        let seen = self.thread.join().expect("the R_f watch");
        assert!(seen.len() >= min, "R_f read {} times", seen.len());
        for w in seen.windows(2) {
            assert!(w[1] >= w[0], "R_f went down from {} to {}", w[0], w[1]);
        }
        eprintln!("R_f read {} times, never lower", seen.len());
    }
}

/// `R_f` on `oracle` rises above `above` (every member's entry moves on).
pub fn wait_resolved_above(oracle: &Node, above: i64, what: &str) -> i64 {
    poll_until(what, Duration::from_secs(60), || {
        fleet_resolved(&mut oracle.connect()).filter(|&r| r > above)
    })
}

/// Timestamps and blocks on each member, into `history` and `dense`.
pub fn load_members(
    members: &[&Node],
    history: &History,
    dense: &DenseHistory,
) -> (Vec<Load>, Vec<SeqLoad>) {
    let run = Duration::from_secs(500);
    let mut loads = Vec::new();
    let mut seqs = Vec::new();
    for m in members {
        m.connect()
            .batch_execute("CREATE ROLE app LOGIN; GRANT tsoracle_seq_user TO app")
            .expect("app role");
        let endpoint = Endpoint::fixed(m.name(), &m.conninfo());
        loads.push(Load::start(
            vec![endpoint],
            LoadOptions::new(4, run),
            ops::mixed(20),
            history.clone(),
        ));
        seqs.push(SeqLoad::start(
            Endpoint::fixed(m.name(), &m.conninfo_for("app", "postgres")),
            SeqLoadOptions::new(2, run, &KEYS),
            dense.clone(),
        ));
    }
    (loads, seqs)
}

/// Stop the loads; every history unique and in order, every block below the oracle's counters.
pub fn check_histories(
    loads: Vec<Load>,
    seqs: Vec<SeqLoad>,
    history: &History,
    dense: &DenseHistory,
    oracle: &Node,
) {
    for l in loads {
        l.stop_and_join();
    }
    for s in seqs {
        s.stop_and_join();
    }
    history.assert_valid();
    let mut c = oracle.connect();
    let totals: BTreeMap<String, i64> = KEYS
        .iter()
        .map(|k| {
            let v: Option<i64> = c.query_one("SELECT tso_seq_peek($1)", &[k]).unwrap().get(0);
            (k.to_string(), v.unwrap_or(0))
        })
        .collect();
    let blocks = dense.check(Some(&totals)).unwrap_or_else(|v| panic!("blocks: {v}"));
    for key in KEYS {
        assert!(blocks.keys[key].ok_calls > 0, "{key}: no block granted");
    }
}

/// A transaction on a member that holds a timestamp while `R_f` is read on the oracle, again
/// and again until stopped (docs/fleet.md, "Reading a fleet in order"): `R_f` must stay below
/// every value a transaction still holds, and below every value handed out after it was read.
pub struct HoldWatch {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<HoldSeen>,
}

#[derive(Default)]
struct HoldSeen {
    /// `R_f` read while a value was held: (held, R_f).
    held: Vec<(i64, i64)>,
    /// `R_f` as read, and the instant its read had ended.
    reads: Vec<(std::time::Instant, i64)>,
}

impl HoldWatch {
    /// Hold on `member` (a connection string), read `R_f` at `oracle`.
    pub fn start(member: String, oracle: String) -> HoldWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut seen = HoldSeen::default();
            let (mut m, mut o): (Option<Client>, Option<Client>) = (None, None);
            while !stopped.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
                let (Some(mc), Some(oc)) = (m.as_mut(), o.as_mut()) else {
                    m = m.or_else(|| Client::connect(&member, postgres::NoTls).ok());
                    o = o.or_else(|| Client::connect(&oracle, postgres::NoTls).ok());
                    continue;
                };
                let held = mc
                    .batch_execute("BEGIN")
                    .and_then(|()| mc.query_one("SELECT tso_next()", &[]))
                    .map(|r| r.get::<_, i64>(0));
                let Ok(held) = held else {
                    // The member could not serve (the link is down): try again.
                    if mc.batch_execute("ROLLBACK").is_err() {
                        m = None;
                    }
                    continue;
                };
                // Held for 400 ms: longer than a report of the member's R and its publication
                // in R_f take (tsoracle.resolved_interval_ms, 100 ms, each).
                for _ in 0..8 {
                    match oc.query_one("SELECT tso_fleet_resolved()", &[]) {
                        Ok(r) => {
                            let rf: i64 = r.get(0);
                            seen.held.push((held, rf));
                            seen.reads.push((std::time::Instant::now(), rf));
                        }
                        Err(_) => {
                            o = None;
                            break;
                        }
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                if mc.batch_execute("COMMIT").is_err() {
                    m = None;
                }
            }
            seen
        });
        HoldWatch { stop, thread }
    }

    /// Stop. `R_f` was read at least `min` times while a value was held, and was below it
    /// every time; every call on `node` in `history` that began after a read of `R_f` got
    /// values above it.
    pub fn check(self, min: usize, history: &History, node: &str) {
        self.stop.store(true, Ordering::SeqCst);
        let seen = self.thread.join().expect("the hold watch");
        assert!(
            seen.held.len() >= min,
            "R_f read {} times while a value was held",
            seen.held.len()
        );
        for &(held, rf) in &seen.held {
            assert!(rf < held, "R_f {rf} passed {held}, which a transaction on the member held");
        }
        // The calls by start; the lowest first value among those that began at or after each.
        let mut calls: Vec<(std::time::Instant, i64)> = history.with_calls(|c| {
            c.iter()
                .filter(|c| c.node == node)
                .filter_map(|c| Some((c.start, c.first()?)))
                .collect()
        });
        calls.sort();
        let mut lowest_after = vec![i64::MAX; calls.len() + 1];
        for i in (0..calls.len()).rev() {
            lowest_after[i] = lowest_after[i + 1].min(calls[i].1);
        }
        for &(at, rf) in &seen.reads {
            let i = calls.partition_point(|&(start, _)| start <= at);
            assert!(
                lowest_after[i] > rf,
                "R_f {rf} was read before a call on {node} began that got {}",
                lowest_after[i]
            );
        }
        eprintln!(
            "R_f read {} times while a value was held, below it; {} reads before later calls",
            seen.held.len(),
            seen.reads.len()
        );
    }
}
