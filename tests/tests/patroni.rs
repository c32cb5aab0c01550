//! High availability under Patroni, with a real Patroni 3.0.2 and etcd (Debian's packages):
//! three PostgreSQL 15 members on loopback ports, `synchronous_mode: true`,
//! `use_pg_rewind: true`, tsoracle preloaded through Patroni's configuration
//! ([`tsoracle_tests::patroni`]).
//!
//! One cluster lives through four failovers in a row, each under a load of 16 sessions
//! (`tso_next()`, `tso_next_batch(k)`, `tso_seq(key, k)`) and a lease holder, all reaching the
//! leader the way applications do: by the multi-host connection string with
//! `target_session_attrs=read-write`. Every call is recorded with the member and timeline
//! (the leadership term) that answered it. After each scenario the load stops and everything
//! recorded since the cluster started is checked: timestamps unique and in real-time order,
//! `tso_seq` blocks tiling `[0, tso_seq_peek)` per key, lease bounds never below a timestamp
//! returned before the grant and always below every timestamp another term served after it.
//!
//! 1. `patronictl switchover` from the leader to its synchronous standby.
//! 2. The leader's node dies: `kill -9` of its Patroni and of its postmaster and all its
//!    children. The synchronous standby takes over once the leader key expires (`ttl`).
//!    The dead member is started again and rejoins.
//! 3. The leader's node freezes: SIGSTOP of its Patroni, its postmaster and all its children,
//!    with 4 more sessions connected directly to it. A new leader is elected; a second load
//!    reaches it. After more than `ttl`, the old node's PostgreSQL wakes (SIGCONT), with its
//!    clients still connected and calling, and its Patroni 3 s later. Nothing the old node
//!    returns is below what the new leader returned before (the real-time order check over the
//!    one history of both nodes), and it serves nothing at all once awake: it issues only until
//!    `tsoracle.window_ahead_ms` after the start of its last commit its synchronous standby
//!    acknowledged, long past (docs/operations/patroni.md).
//! 4. The old leader of scenario 3 rejoins as a standby through `pg_rewind`; the third member
//!    is stopped, so the old leader becomes the synchronous standby, and the leader is killed
//!    again: the failover goes back to it.
//!
//! Each scenario prints one line `patroni-figures: scenario=... ops=... violations=0
//! fault_to_first_ts_ms=...`: `ops` counts every recorded call checked so far (timestamps,
//! sequence calls, lease calls, errors included), `scenario_ops` those of this scenario, and
//! `fault_to_first_ts_ms` the time from the fault (the switchover command, the kill, the
//! freeze) to the end of the first call the new leader answered with a timestamp.
//!
//! `a_member_follows_its_oracle_through_a_patroni_switchover`: a member of a fleet
//! (docs/fleet.md) whose oracle is a two-member Patroni cluster, its `tsoracle.oracle` the
//! multi-host connection string; under load on the member and on the oracle, a `patronictl
//! switchover`: the member finds the new leader, and one history of both is in one order.
//!
//! `strict_mode_requires_a_synchronous_standby` tests `tsoracle.require_synchronous_standby`
//! on a plain primary and standby (no Patroni): what Patroni's non-strict synchronous mode
//! does when the standby goes (clear `synchronous_standby_names`) must stop tsoracle from
//! granting anything.
//!
//! Run with: `cargo test -p tsoracle-tests --test patroni -- --test-threads=1`

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::{Client, NoTls};
use tsoracle_tests::cluster::make_sync;
use tsoracle_tests::load::{SeqLoad, SeqLoadOptions};
use tsoracle_tests::patroni::{
    check_leases, connect_read_write, label_member, render_config, session_label, LeaseHolder,
    LeaseLog, MemberConfig, PatroniCluster, PatroniLoad, PatroniLoadOptions, PatroniOpts, Target,
    HOST_CONNECT_TIMEOUT,
};
use tsoracle_tests::seqlease::alter_system;
use tsoracle_tests::tso::{status, tso_next};
use tsoracle_tests::{
    ops, pg_error_string, physical, poll_until, serving_node, DenseHistory, History, Load,
    LoadOptions, Node, NodeOpts, StopMode,
};

const KEYS: [&str; 3] = ["k0", "k1", "k2"];
/// Keys taken through a member: its role's own (keys belong to the role that created them).
const MEMBER_KEYS: [&str; 2] = ["m0", "m1"];
/// TTL of the test's leases (the shortest `tsoracle.lease_ttl_min_ms` accepts by default).
const LEASE_TTL_MS: i32 = 5000;
/// Successful timestamp calls wanted on a leader before a fault and after a failover.
const PROGRESS: usize = 300;

