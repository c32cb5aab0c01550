//! The resolved timestamp `R` (docs/resolved.md): every timestamp at or below it has been
//! issued to a transaction that has ended, and none will be issued again.
//!
//! The bookkeeping, as the extension keeps it in shared memory:
//!
//! - every backend has a slot holding the lowest value its open top-level transaction may have
//!   taken, 0 when it holds none. Before its first grant in a transaction a backend writes
//!   there a lower bound of what it will get ([`hold_floor`]: the end of its own last grant,
//!   or the window's `next` as it reads it if it has none; `next` only grows), then a
//!   sequentially consistent fence, then it takes its grant and raises the slot to the
//!   grant's first value; at the end of the transaction — after its commit is visible — it
//!   clears the slot;
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

/// The lower bound a backend holds before its first grant of a transaction: one past the
/// last value it was granted (`last_grant_end`, 0 for none), else the window's `next`, read
/// only then. Both are at or below every value the window grants from now on, as `next`
/// never goes down and the backend never outlives the window. The end of the backend's own
/// grant costs no read of the window's cache line, which every grant writes; being older, it
/// holds `R` lower, but only until the slot is raised to the grant, and `R` never goes down.
pub fn hold_floor(last_grant_end: u64, read_next: impl FnOnce() -> u64) -> u64 {
    match last_grant_end {
        0 => read_next(),
        end => end,
    }
}

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
    fn the_floor_is_the_last_grant_s_end_and_reads_the_window_only_without_one() {
        assert_eq!(hold_floor(0, || 500), 500, "no grant yet: the window's next");
        let unread = || -> u64 { panic!("the window is read only when the backend has no grant") };
        assert_eq!(hold_floor(120, unread), 120);
    }

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
