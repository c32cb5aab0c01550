//! Leases and the safe frontier on real clusters: `tso_lease_acquire`, `tso_lease_renew`,
//! `tso_lease_release`, `tso_safe_frontier`.
//!
//! A lease lets its holder stamp timestamps itself up to `ts_upper_bound` (physical ms, a
//! bound the oracle has already made durable) until it expires; the oracle must never issue
//! anything at or below a bound it granted once it restarts, and must not forget a live lease.
//!
//! Run with: `cargo test -p tsoracle-tests --test leases -- --test-threads=1`

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::Client;
use tsoracle_tests::seqlease::{
    alter_system, lease_rows, queue_counters, sqlstate_of, LeaseRow, QueueCounters,
};
use tsoracle_tests::tso::{durable_high_water, tso_next};
use tsoracle_tests::{
    expect_sqlstate, now_ms, ops, pg_error_string, physical, serving_node, wait_for, History, Load,
    LoadOptions, NodeOpts, SplitMix64, StopMode,
};

// ============================================================================ helpers

/// One row of `tso_lease_acquire`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Grant {
    id: i64,
    bound: i64,
    expires: i64,
    epoch: i32,
}

fn acquire(
    c: &mut Client,
    holder: &str,
    holder_epoch: i64,
    ttl_ms: i32,
) -> Result<Grant, postgres::Error> {
    let r = c.query_one(
        "SELECT lease_id, ts_upper_bound, expires_at_ms, epoch FROM tso_lease_acquire($1, $2, $3)",
        &[&holder, &holder_epoch, &ttl_ms],
    )?;
    Ok(Grant {
        id: r.try_get(0)?,
        bound: r.try_get(1)?,
        expires: r.try_get(2)?,
        epoch: r.try_get(3)?,
    })
}

#[track_caller]
fn acquire_ok(c: &mut Client, holder: &str, holder_epoch: i64, ttl_ms: i32) -> Grant {
    acquire(c, holder, holder_epoch, ttl_ms).unwrap_or_else(|e| {
        panic!("tso_lease_acquire({holder:?}, {holder_epoch}, {ttl_ms}): {}", pg_error_string(&e))
    })
}

/// `tso_lease_renew(id)` → (bound, expires, epoch).
fn renew(c: &mut Client, id: i64) -> Result<(i64, i64, i32), postgres::Error> {
    let r = c.query_one(
        "SELECT ts_upper_bound, expires_at_ms, epoch FROM tso_lease_renew($1)",
        &[&id],
    )?;
    Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?))
}

#[track_caller]
fn renew_ok(c: &mut Client, id: i64) -> (i64, i64, i32) {
    renew(c, id).unwrap_or_else(|e| panic!("tso_lease_renew({id}): {}", pg_error_string(&e)))
}

fn release(c: &mut Client, id: i64) -> Result<(), postgres::Error> {
    c.execute("SELECT tso_lease_release($1)", &[&id]).map(|_| ())
}

#[track_caller]
fn release_ok(c: &mut Client, id: i64) {
    release(c, id).unwrap_or_else(|e| panic!("tso_lease_release({id}): {}", pg_error_string(&e)))
}

#[track_caller]
fn frontier(c: &mut Client) -> i64 {
    c.query_one("SELECT tso_safe_frontier()", &[])
        .unwrap_or_else(|e| panic!("tso_safe_frontier(): {}", pg_error_string(&e)))
        .get(0)
}

#[track_caller]
fn counters(c: &mut Client) -> QueueCounters {
    queue_counters(c).unwrap_or_else(|e| panic!("tso_status(): {}", pg_error_string(&e)))
}

#[track_caller]
fn status_high_water(c: &mut Client) -> i64 {
    c.query_one("SELECT high_water_ms FROM tso_status()", &[]).unwrap().get(0)
}

/// The row of lease `g` must be there with its bound and expiry.
#[track_caller]
fn assert_row(
    rows: &BTreeMap<i64, LeaseRow>,
    g: &Grant,
    holder: &str,
    holder_epoch: i64,
    superseded: bool,
    what: &str,
) {
    let row = rows.get(&g.id).unwrap_or_else(|| {
        panic!("{what}: lease {} of {holder:?} is missing from tsoracle.lease: {rows:?}", g.id)
    });
    assert_eq!(
        (row.holder.as_str(), row.holder_epoch, row.bound, row.expires, row.superseded),
        (holder, holder_epoch, g.bound, g.expires, superseded),
        "{what}: row of lease {g:?}"
    );
}

/// Wait (bounded) until the wall clock is past `ms`.
fn sleep_until_ms(ms: i64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while now_ms() <= ms {
        assert!(Instant::now() < deadline, "clock never reached {ms}");
        std::thread::sleep(Duration::from_millis(((ms - now_ms()).clamp(1, 200)) as u64));
    }
}

// ============================================================================ 1

