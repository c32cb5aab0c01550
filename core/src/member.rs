//! A member of a fleet (docs/fleet.md): the arithmetic its proxy rests on.
//!
//! - [`split`]: one answer `[first, first + total)` from the oracle, handed to the calls that
//!   shared its round trip, in order: each gets a range of its own, and together they tile it.
//! - [`floor_after`]: where every later value from the oracle starts, once an answer came.
//! - [`EpochGate`]: answers from an epoch older than one already seen are refused.
//! - [`OwnPast`]: what a cluster issued on its own before it joined the fleet; nothing the
//!   oracle answers at or below it is handed out.
//! - [`HandedBlock`] and [`CountersToKeep`]: the last block of each counter a member handed
//!   out, with the key's incarnation on the oracle (`made`); an answer
//!   below it ([`OwnPast::check_handed`]) is refused, and a lagging copy of it is kept in the
//!   member's `tsoracle.member_counter` so that it is refused after a restart too.
//! - [`OracleSeen`]: the oracle a member was served by, kept durably: another cluster, or an
//!   older epoch, is refused after any restart.
//! - [`above_fetched`] and [`kept_past_ms`]: a member's own past as a member. Nothing the
//!   oracle answers below what it fetched before in this server's life is handed out; and a
//!   lagging bound of it, kept in the member's own high-water, makes [`OwnPast`] refuse it
//!   after a restart too.
//! - [`lease_above_resolved`]: a lease grant is handed out only if its holder's lowest stamp
//!   is above the member's resolved timestamp (a lost answer's idempotent re-grant may not be).

/// The first value of each call's range, for calls asking `counts` values each, out of the
/// answer that starts at `first` (the oracle answered `counts.iter().sum()` values).
pub fn split(first: u64, counts: &[u32]) -> Vec<u64> {
    let mut at = first;
    counts
        .iter()
        .map(|&c| {
            let start = at;
            at = at.saturating_add(u64::from(c));
            start
        })
        .collect()
}

/// One past the highest value of an answer `[first, first + total)`: the oracle issued every
/// value of it before the round trip came back, so every value fetched after is above.
pub fn floor_after(first: u64, total: u32) -> u64 {
    first.saturating_add(u64::from(total))
}

/// The oracle's answer to a member's round trip, read by [`parse_next_answer`]: the bytes
/// of a `bigint[]` of the two as text. Written on every round trip, without `format!`.
pub fn next_answer(first: u64, epoch: u64) -> String {
    let mut out = Vec::with_capacity(2 * 20 + 3);
    out.push(b'{');
    push_decimal(&mut out, first);
    out.push(b',');
    push_decimal(&mut out, epoch);
    out.push(b'}');
    // ASCII digits, braces and a comma: always UTF-8 (an empty answer would be refused).
    String::from_utf8(out).unwrap_or_default()
}

fn push_decimal(out: &mut Vec<u8>, mut v: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// The oracle's answer to `tsoracle.member_next(n)` as text, `{first,epoch}` (a `bigint[]`
/// of two, or [`next_answer`]'s text): the first of the `n` values and the oracle's epoch.
/// Anything else is `None`.
pub fn parse_next_answer(text: &str) -> Option<(u64, u64)> {
    let inner = text.strip_prefix('{')?.strip_suffix('}')?;
    let (first, epoch) = inner.split_once(',')?;
    Some((first.parse().ok()?, epoch.parse().ok()?))
}

/// The highest epoch of the oracle seen in answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EpochGate {
    seen: u64,
}

/// An answer from an epoch older than one seen: a deposed primary still answering.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the oracle answered from epoch {got}, older than epoch {seen} it answered before: a deposed primary")]
pub struct StaleEpoch {
    pub got: u64,
    pub seen: u64,
}

impl EpochGate {
    pub fn new(seen: u64) -> Self {
        EpochGate { seen }
    }

    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// Accept an answer of `epoch` (and remember it if higher), or refuse it.
    pub fn accept(&mut self, epoch: u64) -> Result<(), StaleEpoch> {
        if epoch < self.seen {
            return Err(StaleEpoch { got: epoch, seen: self.seen });
        }
        self.seen = epoch;
        Ok(())
    }
}

