//! The fence's arithmetic (docs/worker.md, "The fence"): where the oracle may start serving
//! after a start, crash restart, promotion, restore or seed, and what it commits first.
//! The worker does the I/O around exactly these functions.

use crate::error::CoreError;
use crate::timestamp::MAX_SQL_PHYSICAL_MS;

/// The floor of a new epoch: strictly above the durable high-water read from the table and
/// above the highest one this server committed in its lifetime (the table may have been
/// recreated or restored lower underneath it), at least the clock, and at least a requested
/// seed. Every timestamp issued before the fence has a physical part at most one of those
/// high-waters, so below the floor.
/// `PhysicalOutOfRange` when the floor would be above the last millisecond a timestamp can be
/// issued in (the oracle then refuses to serve rather than fence in a loop).
pub fn floor_ms(
    durable_ms: u64,
    remembered_ms: u64,
    now_ms: u64,
    seed_ms: u64,
) -> Result<u64, CoreError> {
    let floor = durable_ms.max(remembered_ms).saturating_add(1).max(now_ms).max(seed_ms);
    if floor > MAX_SQL_PHYSICAL_MS {
        return Err(CoreError::PhysicalOutOfRange(floor));
    }
    Ok(floor)
}

/// What the fence commits ("advance to at least"): `failover_advance_ms` above the floor,
/// within the timestamp range. Never below the floor.
pub fn request_ms(floor_ms: u64, failover_advance_ms: u64) -> u64 {
    floor_ms.saturating_add(failover_advance_ms).min(MAX_SQL_PHYSICAL_MS).max(floor_ms)
}

/// The epoch a fence commits: the WAL timeline it runs on plus the base this cluster keeps
/// (`tsoracle.epoch_base`), never below the epoch the durable row already has (`prior`) nor
/// a restore's (`seed`).
///
/// The epoch is what lets a member refuse a deposed primary: a promoted standby must fence at
/// a higher epoch than any fence of the primary it replaced. The timeline alone does that
/// until the epoch is carried above it — `pg_upgrade` starts the timeline again at 1 while
/// the row keeps the epoch, and a restore can bring a higher one — after which the timeline
/// rises through failovers without raising the epoch. [`base_after`] keeps the difference
/// durably, so that each later promotion (a higher timeline, the base replicated) raises the
/// epoch again; a restart on the same timeline gives the same epoch, not a higher one.
pub fn epoch(prior: u64, base: u64, timeline: u64, seed: u64) -> u64 {
    // Stored as a bigint: never above its top (where a promotion can raise it no more).
    base.saturating_add(timeline).max(prior).max(seed).min(i64::MAX as u64)
}

/// The base to keep after a fence committed `epoch` on `timeline`: `epoch - timeline`, so
/// that [`epoch`] on a later timeline is above it.
pub fn base_after(epoch: u64, timeline: u64) -> u64 {
    epoch.saturating_sub(timeline)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_floor_starts_above_every_high_water() {
        assert_eq!(floor_ms(0, 0, 1_000, 0), Ok(1_000), "a first fence starts at the clock");
        assert_eq!(floor_ms(5_000, 0, 1_000, 0), Ok(5_001), "above the durable high-water");
        assert_eq!(floor_ms(5_000, 9_000, 1_000, 0), Ok(9_001), "above what this server committed");
        assert_eq!(floor_ms(5_000, 0, 1_000, 7_000), Ok(7_000), "at the seed");
        assert_eq!(
            floor_ms(MAX_SQL_PHYSICAL_MS, 0, 0, 0),
            Err(CoreError::PhysicalOutOfRange(MAX_SQL_PHYSICAL_MS + 1))
        );
        assert_eq!(request_ms(1_000, 500), 1_500);
        assert_eq!(request_ms(MAX_SQL_PHYSICAL_MS, 500), MAX_SQL_PHYSICAL_MS);
    }

    #[test]
    fn a_failover_after_pg_upgrade_raises_the_epoch() {
        // Failed over once (timeline 2, epoch 2), then pg_upgrade: timeline 1, epoch 2 kept.
        let upgraded = epoch(2, 0, 1, 0);
        assert_eq!(upgraded, 2);
        let base = base_after(upgraded, 1);
        // Restarted: the same epoch. Its standby promoted (timeline 2): a higher one.
        assert_eq!(epoch(upgraded, base, 1, 0), 2);
        assert_eq!(epoch(upgraded, base, 2, 0), 3, "the timeline alone would give 2 again");
        // Without a base (no restore, no upgrade) the epoch is the timeline, as before 0.6.0.
        assert_eq!(epoch(3, 0, 4, 0), 4);
        assert_eq!(epoch(0, 0, 1, 0), 1);
    }

    proptest! {
        /// From any state a fence leaves (epoch `e` on timeline `t`, its base kept): a restart
        /// on the same timeline fences at `e` again, and a promotion to a higher timeline (its
        /// row and base replicated) fences strictly above `e`; the epoch is never below the
        /// row's, the seed or the timeline.
        #[test]
        fn a_promotion_always_raises_the_epoch_and_a_restart_never_does(
            prior in 0u64..1_000_000,
            base in 0u64..1_000_000,
            timeline in 1u64..1_000_000,
            seed in 0u64..1_000_000,
            up in 1u64..1_000,
        ) {
            let e = epoch(prior, base, timeline, seed);
            prop_assert!(e >= prior && e >= seed && e >= timeline);
            let kept = base_after(e, timeline).max(base);
            prop_assert_eq!(epoch(e, kept, timeline, 0), e, "a restart");
            prop_assert!(epoch(e, kept, timeline + up, 0) > e, "a promotion");
        }

        /// The floor is above both high-waters, at least the clock and the seed, and the
        /// request is between the floor and the top of the range.
        #[test]
        fn floor_and_request_bound_everything_before(
            durable in 0u64..=MAX_SQL_PHYSICAL_MS,
            remembered in 0u64..=MAX_SQL_PHYSICAL_MS,
            now in 0u64..=u64::MAX,
            seed in 0u64..=MAX_SQL_PHYSICAL_MS,
            advance in 0u64..=3_600_000,
        ) {
            match floor_ms(durable, remembered, now, seed) {
                Ok(floor) => {
                    prop_assert!(floor > durable && floor > remembered);
                    prop_assert!(floor >= now && floor >= seed);
                    prop_assert!(floor <= MAX_SQL_PHYSICAL_MS);
                    let request = request_ms(floor, advance);
                    prop_assert!(request >= floor && request <= MAX_SQL_PHYSICAL_MS);
                    prop_assert!(request == (floor + advance).min(MAX_SQL_PHYSICAL_MS));
                }
                Err(_) => prop_assert!(
                    durable.max(remembered) >= MAX_SQL_PHYSICAL_MS || now > MAX_SQL_PHYSICAL_MS
                ),
            }
        }
    }
}