/// Leases survive `restart -m fast` and kill -9 of the postmaster: the same id, bound, expiry
/// and superseded flag in `tsoracle.lease`, counted in `live_leases`, still holding the
/// frontier; renew works and returns a bound at least the old one (here: above every bound
/// so far, since each grant moves the high-water); acquire with the same holder and epoch
/// is still idempotent; a superseded lease still cannot be renewed and a lower epoch is
/// still 55000. The first `tso_next()` after each restart has physical ms above every lease
/// bound granted before it.
#[test]
fn leases_survive_restart_and_kill9() {
    let mut node = serving_node("lease-restart", NodeOpts::new());
    let mut c = node.connect();
    let t0 = now_ms();
    let mut a = acquire_ok(&mut c, "keeper", 1, 60_000);
    let t1 = now_ms();
    let epoch =
        c.query_one("SELECT epoch FROM tso_status()", &[]).unwrap().get::<_, Option<i64>>(0);
    assert_eq!(Some(a.epoch as i64), epoch, "the lease's epoch is the oracle's");
    assert_eq!(a.id, a.bound, "lease_id is the acquire-time bound");
    assert!(a.bound >= t0 + 60_000, "bound {} below acquire time + ttl {}", a.bound, t0 + 60_000);
    assert!(
        a.expires >= t0 + 60_000 && a.expires <= t1 + 60_000,
        "{a:?} acquired during {t0}..{t1}"
    );
    assert!(durable_high_water(&mut c).unwrap().unwrap() >= a.bound, "the bound is durable");
    assert_eq!(
        acquire_ok(&mut c, "keeper", 1, 60_000),
        a,
        "same holder and epoch while live: the same lease"
    );
    let s1 = acquire_ok(&mut c, "sup", 1, 60_000);
    let s2 = acquire_ok(&mut c, "sup", 2, 60_000);
    assert!(s1.bound > a.bound && s2.bound > s1.bound, "{a:?} {s1:?} {s2:?}");
    let rows = lease_rows(&mut c);
    assert_row(&rows, &a, "keeper", 1, false, "before restarts");
    assert_row(&rows, &s1, "sup", 1, true, "before restarts");
    assert_row(&rows, &s2, "sup", 2, false, "before restarts");
    let mut max_bound = s2.bound;
    drop(c);

    for how in ["restart -m fast", "kill -9 of the postmaster"] {
        if how.starts_with("restart") {
            node.restart(StopMode::Fast).unwrap();
        } else {
            node.kill9_postmaster().unwrap();
            node.start().unwrap();
        }
        node.wait_serving().unwrap_or_else(|e| panic!("not serving after {how}: {e}"));
        let mut c = node.connect();
        let first = tso_next(&mut c)
            .unwrap_or_else(|e| panic!("tso_next() after {how}: {}", pg_error_string(&e)));
        assert!(
            physical(first) > max_bound,
            "after {how}: first tso_next() has physical {} <= lease bound {max_bound} granted before",
            physical(first)
        );
        let rows = lease_rows(&mut c);
        assert_eq!(rows.len(), 3, "after {how}: {rows:?}");
        assert_row(&rows, &a, "keeper", 1, false, how);
        assert_row(&rows, &s1, "sup", 1, true, how);
        assert_row(&rows, &s2, "sup", 2, false, how);
        assert_eq!(counters(&mut c).live_leases, 3, "after {how}");
        let f = frontier(&mut c);
        assert!(f <= a.bound, "after {how}: frontier {f} above the lowest live bound {}", a.bound);

        expect_sqlstate(
            renew(&mut c, s1.id),
            &SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
            &format!("renew superseded after {how}"),
        );
        expect_sqlstate(
            acquire(&mut c, "sup", 1, 60_000),
            &SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
            &format!("lower epoch after {how}"),
        );
        let (bound, expires, ep) = renew_ok(&mut c, a.id);
        assert!(bound >= a.bound, "after {how}: renew lowered the bound {} -> {bound}", a.bound);
        assert!(
            bound > max_bound,
            "after {how}: a renewal moves the high-water: {bound} <= {max_bound}"
        );
        assert!(expires >= a.expires, "after {how}: renew shortened the lease");
        assert!(ep >= a.epoch);
        a = Grant { id: a.id, bound, expires, epoch: ep };
        max_bound = bound;
        assert_eq!(
            acquire_ok(&mut c, "keeper", 1, 60_000),
            a,
            "after {how}: idempotent acquire returns the renewed lease"
        );
        assert_row(&lease_rows(&mut c), &a, "keeper", 1, false, &format!("renewed after {how}"));
        assert!(durable_high_water(&mut c).unwrap().unwrap() >= bound);
    }
}

// ============================================================================ 2