/// An answer of the oracle whose first value is below what this member fetched before: never
/// correct (a deposed primary, an oracle restored or replaced behind the member's back).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the oracle answered {first}, below {floor}, one past the highest value it answered this member before: a deposed primary, or an oracle that went back")]
pub struct BelowFetched {
    pub first: u64,
    pub floor: u64,
}

/// An answer of the oracle that starts at `first` may be handed out by a member that fetched
/// every value below `floor` (one past the highest value of every answer it fetched before in
/// this server's life, 0 for none): a correct oracle issued each later answer after the earlier
/// ones came back (on one connection, in order; on a new one, after the old one's answers were
/// read), so above all of them. Only a wrong oracle is refused.
pub fn above_fetched(first: u64, floor: u64) -> Result<(), BelowFetched> {
    if first >= floor {
        Ok(())
    } else {
        Err(BelowFetched { first, floor })
    }
}

/// The bound a member keeps durably in its own high-water (`tsoracle.high_water.physical_ms`)
/// once it fetched every value below `floor`: the millisecond before that of the highest value
/// fetched. It lags (what it fetched in that millisecond is not covered), so that every later
/// answer of a correct oracle, and every lease it grants later, is in a millisecond above it,
/// and [`OwnPast`] (which refuses a millisecond at or below its high-water) never refuses one.
pub fn kept_past_ms(floor: u64) -> u64 {
    match floor {
        0 => 0,
        f => crate::timestamp::physical_ms(f - 1).saturating_sub(1),
    }
}

/// A lease grant whose holder may stamp from millisecond `from_ms` is below what this member's
/// resolved timestamp may reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the lease's lowest stamp (millisecond {from_ms}) is at or below this member's resolved timestamp {resolved} or the value {held} it held the resolved timestamp below while the grant was in flight: an answer granted before and lost")]
pub struct LeaseBelowResolved {
    pub from_ms: u64,
    pub held: u64,
    pub resolved: u64,
}

/// A lease grant through a member, whose holder stamps from millisecond `from_ms` on, may be
/// handed out: its first stamp is above `resolved` (the highest resolved timestamp this member
/// computed or published) and at or above `held` (the value the worker's holder slot held the
/// resolved timestamp below while the grant was in flight, so that no resolved timestamp
/// computed before the grant is published passes it). A grant the oracle made for this call
/// always is (its lowest stamp is past a value the oracle issued after the member fetched
/// everything below `held`); the idempotent re-grant of one whose answer was lost may not be.
pub fn lease_above_resolved(
    from_ms: u64,
    held: u64,
    resolved: u64,
) -> Result<(), LeaseBelowResolved> {
    let first = crate::timestamp::pack(from_ms.min(crate::timestamp::MAX_PHYSICAL_MS), 0)
        .unwrap_or(u64::MAX);
    if first > resolved && first >= held {
        Ok(())
    } else {
        Err(LeaseBelowResolved { from_ms, held, resolved })
    }
}

/// What a cluster issued on its own, as its own tables hold it when its worker starts as a
/// member: the durable high-water (every timestamp it issued, and every lease bound it granted,
/// is in a millisecond at or below it) and the counters (every block it granted of a key is
/// below the key's `next`). A cluster that joins a fleet has the oracle seeded above both
/// (docs/operations/fleet.md); one that joined without it must not hand out the oracle's
/// values that repeat its own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnPast {
    high_water_ms: u64,
    counters: std::collections::HashMap<String, u64>,
    handed: std::collections::BTreeMap<String, HandedBlock>,
}

/// The last block of a counter a member handed out, as the oracle answered it: the key's
/// incarnation on the oracle (`made`: a timestamp the oracle issued when it created the key's
/// row, so a key dropped and created again has a higher one; 0 for a row from before 0.6.0)
/// and one past the block's last value.
///
/// A correct oracle's later answers for the key are never below it: its incarnation does not
/// go back, and within one incarnation its counter only moves forward. An answer below it
/// comes from an oracle gone back (a deposed primary, a restored copy).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HandedBlock {
    pub made: u64,
    pub end: u64,
}

