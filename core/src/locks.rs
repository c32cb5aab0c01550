//! PostgreSQL's table-level lock modes and which conflict (`lock.c`'s `LockConflicts`), so
//! that the worker can name the process that holds, or waits for, a lock its statement could
//! not get: a `55P03` whose HINT says whom to wait for.

/// A lock mode, numbered as `lockdefs.h` numbers them (1 = `AccessShareLock` ... 8 =
/// `AccessExclusiveLock`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct LockMode(pub u8);

pub const ACCESS_SHARE: LockMode = LockMode(1);
pub const ROW_SHARE: LockMode = LockMode(2);
pub const ROW_EXCLUSIVE: LockMode = LockMode(3);
pub const SHARE_UPDATE_EXCLUSIVE: LockMode = LockMode(4);
pub const SHARE: LockMode = LockMode(5);
pub const SHARE_ROW_EXCLUSIVE: LockMode = LockMode(6);
pub const EXCLUSIVE: LockMode = LockMode(7);
pub const ACCESS_EXCLUSIVE: LockMode = LockMode(8);

/// Bit `m` set for each mode `m` that conflicts with mode index `i` (the table of `lock.c`).
const CONFLICTS: [u16; 9] = [
    0,
    1 << 8,
    (1 << 7) | (1 << 8),
    (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8),
    (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8),
    (1 << 3) | (1 << 4) | (1 << 6) | (1 << 7) | (1 << 8),
    (1 << 3) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8),
    (1 << 2) | (1 << 3) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8),
    0b1_1111_1110,
];

impl LockMode {
    /// Whether a lock in mode `self` and one in `other` on the same object conflict.
    pub fn conflicts_with(self, other: LockMode) -> bool {
        usize::from(self.0) < CONFLICTS.len()
            && other.0 < 9
            && CONFLICTS[usize::from(self.0)] & (1 << other.0) != 0
    }

    /// Whether `held`, a bit mask of held modes (`LOCKBIT_ON(mode)`, as `LockInstanceData`'s
    /// `holdMask` reports them), holds a mode that conflicts with `self`.
    pub fn conflicts_with_mask(self, held: u32) -> bool {
        (1..=8).any(|m| held & (1 << m) != 0 && self.conflicts_with(LockMode(m)))
    }

    pub fn name(self) -> &'static str {
        match self.0 {
            1 => "AccessShareLock",
            2 => "RowShareLock",
            3 => "RowExclusiveLock",
            4 => "ShareUpdateExclusiveLock",
            5 => "ShareLock",
            6 => "ShareRowExclusiveLock",
            7 => "ExclusiveLock",
            8 => "AccessExclusiveLock",
            _ => "a lock",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_postgresqls() {
        let all: Vec<LockMode> = (1..=8).map(LockMode).collect();
        for a in &all {
            for b in &all {
                assert_eq!(a.conflicts_with(*b), b.conflicts_with(*a), "{a:?} {b:?} symmetric");
            }
        }
        // The everyday cases the worker meets.
        assert!(!ROW_EXCLUSIVE.conflicts_with(SHARE_UPDATE_EXCLUSIVE), "VACUUM, ANALYZE, CIC");
        assert!(ROW_EXCLUSIVE.conflicts_with(SHARE), "CREATE INDEX");
        assert!(!ROW_EXCLUSIVE.conflicts_with(ROW_EXCLUSIVE));
        assert!(
            !ACCESS_SHARE.conflicts_with(EXCLUSIVE),
            "pg_dump reads past REFRESH ... CONCURRENTLY"
        );
        assert!(ACCESS_SHARE.conflicts_with(ACCESS_EXCLUSIVE), "VACUUM FULL, CLUSTER");
        assert!(SHARE_UPDATE_EXCLUSIVE.conflicts_with(SHARE_UPDATE_EXCLUSIVE), "two VACUUMs");
        assert!(SHARE_ROW_EXCLUSIVE.conflicts_with(SHARE_UPDATE_EXCLUSIVE));
        assert!(!SHARE.conflicts_with(SHARE));
        assert!(ACCESS_EXCLUSIVE.conflicts_with(ACCESS_SHARE));
        assert_eq!(all.iter().filter(|m| ACCESS_SHARE.conflicts_with(**m)).count(), 1);
        assert_eq!(all.iter().filter(|m| ACCESS_EXCLUSIVE.conflicts_with(**m)).count(), 8);
        assert!(ROW_EXCLUSIVE.conflicts_with_mask(1 << 5));
        assert!(!ROW_EXCLUSIVE.conflicts_with_mask((1 << 1) | (1 << 3) | (1 << 4)));
        assert!(!LockMode(9).conflicts_with(ACCESS_SHARE));
    }
}
