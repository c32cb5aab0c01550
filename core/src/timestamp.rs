//! Timestamps are `physical_ms << 18 | logical`: 46-bit milliseconds since the Unix epoch and
//! an 18-bit counter. Within one millisecond the values are consecutive integers.

use crate::error::CoreError;

pub const LOGICAL_BITS: u32 = 18;
pub const LOGICAL_PER_MS: u64 = 1 << LOGICAL_BITS; // 262144
pub const MAX_LOGICAL: u64 = LOGICAL_PER_MS - 1;
pub const PHYSICAL_BITS: u32 = 46;
pub const MAX_PHYSICAL_MS: u64 = (1 << PHYSICAL_BITS) - 1;

/// The largest physical_ms whose timestamps still fit in a non-negative SQL `bigint`
/// (46 + 18 bits fill all 64, so the top physical bit would be the sign bit). That is the
/// year 3084; the allocator never issues above it, so every issued timestamp is `<= i64::MAX`.
pub const MAX_SQL_PHYSICAL_MS: u64 = (1 << (PHYSICAL_BITS - 1)) - 1;

pub fn pack(physical_ms: u64, logical: u64) -> Result<u64, CoreError> {
    if physical_ms > MAX_PHYSICAL_MS {
        return Err(CoreError::PhysicalOutOfRange(physical_ms));
    }
    if logical > MAX_LOGICAL {
        return Err(CoreError::LogicalOutOfRange(logical));
    }
    Ok(physical_ms << LOGICAL_BITS | logical)
}

pub fn physical_ms(ts: u64) -> u64 {
    ts >> LOGICAL_BITS
}

pub fn logical(ts: u64) -> u64 {
    ts & MAX_LOGICAL
}

/// Timestamp as a SQL `bigint`. Every timestamp the allocator issues is `<= i64::MAX`
/// (see [`MAX_SQL_PHYSICAL_MS`]); a larger value cannot come from it and saturates.
pub fn to_sql(ts: u64) -> i64 {
    i64::try_from(ts).unwrap_or(i64::MAX)
}

/// A SQL `bigint` back to a timestamp; every non-negative value is a valid timestamp.
pub fn from_sql(v: i64) -> Result<u64, CoreError> {
    u64::try_from(v).map_err(|_| CoreError::NegativeTimestamp(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn pack_limits() {
        assert_eq!(pack(0, 0), Ok(0));
        assert_eq!(pack(MAX_PHYSICAL_MS, MAX_LOGICAL), Ok(u64::MAX));
        assert_eq!(pack(1, 0), Ok(LOGICAL_PER_MS));
        assert_eq!(
            pack(MAX_PHYSICAL_MS + 1, 0),
            Err(CoreError::PhysicalOutOfRange(MAX_PHYSICAL_MS + 1))
        );
        assert_eq!(pack(0, LOGICAL_PER_MS), Err(CoreError::LogicalOutOfRange(LOGICAL_PER_MS)));
        // The last SQL-representable millisecond ends exactly at i64::MAX.
        assert_eq!(pack(MAX_SQL_PHYSICAL_MS, MAX_LOGICAL), Ok(i64::MAX as u64));
    }

    #[test]
    fn sql_conversion() {
        assert_eq!(to_sql(0), 0);
        assert_eq!(to_sql(i64::MAX as u64), i64::MAX);
        assert_eq!(from_sql(i64::MAX), Ok(i64::MAX as u64));
        assert_eq!(from_sql(-1), Err(CoreError::NegativeTimestamp(-1)));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn pack_roundtrip(p in 0..=MAX_PHYSICAL_MS, l in 0..=MAX_LOGICAL) {
            let ts = pack(p, l).unwrap();
            prop_assert_eq!(physical_ms(ts), p);
            prop_assert_eq!(logical(ts), l);
        }

        #[test]
        fn pack_preserves_order(a in (0..=MAX_PHYSICAL_MS, 0..=MAX_LOGICAL),
                                b in (0..=MAX_PHYSICAL_MS, 0..=MAX_LOGICAL)) {
            prop_assert_eq!(a.cmp(&b), pack(a.0, a.1).unwrap().cmp(&pack(b.0, b.1).unwrap()));
        }

        #[test]
        fn pack_rejects_out_of_range(p in (MAX_PHYSICAL_MS + 1).., l in LOGICAL_PER_MS..) {
            prop_assert_eq!(pack(p, 0), Err(CoreError::PhysicalOutOfRange(p)));
            prop_assert_eq!(pack(0, l), Err(CoreError::LogicalOutOfRange(l)));
        }

        #[test]
        fn sql_roundtrip(p in 0..=MAX_SQL_PHYSICAL_MS, l in 0..=MAX_LOGICAL) {
            let ts = pack(p, l).unwrap();
            prop_assert!(to_sql(ts) >= 0);
            prop_assert_eq!(from_sql(to_sql(ts)), Ok(ts));
        }
    }
}