/// The safe frontier: with a short TTL (`tsoracle.lease_ttl_min_ms` lowered to 200 ms by
/// ALTER SYSTEM) it is at most the bound while the lease is live and rises above it after
/// expiry without any release (once the high-water passes the bound), and the expired row is
/// deleted. At most the bound while a lease is held; a superseded lease still holds it;
/// after releasing that one it rises to the next lease's bound, then to the high-water. A lease that expires
/// while the server is down is dropped at the next start; a live one is kept.
#[test]
fn safe_frontier_moves() {
    let mut node = serving_node("lease-frontier", NodeOpts::new());
    let mut c = node.connect();
    let f0 = frontier(&mut c);
    assert!(f0 > 0 && f0 <= status_high_water(&mut c), "no lease: frontier {f0} is the high-water");

    // Expiry without release (first: leases granted later would push the high-water, and
    // with it the bound of this lease, by their TTLs). Expired leases are purged at once.
    assert_eq!(alter_system(&node, "tsoracle.lease_ttl_min_ms", Some("200")).unwrap(), "200ms");
    assert_eq!(alter_system(&node, "tsoracle.expired_lease_retention_ms", Some("0")).unwrap(), "0");
    let e = acquire_ok(&mut c, "fe", 1, 1_000);
    let fe = frontier(&mut c);
    assert!(fe <= e.bound, "frontier {fe} above the held bound {}", e.bound);
    sleep_until_ms(e.expires);
    wait_for("frontier above the expired lease's bound", Duration::from_secs(20), || {
        frontier(&mut c) > e.bound
    });
    wait_for("expired lease deleted from tsoracle.lease", Duration::from_secs(20), || {
        lease_rows(&mut c).is_empty()
    });
    wait_for("live_leases back to 0", Duration::from_secs(20), || {
        counters(&mut c).live_leases == 0
    });

    let a = acquire_ok(&mut c, "fa", 1, 10_000);
    let f1 = frontier(&mut c);
    assert!(f1 <= a.bound, "frontier {f1} above the held bound {}", a.bound);
    let b = acquire_ok(&mut c, "fa", 2, 10_000);
    assert!(b.bound > a.bound);
    expect_sqlstate(
        renew(&mut c, a.id),
        &SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
        "renew a superseded lease",
    );
    let f2 = frontier(&mut c);
    assert!(f2 <= a.bound, "a superseded lease must still hold the frontier: {f2} > {}", a.bound);
    release_ok(&mut c, a.id);
    let f3 = frontier(&mut c);
    assert!(
        f3 > a.bound && f3 > f2,
        "after releasing the superseded lease the frontier rises: {f2} -> {f3} (bound {})",
        a.bound
    );
    assert!(f3 <= b.bound, "still held by {b:?}: {f3}");
    release_ok(&mut c, b.id);
    release_ok(&mut c, b.id);
    let f4 = frontier(&mut c);
    // Nothing holds it any more: it is the high-water, which B's grant moved to B's bound.
    assert!(
        f4 >= b.bound && f4 <= status_high_water(&mut c),
        "after the last release the frontier is the high-water: {f3} -> {f4}"
    );
    expect_sqlstate(renew(&mut c, b.id), &SqlState::NO_DATA_FOUND, "renew a released lease");
    assert!(lease_rows(&mut c).is_empty());

    // Expired while the server is down: dropped by the fence; a live lease is kept.
    let keep = acquire_ok(&mut c, "keep", 1, 120_000);
    let mut ttl = 3_000;
    let gone = loop {
        let g = acquire_ok(&mut c, "gone", ttl as i64, ttl);
        node.stop(StopMode::Fast).unwrap();
        if now_ms() < g.expires {
            // The server stopped while the lease was live: its row was in the table then.
            break g;
        }
        assert!(ttl < 100_000, "the server never stopped within a lease's TTL");
        eprintln!("stop took longer than the {ttl} ms TTL; again with a longer one");
        ttl *= 4;
        node.start().unwrap();
        node.wait_serving().unwrap();
        c = node.connect();
    };
    sleep_until_ms(gone.expires + 100);
    node.start().unwrap();
    node.wait_serving().unwrap();
    let mut c = node.connect();
    let rows = lease_rows(&mut c);
    assert!(
        !rows.contains_key(&gone.id),
        "a lease that expired while the server was down was reloaded: {rows:?}"
    );
    assert_row(&rows, &keep, "keep", 1, false, "after restart");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(counters(&mut c).live_leases, 1);
    let f = frontier(&mut c);
    assert!(f <= keep.bound, "the live lease still holds the frontier: {f} > {}", keep.bound);
    // The fence logs its count just after it starts serving: poll for the line.
    wait_for(
        "the fence to report the reloaded leases (\"1 live leases\")",
        Duration::from_secs(30),
        || node.log_contents().contains("1 live leases"),
    );
    alter_system(&node, "tsoracle.lease_ttl_min_ms", None).unwrap();
}

/// `tso_lease_renew` of a lease that has expired is 55000 while the server remembers it
/// (`tsoracle.expired_lease_retention_ms`, default 10 min): the row stays, no longer live.
/// Once purged, the id is unknown: P0002, like an id that was never granted.
#[test]
fn renew_of_an_expired_lease_is_55000_until_purged() {
    let node = serving_node("lease-expired", NodeOpts::new());
    let mut c = node.connect();
    assert_eq!(alter_system(&node, "tsoracle.lease_ttl_min_ms", Some("200")).unwrap(), "200ms");
    let g = acquire_ok(&mut c, "late", 1, 500);
    sleep_until_ms(g.expires + 50);
    wait_for("live_leases back to 0", Duration::from_secs(20), || {
        counters(&mut c).live_leases == 0
    });
    assert!(lease_rows(&mut c).contains_key(&g.id), "an expired lease is remembered");
    let r = renew(&mut c, g.id);
    expect_sqlstate(r, &SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE, "renew of an expired lease");

    assert_eq!(alter_system(&node, "tsoracle.expired_lease_retention_ms", Some("0")).unwrap(), "0");
    wait_for("expired lease purged from tsoracle.lease", Duration::from_secs(20), || {
        !lease_rows(&mut c).contains_key(&g.id)
    });
    let r = renew(&mut c, g.id);
    expect_sqlstate(r, &SqlState::NO_DATA_FOUND, "renew of a purged lease");
}

// ============================================================================ 3

/// What a session believes it holds.
#[derive(Clone, Debug)]
struct Held {
    id: i64,
    holder: String,
    holder_epoch: i64,
    bound: i64,
    expires: i64,
    /// Known to be superseded (by this session's own higher epoch).
    superseded: bool,
    /// The holder is shared with another session (which may supersede it unseen).
    shared: bool,
}

#[derive(Default)]
struct Shared {
    /// Every lease id ever granted → (holder, holder_epoch).
    ids: Mutex<HashMap<i64, (String, i64)>>,
    released: Mutex<HashSet<i64>>,
}

struct SessionResult {
    held: Vec<Held>,
    ops: BTreeMap<&'static str, u64>,
}

fn code(e: &postgres::Error) -> String {
    sqlstate_of(e)
}

