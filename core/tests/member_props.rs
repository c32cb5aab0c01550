//! Properties of a member's proxy arithmetic (`tsoracle_core::member`).

use proptest::prelude::*;
use tsoracle_core::member::{
    floor_after, next_answer, parse_next_answer, split, EpochGate, MemberIdentity, OracleRefused,
    OracleSeen, OwnPast,
};
use tsoracle_core::timestamp::{pack, MAX_LOGICAL};

proptest! {
    /// The calls' ranges are disjoint, in order, tile the answer exactly, and all lie below
    /// the floor that follows it.
    #[test]
    fn split_tiles_the_answer(first in 0u64..(1 << 62), counts in prop::collection::vec(1u32..=262_144, 1..64)) {
        let total: u32 = counts.iter().sum();
        let starts = split(first, &counts);
        prop_assert_eq!(starts.len(), counts.len());
        prop_assert_eq!(starts[0], first);
        for i in 1..starts.len() {
            prop_assert_eq!(starts[i], starts[i - 1] + u64::from(counts[i - 1]));
        }
        let end = starts[starts.len() - 1] + u64::from(counts[counts.len() - 1]);
        prop_assert_eq!(end, floor_after(first, total));
    }

    /// An answer of `tsoracle.member_next` reads back as what the oracle sent; any other text
    /// is refused, never read as a value.
    #[test]
    fn a_next_answer_reads_back_and_nothing_else_does(first: u64, epoch: u64, junk in "[ -~]{0,24}") {
        prop_assert_eq!(parse_next_answer(&format!("{{{first},{epoch}}}")), Some((first, epoch)));
        // The oracle's text, the bytes of the array's: the same answer.
        prop_assert_eq!(next_answer(first, epoch), format!("{{{first},{epoch}}}"));
        let well_formed = junk.strip_prefix('{').and_then(|j| j.strip_suffix('}')).and_then(|j| {
            let (a, b) = j.split_once(',')?;
            Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?))
        });
        prop_assert_eq!(parse_next_answer(&junk), well_formed);
        for bad in ["", "{}", "{1}", "{1,2,3}", "{-1,2}", "1,2", "{1,2", "{ 1,2}", "{NULL,2}"] {
            prop_assert_eq!(parse_next_answer(bad), None, "{}", bad);
        }
    }

    /// Once an epoch is seen, no older one is ever accepted, whatever comes in between.
    #[test]
    fn an_older_epoch_is_never_accepted(epochs in prop::collection::vec(0u64..20, 1..50)) {
        let mut gate = EpochGate::default();
        let mut highest = 0u64;
        for e in epochs {
            let accepted = gate.accept(e).is_ok();
            prop_assert_eq!(accepted, e >= highest);
            highest = highest.max(e);
            prop_assert_eq!(gate.seen(), highest);
        }
    }
}

proptest! {
    /// A cluster that joined a fleet hands out no timestamp of the oracle that it could have
    /// issued on its own (every one in a millisecond at or below its high-water), and every
    /// one it admits is above all of those.
    #[test]
    fn own_past_admits_only_timestamps_above_all_it_issued(
        high_water_ms in 0u64..(1 << 45),
        physical in 0u64..(1 << 45),
        logical in 0u64..=MAX_LOGICAL,
    ) {
        let own = OwnPast::new(high_water_ms, Vec::new());
        let ts = pack(physical, logical).unwrap();
        let highest_own = pack(high_water_ms, MAX_LOGICAL).unwrap();
        prop_assert_eq!(own.check_timestamps(ts).is_ok(), ts > highest_own);
        prop_assert_eq!(own.check_lease(physical).is_ok(), physical > high_water_ms);
    }

    /// A block of a key is admitted exactly when it starts at or above where the cluster's own
    /// counter of that key stood (the highest, if the key was read twice); other keys pass.
    #[test]
    fn own_past_admits_only_blocks_above_its_own_counters(
        nexts in prop::collection::vec(0u64..1000, 1..4),
        start in 0u64..1200,
    ) {
        let own = OwnPast::new(0, nexts.iter().map(|n| ("k".to_string(), *n)));
        let next = *nexts.iter().max().unwrap();
        prop_assert_eq!(own.check_block("k", start).is_ok(), start >= next);
        prop_assert!(own.check_block("other", start).is_ok());
    }
}