impl HandedBlock {
    /// What is kept once `later` was handed out after `self`: the end within the newest
    /// incarnation.
    pub fn merge(self, later: HandedBlock) -> HandedBlock {
        match later.made.cmp(&self.made) {
            std::cmp::Ordering::Greater => later,
            std::cmp::Ordering::Equal => {
                HandedBlock { made: self.made, end: self.end.max(later.end) }
            }
            std::cmp::Ordering::Less => self,
        }
    }

    /// A block from `start` on, from incarnation `made`, repeats nothing of what `self`
    /// covers.
    pub fn admits(&self, made: u64, start: u64) -> bool {
        made > self.made || (made == self.made && start >= self.end)
    }
}

/// `block` of `key` was handed out: `blocks` keeps, per key, the merge of all of them.
fn note_block(
    blocks: &mut std::collections::BTreeMap<String, HandedBlock>,
    key: &str,
    block: HandedBlock,
) {
    match blocks.get_mut(key) {
        Some(at) => *at = at.merge(block),
        None => {
            blocks.insert(key.to_string(), block);
        }
    }
}

/// A value from the oracle that repeats one this cluster issued on its own.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BelowOwnPast {
    #[error("the oracle's timestamps are in millisecond {got_ms}, at or below this cluster's own high-water {high_water_ms} ms: this cluster issued timestamps there on its own before it joined the fleet, or handed them out as a member")]
    Timestamps { got_ms: u64, high_water_ms: u64 },
    #[error("the oracle's block of counter \"{key}\" starts at {start}, below {next}, where this cluster's own counter stood before it joined the fleet")]
    Counter { key: String, start: u64, next: u64 },
    #[error("the oracle's block of counter \"{key}\" (from {start}, incarnation {made}) is below the blocks of it this cluster handed out as a member (up to {}, incarnation {}): the oracle went back", kept.end, kept.made)]
    HandedOut { key: String, start: u64, made: u64, kept: HandedBlock },
}

impl OwnPast {
    /// The past read from the cluster's own tables: its high-water (0 if it never served on
    /// its own) and each counter's `next`.
    pub fn new(high_water_ms: u64, counters: impl IntoIterator<Item = (String, u64)>) -> Self {
        let mut map = std::collections::HashMap::new();
        for (key, next) in counters {
            let at = map.entry(key).or_insert(0);
            *at = next.max(*at);
        }
        OwnPast { high_water_ms, counters: map, handed: Default::default() }
    }

    /// With the blocks this cluster handed out as a member, as its `tsoracle.member_counter`
    /// holds them.
    pub fn with_handed(mut self, blocks: impl IntoIterator<Item = (String, HandedBlock)>) -> Self {
        for (key, block) in blocks {
            self.handed_out(&key, block);
        }
        self
    }

    /// A block of `key` was handed out as a member: every later answer must be above it.
    pub fn handed_out(&mut self, key: &str, block: HandedBlock) {
        note_block(&mut self.handed, key, block);
    }

    /// The oracle's block of `key` from `start` on, from incarnation `made`, may be handed
    /// out: above every block of the key this member handed out ([`Self::check_handed`]),
    /// and at or above the counter this cluster had of the key before it joined
    /// ([`Self::check_block`]) unless the key was dropped and made again since this member
    /// handed out a block of it (a newer incarnation than the one kept: the drop restarted
    /// the key for the whole fleet, this cluster's own values of it included).
    pub fn check_counter(&self, key: &str, made: u64, start: u64) -> Result<(), BelowOwnPast> {
        self.check_handed(key, made, start)?;
        match self.handed.get(key) {
            Some(kept) if made > kept.made => Ok(()),
            _ => self.check_block(key, start),
        }
    }