/// One lease session: a holder of its own (`shared == None`) or a holder shared with other
/// sessions, whose epochs come from one counter (so they only increase).
fn lease_session(
    mut c: Client,
    holder: String,
    shared_epoch: Option<Arc<AtomicI64>>,
    shared: Arc<Shared>,
    grants: History,
    renewals: History,
    until: Instant,
) -> SessionResult {
    let mut rng = SplitMix64::from_entropy();
    let mut held: Vec<Held> = Vec::new();
    let mut ops: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut epoch: i64 = 1;
    let is_shared = shared_epoch.is_some();
    let new_id = |g: &Grant, holder: &str, e: i64| {
        let mut ids = shared.ids.lock().unwrap();
        if let Some(prev) = ids.insert(g.id, (holder.to_string(), e)) {
            panic!("lease id {} granted twice: to {prev:?} and to ({holder:?}, {e}) ({g:?})", g.id);
        }
    };
    while Instant::now() < until {
        let ttl = rng.range_inclusive(300, 4_000) as i32;
        let dice = rng.range_inclusive(0, 99);
        // The index of this session's current (active, own-epoch) lease, for solo holders.
        let current = held.iter().position(|h| !h.superseded && !h.shared);
        let start = Instant::now();
        let t0 = now_ms();
        if is_shared {
            let ctr = shared_epoch.as_ref().unwrap();
            if dice < 35 || held.is_empty() {
                let e = ctr.fetch_add(1, Ordering::SeqCst) + 1;
                match acquire(&mut c, &holder, e, ttl) {
                    Ok(g) => {
                        grants.record_ok(start, Instant::now(), "acquire", g.bound, 1);
                        new_id(&g, &holder, e);
                        held.push(Held {
                            id: g.id,
                            holder: holder.clone(),
                            holder_epoch: e,
                            bound: g.bound,
                            expires: g.expires,
                            superseded: false,
                            shared: true,
                        });
                        *ops.entry("shared acquire ok").or_default() += 1;
                    }
                    Err(err) if code(&err) == "55000" => {
                        *ops.entry("shared acquire 55000 (higher epoch active)").or_default() += 1
                    }
                    Err(err) => panic!("shared acquire ({holder}, {e}): {}", pg_error_string(&err)),
                }
            } else if dice < 60 {
                let i = rng.range_inclusive(0, held.len() as i64 - 1) as usize;
                let h = held[i].clone();
                let r = renew(&mut c, h.id);
                let t1 = now_ms();
                match r {
                    Ok((bound, expires, _)) => {
                        assert!(h.expires > t0, "renewed lease {h:?}, which had expired at {t0}");
                        // Renewals move the high-water to max(H, now + ttl): they never lower a
                        // bound and always cover the renewed TTL, but do not stack.
                        assert!(bound >= h.bound, "renew lowered the bound: {h:?} -> {bound}");
                        assert!(
                            bound >= expires,
                            "renew does not cover its TTL: {h:?} -> {bound}, expires {expires}"
                        );
                        assert!(
                            expires >= t0 && expires <= t1 + 4_000,
                            "{h:?} renewed to {expires} during {t0}..{t1}"
                        );
                        renewals.record_ok(start, Instant::now(), "renew", bound, 1);
                        held[i].bound = bound;
                        held[i].expires = expires;
                        *ops.entry("shared renew ok").or_default() += 1;
                    }
                    Err(err) if code(&err) == "55000" => {
                        // Superseded by another session, or expired.
                        if h.expires <= t1 {
                            held.remove(i);
                        }
                        *ops.entry("shared renew 55000").or_default() += 1;
                    }
                    Err(err) if code(&err) == "P0002" => {
                        assert!(
                            h.expires <= t1,
                            "renew of a live lease {h:?} said it does not exist (at {t1})"
                        );
                        held.remove(i);
                        *ops.entry("shared renew P0002 (expired, swept)").or_default() += 1;
                    }
                    Err(err) => panic!("renew {h:?}: {}", pg_error_string(&err)),
                }
            } else if dice < 75 {
                let i = rng.range_inclusive(0, held.len() as i64 - 1) as usize;
                let h = held.remove(i);
                release(&mut c, h.id)
                    .unwrap_or_else(|e| panic!("release {h:?}: {}", pg_error_string(&e)));
                shared.released.lock().unwrap().insert(h.id);
                *ops.entry("shared release").or_default() += 1;
            } else {
                std::thread::sleep(Duration::from_millis(rng.range_inclusive(5, 60) as u64));
            }
            continue;
        }

        // A holder of its own.
        match dice {
            // Renew the current lease.
            0..=24 if current.is_some() => {
                let i = current.unwrap();
                let h = held[i].clone();
                let r = renew(&mut c, h.id);
                let t1 = now_ms();
                match r {
                    Ok((bound, expires, _)) => {
                        assert!(h.expires > t0, "renewed lease {h:?}, which had expired at {t0}");
                        // Renewals move the high-water to max(H, now + ttl): they never lower a
                        // bound and always cover the renewed TTL, but do not stack.
                        assert!(bound >= h.bound, "renew lowered the bound: {h:?} -> {bound}");
                        assert!(
                            bound >= expires,
                            "renew does not cover its TTL: {h:?} -> {bound}, expires {expires}"
                        );
                        assert!(expires >= t0 && expires <= t1 + 4_000);
                        renewals.record_ok(start, Instant::now(), "renew", bound, 1);
                        held[i].bound = bound;
                        held[i].expires = expires;
                        *ops.entry("renew ok").or_default() += 1;
                    }
                    Err(err) if code(&err) == "55000" || code(&err) == "P0002" => {
                        assert!(
                            h.expires <= t1,
                            "renew of the live, active lease {h:?} failed at {t1}: {}",
                            pg_error_string(&err)
                        );
                        held.remove(i);
                        *ops.entry("renew of an expired lease").or_default() += 1;
                    }
                    Err(err) => panic!("renew {h:?}: {}", pg_error_string(&err)),
                }
            }
            // Acquire again at the same epoch: idempotent while live.
            0..=39 => {
                let r = acquire(&mut c, &holder, epoch, ttl);
                let t1 = now_ms();
                let g = r.unwrap_or_else(|e| {
                    panic!("acquire ({holder}, {epoch}): {}", pg_error_string(&e))
                });
                match current {
                    Some(i) if held[i].id == g.id => {
                        let h = &held[i];
                        assert!(h.expires > t0, "an expired lease was handed back: {h:?} at {t0}");
                        assert_eq!(
                            (g.bound, g.expires),
                            (h.bound, h.expires),
                            "idempotent acquire of {h:?}"
                        );
                        *ops.entry("acquire idempotent").or_default() += 1;
                    }
                    cur => {
                        if let Some(i) = cur {
                            assert!(
                                held[i].expires <= t1,
                                "a new lease {g:?} although {:?} was live",
                                held[i]
                            );
                            held.remove(i);
                        }
                        grants.record_ok(start, Instant::now(), "acquire", g.bound, 1);
                        new_id(&g, &holder, epoch);
                        held.push(Held {
                            id: g.id,
                            holder: holder.clone(),
                            holder_epoch: epoch,
                            bound: g.bound,
                            expires: g.expires,
                            superseded: false,
                            shared: false,
                        });
                        *ops.entry("acquire new").or_default() += 1;
                    }
                }
            }
            // A higher epoch: a new lease; the current one is superseded but kept.
            40..=54 => {
                let g = acquire(&mut c, &holder, epoch + 1, ttl).unwrap_or_else(|e| {
                    panic!("acquire ({holder}, {}): {}", epoch + 1, pg_error_string(&e))
                });
                if let Some(i) = current {
                    if held[i].expires > t0 {
                        held[i].superseded = true;
                    } else {
                        held.remove(i);
                    }
                }
                epoch += 1;
                grants.record_ok(start, Instant::now(), "acquire", g.bound, 1);
                new_id(&g, &holder, epoch);
                held.push(Held {
                    id: g.id,
                    holder: holder.clone(),
                    holder_epoch: epoch,
                    bound: g.bound,
                    expires: g.expires,
                    superseded: false,
                    shared: false,
                });
                *ops.entry("acquire higher epoch").or_default() += 1;
            }
            // Release any lease held.
            55..=64 if !held.is_empty() => {
                let i = rng.range_inclusive(0, held.len() as i64 - 1) as usize;
                let h = held.remove(i);
                release(&mut c, h.id)
                    .unwrap_or_else(|e| panic!("release {h:?}: {}", pg_error_string(&e)));
                shared.released.lock().unwrap().insert(h.id);
                *ops.entry("release").or_default() += 1;
            }
            // Renew a superseded lease: never works.
            65..=74 if held.iter().any(|h| h.superseded) => {
                let i = held.iter().position(|h| h.superseded).unwrap();
                let h = held[i].clone();
                let r = renew(&mut c, h.id);
                let t1 = now_ms();
                match r {
                    Ok(v) => panic!("renewed the superseded lease {h:?}: {v:?}"),
                    Err(err) if code(&err) == "55000" => {
                        if h.expires <= t1 {
                            held.remove(i);
                        }
                        *ops.entry("renew superseded 55000").or_default() += 1;
                    }
                    Err(err) if code(&err) == "P0002" => {
                        assert!(h.expires <= t1, "renew of the live superseded lease {h:?}: P0002");
                        held.remove(i);
                        *ops.entry("renew superseded P0002 (expired, swept)").or_default() += 1;
                    }
                    Err(err) => panic!("renew superseded {h:?}: {}", pg_error_string(&err)),
                }
            }
            // A lower epoch while the current lease is live: 55000.
            75..=81 if epoch > 1 && current.is_some_and(|i| held[i].expires > t0 + 1_000) => {
                let i = current.unwrap();
                let r = acquire(&mut c, &holder, epoch - 1, ttl);
                let t1 = now_ms();
                match r {
                    Err(err) if code(&err) == "55000" => {
                        *ops.entry("acquire lower epoch 55000").or_default() += 1
                    }
                    Ok(g) if held[i].expires <= t1 => {
                        // The current lease expired during the call: no active lease, so the
                        // lower epoch is granted.
                        held.remove(i);
                        epoch -= 1;
                        grants.record_ok(start, Instant::now(), "acquire", g.bound, 1);
                        new_id(&g, &holder, epoch);
                        held.push(Held {
                            id: g.id,
                            holder: holder.clone(),
                            holder_epoch: epoch,
                            bound: g.bound,
                            expires: g.expires,
                            superseded: false,
                            shared: false,
                        });
                    }
                    other => panic!(
                        "acquire at a lower epoch while {:?} is live: {:?}",
                        held[i],
                        other.map_err(|e| pg_error_string(&e))
                    ),
                }
            }
            _ => std::thread::sleep(Duration::from_millis(rng.range_inclusive(5, 60) as u64)),
        }
    }
    SessionResult { held, ops }
}

