//! UUIDv7 (RFC 9562) made of a tsoracle timestamp, so that the order of the bytes is the
//! order of the oracle:
//!
//! ```text
//!  byte   0   1   2   3   4   5 | 6        7       | 8         9 ... 15
//!         unix_ts_ms (48 bits)  | ver=7 | counter  | var=10 |  random (56 bits)
//!         = physical_ms         | 4 bits| 12 bits  | 2 bits | counter 6 bits | ...
//! ```
//!
//! - `unix_ts_ms` (bytes 0–5, big-endian) is the timestamp's `physical_ms` (46 bits, so its top
//!   two bits are 0 until the year 3084);
//! - the 18-bit logical part is a dedicated counter (RFC 9562 §6.2, method 1): its top 12 bits
//!   are `rand_a` (the low nibble of byte 6 and byte 7), its low 6 bits the top of `rand_b`
//!   (byte 8 after the variant bits);
//! - the last 7 bytes (56 bits) are random, from a CSPRNG, new for every UUID.
//!
//! Version and variant bits are the same in every UUID, so comparing two of them bytewise (as
//! PostgreSQL's `uuid` type does) compares `(physical_ms, logical)` first: UUIDs of distinct
//! timestamps are ordered like the timestamps, and never equal.

use crate::error::CoreError;
use crate::timestamp::{logical, pack, physical_ms, MAX_SQL_PHYSICAL_MS};

/// The random bytes at the end of a UUID.
pub const RANDOM_BYTES: usize = 7;

/// The UUID of timestamp `ts`, with `random` as its last 7 bytes.
pub fn encode(ts: u64, random: [u8; RANDOM_BYTES]) -> [u8; 16] {
    let physical = physical_ms(ts);
    let counter = logical(ts);
    let mut bytes = [0u8; 16];
    bytes[..6].copy_from_slice(&physical.to_be_bytes()[2..]);
    bytes[6] = 0x70 | ((counter >> 14) & 0x0F) as u8;
    bytes[7] = ((counter >> 6) & 0xFF) as u8;
    bytes[8] = 0x80 | (counter & 0x3F) as u8;
    bytes[9..].copy_from_slice(&random);
    bytes
}

/// The timestamp a UUID of this layout carries. Refuses what is not a version-7 UUID of the
/// RFC 9562 variant, and one whose time is beyond the last millisecond a timestamp can be
/// issued in (it cannot be tsoracle's). Any other UUIDv7 decodes too: its `unix_ts_ms` and its
/// 18 bits after the version, whatever another generator put there.
pub fn decode(bytes: [u8; 16]) -> Result<u64, CoreError> {
    let version = bytes[6] >> 4;
    if version != 7 {
        return Err(CoreError::NotUuidV7 { version, variant: bytes[8] >> 6 });
    }
    if bytes[8] >> 6 != 0b10 {
        return Err(CoreError::NotUuidV7 { version, variant: bytes[8] >> 6 });
    }
    let mut ms = [0u8; 8];
    ms[2..].copy_from_slice(&bytes[..6]);
    let physical = u64::from_be_bytes(ms);
    if physical > MAX_SQL_PHYSICAL_MS {
        return Err(CoreError::UuidTimeOutOfRange(physical));
    }
    let counter = (u64::from(bytes[6] & 0x0F) << 14)
        | (u64::from(bytes[7]) << 6)
        | u64::from(bytes[8] & 0x3F);
    pack(physical, counter)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TOP: u64 = (MAX_SQL_PHYSICAL_MS << 18) | crate::timestamp::MAX_LOGICAL;

    #[test]
    fn layout_bit_by_bit() {
        let ts = pack(0x1234_5678_9ABC, 0b10_1100_1110_0101_1011).unwrap();
        let u = encode(ts, [1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(&u[..6], &[0x12, 0x34, 0x56, 0x78, 0x9A, 0xBC]);
        assert_eq!(u[6], 0x70 | 0b1011, "version 7, the counter's top 4 bits");
        assert_eq!(u[7], 0b0011_1001, "the counter's next 8 bits");
        assert_eq!(u[8], 0x80 | 0b01_1011, "variant 10, the counter's low 6 bits");
        assert_eq!(&u[9..], &[1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(decode(u), Ok(ts));
    }

    #[test]
    fn other_versions_and_variants_are_refused() {
        let mut u = encode(pack(1_700_000_000_000, 5).unwrap(), [0; 7]);
        u[6] = 0x40 | (u[6] & 0x0F);
        assert_eq!(decode(u), Err(CoreError::NotUuidV7 { version: 4, variant: 2 }));
        let mut u = encode(pack(1_700_000_000_000, 5).unwrap(), [0; 7]);
        u[8] &= 0x3F;
        assert_eq!(decode(u), Err(CoreError::NotUuidV7 { version: 7, variant: 0 }));
        let mut u = encode(0, [0; 7]);
        u[0] = 0xFF;
        assert!(matches!(decode(u), Err(CoreError::UuidTimeOutOfRange(_))));
    }

    proptest! {
        /// decode(encode(t)) = t, version and variant bits are set, and the byte order of two
        /// UUIDs is the order of their timestamps, whatever their random bytes.
        #[test]
        fn round_trip_and_order(
            a in 0u64..=TOP,
            b in 0u64..=TOP,
            ra in any::<[u8; 7]>(),
            rb in any::<[u8; 7]>(),
        ) {
            let (ua, ub) = (encode(a, ra), encode(b, rb));
            prop_assert_eq!(decode(ua), Ok(a));
            prop_assert_eq!(ua[6] >> 4, 7);
            prop_assert_eq!(ua[8] >> 6, 0b10);
            if a != b {
                prop_assert_eq!(ua.cmp(&ub), a.cmp(&b));
            }
        }

        /// Neighbouring timestamps (the counter carrying into the millisecond) stay in order.
        #[test]
        fn consecutive_timestamps_are_consecutive_uuids(t in 0u64..TOP, r in any::<[u8; 7]>()) {
            prop_assert!(encode(t, r) < encode(t + 1, [0; 7]));
            prop_assert!(encode(t, [0xFF; 7]) < encode(t + 1, r));
        }
    }
}
