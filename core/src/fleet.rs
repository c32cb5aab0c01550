//! The fleet-wide resolved timestamp `R_f` (docs/fleet.md): the arithmetic it rests on.
//!
//! Each member of a fleet has its own resolved timestamp `R_m` over its own transactions
//! (every value at or below it was obtained by a transaction that ended there, and the member
//! will never obtain one again); the oracle has its own `R_o`. Each is a *fact* once computed:
//! it stays true forever. So
//!
//! - a member's entry on the oracle keeps the highest `R_m` it reported ([`MemberEntry::report`]);
//!   any `R_m` it ever reported is true, so the highest is;
//! - `R_f = min(R_o, every registered member's entry)` ([`fleet_resolved`]) is true for every
//!   cluster at once, as long as every member that may obtain values is registered before it
//!   obtains its first one;
//! - a new member's first entry is `min(what it reports, next − 1)` ([`first_entry`]), with
//!   `next` the oracle's next value when the registration is made: a member not yet registered
//!   has obtained nothing from this oracle, so nothing it will obtain is at or below `next − 1`;
//! - what is published is the maximum of every `R_f` computed and of the one persisted
//!   before ([`publish`]): earlier values stay true, so `R_f` never goes down, across a failover
//!   of the oracle too (the new primary starts from the persisted one).
//!
//! A member that stops reporting keeps its entry: it holds `R_f` until it is removed. Nothing
//! here skips it on a timeout.

/// A member's entry on the oracle: the highest resolved timestamp it reported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemberEntry {
    resolved: u64,
}

impl MemberEntry {
    /// An entry as persisted (or as [`first_entry`] made it).
    pub fn new(resolved: u64) -> Self {
        MemberEntry { resolved }
    }

    pub fn resolved(&self) -> u64 {
        self.resolved
    }

    /// A report of the member's `R`: kept if higher; `true` when the entry moved.
    pub fn report(&mut self, resolved: u64) -> bool {
        if resolved > self.resolved {
            self.resolved = resolved;
            true
        } else {
            false
        }
    }
}

/// The entry of a member registered for the first time, while the oracle's next value is
/// `oracle_next` (0 when the oracle has not served yet): it has obtained nothing from this
/// oracle, so every value it will get is at or above `oracle_next`. `reported` is the member's
/// own `R` (0 when it has none yet), a fact too: the lower of the two is kept.
pub fn first_entry(reported: u64, oracle_next: u64) -> MemberEntry {
    let below_next = oracle_next.saturating_sub(1);
    let r = if reported == 0 { below_next } else { reported.min(below_next) };
    MemberEntry::new(r)
}

/// `R_f`: the oracle's own `R` and every member's entry, the lowest of them.
pub fn fleet_resolved(oracle_resolved: u64, members: impl IntoIterator<Item = MemberEntry>) -> u64 {
    members.into_iter().map(|m| m.resolved).fold(oracle_resolved, u64::min)
}

/// What to publish: never below what was published (or persisted) before.
pub fn publish(published: u64, computed: u64) -> u64 {
    published.max(computed)
}

/// The member holding `R_f` back: the index of the lowest entry, if it is below the oracle's
/// own `R` (otherwise the oracle's own transactions or leases hold it).
pub fn holding(oracle_resolved: u64, members: &[MemberEntry]) -> Option<usize> {
    members
        .iter()
        .enumerate()
        .filter(|(_, m)| m.resolved < oracle_resolved)
        .min_by_key(|(_, m)| m.resolved)
        .map(|(i, _)| i)
}

/// Whether a new session may speak for a member already registered with a live session on
/// the oracle: only once that session has been silent (no hello and no report) for at least
/// `silence_ms` on the monotonic clock. A session that still reports belongs to a cluster
/// that is alive: a second one with the same identity (a clone) must not take its place, or
/// its entry would move past what the live one still holds.
pub fn may_take_over(now_mono_ms: u64, last_heard_mono_ms: u64, silence_ms: u64) -> bool {
    now_mono_ms.saturating_sub(last_heard_mono_ms) >= silence_ms
}