/// 10 lease sessions (6 holders of their own; 2 holders shared by 2 sessions each, with
/// epochs from a common counter) acquire, re-acquire, supersede, renew, release and let
/// leases expire (TTL 300..4000 ms, `lease_ttl_min_ms` lowered to 200) for 5 s, while 4
/// sessions call `tso_next()`. Every outcome is checked on the spot against what the session
/// knows (a live active lease renews; an idempotent acquire returns the same lease; a lower
/// epoch is 55000; a superseded lease never renews). At the end:
///
/// * no lease lost: every lease a session holds, has not released and that is still live
///   when `tsoracle.lease` is read is there, with the bound and expiry it was last given
///   (and `superseded` when the session superseded it itself);
/// * no phantom: every row live at that moment is held by some session; no released lease
///   is there;
/// * lease ids are unique, and every acquire's bound is unique and real-time ordered (each
///   acquire moves the durable high-water); a renewal's bound is never below a grant made
///   before it began (renewals do not stack, so it may equal one);
/// * the frontier is at most every live bound; the `tso_next()` history is valid.
#[test]
fn concurrent_leases_are_never_lost() {
    let node = serving_node("lease-concurrent", NodeOpts::new());
    assert_eq!(alter_system(&node, "tsoracle.lease_ttl_min_ms", Some("200")).unwrap(), "200ms");
    let shared = Arc::new(Shared::default());
    let grants = History::new();
    let renewals = History::new();
    let ts_history = History::new();
    let ts_load = Load::start(
        vec![node.endpoint()],
        LoadOptions::new(4, Duration::from_secs(5)),
        ops::tso_next(),
        ts_history.clone(),
    );
    let until = Instant::now() + Duration::from_secs(5);
    let pair_epochs = [Arc::new(AtomicI64::new(0)), Arc::new(AtomicI64::new(0))];
    let mut threads = Vec::new();
    for i in 0..10 {
        let c = node.connect();
        let (holder, ep) = if i < 6 {
            (format!("solo-{i}"), None)
        } else {
            let p = (i - 6) / 2;
            (format!("pair-{p}"), Some(pair_epochs[p].clone()))
        };
        let (shared, grants, renewals) = (shared.clone(), grants.clone(), renewals.clone());
        threads.push(
            std::thread::Builder::new()
                .name(format!("lease-{i}"))
                .spawn(move || lease_session(c, holder, ep, shared, grants, renewals, until))
                .unwrap(),
        );
    }
    let results: Vec<SessionResult> = threads
        .into_iter()
        .map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
        .collect();
    let ts_stats = ts_load.join();

    let mut c = node.connect();
    let before = now_ms();
    let rows = lease_rows(&mut c);
    let after = now_ms();
    let mut held_live = 0;
    let mut by_id: HashMap<i64, &Held> = HashMap::new();
    for h in results.iter().flat_map(|r| r.held.iter()) {
        by_id.insert(h.id, h);
        if h.expires <= after {
            continue; // may have been swept already
        }
        held_live += 1;
        let row = rows.get(&h.id).unwrap_or_else(|| panic!("lease lost: {h:?} is live until {} but not in tsoracle.lease (read at {before}..{after})", h.expires));
        assert_eq!(
            (row.holder.as_str(), row.holder_epoch, row.bound, row.expires),
            (h.holder.as_str(), h.holder_epoch, h.bound, h.expires),
            "row of {h:?}"
        );
        if h.superseded {
            assert!(row.superseded, "{h:?} was superseded by its own session: {row:?}");
        } else if !h.shared {
            assert!(!row.superseded, "nobody superseded {h:?}: {row:?}");
        }
    }
    let ids = shared.ids.lock().unwrap();
    let released = shared.released.lock().unwrap();
    for row in rows.values() {
        assert!(ids.contains_key(&row.id), "a lease nobody was granted: {row:?}");
        assert!(!released.contains(&row.id), "a released lease is still there: {row:?}");
        if row.expires > after {
            assert!(by_id.contains_key(&row.id), "a live lease no session holds: {row:?}");
        }
    }
    let granted = grants.assert_valid();
    // Renewals move the high-water to max(H, now + ttl), so they do not stack: a renewal's
    // bound may equal an earlier grant's, but is never below one that ended before it began.
    let acquired = grants.calls();
    let renewed = renewals.calls();
    for r in &renewed {
        let bound = r.first().expect("renewals are recorded ok");
        for g in acquired.iter().chain(&renewed).filter(|g| g.end < r.start) {
            let earlier = g.first().expect("grants are recorded ok");
            assert!(
                bound >= earlier,
                "a renewal's bound {bound} is below {earlier}, granted before it began"
            );
        }
    }
    let hw_now = durable_high_water(&mut c).unwrap().unwrap();
    assert!(
        renewed.iter().all(|r| r.first().unwrap() <= hw_now),
        "a renewal bound above the durable high-water"
    );
    let f = frontier(&mut c);
    let t = now_ms();
    let lowest = lease_rows(&mut c).values().filter(|r| r.expires > t).map(|r| r.bound).min();
    if let Some(lowest) = lowest {
        assert!(f <= lowest, "frontier {f} above the live bound {lowest}");
    }
    let ts = ts_history.assert_valid();
    assert_eq!(ts.err_calls, 0, "tso_next() failed: {:?}", ts_stats.sample_errors);
    assert!(ts.ok_calls > 0);
    let hw = durable_high_water(&mut c).unwrap().unwrap();
    assert!(physical(ts.max_value.unwrap()) <= hw);
    assert!(granted.max_value.unwrap() <= hw, "a bound above the durable high-water");

    let mut ops: BTreeMap<&str, u64> = BTreeMap::new();
    for r in &results {
        for (k, v) in &r.ops {
            *ops.entry(k).or_default() += v;
        }
    }
    eprintln!(
        "leases: {} ids granted, {} bounds granted, {} released, {held_live} live at the end ({} rows); tso_next {} calls; ops {ops:?}",
        ids.len(),
        granted.ok_calls,
        released.len(),
        rows.len(),
        ts.ok_calls
    );
    assert!(
        ops.get("renew ok").copied().unwrap_or(0) > 0
            && ops.get("acquire higher epoch").copied().unwrap_or(0) > 0,
        "{ops:?}"
    );
}

