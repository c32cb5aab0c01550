//! Publishing the resolved timestamp to hot standbys and to logical decoding (and, on the
//! oracle of a fleet, the fleet's `R_f` with it: `super::fleet`).

use super::state::Worker;
use crate::pg::clock;
use crate::pg::guc;
use crate::pg::xact::{subtransaction, transaction};
use pgrx::prelude::*;

impl Worker {
    /// Every `tsoracle.resolved_interval_ms`, if `R` advanced since the last time: write it
    /// to `tsoracle.resolved` (standbys read it as far as they have replayed) and, with
    /// `wal_level = logical`, emit it as a transactional message with prefix
    /// `tsoracle.resolved` — in one transaction, which begins after every transaction holding
    /// a value at or below `R` has ended, so its commit comes after theirs in the WAL and in
    /// the change stream.
    pub(super) fn publish_resolved(&mut self) {
        let now = clock::mono_ms();
        // On the oracle of a fleet, a member's registration or removal waits for this: at once.
        let oracle = !guc::is_member();
        let on_time =
            now.saturating_sub(self.resolved_published_mono_ms) >= guc::resolved_interval_ms();
        let urgent = oracle && super::fleet::urgent();
        if !on_time && !urgent {
            return;
        }
        if on_time {
            self.resolved_published_mono_ms = now;
        }
        let Ok(r) = crate::shmem::holders::primary_resolved(self.signals) else {
            return;
        };
        // This cluster's own R every interval only, whatever the fleet needs in between.
        let local = on_time && r > self.signals.published_resolved().0;
        // A member that published nothing for half tsoracle.window_ahead_ms (cut off from its
        // oracle, or idle) commits all the same, as an oracle's worker does with its window:
        // its standbys show they replay (TsoracleStandbyNotReplaying pages a standby that
        // replayed no commit for a minute, not every member's standby in an oracle outage).
        let beat = !oracle && on_time && !local && member_beat_due(now);
        // The fleet's R_f, from this R and the members' entries, in the same transaction.
        let fleet = oracle && (on_time || urgent) && super::fleet::due(r);
        // On a member: a lagging bound of what it fetched, raised in its own high-water in
        // the same transaction (refused below after a restart: member/past.rs).
        let past = if !oracle && on_time { super::member::past_due(self.signals) } else { None };
        if !local && !fleet && past.is_none() && !beat {
            return;
        }
        let past_written = std::cell::Cell::new(false);
        let written = transaction(|| -> Result<Option<super::fleet::Written>, pgrx::spi::Error> {
            if local {
                publish(Published::Local, r)?;
            } else if beat {
                beat_row()?;
            }
            if let Some(due) = &past {
                // In a subtransaction: a high-water row locked or broken holds up this bound,
                // not R.
                match subtransaction(|| super::member::keep_past(due)) {
                    Ok(Ok(())) => past_written.set(true),
                    Ok(Err(e)) => warn_past(&e.to_string()),
                    Err(e) => warn_past(&e.to_string()),
                }
            }
            // In a subtransaction: a fleet table locked or broken holds up R_f, not R.
            Ok(if fleet {
                match subtransaction(|| {
                    let w = super::fleet::write(r)?;
                    if let Some(rf) = w.raised() {
                        publish(Published::Fleet, rf)?;
                    }
                    Ok::<_, pgrx::spi::Error>(w)
                }) {
                    Ok(Ok(w)) => Some(w),
                    Ok(Err(e)) => {
                        warn_fleet(&e.to_string());
                        None
                    }
                    Err(e) => {
                        warn_fleet(&e.to_string());
                        None
                    }
                }
            } else {
                None
            })
        });
        // Not published now (tsoracle.resolved locked past the worker's lock_timeout): the next
        // interval tries again; R on the primary goes on, standbys' R waits.
        let failure = match written {
            Ok(Ok(fleet)) => {
                if local {
                    self.signals.set_published_resolved(r, clock::now_ms());
                }
                if !oracle {
                    MEMBER_COMMITTED_MONO_MS.set(now);
                }
                if let Some(due) = past.as_ref().filter(|_| past_written.get()) {
                    super::member::past_kept(due);
                }
                if let Some(w) = fleet {
                    super::fleet::committed(w, clock::now_ms());
                }
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        };
        // Once a minute at most: it is tried again every interval.
        thread_local! { static WARNED_MONO_MS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) }; }
        if now.saturating_sub(WARNED_MONO_MS.get()) >= 60_000 || WARNED_MONO_MS.get() == 0 {
            WARNED_MONO_MS.set(now);
            pgrx::warning!("tsoracle could not publish the resolved timestamp {r}: {failure}; retrying every tsoracle.resolved_interval_ms");
        }
    }
}