/// What a member's session says, at its hello, of the run of its cluster it speaks for
/// (docs/fleet-resolved.md, "One run at a time"): a run is one postmaster's life (`run`: its start, in
/// µs); `prev` is the run this cluster's own table named before this one began (0: none), and
/// `ended_prev` whether this cluster can prove that run ended — it started from a clean
/// shutdown, or it was promoted since it last registered. A snapshot of a running member,
/// started as a primary, proves neither: it recovers from a crash, on the same timeline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunClaim {
    pub run: u64,
    pub prev: u64,
    pub ended_prev: bool,
}

impl RunClaim {
    /// The claim as the hello's version text carries it, after the version as semver build
    /// metadata (`0.6.0+run.<run>.<prev>.<0|1>`): the hello's arguments are unchanged.
    pub fn version_text(&self, version: &str) -> String {
        format!("{version}+run.{}.{}.{}", self.run, self.prev, u8::from(self.ended_prev))
    }

    /// The claim in a hello's version text, and the version without it (`None`: no claim, a
    /// member of an older build).
    pub fn parse(version_text: &str) -> (&str, Option<RunClaim>) {
        let Some((version, meta)) = version_text.split_once("+run.") else {
            return (version_text, None);
        };
        let mut parts = meta.split('.');
        let claim = match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(run), Some(prev), Some(ended), None) => {
                match (run.parse(), prev.parse(), ended) {
                    (Ok(run), Ok(prev), "0" | "1") => {
                        Some(RunClaim { run, prev, ended_prev: ended == "1" })
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        (version, claim)
    }
}

/// How a new session takes an entry over from the run that spoke for it (`speaking`: 0 when
/// the oracle does not know it: a new entry, or the oracle restarted since).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Takeover {
    /// The oracle does not know which run spoke: the new one is taken at its word.
    Unknown,
    /// The same run again (its connection made again, its worker restarted).
    Same,
    /// A run of the same cluster that proves the speaking run ended (a clean restart, a
    /// promotion): the entry moves as the new run reports.
    Succeeds,
    /// Nothing proves the speaking run ended: a copy of the member started beside it, or a
    /// restart after a crash, look the same. The entry is held where it is.
    Unproven,
}

/// How a session claiming `claim` (`None`: it claims nothing) takes over from `speaking`.
pub fn takeover(speaking: u64, claim: Option<RunClaim>) -> Takeover {
    match claim {
        _ if speaking == 0 => Takeover::Unknown,
        Some(c) if c.run == speaking => Takeover::Same,
        Some(c) if c.prev == speaking && c.ended_prev => Takeover::Succeeds,
        _ => Takeover::Unproven,
    }
}

/// The hold on an entry after a takeover: an unproven one holds the entry at what it holds
/// (the last report of the run that spoke, or an earlier hold); any other keeps the hold it
/// had. Only a superuser releases a hold (`tso_fleet_admit`).
pub fn hold_after(how: Takeover, entry: MemberEntry, held_at: Option<u64>) -> Option<u64> {
    match how {
        Takeover::Unproven => Some(held_at.map_or(entry.resolved(), |h| h.min(entry.resolved()))),
        _ => held_at,
    }
}

/// A report of `resolved` on an entry held at `held_at`: never raised above the hold. `true`
/// when the entry moved.
pub fn report_held(entry: &mut MemberEntry, resolved: u64, held_at: Option<u64>) -> bool {
    entry.report(held_at.map_or(resolved, |h| resolved.min(h)))
}

/// The most members `tsoracle.max_members` may admit, and its default.
pub const MAX_MEMBERS_LIMIT: usize = 10_000;
pub const MAX_MEMBERS_DEFAULT: usize = 64;

/// Where the members' slots lie in the oracle's shared-memory block, and how big the block
/// must be: a header of `header` bytes, then `slots` slots of `slot` bytes each at alignment
/// `align` (a power of two), wherever PostgreSQL places the block (it promises only its own
/// `MAXALIGN`, so `align` spare bytes are asked for). `None` on an overflow.
pub fn slots_block(
    header: usize,
    slot: usize,
    align: usize,
    slots: usize,
) -> Option<(usize, usize)> {
    let align = align.max(1);
    let offset = header.checked_next_multiple_of(align)?;
    let total = slot.checked_mul(slots)?.checked_add(offset)?.checked_add(align)?;
    Some((offset, total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_slots_block_holds_every_slot_after_the_header() {
        // 64 slots of 96 bytes at 8 after a 40-byte header: the slots start at 40, and the
        // block has room for them however the block is placed.
        assert_eq!(slots_block(40, 96, 8, 64), Some((40, 40 + 64 * 96 + 8)));
        // A header that is not a multiple of the alignment: the slots start at the next one.
        assert_eq!(slots_block(41, 96, 8, 1), Some((48, 48 + 96 + 8)));
        for n in [1, MAX_MEMBERS_DEFAULT, 1_000, MAX_MEMBERS_LIMIT] {
            let (offset, total) = slots_block(41, 96, 64, n).unwrap();
            assert!(offset >= 41 && offset % 64 == 0);
            // Placed at any address, the aligned start plus every slot still fits.
            for misalign in 0usize..64 {
                let start = misalign.div_ceil(64) * 64 - misalign;
                assert!(start + offset + n * 96 <= total, "{n} slots at {misalign}");
            }
        }
        // The largest setting stays small: about 1 MB with slots of 96 bytes.
        assert!(slots_block(64, 96, 8, MAX_MEMBERS_LIMIT).unwrap().1 < 1 << 20);
        assert_eq!(slots_block(0, usize::MAX, 8, 2), None, "an overflow is refused");
    }

    #[test]
    fn a_copy_is_held_and_a_clean_restart_is_not() {
        let (run, next) = (1_000, 2_000);
        let clean = RunClaim { run: next, prev: run, ended_prev: true };
        assert_eq!(takeover(run, Some(clean)), Takeover::Succeeds);
        // A snapshot copy: same predecessor, no proof it ended.
        assert_eq!(
            takeover(run, Some(RunClaim { ended_prev: false, ..clean })),
            Takeover::Unproven
        );
        // A cold copy of a stopped member, after the original started again: another prev.
        assert_eq!(takeover(next, Some(RunClaim { run: 3_000, ..clean })), Takeover::Unproven);
        assert_eq!(
            takeover(run, Some(RunClaim { run, prev: 7, ended_prev: false })),
            Takeover::Same
        );
        assert_eq!(takeover(run, None), Takeover::Unproven);
        assert_eq!(takeover(0, None), Takeover::Unknown);
        let mut e = MemberEntry::new(50);
        let held = hold_after(Takeover::Unproven, e, None);
        assert_eq!(held, Some(50));
        assert!(!report_held(&mut e, 80, held), "held at 50");
        assert_eq!(e.resolved(), 50);
        assert_eq!(RunClaim::parse("0.6.0"), ("0.6.0", None));
        assert_eq!(RunClaim::parse("0.6.0+run.1.2.3"), ("0.6.0", None));
        assert_eq!(RunClaim::parse(&clean.version_text("0.6.0")), ("0.6.0", Some(clean)));
    }

    #[test]
    fn the_lowest_of_the_oracle_and_its_members() {
        assert_eq!(fleet_resolved(100, []), 100, "no member: the oracle's own R");
        let m = [MemberEntry::new(70), MemberEntry::new(40)];
        assert_eq!(fleet_resolved(100, m), 40);
        assert_eq!(holding(100, &m), Some(1));
        assert_eq!(fleet_resolved(30, m), 30, "the oracle's own transactions hold it");
        assert_eq!(holding(30, &m), None);
    }

    #[test]
    fn a_new_member_starts_below_the_oracles_next_value() {
        assert_eq!(first_entry(0, 500).resolved(), 499, "nothing reported yet");
        assert_eq!(first_entry(300, 500).resolved(), 300, "its own R, lower");
        assert_eq!(first_entry(900, 500).resolved(), 499, "an R from elsewhere is capped");
        assert_eq!(first_entry(0, 0).resolved(), 0, "an oracle that served nothing");
    }

    #[test]
    fn a_report_only_raises() {
        let mut m = MemberEntry::new(50);
        assert!(!m.report(40), "an older report");
        assert_eq!(m.resolved(), 50);
        assert!(m.report(60));
        assert_eq!(m.resolved(), 60);
    }

    proptest! {
        /// After an unproven takeover, no report of any run raises the entry above what it
        /// held when the takeover came, whatever takeovers follow, until the hold is
        /// released: the value the old run still holds stays above `R_f`.
        #[test]
        fn an_unproven_takeover_holds_the_entry_for_good(
            start in 0u64..1_000_000,
            steps in proptest::collection::vec(
                (0u64..2_000_000, proptest::option::of((1u64..5, 0u64..5, any::<bool>()))),
                1..40,
            ),
        ) {
            let mut entry = MemberEntry::new(start);
            let mut held = None;
            let mut speaking = 1u64;
            let mut ceiling = u64::MAX;
            for (report, claim) in steps {
                if let Some((run, prev, ended_prev)) = claim {
                    let c = RunClaim { run, prev, ended_prev };
                    let how = takeover(speaking, Some(c));
                    held = hold_after(how, entry, held);
                    if how == Takeover::Unproven {
                        ceiling = ceiling.min(entry.resolved());
                        prop_assert_eq!(held, Some(ceiling));
                    }
                    speaking = run;
                }
                report_held(&mut entry, report, held);
                prop_assert!(entry.resolved() <= ceiling);
                if held.is_none() {
                    prop_assert_eq!(ceiling, u64::MAX, "a hold is never dropped by a takeover");
                }
            }
        }

        /// A claim survives the hello's version text, and the version is read as before.
        #[test]
        fn a_claim_round_trips_through_the_version_text(
            run in any::<u64>(), prev in any::<u64>(), ended_prev in any::<bool>(),
        ) {
            let c = RunClaim { run, prev, ended_prev };
            let text = c.version_text("0.6.0");
            prop_assert_eq!(RunClaim::parse(&text), ("0.6.0", Some(c)));
        }

        /// A model: members obtain values from one counter and hold them in open
        /// transactions; each reports its true R now and then, possibly late. Every R_f
        /// published is below every value still held anywhere, and never decreases.
        #[test]
        fn published_r_f_is_below_everything_still_held(
            steps in proptest::collection::vec((0usize..3, 0u8..4), 1..300),
        ) {
            let mut next: u64 = 1;
            // held[m]: values members hold in open transactions (index 2 is the oracle).
            let mut held: Vec<Vec<u64>> = vec![Vec::new(); 3];
            // Each member's own R: everything below its lowest held value and below what it
            // may still obtain (the counter's next when it computes it).
            let own_r = |held: &Vec<u64>, next: u64| held.iter().copied().min().unwrap_or(next).min(next) - 1;
            let mut entries = [first_entry(0, next), first_entry(0, next)];
            let mut published = 0u64;
            for (who, what) in steps {
                match what {
                    0 => { held[who].push(next); next += 1; }
                    1 => { if !held[who].is_empty() { held[who].remove(0); } }
                    2 => if who < 2 { entries[who].report(own_r(&held[who], next)); },
                    _ => {
                        let before = published;
                        published = publish(published, fleet_resolved(own_r(&held[2], next), entries));
                        prop_assert!(published >= before);
                        for h in held.iter().flatten() {
                            prop_assert!(*h > published, "R_f {} passed a held value {}", published, h);
                        }
                    }
                }
            }
        }
    }
}