// ============================================================================ 4

/// A plain LOGIN role gets 42501 on the three lease functions and on `tsoracle.lease`;
/// `tso_safe_frontier()` is open to it. Granted `tsoracle_lease_holder` it can acquire,
/// renew and release, but still never read or write `tsoracle.lease`. Revoked, 42501 again.
#[test]
fn leases_are_a_privilege() {
    let node = serving_node("lease-privileges", NodeOpts::new());
    let mut su = node.connect();
    su.batch_execute("CREATE ROLE plain LOGIN").unwrap();
    let mut p = node.connect_as("plain");
    let denied = SqlState::INSUFFICIENT_PRIVILEGE;
    expect_sqlstate(acquire(&mut p, "p", 1, 10_000), &denied, "acquire as plain");
    expect_sqlstate(renew(&mut p, 1), &denied, "renew as plain");
    expect_sqlstate(release(&mut p, 1), &denied, "release as plain");
    let table_sql = [
        "SELECT * FROM tsoracle.lease",
        "INSERT INTO tsoracle.lease (lease_id, holder, holder_epoch, ts_upper_bound_ms, expires_at_ms, ttl_ms) VALUES (1, 'p', 1, 1, 1, 1)",
        "UPDATE tsoracle.lease SET expires_at_ms = 0",
        "DELETE FROM tsoracle.lease",
    ];
    for sql in table_sql {
        expect_sqlstate(p.batch_execute(sql), &denied, &format!("{sql} as plain"));
    }
    assert!(frontier(&mut p) > 0, "tso_safe_frontier() is open to everyone");

    su.batch_execute("GRANT tsoracle_lease_holder TO plain").unwrap();
    let g = acquire(&mut p, "p", 1, 10_000)
        .unwrap_or_else(|e| panic!("acquire as a lease holder: {}", pg_error_string(&e)));
    let (bound, _, _) = renew(&mut p, g.id)
        .unwrap_or_else(|e| panic!("renew as a lease holder: {}", pg_error_string(&e)));
    assert!(bound > g.bound);
    assert!(frontier(&mut p) <= bound);
    for sql in table_sql {
        expect_sqlstate(p.batch_execute(sql), &denied, &format!("{sql} as a lease holder"));
    }
    // A role created as a member from the start.
    su.batch_execute("CREATE ROLE lessee LOGIN IN ROLE tsoracle_lease_holder").unwrap();
    let mut l = node.connect_as("lessee");
    let g2 = acquire(&mut l, "l", 1, 10_000)
        .unwrap_or_else(|e| panic!("acquire as lessee: {}", pg_error_string(&e)));
    expect_sqlstate(
        l.batch_execute("SELECT * FROM tsoracle.lease"),
        &denied,
        "SELECT tsoracle.lease as lessee",
    );
    release(&mut l, g2.id).unwrap();
    release(&mut p, g.id)
        .unwrap_or_else(|e| panic!("release as a lease holder: {}", pg_error_string(&e)));
    assert!(lease_rows(&mut su).is_empty());

    su.batch_execute("REVOKE tsoracle_lease_holder FROM plain").unwrap();
    expect_sqlstate(acquire(&mut p, "p", 2, 10_000), &denied, "acquire after REVOKE");
    assert!(lease_rows(&mut su).is_empty(), "nothing was granted after the REVOKE");
}

