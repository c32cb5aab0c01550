//! Helpers for the dense sequences (`tso_seq`, `tso_seq_batch`) and the leases: the calls, the
//! group-commit counters of `tso_status()`, the counters read back from `tsoracle.seq`, the
//! lease calls (`tso_lease_acquire`, `tso_lease_renew`, `tso_lease_release`,
//! `tso_safe_frontier`) and the rows of `tsoracle.lease`, and `ALTER SYSTEM` + reload.
//!
//! The sequence load ([`SeqLoad`]: every call recorded in a [`crate::DenseHistory`]) is in
//! [`crate::load`], with the other loads, and re-exported here.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use postgres::types::Type;
use postgres::Client;

use crate::error::{pg_error_string, HarnessError};
use crate::node::Node;
use crate::Result;

pub use crate::load::{SeqLoad, SeqLoadOptions, SeqLoadStats};

/// The request-queue counters of `tso_status()`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueCounters {
    pub group_commits: i64,
    pub grouped_requests: i64,
    pub live_leases: i64,
    pub worker_pid: Option<i32>,
    pub fences: i64,
}

/// `SELECT group_commits, grouped_requests, live_leases, worker_pid, fences FROM tso_status()`.
pub fn queue_counters(c: &mut Client) -> std::result::Result<QueueCounters, postgres::Error> {
    let r = c.query_one(
        "SELECT group_commits, grouped_requests, live_leases, worker_pid, fences FROM tso_status()",
        &[],
    )?;
    Ok(QueueCounters {
        group_commits: r.try_get(0)?,
        grouped_requests: r.try_get(1)?,
        live_leases: r.try_get(2)?,
        worker_pid: r.try_get(3)?,
        fences: r.try_get(4)?,
    })
}

/// Every counter of `tsoracle.seq` (superuser): key → next.
pub fn seq_totals(c: &mut Client) -> std::result::Result<BTreeMap<String, i64>, postgres::Error> {
    Ok(c.query("SELECT key, next FROM tsoracle.seq ORDER BY key", &[])?
        .into_iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1)))
        .collect())
}

/// `tso_seq(key, count)`.
pub fn seq(c: &mut Client, key: &str, count: i32) -> std::result::Result<i64, postgres::Error> {
    c.query_one("SELECT tso_seq($1, $2)", &[&key, &count])?.try_get(0)
}

/// [`seq`], panicking with the error.
#[track_caller]
pub fn seq_ok(c: &mut Client, key: &str, count: i32) -> i64 {
    seq(c, key, count)
        .unwrap_or_else(|e| panic!("tso_seq({key}, {count}): {}", crate::pg_error_string(&e)))
}

/// The worker's group commits so far (`tso_status().group_commits`): unmoved across a call,
/// the call was served in place.
#[track_caller]
pub fn group_commits(c: &mut Client) -> i64 {
    queue_counters(c)
        .unwrap_or_else(|e| panic!("tso_status(): {}", crate::pg_error_string(&e)))
        .group_commits
}

/// `tso_seq_peek(key)`.
pub fn peek(c: &mut Client, key: &str) -> std::result::Result<Option<i64>, postgres::Error> {
    c.query_one("SELECT tso_seq_peek($1)", &[&key])?.try_get(0)
}

/// `SELECT key, start, count FROM tso_seq_batch(keys, counts)`, rows in the order returned.
pub fn seq_batch(
    c: &mut Client,
    keys: &[&str],
    counts: &[i32],
) -> std::result::Result<Vec<(String, i64, i32)>, postgres::Error> {
    let keys: Vec<String> = keys.iter().map(|s| s.to_string()).collect();
    let counts: Vec<i32> = counts.to_vec();
    c.query(
        "SELECT key, start, count FROM tso_seq_batch($1::text[], $2::int[])",
        &[&keys, &counts],
    )?
    .into_iter()
    .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
    .collect()
}

/// [`seq`] with an unnamed statement, for a transaction pooler
/// ([`crate::load::ops::unnamed`] says why).
pub fn seq_unnamed(
    c: &mut Client,
    key: &str,
    count: i32,
) -> std::result::Result<i64, postgres::Error> {
    c.query_typed_one("SELECT tso_seq($1, $2)", &[(&key, Type::TEXT), (&count, Type::INT4)])?
        .try_get(0)
}

/// [`seq_batch`] with an unnamed statement, for a transaction pooler.
pub fn seq_batch_unnamed(
    c: &mut Client,
    keys: &[&str],
    counts: &[i32],
) -> std::result::Result<Vec<(String, i64, i32)>, postgres::Error> {
    let keys: Vec<String> = keys.iter().map(|s| s.to_string()).collect();
    let counts: Vec<i32> = counts.to_vec();
    c.query_typed(
        "SELECT key, start, count FROM tso_seq_batch($1, $2)",
        &[(&keys, Type::TEXT_ARRAY), (&counts, Type::INT4_ARRAY)],
    )?
    .into_iter()
    .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
    .collect()
}

/// The SQLSTATE of an error as text, or `"none"` (connection lost, client-side error).
pub fn sqlstate_of(e: &postgres::Error) -> String {
    e.code().map(|c| c.code().to_string()).unwrap_or_else(|| "none".into())
}