    /// The oracle's block of `key` from `start` on, from incarnation `made`, may be handed
    /// out: it is above every block of the key handed out as a member.
    pub fn check_handed(&self, key: &str, made: u64, start: u64) -> Result<(), BelowOwnPast> {
        match self.handed.get(key) {
            Some(kept) if !kept.admits(made, start) => {
                Err(BelowOwnPast::HandedOut { key: key.to_string(), start, made, kept: *kept })
            }
            _ => Ok(()),
        }
    }

    pub fn high_water_ms(&self) -> u64 {
        self.high_water_ms
    }

    /// The oracle's timestamps from `first` on (an answer is ascending) may be handed out:
    /// their millisecond is past every one this cluster issued in.
    pub fn check_timestamps(&self, first: u64) -> Result<(), BelowOwnPast> {
        let got_ms = crate::timestamp::physical_ms(first);
        if got_ms > self.high_water_ms {
            Ok(())
        } else {
            Err(BelowOwnPast::Timestamps { got_ms, high_water_ms: self.high_water_ms })
        }
    }

    /// A lease whose holder stamps from millisecond `lower_bound_ms` on may be handed out.
    pub fn check_lease(&self, lower_bound_ms: u64) -> Result<(), BelowOwnPast> {
        if lower_bound_ms > self.high_water_ms {
            Ok(())
        } else {
            Err(BelowOwnPast::Timestamps {
                got_ms: lower_bound_ms,
                high_water_ms: self.high_water_ms,
            })
        }
    }

    /// A block of `key` from `start` on may be handed out: it starts at or above every value
    /// this cluster granted of the key itself.
    pub fn check_block(&self, key: &str, start: u64) -> Result<(), BelowOwnPast> {
        match self.counters.get(key) {
            Some(&next) if start < next => {
                Err(BelowOwnPast::Counter { key: key.to_string(), start, next })
            }
            _ => Ok(()),
        }
    }
}

/// The blocks a member handed out that its `tsoracle.member_counter` does not hold yet:
/// written in the transaction that publishes its resolved timestamp, so that [`OwnPast`] read
/// back after a restart refuses below them. It lags as the kept high-water does: blocks
/// handed out after the last publication are not kept yet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CountersToKeep {
    pending: std::collections::BTreeMap<String, HandedBlock>,
}

impl CountersToKeep {
    /// A block of `key` was handed out.
    pub fn handed_out(&mut self, key: &str, block: HandedBlock) {
        note_block(&mut self.pending, key, block);
    }

    /// What to write now: each key that moved since its last write.
    pub fn due(&self) -> Vec<(String, HandedBlock)> {
        self.pending.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }

    /// `written` (a `due()` before) committed: keys that moved no further since are done.
    pub fn kept(&mut self, written: &[(String, HandedBlock)]) {
        for (key, block) in written {
            if self.pending.get(key) == Some(block) {
                self.pending.remove(key);
            }
        }
    }
}

/// The oracle a member was served by, as the member keeps it durably (`tsoracle.member_oracle`):
/// its system identifier (0: none yet) and the highest epoch it answered with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OracleSeen {
    pub system_id: u64,
    pub epoch: u64,
}

/// Why an oracle's hello is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OracleRefused {
    #[error("the oracle is another cluster (system identifier {got}, not {seen})")]
    Other { got: u64, seen: u64 },
    #[error("the oracle is not serving (epoch 0): its fence has not run, or it was handed over")]
    NotServing,
    #[error(transparent)]
    Stale(#[from] StaleEpoch),
}

impl OracleSeen {
    /// The larger of two memories of the same oracle (in memory, and the durable one).
    pub fn merge(self, other: OracleSeen) -> OracleSeen {
        OracleSeen {
            system_id: if self.system_id != 0 { self.system_id } else { other.system_id },
            epoch: self.epoch.max(other.epoch),
        }
    }

