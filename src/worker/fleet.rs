//! On the oracle of a fleet (docs/fleet.md): the members' registrations and reports made
//! durable in `tsoracle.fleet_member`, and the fleet-wide resolved timestamp `R_f` published
//! in `tsoracle.fleet_resolved` and the change stream — in the transaction that publishes the
//! oracle's own `R` (`super::resolved`).
//!
//! `R_f` is handed out (`tso_fleet_resolved()`) only once the transaction that wrote it has
//! committed: a new primary starts from the persisted one and from the persisted entries, so
//! `R_f` never goes down across a failover. A member is served no timestamp before its
//! registration committed (`caller::fleet::check_served`), nor before the run that speaks
//! for it and its hold (docs/fleet-resolved.md, "One run at a time") committed: the oracle's restart or
//! failover forgets neither.

use crate::shmem::fleet::{MemberSlot, Slots, FLEET};
use pgrx::prelude::*;
use tsoracle_core::fleet::{fleet_resolved, publish};

/// What a publication wrote, to apply to shared memory once it has committed.
pub(super) struct Written {
    /// The rows read from the table, when this was the first publication since the start.
    loaded: Option<(Vec<MemberSlot>, u64)>,
    /// The slots written (as they were then).
    members: Vec<MemberSlot>,
    /// `R_f` as computed.
    resolved: u64,
    /// Above what was published: to write to `tsoracle.fleet_resolved` and the change stream.
    raised: bool,
}

impl Written {
    /// `R_f` to publish, if it moved.
    pub(super) fn raised(&self) -> Option<u64> {
        self.raised.then_some(self.resolved)
    }
}

/// Anything to write: the table not read yet, a registration or a removal to make durable,
/// an entry that moved, or a higher `R_f` (with `own`, the oracle's own `R`).
pub(super) fn due(own: u64) -> bool {
    let f = FLEET.share();
    !f.loaded || f.used().any(MemberSlot::unwritten) || computed(&f, own) > f.published
}

/// Registrations and removals wait for a publication: it runs at once for them.
pub(super) fn urgent() -> bool {
    let f = FLEET.share();
    !f.loaded || f.used().any(|m| !m.persisted || m.removing || m.admitting)
}

/// `R_f` over the members with a slot and, if `tsoracle.max_members` left some without one,
/// their lowest entry.
fn computed(f: &impl Slots, own: u64) -> u64 {
    let placed = f.used().filter(|m| m.holds()).map(|m| m.entry());
    publish(f.header().published, fleet_resolved(own, placed.chain(f.header().unplaced_entry())))
}

/// Read what a previous primary made durable (the first time since this server started).
fn load() -> Result<(Vec<MemberSlot>, u64), pgrx::spi::Error> {
    Spi::connect(|client| {
        let rows = client.select(
            "SELECT system_id, role::pg_catalog.int8, resolved, COALESCE(held_by_pid, 0), \
                    (pg_catalog.date_part('epoch', registered_at) OPERATOR(pg_catalog.*) 1000)::pg_catalog.int8, \
                    COALESCE((pg_catalog.date_part('epoch', reported_at) OPERATOR(pg_catalog.*) 1000)::pg_catalog.int8, 0), \
                    removed_at IS NOT NULL, run, held_at \
             FROM ONLY tsoracle.fleet_member ORDER BY system_id",
            None,
            &[],
        )?;
        let mut members = Vec::new();
        for row in rows {
            let resolved = row.get::<i64>(3)?.unwrap_or(0).max(0) as u64;
            members.push(MemberSlot {
                used: true,
                system_id: row.get::<i64>(1)?.unwrap_or(0) as u64,
                role: row.get::<i64>(2)?.unwrap_or(0) as u32,
                resolved,
                held_by_pid: row.get::<i32>(4)?.unwrap_or(0),
                registered_ms: row.get::<i64>(5)?.unwrap_or(0).max(0) as u64,
                reported_ms: row.get::<i64>(6)?.unwrap_or(0).max(0) as u64,
                session_pid: 0,
                heard_mono_ms: 0,
                persisted: true,
                persisted_resolved: resolved,
                removing: false,
                removed: row.get::<bool>(7)?.unwrap_or(false),
                admitting: false,
                run: row.get::<i64>(8)?.unwrap_or(0).max(0) as u64,
                held_at: row.get::<i64>(9)?.map(|h| h.max(0) as u64),
            });
        }
        let published = client
            .select("SELECT ts FROM ONLY tsoracle.fleet_resolved WHERE id", None, &[])?
            .first()
            .get_one::<i64>()?
            .unwrap_or(0)
            .max(0) as u64;
        Ok((members, published))
    })
}

