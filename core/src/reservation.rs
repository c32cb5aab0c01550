//! A statement's reservation on a member of a fleet (docs/fleet.md, "One statement, few
//! round trips"): the values one fetch from the oracle answered beyond the one its call
//! needed, kept for the later calls of the same statement.
//!
//! - A reservation belongs to one statement (a number the caller changes at every statement
//!   boundary): [`Reservation::take`] never hands a value to another statement, which fetches
//!   afresh, above everything fetched before it began.
//! - Its values are handed out in order, each once; what the statement leaves is a gap.
//! - Each fetch of the same statement asks twice the last one, up to a cap: `n` values cost
//!   about `log2(cap) + n / cap` round trips.

/// What one statement holds: `[next, end)` of the last fetch, and that fetch's size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    statement: u64,
    next: u64,
    end: u64,
    size: u32,
}

impl Reservation {
    /// Nothing reserved, for no statement.
    pub const EMPTY: Reservation = Reservation { statement: u64::MAX, next: 0, end: 0, size: 0 };

    /// The next value for `statement`, if this reservation is that statement's and is not
    /// used up; `None` means: fetch.
    pub fn take(&mut self, statement: u64) -> Option<u64> {
        if self.statement != statement || self.next >= self.end {
            return None;
        }
        let v = self.next;
        self.next += 1;
        Some(v)
    }

    /// How many values the next fetch for `statement` asks: 1 for a statement's first,
    /// then twice the last fetch of the same statement, never above `cap` (nor below 1).
    pub fn next_size(&self, statement: u64, cap: u32) -> u32 {
        let cap = cap.max(1);
        if self.statement != statement {
            return 1;
        }
        self.size.saturating_mul(2).clamp(1, cap)
    }

    /// A fetch of `[first, first + size)` for `statement`: `first` is handed out by the
    /// caller now, the rest is kept. Replaces whatever was kept: a fetch is above it.
    pub fn fetched(statement: u64, first: u64, size: u32) -> Reservation {
        Reservation {
            statement,
            next: first.saturating_add(1),
            end: first.saturating_add(u64::from(size)),
            size,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statement_grows_its_fetches_and_another_starts_at_one() {
        let mut r = Reservation::EMPTY;
        assert_eq!(r.take(1), None);
        assert_eq!(r.next_size(1, 8), 1);
        r = Reservation::fetched(1, 100, 1);
        assert_eq!(r.take(1), None);
        assert_eq!(r.next_size(1, 8), 2);
        r = Reservation::fetched(1, 200, 2);
        assert_eq!(r.take(1), Some(201));
        assert_eq!(r.take(1), None);
        assert_eq!(r.next_size(1, 8), 4);
        r = Reservation::fetched(1, 300, 8);
        assert_eq!(r.next_size(1, 8), 8, "capped");
        assert_eq!(r.take(2), None, "never another statement's");
        assert_eq!(r.next_size(2, 8), 1);
        assert_eq!(r.next_size(1, 0), 1, "a cap below 1 is 1");
    }
}