    /// The same memory, with the oracle's system identifier replaced by `successor` when one is
    /// named (`tsoracle.oracle_successor`, docs/operations/fleet/pg-upgrade.md): `pg_upgrade`
    /// gives the upgraded oracle a new system identifier, and a superuser names it on each
    /// member. The highest epoch seen is kept, so the successor is admitted only at an epoch no
    /// older than any the member saw; and every other cluster (the old oracle started again,
    /// a copy of it upgraded apart) is refused as another cluster from then on. `None` or 0:
    /// unchanged.
    pub fn succeeded_by(self, successor: Option<u64>) -> OracleSeen {
        match successor {
            Some(id) if id != 0 => OracleSeen { system_id: id, epoch: self.epoch },
            _ => self,
        }
    }

    /// An oracle's hello, answering with `system_id` and `epoch`: what to remember from now on,
    /// or why it is refused (another cluster than the one seen before, an oracle that is not
    /// serving, or an epoch older than one seen: a deposed primary).
    pub fn admit(self, system_id: u64, epoch: u64) -> Result<OracleSeen, OracleRefused> {
        if self.system_id != 0 && system_id != self.system_id {
            return Err(OracleRefused::Other { got: system_id, seen: self.system_id });
        }
        if epoch == 0 {
            return Err(OracleRefused::NotServing);
        }
        EpochGate::new(self.epoch).accept(epoch)?;
        Ok(OracleSeen { system_id, epoch })
    }
}

/// A member's identity in the fleet, as `tsoracle.member_identity` keeps it: the number it
/// registers under on the oracle (its system identifier until it takes one of its own) and the
/// timeline it was last registered on (`None`: no row yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberIdentity {
    pub id: u64,
    pub timeline: Option<u32>,
}

impl MemberIdentity {
    /// After the oracle refused this identity because another live session speaks for it, for
    /// `refused_for_ms` in a row on the monotonic clock: does this cluster, now on `timeline`,
    /// take an identity of its own? Only a cluster promoted since the identity was last
    /// registered (another timeline, or none known) may: a copy of the member (`pg_basebackup`,
    /// a restore) promoted beside its original, or a standby promoted while its old primary
    /// still talks to the oracle. Each then holds the fleet's `R_f` for itself. And only once
    /// the refusal has lasted `wait_ms`: a promoted standby whose old primary is gone takes the
    /// entry over (it keeps the entry) as soon as the oracle sees that primary's session end or
    /// fall silent. A restart on the same timeline never does: it waits for its old session.
    pub fn takes_its_own(&self, timeline: u32, refused_for_ms: u64, wait_ms: u64) -> bool {
        self.timeline != Some(timeline) && refused_for_ms >= wait_ms
    }

    /// Whether this cluster, now on `timeline`, proves that the run its own table named before
    /// this one (its predecessor) has ended, for the oracle (`tsoracle_core::fleet::RunClaim`):
    /// it started from a clean shutdown (`clean_start`), or it was promoted since it last
    /// registered (its old primary deposed). A copy started from a snapshot of a running
    /// member proves neither.
    pub fn proves_predecessor_ended(&self, clean_start: bool, timeline: u32) -> bool {
        clean_start || self.timeline.is_some_and(|t| t != timeline)
    }