/// `ALTER SYSTEM SET name = value` (or `RESET name` for `None`), `pg_reload_conf()`, then wait
/// (bounded) until a backend has re-read the configuration, and until the tsoracle worker has
/// too: it re-reads it at the top of each pass of its loop and takes one group of requests
/// per pass, so of two requests made one after the other after the reload (releases of a
/// lease that does not exist: they change nothing) the second is served by a pass that began
/// after the reload. The pause before them covers the postmaster signalling the worker after
/// this backend. Returns the setting as a fresh session sees it.
pub fn alter_system(node: &Node, name: &str, value: Option<&str>) -> Result<String> {
    let mut c = node.try_connect(crate::node::CONNECT_TIMEOUT)?;
    let before: String = c.query_one("SELECT pg_conf_load_time()::text", &[])?.get(0);
    let sql = match value {
        Some(v) => format!("ALTER SYSTEM SET {name} = '{}'", v.replace('\'', "''")),
        None => format!("ALTER SYSTEM RESET {name}"),
    };
    c.batch_execute(&sql)?;
    c.batch_execute("SELECT pg_reload_conf()")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now: String = c.query_one("SELECT pg_conf_load_time()::text", &[])?.get(0);
        if now != before {
            break;
        }
        if Instant::now() > deadline {
            return Err(HarnessError::Timeout(format!("reload after `{sql}` not observed")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..2 {
        // A node that does not serve (a standby, a refusing worker) answers with an error and
        // needs no such wait for the requests it does not take.
        if c.batch_execute("SELECT tso_lease_release(-1)").is_err() {
            std::thread::sleep(Duration::from_millis(300));
            break;
        }
    }
    let mut fresh = node.try_connect(crate::node::CONNECT_TIMEOUT)?;
    let shown: String = fresh.query_one("SELECT current_setting($1)", &[&name])?.get(0);
    Ok(shown)
}

/// One row of `tso_lease_acquire`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    pub id: i64,
    pub bound: i64,
    pub expires: i64,
    pub epoch: i32,
}

/// `tso_lease_acquire(holder, holder_epoch, ttl_ms)`.
pub fn acquire(
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

/// [`acquire`], panicking with the error.
#[track_caller]
pub fn acquire_ok(c: &mut Client, holder: &str, holder_epoch: i64, ttl_ms: i32) -> Grant {
    acquire(c, holder, holder_epoch, ttl_ms).unwrap_or_else(|e| {
        panic!("tso_lease_acquire({holder:?}, {holder_epoch}, {ttl_ms}): {}", pg_error_string(&e))
    })
}

/// `tso_lease_renew(id)` → (bound, expires, epoch).
pub fn renew(c: &mut Client, id: i64) -> Result<(i64, i64, i32), postgres::Error> {
    let r = c.query_one(
        "SELECT ts_upper_bound, expires_at_ms, epoch FROM tso_lease_renew($1)",
        &[&id],
    )?;
    Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?))
}

/// [`renew`], panicking with the error.
#[track_caller]
pub fn renew_ok(c: &mut Client, id: i64) -> (i64, i64, i32) {
    renew(c, id).unwrap_or_else(|e| panic!("tso_lease_renew({id}): {}", pg_error_string(&e)))
}

/// `tso_lease_release(id)`.
pub fn release(c: &mut Client, id: i64) -> Result<(), postgres::Error> {
    c.execute("SELECT tso_lease_release($1)", &[&id]).map(|_| ())
}

/// [`release`], panicking with the error.
#[track_caller]
pub fn release_ok(c: &mut Client, id: i64) {
    release(c, id).unwrap_or_else(|e| panic!("tso_lease_release({id}): {}", pg_error_string(&e)))
}

/// `tso_safe_frontier()`, panicking on an error.
#[track_caller]
pub fn frontier(c: &mut Client) -> i64 {
    c.query_one("SELECT tso_safe_frontier()", &[])
        .unwrap_or_else(|e| panic!("tso_safe_frontier(): {}", pg_error_string(&e)))
        .get(0)
}

/// A row of `tsoracle.lease`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRow {
    pub id: i64,
    pub holder: String,
    pub holder_epoch: i64,
    pub bound: i64,
    pub expires: i64,
    pub ttl: i64,
    pub superseded: bool,
}

/// Every row of `tsoracle.lease`, by lease id.
#[track_caller]
pub fn lease_rows(c: &mut Client) -> BTreeMap<i64, LeaseRow> {
    c.query(
        "SELECT lease_id, holder, holder_epoch, ts_upper_bound_ms, expires_at_ms, ttl_ms, superseded FROM tsoracle.lease",
        &[],
    )
    .unwrap_or_else(|e| panic!("SELECT FROM tsoracle.lease: {}", pg_error_string(&e)))
    .into_iter()
    .map(|r| {
        let row = LeaseRow {
            id: r.get(0),
            holder: r.get(1),
            holder_epoch: r.get(2),
            bound: r.get(3),
            expires: r.get(4),
            ttl: r.get(5),
            superseded: r.get(6),
        };
        (row.id, row)
    })
    .collect()
}