proptest! {
    /// A member admits an oracle only if it is the cluster that served it before (or none
    /// did), serving, and at an epoch no older than any seen; what it then remembers never
    /// goes back, so a deposed primary stays refused whatever the order of hellos.
    #[test]
    fn a_member_admits_only_its_oracle_at_no_older_epoch(
        seen_id in 0u64..4,
        seen_epoch in 0u64..6,
        hellos in prop::collection::vec((1u64..4, 0u64..8), 1..12),
    ) {
        let mut seen = OracleSeen { system_id: seen_id, epoch: seen_epoch };
        for (system_id, epoch) in hellos {
            match seen.admit(system_id, epoch) {
                Ok(next) => {
                    prop_assert!(seen.system_id == 0 || seen.system_id == system_id);
                    prop_assert!(epoch >= seen.epoch && epoch > 0);
                    prop_assert_eq!(next, OracleSeen { system_id, epoch });
                    seen = next;
                }
                Err(OracleRefused::Other { .. }) => {
                    prop_assert!(seen.system_id != 0 && seen.system_id != system_id)
                }
                Err(OracleRefused::NotServing) => prop_assert_eq!(epoch, 0),
                Err(OracleRefused::Stale(_)) => prop_assert!(epoch < seen.epoch),
            }
        }
    }

    /// A successor named after the oracle's `pg_upgrade` is the only cluster admitted from
    /// then on (the old oracle and any other cluster are refused), and only at an epoch no
    /// older than the highest seen: naming it never lowers what the member remembers.
    #[test]
    fn a_named_successor_is_the_only_oracle_admitted_and_never_older(
        seen_id in 0u64..4,
        seen_epoch in 0u64..6,
        successor in prop::option::of(0u64..4),
        hellos in prop::collection::vec((1u64..4, 0u64..8), 1..12),
    ) {
        let seen = OracleSeen { system_id: seen_id, epoch: seen_epoch };
        let named = seen.succeeded_by(successor);
        prop_assert_eq!(named.epoch, seen_epoch);
        match successor {
            Some(id) if id != 0 => prop_assert_eq!(named.system_id, id),
            _ => prop_assert_eq!(named, seen),
        }
        for (system_id, epoch) in hellos {
            if let Ok(next) = named.admit(system_id, epoch) {
                prop_assert!(epoch >= seen_epoch && epoch > 0);
                match successor {
                    Some(id) if id != 0 => prop_assert_eq!(system_id, id),
                    _ => prop_assert!(seen_id == 0 || system_id == seen_id),
                }
                prop_assert_eq!(next.epoch, epoch);
            }
        }
    }

    /// Merging two memories keeps the highest epoch and a known system identifier.
    #[test]
    fn merged_memories_keep_the_highest_epoch(a_id in 0u64..3, a in 0u64..9, b_id in 0u64..3, b in 0u64..9) {
        let m = OracleSeen { system_id: a_id, epoch: a }.merge(OracleSeen { system_id: b_id, epoch: b });
        prop_assert_eq!(m.epoch, a.max(b));
        prop_assert_eq!(m.system_id, if a_id != 0 { a_id } else { b_id });
    }
}

proptest! {
    /// A second session takes a member over only after the first was silent for the whole
    /// window on the monotonic clock; a session heard from within it keeps the member.
    #[test]
    fn a_member_is_taken_over_only_after_silence(
        heard in 0u64..1_000_000,
        since in 0u64..20_000,
        silence in 1u64..10_000,
    ) {
        let now = heard + since;
        prop_assert_eq!(tsoracle_core::fleet::may_take_over(now, heard, silence), since >= silence);
        // A clock read before the last report (another process's) never allows it early.
        prop_assert!(!tsoracle_core::fleet::may_take_over(heard.saturating_sub(since), heard, silence));
    }
}

proptest! {
    /// A member takes an identity of its own only when it was promoted since its identity was
    /// registered (another timeline) and the oracle refused it for the whole wait; the new one
    /// is none that a copy of it, or no member, goes by.
    #[test]
    fn a_member_takes_its_own_identity_only_when_promoted_and_refused_throughout(
        id: u64,
        system_id: u64,
        registered in proptest::option::of(1u32..5),
        timeline in 1u32..5,
        refused_for in 0u64..20_000,
        wait in 0u64..10_000,
        random: u64,
    ) {
        let me = MemberIdentity { id, timeline: registered };
        let takes = me.takes_its_own(timeline, refused_for, wait);
        prop_assert_eq!(takes, registered != Some(timeline) && refused_for >= wait);
        let fresh = me.fresh(system_id, random);
        prop_assert!(fresh != 0 && fresh != id && fresh != system_id);
    }
}
