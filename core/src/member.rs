//! A member of a fleet (docs/fleet.md): the arithmetic its proxy rests on.
//!
//! - [`split`]: one answer `[first, first + total)` from the oracle, handed to the calls that
//!   shared its round trip, in order: each gets a range of its own, and together they tile it.
//! - [`floor_after`]: where every later value from the oracle starts, once an answer came.
//! - [`EpochGate`]: answers from an epoch older than one already seen are refused.
//! - [`OwnPast`]: what a cluster issued on its own before it joined the fleet; nothing the
//!   oracle answers at or below it is handed out.
//! - [`OracleSeen`]: the oracle a member was served by, kept durably: another cluster, or an
//!   older epoch, is refused after any restart.

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

/// The oracle's answer to `tsoracle.member_next(n)` as text, `{first,epoch}` (a `bigint[]`
/// of two): the first of the `n` values and the oracle's epoch. Anything else is `None`.
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
}

/// A value from the oracle that repeats one this cluster issued on its own.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BelowOwnPast {
    #[error("the oracle's timestamps are in millisecond {got_ms}, at or below this cluster's own high-water {high_water_ms} ms: this cluster issued timestamps there before it joined the fleet")]
    Timestamps { got_ms: u64, high_water_ms: u64 },
    #[error("the oracle's block of counter \"{key}\" starts at {start}, below {next}, where this cluster's own counter stood before it joined the fleet")]
    Counter { key: String, start: u64, next: u64 },
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
        OwnPast { high_water_ms, counters: map }
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
