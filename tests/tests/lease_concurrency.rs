//! Leases under concurrency on a real cluster: sessions of their own holders and sessions
//! sharing a holder acquire, re-acquire, supersede, renew, release and let leases expire at
//! once, while a timestamp load runs. No lease is lost, none is invented, bounds are ordered.
//!
//! Leases one call at a time (restarts, the safe frontier, privileges, bad arguments): the
//! `leases` suite.
//!
//! Run with: `cargo test -p tsoracle-tests --test lease_concurrency -- --test-threads=1`

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use postgres::Client;
use tsoracle_tests::seqlease::{
    acquire, alter_system, frontier, lease_rows, release, renew, sqlstate_of, Grant,
};
use tsoracle_tests::tso::durable_high_water;
use tsoracle_tests::{
    now_ms, ops, pg_error_string, physical, serving_node, History, Load, LoadOptions, NodeOpts,
    SplitMix64,
};

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