/// Inside the publishing transaction: read the table if not yet, write the entries that moved,
/// compute `R_f` (`own`: the oracle's own `R`, computed before the transaction began); the
/// caller publishes it (`Written::raised`).
pub(super) fn write(own: u64) -> Result<Written, pgrx::spi::Error> {
    let mut f = FLEET.share().copy();
    let loaded = if f.loaded { None } else { Some(load()?) };
    if let Some((rows, published)) = &loaded {
        f.published = f.published.max(*published);
        f.merge(rows);
    }
    let members: Vec<MemberSlot> = f.used().filter(|m| m.unwritten()).copied().collect();
    for m in &members {
        if m.admitting {
            Spi::run_with_args(
                "DELETE FROM ONLY tsoracle.fleet_member WHERE system_id OPERATOR(pg_catalog.=) $1",
                &[(m.system_id as i64).into()],
            )?;
        } else if m.removing {
            Spi::run_with_args(
                "UPDATE ONLY tsoracle.fleet_member SET removed_at = pg_catalog.now(), held_by_pid = NULL \
                 WHERE system_id OPERATOR(pg_catalog.=) $1",
                &[(m.system_id as i64).into()],
            )?;
        } else {
            Spi::run_with_args(
                "INSERT INTO tsoracle.fleet_member AS f (system_id, role, resolved, held_by_pid, registered_at, reported_at, run, held_at) \
                 VALUES ($1, $2::pg_catalog.int8::pg_catalog.oid, $3, NULLIF($4, 0), \
                         pg_catalog.to_timestamp($5 OPERATOR(pg_catalog./) 1000.0), \
                         pg_catalog.to_timestamp(NULLIF($6, 0) OPERATOR(pg_catalog./) 1000.0), $7, $8) \
                 ON CONFLICT (system_id) DO UPDATE \
                 SET role = EXCLUDED.role, \
                     resolved = GREATEST(f.resolved, EXCLUDED.resolved), \
                     held_by_pid = EXCLUDED.held_by_pid, \
                     reported_at = EXCLUDED.reported_at, \
                     run = EXCLUDED.run, \
                     held_at = EXCLUDED.held_at",
                &[
                    (m.system_id as i64).into(),
                    i64::from(m.role).into(),
                    (m.resolved as i64).into(),
                    m.held_by_pid.into(),
                    (m.registered_ms as i64).into(),
                    (m.reported_ms as i64).into(),
                    (m.run.min(i64::MAX as u64) as i64).into(),
                    m.held_at.map(|h| h.min(i64::MAX as u64) as i64).into(),
                ],
            )?;
        }
    }
    let resolved = computed(&f, own);
    Ok(Written { loaded, members, resolved, raised: resolved > f.published })
}

/// After the commit: what was written is durable; `R_f` may be handed out.
pub(super) fn committed(w: Written, now_ms: u64) {
    let mut unplaced = (0, 0);
    let mut f = FLEET.exclusive();
    if let Some((rows, published)) = w.loaded {
        f.published = f.published.max(published);
        f.merge(&rows);
        f.loaded = true;
        unplaced = (f.unplaced, f.members().len());
    }
    for m in w.members {
        let Some(i) = f.find(m.system_id) else { continue };
        let slot = &mut f.members_mut()[i];
        if m.admitting {
            if slot.admitting {
                *slot = MemberSlot::default();
            }
        } else if m.removing {
            slot.removing = false;
            slot.removed = true;
            slot.session_pid = 0;
        } else {
            // Durable as written: unless a session changed its run, its hold or its role meanwhile
            // (`caller::fleet::register`, `admit`), which the next publication writes.
            if slot.run == m.run && slot.held_at == m.held_at && slot.role == m.role {
                slot.persisted = true;
            }
            slot.persisted_resolved = slot.persisted_resolved.max(m.resolved);
        }
    }
    if w.resolved > f.published {
        f.published = w.resolved;
        f.published_ms = now_ms;
    }
    drop(f);
    if unplaced.0 > 0 {
        pgrx::warning!(
            "tsoracle: {} members of tsoracle.fleet_member have no place among the {} of tsoracle.max_members: they are refused (53400) and hold the fleet's resolved timestamp until it is raised (a restart)",
            unplaced.0,
            unplaced.1
        );
    }
}
