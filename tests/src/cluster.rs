//! Multi-node helpers for the replication and failover tests.
//!
//! * [`PrimaryPointer`] and [`MixedLoad`], re-exported from [`crate::load`]: "where the
//!   primary is now", and a mixed timestamp/sequence load that follows it across failovers.
//! * Synchronous standby set-up ([`make_sync`]), replay waits ([`wait_replayed`],
//!   [`wait_end_of_local_wal`]), a standby cut off from its primary
//!   ([`remove_primary_conninfo`]), the tsoracle worker's process ([`worker_activity`]),
//!   promotion without a long-running query on the standby ([`promote`]) and promotion timing
//!   ([`first_timestamp`]).
//!
//! Everything is bounded in time.

use std::fs;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::Client;

use crate::error::{pg_error_string, HarnessError};
use crate::node::Node;
use crate::Result;

pub use crate::load::{MixedLoad, MixedLoadOptions, PrimaryPointer};

/// How long the waits of this module poll.
pub const CLUSTER_WAIT: Duration = Duration::from_secs(60);

// ============================================================================ replication

fn lsn_text(c: &mut Client, sql: &str) -> Result<Option<String>> {
    Ok(c.query_one(sql, &[])?.try_get::<_, Option<String>>(0)?)
}

/// `pg_current_wal_lsn()` of a primary, as text.
pub fn current_wal_lsn(primary: &Node) -> Result<String> {
    let mut c = primary.try_connect(CLUSTER_WAIT)?;
    lsn_text(&mut c, "SELECT pg_current_wal_lsn()::text")?
        .ok_or_else(|| HarnessError::Other("pg_current_wal_lsn() is NULL".into()))
}

/// Make `primary` wait for `standby_app` (an application_name, or `*`) synchronously, then
/// wait until a standby named `standby_app` (or any, for `*`) is `sync` in
/// `pg_stat_replication` and has flushed everything the primary had written at that moment
/// (so commits from before the standby became synchronous are on it too).
pub fn make_sync(primary: &mut Node, standby_app: &str) -> Result<()> {
    let names = if standby_app == "*" {
        "*".to_string()
    } else {
        format!("\"{}\"", standby_app.replace('"', "\"\""))
    };
    primary.set_conf("synchronous_standby_names", names)?;
    wait_sync(primary, standby_app)
}