// ============================================================================ 5

/// Every bad lease argument, over SQL: 22023 (TTL outside [lease_ttl_min_ms,
/// lease_ttl_max_ms], both reloadable; empty, NULL or > 128-byte holder; NULL epoch or TTL);
/// P0002 (renew of an id never granted); 55000 (lower holder epoch, renew of a superseded
/// lease). The bounds are inclusive; release is idempotent; renew(NULL) is STRICT (no row).
#[test]
fn bad_lease_arguments_over_sql() {
    let node = serving_node("lease-bad", NodeOpts::new());
    let mut c = node.connect();
    let bad = SqlState::INVALID_PARAMETER_VALUE;
    for ttl in [4_999, 300_001, 0, -1, i32::MIN, i32::MAX] {
        expect_sqlstate(acquire(&mut c, "h", 1, ttl), &bad, &format!("ttl {ttl}"));
    }
    let long = "h".repeat(129);
    let wide = "é".repeat(65);
    for holder in ["", long.as_str(), wide.as_str()] {
        expect_sqlstate(
            acquire(&mut c, holder, 1, 10_000),
            &bad,
            &format!("holder of {} bytes", holder.len()),
        );
    }
    for sql in [
        "SELECT * FROM tso_lease_acquire(NULL, 1, 10000)",
        "SELECT * FROM tso_lease_acquire('h', NULL, 10000)",
        "SELECT * FROM tso_lease_acquire('h', 1, NULL)",
    ] {
        expect_sqlstate(c.query(sql, &[]), &bad, sql);
    }
    assert!(lease_rows(&mut c).is_empty(), "a rejected call granted a lease");

    // Inclusive bounds; a 128-byte holder.
    let lo = acquire_ok(&mut c, "lo", 1, 5_000);
    let hi = acquire_ok(&mut c, &"é".repeat(64), 1, 300_000);
    assert!(hi.bound >= lo.bound + 300_000 - 5_000);
    release_ok(&mut c, lo.id);
    release_ok(&mut c, hi.id);

    // The TTL limits are reloadable.
    assert_eq!(alter_system(&node, "tsoracle.lease_ttl_max_ms", Some("10000")).unwrap(), "10s");
    expect_sqlstate(acquire(&mut c, "h", 1, 10_001), &bad, "ttl above a lowered maximum");
    let g = acquire_ok(&mut c, "h", 1, 10_000);
    release_ok(&mut c, g.id);
    alter_system(&node, "tsoracle.lease_ttl_max_ms", None).unwrap();
    assert_eq!(alter_system(&node, "tsoracle.lease_ttl_min_ms", Some("1000")).unwrap(), "1s");
    expect_sqlstate(acquire(&mut c, "h", 2, 999), &bad, "ttl below a raised minimum");
    let g = acquire_ok(&mut c, "h", 2, 1_000);
    release_ok(&mut c, g.id);
    alter_system(&node, "tsoracle.lease_ttl_min_ms", None).unwrap();
    expect_sqlstate(
        acquire(&mut c, "h", 3, 1_000),
        &bad,
        "ttl below the default minimum after RESET",
    );

    // Unknown ids; idempotent release; STRICT renew.
    for id in [42, -1, 0, i64::MAX] {
        expect_sqlstate(renew(&mut c, id), &SqlState::NO_DATA_FOUND, &format!("renew({id})"));
        release_ok(&mut c, id);
    }
    let rows = c.query("SELECT * FROM tso_lease_renew(NULL)", &[]).unwrap();
    assert!(rows.is_empty(), "renew(NULL) is STRICT: no row");
    c.execute("SELECT tso_lease_release(NULL)", &[]).unwrap();

    // Epochs.
    let a = acquire_ok(&mut c, "ep", 5, 10_000);
    expect_sqlstate(
        acquire(&mut c, "ep", 4, 10_000),
        &SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
        "lower holder epoch",
    );
    let b = acquire_ok(&mut c, "ep", 6, 10_000);
    assert!(b.id != a.id && b.bound > a.bound);
    expect_sqlstate(
        renew(&mut c, a.id),
        &SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
        "renew superseded",
    );
    expect_sqlstate(
        acquire(&mut c, "ep", 5, 10_000),
        &SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
        "the superseded epoch again",
    );
    release_ok(&mut c, b.id);
    release_ok(&mut c, b.id);
    expect_sqlstate(renew(&mut c, b.id), &SqlState::NO_DATA_FOUND, "renew a released lease");
    // With the higher epoch released, the superseded one is still held but not active.
    let rows = lease_rows(&mut c);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(rows[&a.id].superseded);
    release_ok(&mut c, a.id);
    assert!(lease_rows(&mut c).is_empty());
}