    /// A new identity from `random`: never 0 (no member), this one, or `system_id` (the
    /// identity of every copy that has not taken its own).
    pub fn fresh(&self, system_id: u64, random: u64) -> u64 {
        let mut id = random;
        while id == 0 || id == self.id || id == system_id {
            id = id.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        }
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timestamp::{pack, physical_ms, MAX_LOGICAL};
    use proptest::prelude::*;

    #[test]
    fn only_a_clean_start_or_a_promotion_proves_the_predecessor_ended() {
        let kept = MemberIdentity { id: 7, timeline: Some(1) };
        assert!(kept.proves_predecessor_ended(true, 1), "a clean restart");
        assert!(kept.proves_predecessor_ended(false, 2), "promoted since it registered");
        assert!(!kept.proves_predecessor_ended(false, 1), "a snapshot copy, or a crash");
        let never = MemberIdentity { id: 7, timeline: None };
        assert!(!never.proves_predecessor_ended(false, 2), "never registered: nothing to prove");
    }

    #[test]
    fn a_member_that_fetched_nothing_accepts_anything() {
        assert_eq!(above_fetched(0, 0), Ok(()));
        assert_eq!(kept_past_ms(0), 0);
        assert_eq!(kept_past_ms(1), 0);
    }

    #[test]
    fn the_kept_bound_lags_by_a_millisecond() {
        let v = pack(1_000, 5).unwrap();
        assert_eq!(kept_past_ms(v + 1), 999);
        let own = OwnPast::new(kept_past_ms(v + 1), []);
        // The rest of v's millisecond, and later, are accepted; the millisecond before is not.
        assert!(own.check_timestamps(v + 1).is_ok());
        assert!(own.check_timestamps(pack(1_000, 0).unwrap()).is_ok());
        assert!(own.check_timestamps(pack(999, MAX_LOGICAL).unwrap()).is_err());
    }

    #[test]
    fn a_lost_answer_s_regrant_below_r_is_refused() {
        // The numbers: a lower bound of 1796516504527 ms, R at 1796516512128 ms.
        let r = pack(1_796_516_512_128, 0).unwrap();
        assert!(lease_above_resolved(1_796_516_504_527, 0, r).is_err());
        assert!(lease_above_resolved(1_796_516_512_129, 0, r).is_ok());
        // At R's own millisecond: its first stamp is at or below R.
        assert!(lease_above_resolved(1_796_516_512_128, 0, r).is_err());
        // Below the value held while in flight: refused even if R has not passed it yet.
        assert!(lease_above_resolved(10, pack(11, 0).unwrap(), 0).is_err());
    }

    #[test]
    fn a_key_dropped_on_the_oracle_starts_again_but_a_gone_back_oracle_is_refused() {
        let mut own = OwnPast::new(0, []);
        own.handed_out("k", HandedBlock { made: 100, end: 20 });
        // The same incarnation: only at or above the end.
        assert!(own.check_handed("k", 100, 19).is_err());
        assert!(own.check_handed("k", 100, 20).is_ok());
        // Dropped on the oracle and made again: from 0.
        assert!(own.check_handed("k", 150, 0).is_ok());
        // An older incarnation: the oracle went back.
        assert!(own.check_handed("k", 99, 1_000).is_err());
        assert!(own.check_handed("other", 0, 0).is_ok());
        let mut keep = CountersToKeep::default();
        keep.handed_out("k", HandedBlock { made: 100, end: 20 });
        let due = keep.due();
        keep.handed_out("k", HandedBlock { made: 100, end: 30 });
        keep.kept(&due);
        assert_eq!(keep.due(), vec![("k".to_string(), HandedBlock { made: 100, end: 30 })]);
    }

    #[test]
    fn a_drop_restarts_a_key_this_cluster_had_counted_before_it_joined() {
        // Counted to 50 on its own; the oracle carried it (incarnation 7, from 50).
        let mut own = OwnPast::new(0, [("k".to_string(), 50)]);
        assert!(own.check_counter("k", 7, 49).is_err(), "below its own count");
        assert!(own.check_counter("k", 7, 50).is_ok());
        own.handed_out("k", HandedBlock { made: 7, end: 60 });
        // Dropped on the oracle, made again (incarnation 9): from 0.
        assert!(own.check_counter("k", 9, 0).is_ok());
        assert!(own.check_counter("other", 9, 0).is_ok(), "a key it never counted");
        // Never handed out as a member: its own count holds, whatever the incarnation.
        let fresh = OwnPast::new(0, [("k".to_string(), 50)]);
        assert!(fresh.check_counter("k", 9, 0).is_err());
    }

    proptest! {
        /// A correct oracle's blocks of one key, with drops in between (each drop: a new
        /// incarnation from 0), are all admitted, whether the
        /// member kept them in memory or read them back after a restart; any block handed
        /// out before, answered again, is refused.
        #[test]
        fn a_correct_oracle_is_admitted_and_a_replay_refused(
            steps in proptest::collection::vec((1u32..1000, 0u8..10), 1..30),
            keep_at in 0usize..30,
            replay in 0usize..30,
        ) {
            let (mut made, mut next) = (1u64, 0u64);
            let mut own = OwnPast::new(0, []);
            let mut keep = CountersToKeep::default();
            let mut table: std::collections::BTreeMap<String, HandedBlock> = Default::default();
            let mut answers = Vec::new();
            for (i, (count, event)) in steps.iter().enumerate() {
                if *event == 0 {
                    made += 1 + u64::from(*count);
                    next = 0;
                }
                let start = next;
                next += u64::from(*count);
                prop_assert!(own.check_handed("k", made, start).is_ok());
                let block = HandedBlock { made, end: next };
                own.handed_out("k", block);
                keep.handed_out("k", block);
                answers.push((made, start));
                if i == keep_at.min(steps.len() - 1) {
                    let due = keep.due();
                    for (k, b) in &due {
                        let at = table.entry(k.clone()).or_insert(*b);
                        *at = at.merge(*b);
                    }
                    keep.kept(&due);
                }
            }
            let (m, s) = answers[replay % answers.len()];
            prop_assert!(own.check_handed("k", m, s).is_err());
            prop_assert!(own.check_handed("k", made, next).is_ok());
            // Kept at the last publication, then restarted: the same.
            let due = keep.due();
            for (k, b) in &due {
                let at = table.entry(k.clone()).or_insert(*b);
                *at = at.merge(*b);
            }
            keep.kept(&due);
            prop_assert!(keep.due().is_empty());
            let restarted = OwnPast::new(0, []).with_handed(table.clone());
            prop_assert!(restarted.check_handed("k", m, s).is_err());
            prop_assert!(restarted.check_handed("k", made, next).is_ok());
        }

        /// Every later answer of a correct oracle (above every value fetched before) passes
        /// both the in-memory check and, after a restart, OwnPast over the kept bound.
        #[test]
        fn a_correct_oracle_s_later_answers_are_never_refused(
            highest in 0u64..(1 << 62),
            ahead in 1u64..(1 << 40),
        ) {
            let floor = highest + 1;
            let later = highest.saturating_add(ahead);
            prop_assert!(above_fetched(later, floor).is_ok());
            let own = OwnPast::new(kept_past_ms(floor), []);
            prop_assert!(own.check_timestamps(later).is_ok());
            // A lease granted later: its lowest stamp is the millisecond after a later value.
            prop_assert!(own.check_lease(crate::lease::stamp_from_ms(later)).is_ok());
        }

        /// An answer at or below what was fetched before is refused in memory; after a
        /// restart, every one in a millisecond before the highest value's is refused.
        #[test]
        fn an_answer_below_the_member_s_past_is_refused(
            highest in 0u64..(1 << 62),
            below in 0u64..(1 << 40),
        ) {
            let floor = highest + 1;
            let first = highest.saturating_sub(below);
            prop_assert!(above_fetched(first, floor).is_err());
            let own = OwnPast::new(kept_past_ms(floor), []);
            if physical_ms(first) < physical_ms(highest) {
                prop_assert!(own.check_timestamps(first).is_err());
            }
        }

        /// A grant the oracle made for the call (its lowest stamp the millisecond after a value
        /// issued at or above everything fetched when the call left) is above every resolved
        /// timestamp the member could have computed: R is below what it fetched.
        #[test]
        fn a_fresh_grant_is_never_refused(
            held in 1u64..(1 << 62),
            issued_above in 0u64..(1 << 40),
            r_below in 1u64..(1 << 40),
        ) {
            let issued = held.saturating_add(issued_above);
            let resolved = held.saturating_sub(r_below);
            prop_assert!(lease_above_resolved(crate::lease::stamp_from_ms(issued), held, resolved).is_ok());
        }

        /// A grant whose first stamp is at or below R is never handed out.
        #[test]
        fn a_grant_at_or_below_r_is_refused(from_ms in 0u64..(1 << 45), held in 0u64..(1 << 62), r in 0u64..(1 << 63)) {
            let first = pack(from_ms, 0).unwrap();
            prop_assert_eq!(lease_above_resolved(from_ms, held, r).is_ok(), first > r && first >= held);
        }
    }
}