/// The waiting half of [`make_sync`] (for a primary already configured).
pub fn wait_sync(primary: &Node, standby_app: &str) -> Result<()> {
    let mut c = primary.try_connect(CLUSTER_WAIT)?;
    let deadline = Instant::now() + CLUSTER_WAIT;
    let mut last = String::from("no standby");
    let mut target: Option<String> = None;
    loop {
        let rows = c.query(
            "SELECT application_name, state, sync_state, flush_lsn::text, \
                    (flush_lsn >= $1::text::pg_lsn) AS caught_up \
               FROM pg_stat_replication \
              WHERE $2 = '*' OR application_name = $2",
            &[&target.clone().unwrap_or_else(|| "0/0".into()), &standby_app],
        )?;
        let sync = rows.iter().find(|r| r.get::<_, Option<String>>(2).as_deref() == Some("sync"));
        if let Some(r) = sync {
            match &target {
                None => {
                    target = Some(
                        lsn_text(&mut c, "SELECT pg_current_wal_lsn()::text")?.unwrap_or_default(),
                    )
                }
                Some(_) if r.get::<_, Option<bool>>(4) == Some(true) => return Ok(()),
                Some(t) => {
                    last = format!("sync, flushed {:?} < {t}", r.get::<_, Option<String>>(3))
                }
            }
        } else {
            last = format!(
                "{:?}",
                rows.iter()
                    .map(|r| (
                        r.get::<_, Option<String>>(0),
                        r.get::<_, Option<String>>(1),
                        r.get::<_, Option<String>>(2)
                    ))
                    .collect::<Vec<_>>()
            );
        }
        if Instant::now() > deadline {
            return Err(HarnessError::Timeout(format!(
                "node {}: standby {standby_app:?} not synchronous and caught up after {CLUSTER_WAIT:?}; last: {last}",
                primary.name()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Wait until `standby` has replayed up to `lsn` (`pg_last_wal_replay_lsn() >= lsn`).
pub fn wait_replay_lsn(standby: &Node, lsn: &str) -> Result<()> {
    let mut c = standby.try_connect(CLUSTER_WAIT)?;
    let deadline = Instant::now() + CLUSTER_WAIT;
    loop {
        let r = c.query_one(
            "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::text::pg_lsn, false), pg_last_wal_replay_lsn()::text",
            &[&lsn],
        )?;
        if r.get::<_, bool>(0) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(HarnessError::Timeout(format!(
                "node {}: replay at {:?}, not at {lsn} after {CLUSTER_WAIT:?}",
                standby.name(),
                r.get::<_, Option<String>>(1)
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Wait until `standby` has replayed everything `primary` has written so far.
pub fn wait_replayed(primary: &Node, standby: &Node) -> Result<String> {
    let lsn = current_wal_lsn(primary)?;
    wait_replay_lsn(standby, &lsn)?;
    Ok(lsn)
}

/// Remove `primary_conninfo` from a (stopped) standby's `postgresql.auto.conf`: started
/// again, it stays a hot standby (standby.signal is kept) that replays only the WAL it
/// already has and never reconnects to its primary. Returns the removed lines.
pub fn remove_primary_conninfo(standby: &Node) -> Result<Vec<String>> {
    let path = standby.datadir().join("postgresql.auto.conf");
    let text = fs::read_to_string(&path)
        .map_err(|e| HarnessError::io(format!("read {}", path.display()), e))?;
    let (removed, kept): (Vec<&str>, Vec<&str>) =
        text.lines().partition(|l| l.trim_start().starts_with("primary_conninfo"));
    let mut out = kept.join("\n");
    out.push('\n');
    // Writing an existing file keeps its owner (postgres).
    fs::write(&path, out).map_err(|e| HarnessError::io(format!("write {}", path.display()), e))?;
    Ok(removed.into_iter().map(String::from).collect())
}

/// On a hot standby without a source of WAL other than its own `pg_wal`: wait until the
/// startup process has replayed all of it (it then waits in `RecoveryRetrieveRetryInterval`
/// for WAL that will not come) and everything up to `min_lsn` (what the standby reported
/// flushed) is replayed: `pg_last_wal_replay_lsn() >= min_lsn`, or the WAL after the replay
/// position holds no complete record (`pg_waldump` finds none). The standby flushes WAL in
/// the pieces it receives, so what it flushed may end inside a record, which can never be
/// replayed (and no commit the primary waited for ends there). Returns the replay LSN.
pub fn wait_end_of_local_wal(standby: &Node, min_lsn: &str) -> Result<String> {
    let mut c = standby.try_connect(CLUSTER_WAIT)?;
    let deadline = Instant::now() + CLUSTER_WAIT;
    let mut waldump = String::new();
    loop {
        let r = c.query_one(
            "SELECT (SELECT wait_event FROM pg_stat_activity WHERE backend_type = 'startup'), \
                    pg_last_wal_replay_lsn()::text, \
                    coalesce(pg_last_wal_replay_lsn() >= $1::text::pg_lsn, false), \
                    (SELECT timeline_id FROM pg_control_checkpoint())",
            &[&min_lsn],
        )?;
        let wait_event: Option<String> = r.get(0);
        let lsn: Option<String> = r.get(1);
        if wait_event.as_deref() == Some("RecoveryRetrieveRetryInterval") {
            if r.get::<_, bool>(2) {
                return Ok(lsn.unwrap_or_default());
            }
            if let Some(at) = &lsn {
                let (records, out) = complete_records_from(standby, at, r.get(3))?;
                if records == 0 {
                    return Ok(at.clone());
                }
                waldump = out;
            }
        }
        if Instant::now() > deadline {
            return Err(HarnessError::Timeout(format!(
                "node {}: local WAL not replayed to its end after {CLUSTER_WAIT:?}: startup waits on {wait_event:?}, replay at {lsn:?}, want >= {min_lsn} or no complete record after it; pg_waldump from there:\n{waldump}",
                standby.name()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How many complete WAL records `pg_waldump` reads from `lsn` on in the node's `pg_wal`
/// (timeline `timeline`), and its output.
fn complete_records_from(node: &Node, lsn: &str, timeline: i32) -> Result<(usize, String)> {
    let out = std::process::Command::new(node.bin_dir().join("pg_waldump"))
        .arg("--path")
        .arg(node.datadir().join("pg_wal"))
        .arg("--timeline")
        .arg(timeline.to_string())
        .arg("--start")
        .arg(lsn)
        .output()
        .map_err(|e| HarnessError::io("run pg_waldump", e))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let records = stdout.lines().filter(|l| l.starts_with("rmgr:")).count();
    Ok((records, format!("{stdout}{}", String::from_utf8_lossy(&out.stderr))))
}

// ============================================================================ tsoracle

/// The tsoracle worker as `pg_stat_activity` shows it: (pid, wait_event).
pub fn worker_activity(
    c: &mut Client,
) -> std::result::Result<Option<(i32, Option<String>)>, postgres::Error> {
    Ok(c.query_opt(
        "SELECT pid, wait_event FROM pg_stat_activity WHERE backend_type = 'tsoracle worker'",
        &[],
    )?
    .map(|r| (r.get(0), r.get(1))))
}

/// `tso_status().promotion_to_first_ts_ms`.
pub fn promotion_to_first_ts_ms(
    c: &mut Client,
) -> std::result::Result<Option<i64>, postgres::Error> {
    c.query_one("SELECT promotion_to_first_ts_ms FROM tso_status()", &[])?.try_get(0)
}

/// Call `tso_next()` on `c` until it succeeds (retrying 57P03 every millisecond, bounded by
/// `timeout`); returns the value and the time from `since`. Other errors are returned.
pub fn first_timestamp(
    c: &mut Client,
    since: Instant,
    timeout: Duration,
) -> Result<(i64, Duration)> {
    let deadline = Instant::now() + timeout;
    loop {
        let last = match c.query_one("SELECT tso_next()", &[]).and_then(|r| r.try_get::<_, i64>(0))
        {
            Ok(v) => return Ok((v, since.elapsed())),
            Err(e) if e.code() == Some(&SqlState::CANNOT_CONNECT_NOW) => pg_error_string(&e),
            Err(e) => return Err(e.into()),
        };
        if Instant::now() > deadline {
            return Err(HarnessError::Timeout(format!(
                "no timestamp within {timeout:?}; last: {last}"
            )));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Promote a hot standby with `pg_promote(false)` (signal only) and poll `pg_is_in_recovery()`
/// every millisecond until it is false (bounded by [`CLUSTER_WAIT`]); returns how long that
/// took. Unlike `pg_promote(true, ...)`, no query holds a snapshot while the promotion runs:
/// a waiting `pg_promote(true)` conflicts with the replay of cleanup records still arriving
/// from a live primary, and the startup process then waits `max_standby_streaming_delay`
/// (30 s) before it cancels the call and only then sees the promote request.
pub fn promote(standby: &Node) -> Result<Duration> {
    let mut c = standby.try_connect(CLUSTER_WAIT)?;
    let t0 = Instant::now();
    let signalled: bool = c.query_one("SELECT pg_promote(false)", &[])?.get(0);
    if !signalled {
        return Err(HarnessError::Other(format!(
            "node {}: pg_promote(false) returned false",
            standby.name()
        )));
    }
    let deadline = t0 + CLUSTER_WAIT;
    loop {
        let in_recovery: bool = c.query_one("SELECT pg_is_in_recovery()", &[])?.get(0);
        if !in_recovery {
            return Ok(t0.elapsed());
        }
        if Instant::now() > deadline {
            return Err(HarnessError::Timeout(format!(
                "node {}: still in recovery {CLUSTER_WAIT:?} after pg_promote",
                standby.name()
            )));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