impl Worker {
    /// On a member not connected to its oracle (it publishes nothing then): the commit
    /// `publish_resolved` makes at least every half `tsoracle.window_ahead_ms`, without `R`.
    pub(super) fn member_beat(&mut self) {
        let now = clock::mono_ms();
        if !member_beat_due(now) {
            return;
        }
        // A beat that fails (tsoracle.resolved locked, or not there yet) is tried again half
        // a window later, not at every tick.
        let _ = transaction(beat_row);
        MEMBER_COMMITTED_MONO_MS.set(now);
    }
}

/// A commit that writes nothing but the time of `tsoracle.resolved`'s row.
fn beat_row() -> Result<(), pgrx::spi::Error> {
    Spi::run("UPDATE ONLY tsoracle.resolved SET updated_at = pg_catalog.now() WHERE id")
}

thread_local! {
    /// On a member: when its worker last committed a publication (monotonic clock).
    static MEMBER_COMMITTED_MONO_MS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// On a member: half `tsoracle.window_ahead_ms` has passed since its worker last committed a
/// publication.
fn member_beat_due(now: u64) -> bool {
    now.saturating_sub(MEMBER_COMMITTED_MONO_MS.get()) >= (guc::window_ahead_ms() / 2).max(1)
}

/// Once a minute at most: a member's bound of its past is tried again every interval.
fn warn_past(failure: &str) {
    thread_local! { static WARNED_MONO_MS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) }; }
    let now = clock::mono_ms();
    if WARNED_MONO_MS.get() == 0 || now.saturating_sub(WARNED_MONO_MS.get()) >= 60_000 {
        WARNED_MONO_MS.set(now.max(1));
        pgrx::warning!("tsoracle member could not raise its own high-water to what it handed out: {failure}; retrying every tsoracle.resolved_interval_ms");
    }
}

/// Once a minute at most: the fleet's part is tried again every interval.
fn warn_fleet(failure: &str) {
    thread_local! { static WARNED_MONO_MS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) }; }
    let now = clock::mono_ms();
    if WARNED_MONO_MS.get() == 0 || now.saturating_sub(WARNED_MONO_MS.get()) >= 60_000 {
        WARNED_MONO_MS.set(now.max(1));
        pgrx::warning!("tsoracle could not publish the fleet's resolved timestamp: {failure}; retrying every tsoracle.resolved_interval_ms");
    }
}

/// Which resolved timestamp a publication writes.
#[derive(Clone, Copy)]
enum Published {
    /// This cluster's own `R`.
    Local,
    /// The fleet's `R_f`, on its oracle.
    Fleet,
}

/// Write `r` to its table (what standbys read) and, with `wal_level = logical`, emit it as a
/// transactional message in the change stream: `tsoracle.resolved` or
/// `tsoracle.fleet_resolved`, both table and message prefix.
fn publish(what: Published, r: u64) -> Result<(), pgrx::spi::Error> {
    let (update, prefix) = match what {
        Published::Local => (
            "UPDATE ONLY tsoracle.resolved SET ts = GREATEST(ts, $1), updated_at = pg_catalog.now() WHERE id",
            "tsoracle.resolved",
        ),
        Published::Fleet => (
            "UPDATE ONLY tsoracle.fleet_resolved SET ts = GREATEST(ts, $1), updated_at = pg_catalog.now() WHERE id",
            "tsoracle.fleet_resolved",
        ),
    };
    Spi::run_with_args(update, &[(r as i64).into()])?;
    Spi::run_with_args(
        "SELECT CASE WHEN pg_catalog.current_setting('wal_level') OPERATOR(pg_catalog.=) 'logical' \
             THEN pg_catalog.pg_logical_emit_message(true, $2, $1::pg_catalog.text) END",
        &[(r as i64).into(), prefix.into()],
    )
}
