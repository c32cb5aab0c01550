//! The resolved timestamp `R` (docs/resolved.md): every timestamp at or below it has been
//! issued to a transaction that has ended, and none will be issued again.
//!
//! The bookkeeping, as the extension keeps it in shared memory:
//!
//! - every backend has a slot holding the lowest value its open top-level transaction may have
//!   taken, 0 when it holds none. Before its first grant in a transaction a backend writes
//!   there a lower bound of what it will get (the window's `next` as it reads it, which only
//!   grows), then a sequentially consistent fence, then it takes its grant; at the end of the
//!   transaction — after its commit is visible — it clears the slot;
//! - a reader takes the window's `next` (one past the last value issued), a sequentially
//!   consistent fence, then every slot, and computes [`resolved`]. A grant the reader's slot
//!   scan missed comes after the reader's fence, so it is at or above the `next` it read;
//! - what is returned is the maximum of every `R` computed (one shared `fetch_max`): an
//!   earlier `R` stays true, so `R` never goes down.
//!
//! Lease holders stamp values themselves, from `expires_at_ms − ttl_ms` of their last grant
//! or renewal up to their bound, until their lease expires: each live lease holds `R` below
//! the first millisecond its holder may still stamp.

use crate::timestamp::{pack, MAX_PHYSICAL_MS};

/// `R = min(next_ts, the lowest held value, the first value of the earliest millisecond a
/// live lease may still stamp) − 1`, saturating at 0. `next_ts` is one past the last value
/// issued, read before the slots; a held value of 0 is an empty slot.
pub fn resolved(
    next_ts: u64,
    held: impl IntoIterator<Item = u64>,
    lease_from_ms: Option<u64>,
) -> u64 {
    let lowest_held = held.into_iter().filter(|&v| v != 0).min().unwrap_or(u64::MAX);
    let lease = lease_from_ms
        .map(|ms| pack(ms.min(MAX_PHYSICAL_MS), 0).unwrap_or(u64::MAX))
        .unwrap_or(u64::MAX);
    next_ts.min(lowest_held).min(lease).saturating_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_the_next_value_the_lowest_holder_and_leases() {
        assert_eq!(resolved(100, [], None), 99, "nothing held: everything issued");
        assert_eq!(resolved(100, [0, 40, 0, 70], None), 39, "held down by the lowest holder");
        assert_eq!(resolved(100, [0, 0], None), 99);
        assert_eq!(resolved(0, [], None), 0, "nothing issued yet");
        let ms = 1_000u64;
        assert_eq!(resolved(u64::MAX, [], Some(ms)), pack(ms, 0).unwrap() - 1, "a lease");
        assert_eq!(resolved(5, [], Some(ms)), 4, "a lease above everything issued holds nothing");
    }
}