// ------------------------------------------------------------------------------- helpers

/// Everything recorded during the run.
struct Recorded {
    ts: History,
    dense: DenseHistory,
    leases: LeaseLog,
}

impl Recorded {
    fn ops(&self) -> usize {
        self.ts.len() + self.dense.len() + self.leases.len()
    }

    fn ops_since(&self, t: Instant) -> usize {
        self.ts.calls().iter().filter(|c| c.start >= t).count()
            + self.dense.calls().iter().filter(|c| c.start >= t).count()
            + self.leases.calls().iter().filter(|g| g.start >= t).count()
    }
}

/// The 16-session load and a lease holder, both through the multi-host target.
struct Running {
    load: PatroniLoad,
    holder: LeaseHolder,
}

fn start_load(cluster: &PatroniCluster, rec: &Recorded, holder: &str) -> Running {
    let target = Target::Leader(cluster.hosts());
    Running {
        load: PatroniLoad::start(target.clone(), load_opts(16), &rec.ts, &rec.dense),
        holder: LeaseHolder::start(
            target,
            holder,
            LEASE_TTL_MS,
            Duration::from_millis(500),
            &rec.leases,
        ),
    }
}

fn load_opts(threads: usize) -> PatroniLoadOptions {
    PatroniLoadOptions {
        threads,
        seq_keys: KEYS.iter().map(|k| k.to_string()).collect(),
        ..Default::default()
    }
}

impl Running {
    fn stop(self, what: &str) {
        let stats = self.load.stop_and_join();
        self.holder.stop_and_join();
        eprintln!("{what}: load {stats:?}");
    }
}

