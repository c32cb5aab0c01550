//! Leases and the safe frontier on real clusters: `tso_lease_acquire`, `tso_lease_renew`,
//! `tso_lease_release`, `tso_safe_frontier`.
//!
//! A lease lets its holder stamp timestamps itself up to `ts_upper_bound` (physical ms, a
//! bound the oracle has already made durable) until it expires; the oracle must never issue
//! anything at or below a bound it granted once it restarts, and must not forget a live lease.
//!
//! This suite: leases across restarts and kill -9, the safe frontier, expiry and purging,
//! privileges, bad arguments, a restore of more leases than the shared table holds. Many
//! sessions at once: the `lease_concurrency` suite.
//!
//! Run with: `cargo test -p tsoracle-tests --test leases -- --test-threads=1`

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::Client;
use tsoracle_tests::seqlease::{
    acquire, acquire_ok, alter_system, frontier, lease_rows, queue_counters, release, release_ok,
    renew, renew_ok, Grant, LeaseRow, QueueCounters,
};
use tsoracle_tests::tso::{durable_high_water, tso_next};
use tsoracle_tests::{
    expect_sqlstate, now_ms, pg_error_string, physical, serving_node, wait_for, NodeOpts, StopMode,
};

// ============================================================================ helpers

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

// ============================================================================ 4

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

// ============================================================================ 5

/// A lease's lowest stamp and the resolved timestamp (README, "Reading in order"): a lease
/// acquired right after a restart, while the fence serves above the clock (a high-water seeded
/// a minute ahead), tells its holder a lowest stamp above every `R` readers were given before
/// it, and `R` stays below it while the lease lives; a renewal moves the lowest stamp up, and
/// `R` stays below the previous grant's until that grant would have expired. (0.3.0 gave the
/// server's clock at the grant, a minute below `R` here.)
#[test]
fn a_lease_acquired_after_a_restart_stamps_above_every_r_handed_out() {
    let mut node = serving_node("lease-r", NodeOpts::new());
    let mut c = node.connect();
    let ahead = now_ms() + 60_000;
    c.query_one("SELECT tso_seed($1)", &[&ahead]).unwrap();
    node.restart(StopMode::Immediate).unwrap();
    node.wait_serving().unwrap();
    let mut c = node.connect();
    let mut readers = node.connect();
    // Readers are handed R while timestamps are issued, then the lease is acquired.
    let mut r_before = 0i64;
    for _ in 0..50 {
        tso_next(&mut c).unwrap();
        let r: i64 = readers.query_one("SELECT tso_resolved()", &[]).unwrap().get(0);
        r_before = r_before.max(r);
    }
    assert!(physical(r_before) >= ahead, "R {r_before} is not above the seeded clock yet");
    let row = c
        .query_one(
            "SELECT lease_id, ts_lower_bound, ts_upper_bound, expires_at_ms FROM tso_lease_acquire_bounds('r-holder', 1, 5000)",
            &[],
        )
        .unwrap_or_else(|e| panic!("acquire: {}", pg_error_string(&e)));
    let (id, lower, upper, expires): (i64, i64, i64, i64) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    assert!(
        lower << 18 > r_before,
        "the lowest stamp {lower} ms is at or below an R already handed out ({r_before}, {} ms)",
        physical(r_before)
    );
    assert!(lower <= upper, "lowest stamp {lower} above the bound {upper}");
    assert!(expires <= now_ms() + 5_000);
    // While it lives, R stays below its lowest stamp, however many timestamps are issued
    // (batches: the window serves ahead of the clock, one millisecond after the other).
    let first = lower << 18;
    let renew_at = Instant::now() + Duration::from_millis(1_500);
    let mut renewed_lower = None;
    let deadline = Instant::now() + Duration::from_millis(4_000);
    let mut issued = 0i64;
    while Instant::now() < deadline {
        issued =
            c.query_one("SELECT tso_next_batch(200000)", &[]).unwrap().get::<_, i64>(0) + 199_999;
        let r: i64 = readers.query_one("SELECT tso_resolved()", &[]).unwrap().get(0);
        assert!(r < first, "R {r} passed the lowest stamp {first} of a grant that lives");
        if renewed_lower.is_none() && Instant::now() >= renew_at {
            let row = c
                .query_one("SELECT ts_lower_bound FROM tso_lease_renew_bounds($1)", &[&id])
                .unwrap_or_else(|e| panic!("renew: {}", pg_error_string(&e)));
            let l: i64 = row.get(0);
            assert!(l >= lower, "a renewal lowered the lowest stamp: {l} < {lower}");
            renewed_lower = Some(l);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(renewed_lower.is_some(), "the renewal ran");
    assert!(issued > first, "the load issued past the lowest stamp ({issued} <= {first})");
    c.execute("SELECT tso_lease_release($1)", &[&id]).unwrap();
    // Released: R moves on to everything issued.
    let last = tso_next(&mut c).unwrap();
    wait_for("R past the released lease", Duration::from_secs(10), || {
        readers.query_one("SELECT tso_resolved()", &[]).unwrap().get::<_, i64>(0) >= last
    });
}
