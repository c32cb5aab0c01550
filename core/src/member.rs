//! A member of a fleet (docs/fleet.md): the arithmetic its proxy rests on.
//!
//! - [`split`]: one answer `[first, first + total)` from the oracle, handed to the calls that
//!   shared its round trip, in order: each gets a range of its own, and together they tile it.
//! - [`floor_after`]: where every later value from the oracle starts, once an answer came.
//! - [`EpochGate`]: answers from an epoch older than one already seen are refused.

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