/// More live leases than the shared table holds (1,024), loaded by a restore: the frontier
/// still counts every one of them. The lowest bound belongs to the lease with the highest id,
/// the one a table that kept the first 1,024 by id would leave out. New acquires are refused
/// (54000) while the table is over its capacity; releasing the lowest lets the frontier rise
/// to the next.
#[test]
fn a_restore_of_more_leases_than_fit_never_hides_one_from_the_frontier() {
    let node = serving_node("lease-overflow", NodeOpts::new());
    let mut c = node.connect();
    let hw = status_high_water(&mut c);
    let base = hw - 100_000;
    let expires = now_ms() + 600_000;
    let n = 1_100i64;
    // Restored rows go through the merge trigger, and the worker fences again above them.
    let fences_before: i64 =
        c.query_one("SELECT fences FROM tso_status()", &[]).expect("fences").get(0);
    c.execute(
        "INSERT INTO tsoracle.lease (lease_id, holder, holder_epoch, ts_upper_bound_ms, expires_at_ms, ttl_ms) \
         SELECT i, 'restored-' || i, 1, CASE WHEN i = $1 THEN $2::bigint - 5000 ELSE $2::bigint + i END, $3::bigint, 60000 \
           FROM generate_series(1::bigint, $1::bigint) i",
        &[&n, &base, &expires],
    )
    .unwrap_or_else(|e| panic!("restore the leases: {}", pg_error_string(&e)));
    wait_for("the fence after the restore", Duration::from_secs(30), || {
        c.query_one("SELECT fences, state, live_leases FROM tso_status()", &[]).ok().is_some_and(
            |r| r.get::<_, i64>(0) > fences_before && r.get::<_, String>(1) == "serving",
        )
    });
    let live: i64 = c.query_one("SELECT live_leases FROM tso_status()", &[]).unwrap().get(0);
    assert_eq!(live, n, "every restored lease is live");
    assert_eq!(frontier(&mut c), base - 5_000, "the frontier counts the lease with the highest id");
    expect_sqlstate(
        acquire(&mut c, "one-too-many", 1, 10_000),
        &SqlState::PROGRAM_LIMIT_EXCEEDED,
        "acquire beyond the capacity",
    );
    release_ok(&mut c, n);
    wait_for("the released lease leaves the frontier", Duration::from_secs(10), || {
        frontier(&mut c) == base + 1
    });
    // The summary entry still holds the rest: release the next lowest too.
    release_ok(&mut c, 1);
    wait_for("the next lowest leaves the frontier", Duration::from_secs(10), || {
        frontier(&mut c) == base + 2
    });
    let live: i64 = c.query_one("SELECT live_leases FROM tso_status()", &[]).unwrap().get(0);
    assert_eq!(live, n - 2);
}
