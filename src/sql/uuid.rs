//! The SQL surface of UUIDs: `tso_next_uuid`, `tso_uuid`, `tso_from_uuid`. A tsoracle UUID is
//! an RFC 9562 version-7 UUID whose time and counter bits are a tsoracle timestamp
//! (`tsoracle_core::uuid` draws the layout), so its byte order — `ORDER BY id`, a btree on
//! `uuid` — is the oracle's order, across every backend, restarts, crashes and failover.

use crate::caller::window;
use crate::pg::error::{refuse_in_parallel_mode, OrReport, TsoError};
use pgrx::prelude::*;
use pgrx::Uuid;
use tsoracle_core::timestamp;
use tsoracle_core::uuid::{self as layout, RANDOM_BYTES};

/// 56 random bits from PostgreSQL's CSPRNG (`pg_strong_random`, as `gen_random_uuid()` uses).
fn random_tail() -> Result<[u8; RANDOM_BYTES], TsoError> {
    let mut tail = [0u8; RANDOM_BYTES];
    // SAFETY: a valid buffer of RANDOM_BYTES bytes, written by the callee only.
    if unsafe { pg_sys::pg_strong_random(tail.as_mut_ptr().cast(), tail.len()) } {
        Ok(tail)
    } else {
        Err(TsoError::Internal("could not generate random bytes (pg_strong_random)".into()))
    }
}

fn uuid_of(ts: u64) -> Result<Uuid, TsoError> {
    Ok(Uuid::from_bytes(layout::encode(ts, random_tail()?)))
}

/// A UUIDv7 made of the next timestamp: strictly greater, as a `uuid`, than every one issued
/// before it on this cluster.
#[pg_extern]
fn tso_next_uuid() -> Uuid {
    refuse_in_parallel_mode("tso_next_uuid()")
        .and_then(|()| window::next(1))
        .and_then(uuid_of)
        .or_report()
}

/// The UUIDv7 of timestamp `ts` (its last 56 bits random).
#[pg_extern(volatile, parallel_safe, strict)]
fn tso_uuid(ts: i64) -> Uuid {
    timestamp::from_sql(ts)
        .map_err(|_| {
            TsoError::InvalidArgument(format!("{ts} is not a tsoracle timestamp (it is negative)"))
        })
        .and_then(uuid_of)
        .or_report()
}

/// The timestamp a tsoracle UUID carries.
#[pg_extern(immutable, parallel_safe, strict)]
fn tso_from_uuid(id: Uuid) -> i64 {
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(id.as_bytes());
    layout::decode(bytes)
        .map(timestamp::to_sql)
        .map_err(|e| TsoError::InvalidArgument(format!("{id} is not a tsoracle UUID: {e}")))
        .or_report()
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use super::*;
    use crate::pg::testing::sqlstate_of;
    use pgrx::PgSqlErrorCode::*;

    #[pg_test]
    fn next_uuid_is_increasing_and_carries_its_timestamp() {
        let mut prev = tso_next_uuid();
        for _ in 0..1_000 {
            let id = tso_next_uuid();
            assert!(id.as_bytes() > prev.as_bytes(), "{id} after {prev}");
            assert_eq!(id.as_bytes()[6] >> 4, 7, "version 7");
            assert_eq!(id.as_bytes()[8] >> 6, 0b10, "RFC 9562 variant");
            prev = id;
        }
        let ts = tso_from_uuid(prev);
        let next = Spi::get_one::<i64>("SELECT tso_next()").unwrap().unwrap();
        assert!(next > ts, "the oracle went on above the UUID's timestamp");
        // Through SQL: the uuid type's own order is the oracle's.
        let ordered = Spi::get_one::<bool>(
            "SELECT bool_and(a < b) FROM (SELECT tso_next_uuid() a, tso_next_uuid() b FROM generate_series(1, 500)) t",
        )
        .unwrap();
        assert_eq!(ordered, Some(true));
    }

    #[pg_test]
    fn uuid_round_trips_with_fresh_random_bits() {
        let ts = Spi::get_one::<i64>("SELECT tso_next()").unwrap().unwrap();
        let (a, b) = (tso_uuid(ts), tso_uuid(ts));
        assert_eq!(tso_from_uuid(a), ts);
        assert_eq!(tso_from_uuid(b), ts);
        assert_ne!(a, b, "the random bits differ between calls");
        assert_eq!(&a.as_bytes()[..9], &b.as_bytes()[..9], "the timestamp part is the same");
        assert_eq!(tso_from_uuid(tso_uuid(0)), 0);
        assert_eq!(tso_from_uuid(tso_uuid(i64::MAX)), i64::MAX);
    }

    #[pg_test]
    fn bad_uuids_and_timestamps_are_22023() {
        assert_eq!(sqlstate_of(|| tso_uuid(-1)), ERRCODE_INVALID_PARAMETER_VALUE);
        let v4 = Spi::get_one::<Uuid>("SELECT gen_random_uuid()").unwrap().unwrap();
        assert_eq!(sqlstate_of(move || tso_from_uuid(v4)), ERRCODE_INVALID_PARAMETER_VALUE);
        let beyond = Spi::get_one::<Uuid>("SELECT 'ffffffff-ffff-7fff-bfff-ffffffffffff'::uuid")
            .unwrap()
            .unwrap();
        assert_eq!(sqlstate_of(move || tso_from_uuid(beyond)), ERRCODE_INVALID_PARAMETER_VALUE);
        let nil = Uuid::from_bytes([0; 16]);
        assert_eq!(sqlstate_of(move || tso_from_uuid(nil)), ERRCODE_INVALID_PARAMETER_VALUE);
    }

    /// PostgreSQL 18 reads the time of a UUIDv7 itself: it is the timestamp's millisecond.
    #[cfg(feature = "pg18")]
    #[pg_test]
    fn postgres_18_extracts_the_timestamps_time() {
        let same = Spi::get_one::<bool>(
            "SELECT bool_and(uuid_extract_timestamp(id) = tso_to_timestamptz(tso_from_uuid(id)) \
                         AND uuid_extract_version(id) = 7) \
               FROM (SELECT tso_next_uuid() id FROM generate_series(1, 100)) t",
        )
        .unwrap();
        assert_eq!(same, Some(true));
    }
}