/// Wait until `n` successful timestamp calls that started at or after `since` were answered
/// by member `member`; returns the label (`member/tlT`) of the term that answered them.
#[track_caller]
fn wait_served_by(rec: &Recorded, member: &str, since: Instant, n: usize, what: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let mut per_label: BTreeMap<String, usize> = BTreeMap::new();
        for c in rec.ts.calls() {
            if c.is_ok() && c.start >= since && label_member(&c.node) == member {
                *per_label.entry(c.node.clone()).or_default() += 1;
            }
        }
        if let Some((label, _)) = per_label.iter().find(|(_, &k)| k >= n) {
            return label.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{what}: fewer than {n} successful timestamp calls on {member} in 90 s: {per_label:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Wait until the lease holder got a grant from term `label`.
#[track_caller]
fn wait_lease_from(rec: &Recorded, label: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !rec.leases.calls().iter().any(|g| g.node == label && g.result.is_ok()) {
        assert!(Instant::now() < deadline, "{what}: no lease granted by {label} in 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Wait until some `tso_seq` call on term `label` succeeded.
#[track_caller]
fn wait_seq_from(rec: &Recorded, label: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !rec.dense.calls().iter().any(|c| c.node == label && c.result.is_ok()) {
        assert!(Instant::now() < deadline, "{what}: no tso_seq succeeded on {label} in 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The end of the first successful timestamp call answered by term `label`.
fn first_ts_end(rec: &Recorded, label: &str) -> Option<Instant> {
    rec.ts.calls().iter().filter(|c| c.is_ok() && c.node == label).map(|c| c.end).min()
}

/// `tso_seq_peek` of every key, on the leader.
fn seq_totals(cluster: &PatroniCluster) -> BTreeMap<String, i64> {
    seq_totals_of(cluster, &KEYS)
}

/// `tso_seq_peek` of `keys`, on the leader.
fn seq_totals_of(cluster: &PatroniCluster, keys: &[&str]) -> BTreeMap<String, i64> {
    // Retried (bounded): one connect may take over its 2 s on a box this busy.
    let mut c = poll_until("a session on the leader", Duration::from_secs(30), || {
        connect_read_write(&cluster.hosts(), HOST_CONNECT_TIMEOUT, 30_000).ok()
    });
    keys.iter()
        .map(|k| {
            let v: Option<i64> = c
                .query_one("SELECT tso_seq_peek($1)", &[k])
                .and_then(|r| r.try_get(0))
                .unwrap_or_else(|e| panic!("tso_seq_peek({k}): {}", pg_error_string(&e)));
            (k.to_string(), v.unwrap_or(0))
        })
        .collect()
}

/// Check everything recorded so far (the load must be stopped) and print the scenario's
/// figures.
fn check_and_report(
    cluster: &PatroniCluster,
    rec: &Recorded,
    scenario: &str,
    began: Instant,
    fault: Instant,
    new_label: &str,
) {
    let totals = seq_totals(cluster);
    let tr = rec
        .ts
        .check()
        .unwrap_or_else(|v| panic!("{scenario}: timestamp history check failed: {v}"));
    let dr = rec
        .dense
        .check(Some(&totals))
        .unwrap_or_else(|v| panic!("{scenario}: tso_seq history check failed: {v}"));
    let lr = check_leases(&rec.ts, &rec.leases)
        .unwrap_or_else(|v| panic!("{scenario}: lease check failed: {v}"));
    let first = first_ts_end(rec, new_label).expect("the new leader served timestamps");
    let fault_to_first = first.saturating_duration_since(fault);
    eprintln!(
        "{scenario}: timestamps {} calls ({} ok), values per term {:?}",
        tr.calls, tr.ok_calls, tr.per_node
    );
    for (k, kr) in &dr.keys {
        eprintln!(
            "{scenario}: tso_seq {k}: total {}, {} ok blocks, {} errored calls, gaps {:?}",
            kr.total, kr.ok_calls, kr.err_calls, kr.gaps
        );
    }
    eprintln!(
        "{scenario}: leases: {} grants ({} acquires, {} renewals) by terms {:?}, {} errored calls, {} cross-term comparisons",
        lr.ok_grants, lr.acquires, lr.renewals, lr.terms, lr.err_grants, lr.cross_term_pairs
    );
    figures(&format!(
        "patroni-figures: scenario={scenario} ops={} scenario_ops={} ts_calls={} seq_calls={} lease_calls={} violations=0 \
         fault_to_first_ts_ms={:.0} new_leader={new_label}",
        rec.ops(),
        rec.ops_since(began),
        rec.ts.len(),
        rec.dense.len(),
        rec.leases.len(),
        fault_to_first.as_secs_f64() * 1e3,
    ));
}

/// Write a figures line straight to the test's stderr: unlike `println!`/`eprintln!`, not
/// captured by the test harness, so it shows in every run (with or without `--nocapture`).
fn figures(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// `promotion_to_first_ts_ms` and epoch of the leader, for the log.
fn leader_status_line(cluster: &PatroniCluster) -> String {
    match connect_read_write(&cluster.hosts(), HOST_CONNECT_TIMEOUT, 10_000) {
        Ok(mut c) => {
            let p2f: Option<i64> = c
                .query_one("SELECT promotion_to_first_ts_ms FROM tso_status()", &[])
                .and_then(|r| r.try_get(0))
                .unwrap_or(None);
            match status(&mut c) {
                Ok(st) => format!(
                    "epoch {:?} timeline {:?} sync_replication {:?} promotion_to_first_ts_ms {p2f:?}",
                    st.epoch, st.timeline, st.sync_replication
                ),
                Err(e) => pg_error_string(&e),
            }
        }
        Err(e) => e.to_string(),
    }
}

// ---------------------------------------------------------------------------------------- 1-4

/// The four scenarios on one cluster (see the module documentation).
#[test]
fn failovers_under_patroni() {
    let t_all = Instant::now();
    let opts = PatroniOpts::default();
    let ttl = Duration::from_secs(opts.ttl as u64);
    let mut cluster = PatroniCluster::start("ha", opts)
        .unwrap_or_else(|e| panic!("start the Patroni cluster: {e}"));
    eprintln!("cluster up in {:.1} s: {}", t_all.elapsed().as_secs_f64(), cluster.describe());

    // The postgres crate's own multi-host support finds the leader.
    let mut c = Client::connect(&cluster.conninfo(), NoTls).unwrap_or_else(|e| {
        panic!("multi-host connect ({}): {}", cluster.conninfo(), pg_error_string(&e))
    });
    let label = session_label(&mut c, &cluster.hosts()).expect("session label");
    assert_eq!(label, "pg1/tl1", "the multi-host connection string reaches the bootstrap leader");
    let st = status(&mut c).expect("tso_status()");
    assert_eq!(
        (st.state.as_str(), st.sync_replication),
        ("serving", Some(true)),
        "Patroni's synchronous_mode: {st:?}"
    );
    let window: String = c.query_one("SHOW tsoracle.window_ahead_ms", &[]).expect("SHOW").get(0);
    let ha_ttl: String = c.query_one("SHOW tsoracle.ha_ttl_ms", &[]).expect("SHOW").get(0);
    assert_eq!(
        (window.as_str(), ha_ttl.as_str()),
        ("1s", "16s"),
        "tsoracle.* settings come from Patroni's bootstrap.dcs"
    );
    drop(c);

    let rec = Recorded { ts: History::new(), dense: DenseHistory::new(), leases: LeaseLog::new() };

    // ------------------------------------------------------------------ 1: switchover
    let leader = 0;
    let sync =
        cluster.wait_sync(leader, None, Duration::from_secs(60)).expect("a synchronous standby");
    let began = Instant::now();
    let running = start_load(&cluster, &rec, "holder-1");
    let old_label =
        wait_served_by(&rec, &cluster.member(leader).name, began, PROGRESS, "switchover: before");
    wait_lease_from(&rec, &old_label, "switchover: before");
    let fault = Instant::now();
    let out =
        cluster.switchover(leader, sync).unwrap_or_else(|e| panic!("patronictl switchover: {e}"));
    eprintln!("switchover: patronictl said: {}", out.trim());
    let new = cluster.wait_leader(&[leader], Duration::from_secs(60)).expect("a new leader");
    assert_eq!(new, sync, "the switchover went to the synchronous standby");
    let new_label =
        wait_served_by(&rec, &cluster.member(new).name, fault, PROGRESS, "switchover: after");
    wait_seq_from(&rec, &new_label, "switchover: after");
    wait_lease_from(&rec, &new_label, "switchover: after");
    running.stop("switchover");
    eprintln!("switchover: new leader {}", leader_status_line(&cluster));
    check_and_report(&cluster, &rec, "switchover", began, fault, &new_label);
    cluster.wait_rejoined(leader, new).expect("the old leader rejoins after the switchover");

    // ------------------------------------------------------------------ 2: kill -9 of the leader's node
    let leader = new;
    let sync =
        cluster.wait_sync(leader, None, Duration::from_secs(60)).expect("a synchronous standby");
    let began = Instant::now();
    let running = start_load(&cluster, &rec, "holder-2");
    wait_served_by(&rec, &cluster.member(leader).name, began, PROGRESS, "kill -9: before");
    let fault = Instant::now();
    let killed = cluster.kill9_member(leader).expect("kill -9 the leader's Patroni and PostgreSQL");
    eprintln!("kill -9: killed {} processes of {}", killed.len(), cluster.member(leader).name);
    let new = cluster.wait_leader(&[leader], ttl * 4).expect("a new leader after the kill");
    assert_eq!(new, sync, "the synchronous standby takes over");
    let new_label =
        wait_served_by(&rec, &cluster.member(new).name, fault, PROGRESS, "kill -9: after");
    wait_seq_from(&rec, &new_label, "kill -9: after");
    wait_lease_from(&rec, &new_label, "kill -9: after");
    running.stop("kill -9");
    eprintln!("kill -9: new leader {}", leader_status_line(&cluster));
    check_and_report(&cluster, &rec, "kill9", began, fault, &new_label);
    let log_before = cluster.member(leader).log_contents().len();
    cluster.start_member(leader).expect("start the killed member's Patroni again");
    cluster.wait_rejoined(leader, new).expect("the killed member rejoins");
    let rejoin_log = cluster.member(leader).log_contents()[log_before..].to_string();
    eprintln!(
        "kill -9: {} rejoined {}",
        cluster.member(leader).name,
        if rejoin_log.contains("pg_rewind exit code=0") {
            "through pg_rewind"
        } else {
            "without pg_rewind"
        }
    );

    // ------------------------------------------------------------------ 3: the leader's node freezes
    let leader = new;
    let others: Vec<usize> = (0..cluster.members().len()).filter(|&i| i != leader).collect();
    cluster.wait_replicas(leader, &others, Duration::from_secs(60)).expect("both replicas stream");
    let sync =
        cluster.wait_sync(leader, None, Duration::from_secs(60)).expect("a synchronous standby");
    let began = Instant::now();
    let running = start_load(&cluster, &rec, "holder-3");
    let old_label =
        wait_served_by(&rec, &cluster.member(leader).name, began, PROGRESS, "freeze: before");
    // Clients connected directly to the leader, which stay connected through the freeze.
    let direct = PatroniLoad::start(
        Target::Direct { hosts: cluster.hosts(), port: cluster.member(leader).pg_port },
        load_opts(4),
        &rec.ts,
        &rec.dense,
    );
    wait_served_by(
        &rec,
        &cluster.member(leader).name,
        Instant::now(),
        100,
        "freeze: direct clients",
    );
    let frozen = cluster.freeze_member(leader).expect("SIGSTOP the leader's node");
    let fault = frozen.at;
    eprintln!(
        "freeze: stopped {} Patroni and {} PostgreSQL processes of {}",
        frozen.patroni.len(),
        frozen.postgres.len(),
        frozen.member
    );
    // A second load and lease holder: the first ones are stuck in calls to the frozen node.
    let running2 = start_load(&cluster, &rec, "holder-3b");
    let new =
        cluster.wait_leader(&[leader], ttl * 4).expect("a new leader while the old one is frozen");
    assert_eq!(new, sync, "the synchronous standby takes over");
    let new_label =
        wait_served_by(&rec, &cluster.member(new).name, fault, PROGRESS, "freeze: new leader");
    wait_seq_from(&rec, &new_label, "freeze: new leader");
    // Frozen for longer than ttl.
    let until = fault + ttl + Duration::from_secs(1);
    std::thread::sleep(until.saturating_duration_since(Instant::now()));
    let served_before_wake = rec.ts.max_value().expect("timestamps");
    let old_log_before = cluster.member(leader).log_contents().len();
    let woke = frozen.thaw(Duration::from_secs(3));
    eprintln!(
        "freeze: {} woke after {:.1} s frozen",
        cluster.member(leader).name,
        (woke - fault).as_secs_f64()
    );
    // It demotes itself, and rejoins through pg_rewind (scenario 4).
    cluster.wait_rejoined(leader, new).expect("the frozen leader rejoins after waking");
    let direct_stats = direct.stop_and_join();
    running.stop("freeze (sessions of the frozen node)");
    wait_lease_from(&rec, &new_label, "freeze: new leader");
    running2.stop("freeze (second load)");
    eprintln!("freeze: direct clients of the old leader: {direct_stats:?}");
    eprintln!("freeze: new leader {}", leader_status_line(&cluster));
    // What the old leader answered once awake: nothing (its window ended long before).
    let after_wake: Vec<_> =
        rec.ts.calls().into_iter().filter(|c| c.node == old_label && c.end >= woke).collect();
    let ok_after_wake: Vec<_> =
        after_wake.iter().filter(|c| c.is_ok() && c.start >= woke).collect();
    let seq_after_wake = rec
        .dense
        .calls()
        .iter()
        .filter(|c| c.node == old_label && c.result.is_ok() && c.start >= woke)
        .count();
    let started_after_wake = after_wake.iter().filter(|c| c.start >= woke).count();
    eprintln!(
        "freeze: calls of the old leader that ended after it woke: {} ({} were in flight across the freeze, \
         {started_after_wake} began after the wake), of which {} succeeded; highest timestamp before the wake \
         {served_before_wake} (physical {}); errors seen: {:?}",
        after_wake.len(),
        after_wake.iter().filter(|c| c.start < woke).count(),
        after_wake.iter().filter(|c| c.is_ok()).count(),
        physical(served_before_wake),
        after_wake.iter().filter_map(|c| c.result.as_ref().err()).take(3).collect::<Vec<_>>()
    );
    figures(&format!(
        "patroni-figures: scenario=freeze old_leader_calls_begun_after_wake={started_after_wake} \
         old_leader_served_after_wake={}",
        ok_after_wake.len() + seq_after_wake
    ));
    assert!(
        started_after_wake >= 4,
        "only {started_after_wake} calls reached the old leader after it woke: the scenario did not test what it should"
    );
    assert!(
        ok_after_wake.is_empty() && seq_after_wake == 0,
        "the old leader served after waking: {ok_after_wake:?} ({seq_after_wake} tso_seq blocks)"
    );
    check_and_report(&cluster, &rec, "freeze", began, fault, &new_label);

    // ------------------------------------------------------------------ 4: rejoin through pg_rewind, fail back
    let rewind_log = cluster.member(leader).log_contents()[old_log_before..].to_string();
    assert!(
        rewind_log.contains("running pg_rewind from")
            && rewind_log.contains("pg_rewind exit code=0"),
        "{} did not rejoin through pg_rewind; its log since the wake:\n{}",
        cluster.member(leader).name,
        rewind_log
            .lines()
            .filter(|l| l.contains(" INFO: ") || l.contains("WARNING") || l.contains("ERROR"))
            .take(60)
            .collect::<Vec<_>>()
            .join("\n")
    );
    let old = leader;
    let leader = new;
    let third =
        (0..cluster.members().len()).find(|&i| i != old && i != leader).expect("a third member");
    // With the third member stopped, the rewound old leader is the only candidate.
    cluster.stop_member(third).expect("stop the third member");
    cluster
        .wait_sync(leader, Some(old), Duration::from_secs(60))
        .expect("the rewound old leader becomes the synchronous standby");
    let began = Instant::now();
    let running = start_load(&cluster, &rec, "holder-4");
    wait_served_by(&rec, &cluster.member(leader).name, began, PROGRESS, "fail back: before");
    let fault = Instant::now();
    cluster.kill9_member(leader).expect("kill -9 the leader");
    let back = cluster.wait_leader(&[leader], ttl * 4).expect("a new leader");
    assert_eq!(back, old, "the failover goes back to the rewound old leader");
    let new_label =
        wait_served_by(&rec, &cluster.member(back).name, fault, PROGRESS, "fail back: after");
    wait_seq_from(&rec, &new_label, "fail back: after");
    wait_lease_from(&rec, &new_label, "fail back: after");
    running.stop("fail back");
    eprintln!("fail back: new leader {}", leader_status_line(&cluster));
    check_and_report(&cluster, &rec, "rewind_failback", began, fault, &new_label);

    figures(&format!(
        "patroni-figures: scenario=all total_wall_s={:.1}",
        t_all.elapsed().as_secs_f64()
    ));
}

// ---------------------------------------------------------------------------------------- 5

/// `tsoracle.require_synchronous_standby` (strict mode): with it on, the worker grants
/// nothing (no window, no `tso_seq` block, no lease) unless a synchronous standby is
/// connected; callers get 57P03 saying so.
///
/// On a primary with a streaming but asynchronous standby (what Patroni's non-strict
/// `synchronous_mode` leaves when it drops the synchronous standby): refused. Once the
/// standby is synchronous: served. With `synchronous_standby_names` cleared and the standby
/// stopped: refused again, and nothing served after the window already granted ran out.
/// Strict mode off again: served (asynchronously), so the refusals were strict mode's.
///
/// Depends on the GUC `tsoracle.require_synchronous_standby` in the installed build.
/// A member of a fleet whose oracle runs under Patroni follows a switchover by libpq's own
/// mechanism (every Patroni member in its connection string, `target_session_attrs=read-write`):
/// the member's calls and the oracle's own, in one history, are unique and in real-time order,
/// and the blocks taken through the member and on the oracle tile.
#[test]
fn a_member_follows_its_oracle_through_a_patroni_switchover() {
    let cluster =
        PatroniCluster::start("hafleet", PatroniOpts { members: 2, ..Default::default() })
            .unwrap_or_else(|e| panic!("start the Patroni cluster: {e}"));
    let mut c = Client::connect(&cluster.conninfo(), NoTls)
        .unwrap_or_else(|e| panic!("connect to the leader: {}", pg_error_string(&e)));
    c.batch_execute("CREATE ROLE fleet_member LOGIN; GRANT tsoracle_member TO fleet_member")
        .expect("the members' role");
    drop(c);
    let conninfo = cluster.conninfo().replace("user=postgres", "user=fleet_member");
    let member = serving_node(
        "hafleet-member",
        NodeOpts::new()
            .setting("tsoracle.oracle", &conninfo)
            .setting("tsoracle.extension_timeout_ms", 3000),
    );
    let epoch = |m: &Node| -> Option<i64> {
        m.connect()
            .query_one("SELECT oracle_epoch FROM tso_member_status()", &[])
            .expect("tso_member_status()")
            .get(0)
    };

    let rec = Recorded { ts: History::new(), dense: DenseHistory::new(), leases: LeaseLog::new() };
    let leader = cluster.wait_leader(&[], Duration::from_secs(60)).expect("a leader");
    let sync =
        cluster.wait_sync(leader, None, Duration::from_secs(60)).expect("a synchronous standby");
    let began = Instant::now();
    let run = Duration::from_secs(180);
    let oracle_load =
        PatroniLoad::start(Target::Leader(cluster.hosts()), load_opts(6), &rec.ts, &rec.dense);
    let member_load = Load::start(
        vec![member.endpoint()],
        LoadOptions::new(6, run),
        ops::mixed(50),
        rec.ts.clone(),
    );
    let member_seq = SeqLoad::start(
        member.endpoint(),
        SeqLoadOptions::new(2, run, &MEMBER_KEYS),
        rec.dense.clone(),
    );
    wait_served_by(&rec, &cluster.member(leader).name, began, 100, "before the switchover");
    rec.ts.wait_progress_on(&[member.name()], began, 100, "the member before the switchover");
    let epoch_before = epoch(&member);

    let fault = Instant::now();
    cluster.switchover(leader, sync).unwrap_or_else(|e| panic!("patronictl switchover: {e}"));
    let new = cluster.wait_leader(&[leader], Duration::from_secs(60)).expect("a new leader");
    wait_served_by(&rec, &cluster.member(new).name, fault, 100, "after the switchover");
    // Calls that begin now can only be served by the new leader.
    let after = Instant::now();
    rec.ts.wait_progress_on(&[member.name()], after, 100, "the member after the switchover");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !rec
        .dense
        .calls()
        .iter()
        .any(|c| c.node == member.name() && c.start >= after && c.result.is_ok())
    {
        assert!(Instant::now() < deadline, "no block through the member after the switchover");
        std::thread::sleep(Duration::from_millis(50));
    }
    let epoch_after = epoch(&member);
    assert!(
        epoch_after > epoch_before,
        "the new leader's epoch {epoch_after:?} > {epoch_before:?}"
    );
    oracle_load.stop_and_join();
    member_load.stop_and_join();
    member_seq.stop_and_join();

    let tr = rec.ts.check().unwrap_or_else(|v| panic!("timestamps through a switchover: {v}"));
    rec.dense
        .check(Some(&seq_totals_of(&cluster, &[KEYS.as_slice(), &MEMBER_KEYS].concat())))
        .unwrap_or_else(|v| panic!("blocks through a switchover: {v}"));
    eprintln!("member through a switchover: {:?}", tr.per_node);
}

#[test]
fn strict_mode_requires_a_synchronous_standby() {
    let mut primary = Node::start_new(
        "strict-primary",
        NodeOpts::new()
            .setting("tsoracle.window_ahead_ms", 200)
            .setting("tsoracle.max_lead_ms", 400)
            .setting("tsoracle.extension_timeout_ms", 1000),
    )
    .expect("start the primary");
    primary.create_extension().unwrap_or_else(|e| panic!("CREATE EXTENSION: {e}"));
    let mut standby = Node::base_backup_from(&primary, "strict-standby").expect("pg_basebackup");
    standby.start().expect("start the standby");
    let mut c = primary.connect();
    wait_streaming(&mut c, standby.name());

    let shown = alter_system(&primary, "tsoracle.require_synchronous_standby", Some("on")).unwrap_or_else(|e| {
        panic!("ALTER SYSTEM SET tsoracle.require_synchronous_standby (does the installed build have this GUC?): {e}")
    });
    assert_eq!(shown, "on");

    // Asynchronous standby only.
    expect_strict_refusal(&mut c, "asynchronous standby only");

    // Synchronous: served.
    make_sync(&mut primary, standby.name()).unwrap_or_else(|e| panic!("synchronous standby: {e}"));
    let deadline = Instant::now() + Duration::from_secs(30);
    let v = loop {
        match tso_next(&mut c) {
            Ok(v) => break v,
            Err(e) => assert!(
                Instant::now() < deadline,
                "not serving with a synchronous standby: {}",
                pg_error_string(&e)
            ),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let s: i64 = c
        .query_one("SELECT tso_seq('strict', 1)", &[])
        .expect("tso_seq with a synchronous standby")
        .get(0);
    c.query_one("SELECT * FROM tso_lease_acquire('strict-holder', 1, 5000)", &[])
        .expect("lease with a synchronous standby");
    assert_eq!(status(&mut c).expect("tso_status()").sync_replication, Some(true));

    // Patroni's non-strict synchronous_mode when the standby goes: it clears
    // synchronous_standby_names, and commits no longer wait for anyone.
    primary.unset_conf("synchronous_standby_names").expect("clear synchronous_standby_names");
    standby.stop(StopMode::Immediate).expect("stop the standby");
    let gone = Instant::now();
    // The worker re-reads its configuration at its next tick.
    std::thread::sleep(Duration::from_millis(500));
    // (tso_seq_peek refuses too: read the durable counter.)
    let counter = "SELECT next FROM tsoracle.seq WHERE key = 'strict'";
    let before: Option<i64> = c.query_one(counter, &[]).expect("tsoracle.seq").get(0);
    assert!(before >= Some(s + 1), "{before:?}");
    expect_strict_refusal(&mut c, "standby gone, synchronous_standby_names cleared");
    // Nothing was granted meanwhile: the counter did not move.
    let after: Option<i64> = c.query_one(counter, &[]).expect("tsoracle.seq").get(0);
    assert_eq!(after, before, "a tso_seq block was granted without a synchronous standby");
    eprintln!(
        "strict mode: refusing {:.0} ms after the standby stopped",
        gone.elapsed().as_secs_f64() * 1e3
    );

    // Strict mode off: served again (asynchronously), above everything before.
    alter_system(&primary, "tsoracle.require_synchronous_standby", Some("off"))
        .expect("strict mode off");
    let deadline = Instant::now() + Duration::from_secs(30);
    let w = loop {
        match tso_next(&mut c) {
            Ok(w) => break w,
            Err(e) => assert!(
                Instant::now() < deadline,
                "not serving with strict mode off: {}",
                pg_error_string(&e)
            ),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(w > v, "{w} <= {v}");
    let s2: i64 = c
        .query_one("SELECT tso_seq('strict', 1)", &[])
        .expect("tso_seq with strict mode off")
        .get(0);
    assert_eq!(Some(s2), after, "the sequence continues where it stopped");
}

/// Wait until `standby` streams from the primary `c` is connected to.
fn wait_streaming(c: &mut Client, standby: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'",
                &[&standby],
            )
            .expect("pg_stat_replication")
            .get(0);
        if n > 0 {
            return;
        }
        assert!(Instant::now() < deadline, "{standby} not streaming after 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Strict mode refuses: `tso_seq` and a lease at once, `tso_next()` once the window already
/// granted has run out (bounded): all 57P03 with a message naming the synchronous standby.
#[track_caller]
fn expect_strict_refusal(c: &mut Client, what: &str) {
    let check = |r: Result<(), postgres::Error>, call: &str| -> bool {
        match r {
            Ok(()) => false,
            Err(e) => {
                assert_eq!(
                    e.code(),
                    Some(&SqlState::CANNOT_CONNECT_NOW),
                    "{what}: {call}: {}",
                    pg_error_string(&e)
                );
                let msg = pg_error_string(&e);
                assert!(
                    msg.contains("synchronous standby"),
                    "{what}: {call}: the message does not say why: {msg}"
                );
                true
            }
        }
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut seq, mut lease, mut next) = (false, false, false);
    while !(seq && lease && next) {
        if !seq {
            seq = check(c.query_one("SELECT tso_seq('strict', 1)", &[]).map(|_| ()), "tso_seq");
        }
        if !lease {
            // A fresh holder name each time: an acquire that succeeded would be idempotent.
            let holder = format!("strict-{}", tsoracle_tests::now_ms());
            lease = check(
                c.query_one("SELECT * FROM tso_lease_acquire($1, 1, 5000)", &[&holder]).map(|_| ()),
                "tso_lease_acquire",
            );
        }
        if !next {
            next = check(tso_next(c).map(|_| ()), "tso_next");
        }
        assert!(
            Instant::now() < deadline,
            "{what}: strict mode did not refuse within 30 s (tso_seq refused: {seq}, lease refused: {lease}, tso_next refused: {next})"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------------------------------- README

/// The configuration the Patroni guide shows (docs/operations/patroni.md) is the one this
/// harness generates and
/// the tests above run, for the member `pg1` with ports 8008 (REST), 5432 (PostgreSQL) and
/// 2379 (etcd).
#[test]
fn readme_shows_the_tested_configuration() {
    let member = MemberConfig {
        scope: "tsoracle".into(),
        name: "pg1".into(),
        api_port: 8008,
        pg_port: 5432,
        etcd: "127.0.0.1:2379".into(),
        data_dir: "/var/lib/postgresql/15/pg1".into(),
        run_dir: "/var/run/postgresql".into(),
        bin_dir: "/usr/lib/postgresql/15/bin".into(),
    };
    let yaml = render_config(&member, &PatroniOpts::default());
    let guide = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/operations/patroni.md"
    ))
    .expect("read docs/operations/patroni.md");
    assert!(
        guide.contains(&format!("```yaml\n{yaml}```\n")),
        "docs/operations/patroni.md does not show the configuration the harness generates:\n{yaml}"
    );
}
