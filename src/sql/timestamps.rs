//! The SQL surface of timestamps: `tso_next`, `tso_next_batch`, the conversions and `tso_seed`.
//! Thin: validation and error mapping here, logic in `oracle`,
//! `worker` and the pure core.

use crate::caller::window;
use crate::pg::error::{check_superuser, refuse_in_parallel_mode, OrReport, TsoError};
use crate::pg::guc;
use crate::shmem::{self, oracle::HANDED_OVER, ORACLE};
use pgrx::prelude::*;
use tsoracle_core::timestamp;

/// Microseconds between the Unix epoch and PostgreSQL's epoch (2000-01-01).
pub(crate) const PG_EPOCH_OFFSET_US: i64 = 946_684_800_000_000;

/// The next timestamp: strictly greater than every one issued before it.
#[pg_extern]
fn tso_next() -> i64 {
    refuse_in_parallel_mode("tso_next()")
        .and_then(|()| window::next(1))
        .map(timestamp::to_sql)
        .or_report()
}

/// The first of `count` consecutive timestamps `[first, first + count)`, all in one millisecond.
#[pg_extern]
fn tso_next_batch(count: i32) -> i64 {
    refuse_in_parallel_mode("tso_next_batch()")
        .and_then(|()| window::next(i64::from(count)))
        .map(timestamp::to_sql)
        .or_report()
}

/// A member of a fleet has no oracle of its own: what acts on one is run on the oracle.
fn refuse_on_a_member(what: &'static str) -> Result<(), TsoError> {
    if guc::is_member() {
        return Err(TsoError::NotOnAMember(what));
    }
    Ok(())
}

fn checked_ts(ts: i64) -> u64 {
    timestamp::from_sql(ts)
        .map_err(|_| {
            TsoError::InvalidArgument(format!("{ts} is not a tsoracle timestamp (it is negative)"))
        })
        .or_report()
}

/// Milliseconds since the Unix epoch carried by a timestamp.
#[pg_extern(immutable, parallel_safe, strict)]
fn tso_physical(ts: i64) -> i64 {
    timestamp::physical_ms(checked_ts(ts)) as i64
}

/// The logical counter (0..262143) within the timestamp's millisecond.
#[pg_extern(immutable, parallel_safe, strict)]
fn tso_logical(ts: i64) -> i32 {
    timestamp::logical(checked_ts(ts)) as i32
}

/// The millisecond of a timestamp as a timestamptz.
#[pg_extern(immutable, parallel_safe, strict)]
fn tso_to_timestamptz(ts: i64) -> TimestampWithTimeZone {
    let ms = timestamp::physical_ms(checked_ts(ts)) as i64;
    let pg_us = ms * 1000 - PG_EPOCH_OFFSET_US;
    TimestampWithTimeZone::try_from(pg_us)
        .map_err(|e| {
            TsoError::DatetimeOutOfRange(format!(
                "timestamp {ts} is out of range for timestamptz: {e}"
            ))
        })
        .or_report()
}

/// The smallest timestamp of the millisecond `t` falls in (for range queries).
#[pg_extern(immutable, parallel_safe, strict)]
fn tso_from_timestamptz(t: TimestampWithTimeZone) -> i64 {
    if t.is_infinity() || t.is_neg_infinity() {
        TsoError::DatetimeOutOfRange("infinite timestamptz has no tsoracle timestamp".into())
            .report();
    }
    let pg_us: i64 = t.into_inner();
    let ms = (pg_us + PG_EPOCH_OFFSET_US).div_euclid(1000);
    let ms = u64::try_from(ms)
        .map_err(|_| {
            TsoError::DatetimeOutOfRange(format!(
                "{t} is before 1970-01-01, the start of tsoracle time"
            ))
        })
        .or_report();
    if ms > timestamp::MAX_SQL_PHYSICAL_MS {
        TsoError::DatetimeOutOfRange(format!(
            "{t} is after the last millisecond a tsoracle timestamp can hold (in the year 3084)"
        ))
        .report();
    }
    timestamp::pack(ms, 0)
        .map(timestamp::to_sql)
        .map_err(|_| {
            TsoError::DatetimeOutOfRange(format!("{t} is beyond the 46-bit millisecond range"))
        })
        .or_report()
}

/// Advance the durable high-water to at least `physical_ms` (never lowers it), so a cluster
/// migrating from another timestamp source starts above it. Superuser only. Returns the
/// committed high-water afterwards.
#[pg_extern]
fn tso_seed(physical_ms: i64) -> i64 {
    seed(physical_ms).or_report()
}

fn seed(physical_ms: i64) -> Result<i64, TsoError> {
    refuse_in_parallel_mode("tso_seed()")?;
    let signals = shmem::signals()?;
    check_superuser("call tso_seed()")?;
    window::ensure_primary("seed the high-water")?;
    refuse_on_a_member("tso_seed()")?;
    let target = u64::try_from(physical_ms)
        .ok()
        .filter(|ms| (1..=timestamp::MAX_SQL_PHYSICAL_MS).contains(ms))
        .ok_or_else(|| {
            TsoError::InvalidArgument(format!(
                "physical_ms must be between 1 and {} (the last millisecond a timestamp can be issued in), got {physical_ms}",
                timestamp::MAX_SQL_PHYSICAL_MS
            ))
        })?;
    window::seed(signals, target).map(|high_water| high_water as i64)
}

/// Stop this server's oracle for a switchover to another cluster (docs/operations/
/// logical-replication.md), or before it joins or leaves a fleet (docs/operations/fleet.md):
/// it issues nothing more — no timestamp, block or lease — until the server restarts, and the
/// high-water no longer moves. Returns that high-water (ms): every value issued here is at or
/// below it; `SELECT tso_seed(...)` on the new cluster continues above it. On a member, it
/// bounds the timestamps fetched from the oracle; the oracle's own high-water bounds the rest.
/// Superuser only.
#[pg_extern(volatile, parallel_unsafe)]
fn tso_handover() -> i64 {
    handover().or_report()
}

fn handover() -> Result<i64, TsoError> {
    refuse_in_parallel_mode("tso_handover()")?;
    let signals = shmem::signals()?;
    check_superuser("call tso_handover()")?;
    window::ensure_primary("hand over")?;
    signals.request_handover();
    let member = guc::is_member();
    let done = window::wait_for_worker(signals, || {
        let st = ORACLE.share();
        Ok((st.phase == shmem::Phase::Refused && st.refusal().as_deref() == Some(HANDED_OVER))
            .then(|| {
                if member {
                    // Above every timestamp handed out here: raised before each one is.
                    timestamp::physical_ms(signals.member_floor.get())
                } else {
                    st.max_committed_ms
                }
            }))
    })?;
    done.map(|ms| ms as i64).ok_or(TsoError::WorkerTimeout {
        waited_ms: guc::extension_timeout_ms(),
        what: "confirm the handover",
    })
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use super::*;
    use crate::pg::testing::sqlstate_of;
    use pgrx::PgSqlErrorCode::*;
    use tsoracle_core::timestamp::{logical, physical_ms};

    fn now_ms() -> u64 {
        crate::pg::clock::now_ms()
    }

    #[pg_test]
    fn next_is_strictly_increasing_and_near_the_clock() {
        let mut prev = tso_next();
        for _ in 0..10_000 {
            let ts = tso_next();
            assert!(ts > prev, "{ts} after {prev}");
            prev = ts;
        }
        let physical = physical_ms(prev as u64);
        let now = now_ms();
        // Never far behind the clock; ahead by at most the window.
        assert!(
            physical + 5_000 >= now && physical <= now + 60_000,
            "physical {physical} vs now {now}"
        );
    }

    #[pg_test]
    fn batch_is_consecutive_and_in_one_millisecond() {
        let before = tso_next();
        let first = tso_next_batch(1000);
        assert!(first > before);
        let last = first + 999;
        assert_eq!(physical_ms(first as u64), physical_ms(last as u64));
        assert!(logical(last as u64) >= 999);
        let after = tso_next();
        assert!(after > last, "{after} must be above the batch's last value {last}");
        // The largest batch fills a whole millisecond.
        let full = tso_next_batch(262_144);
        assert_eq!(logical(full as u64), 0);
        assert!(full > after);
    }

    #[pg_test]
    fn next_through_sql_is_increasing() {
        let a = Spi::get_one::<i64>("SELECT tso_next()").unwrap().unwrap();
        let b = Spi::get_one::<i64>("SELECT max(tso_next()) FROM generate_series(1, 100)")
            .unwrap()
            .unwrap();
        assert!(b > a);
    }

    #[pg_test]
    fn bad_batch_counts_are_22023() {
        assert_eq!(sqlstate_of(|| tso_next_batch(0)), ERRCODE_INVALID_PARAMETER_VALUE);
        assert_eq!(sqlstate_of(|| tso_next_batch(-7)), ERRCODE_INVALID_PARAMETER_VALUE);
        assert_eq!(sqlstate_of(|| tso_next_batch(262_145)), ERRCODE_INVALID_PARAMETER_VALUE);
        assert_eq!(sqlstate_of(|| tso_next_batch(i32::MAX)), ERRCODE_INVALID_PARAMETER_VALUE);
    }

    #[pg_test]
    fn decomposition_round_trips() {
        let ts = tso_next();
        let physical = tso_physical(ts);
        let logical = tso_logical(ts);
        assert_eq!(ts, (physical << 18) | i64::from(logical));
        let at = tso_to_timestamptz(ts);
        let back = tso_from_timestamptz(at);
        assert_eq!(back, physical << 18, "the smallest timestamp of that millisecond");
        assert!(back <= ts);
        assert_eq!(tso_physical(0), 0);
        assert_eq!(tso_logical((5 << 18) | 7), 7);
        let epoch =
            Spi::get_one::<i64>("SELECT tso_from_timestamptz('1970-01-01 00:00:01+00')").unwrap();
        assert_eq!(epoch, Some(1000 << 18));
    }

    #[pg_test]
    fn negative_timestamps_are_22023() {
        assert_eq!(sqlstate_of(|| tso_physical(-1)), ERRCODE_INVALID_PARAMETER_VALUE);
        assert_eq!(sqlstate_of(|| tso_logical(i64::MIN)), ERRCODE_INVALID_PARAMETER_VALUE);
        assert_eq!(sqlstate_of(|| tso_to_timestamptz(-5)), ERRCODE_INVALID_PARAMETER_VALUE);
    }

    #[pg_test]
    fn timestamptz_outside_tsoracle_time_is_22008() {
        let before_1970 =
            Spi::get_one::<TimestampWithTimeZone>("SELECT '1969-12-31 23:59:59+00'::timestamptz")
                .unwrap()
                .unwrap();
        assert_eq!(
            sqlstate_of(|| tso_from_timestamptz(before_1970)),
            ERRCODE_DATETIME_FIELD_OVERFLOW
        );
        let inf = Spi::get_one::<TimestampWithTimeZone>("SELECT 'infinity'::timestamptz")
            .unwrap()
            .unwrap();
        assert_eq!(sqlstate_of(|| tso_from_timestamptz(inf)), ERRCODE_DATETIME_FIELD_OVERFLOW);
        // Past the last millisecond a bigint timestamp holds (year 3084), up to the 46-bit limit.
        for year in ["3085-01-01", "3500-06-01", "4199-01-01"] {
            let t = Spi::get_one::<TimestampWithTimeZone>(&format!(
                "SELECT '{year} 00:00:00+00'::timestamptz"
            ))
            .unwrap()
            .unwrap();
            assert_eq!(
                sqlstate_of(move || tso_from_timestamptz(t)),
                ERRCODE_DATETIME_FIELD_OVERFLOW,
                "{year}"
            );
        }
        let last =
            Spi::get_one::<TimestampWithTimeZone>("SELECT '3084-01-01 00:00:00+00'::timestamptz")
                .unwrap()
                .unwrap();
        let ts = tso_from_timestamptz(last);
        assert!(ts > 0 && ts < i64::MAX, "3084-01-01 is still representable: {ts}");
    }

    #[pg_test]
    fn status_reports_a_serving_primary() {
        tso_next();
        let (role, state, high_water, floor, issued, fences, pid) =
            Spi::get_three::<String, String, i64>(
                "SELECT role, state, high_water_ms FROM tso_status()",
            )
            .map(|(r, s, h)| (r.unwrap(), s.unwrap(), h.unwrap(), 0, 0, 0, 0))
            .unwrap();
        let _ = (floor, issued, fences, pid);
        assert_eq!(role, "primary");
        assert_eq!(state, "serving");
        assert!(high_water as u64 >= now_ms());
        let (issued, fences, worker_pid) = Spi::get_three::<i64, i64, i32>(
            "SELECT timestamps_issued, fences, worker_pid FROM tso_status()",
        )
        .unwrap();
        assert!(issued.unwrap() >= 1);
        assert!(fences.unwrap() >= 1);
        assert!(worker_pid.unwrap() > 0);
        let durable =
            Spi::get_one::<i64>("SELECT physical_ms FROM tsoracle.high_water").unwrap().unwrap();
        assert!(durable >= high_water, "the durable row {durable} covers the window {high_water}");
    }

    #[pg_test]
    fn seed_advances_the_oracle_and_never_lowers_it() {
        let target = now_ms() as i64 + 3_600_000;
        let high_water = tso_seed(target);
        assert!(high_water >= target);
        let ts = tso_next();
        assert!(tso_physical(ts) >= target, "next timestamp is at or above the seed");
        // A lower seed changes nothing backwards.
        tso_seed(1);
        assert!(tso_next() > ts);
    }

    #[pg_test]
    fn bad_seeds_are_22023() {
        assert_eq!(sqlstate_of(|| tso_seed(0)), ERRCODE_INVALID_PARAMETER_VALUE);
        assert_eq!(sqlstate_of(|| tso_seed(-1)), ERRCODE_INVALID_PARAMETER_VALUE);
        assert_eq!(sqlstate_of(|| tso_seed(1 << 46)), ERRCODE_INVALID_PARAMETER_VALUE);
        // Above the last millisecond a timestamp can be issued in: the allocator could not serve it.
        let beyond = timestamp::MAX_SQL_PHYSICAL_MS as i64 + 1;
        assert_eq!(sqlstate_of(move || tso_seed(beyond)), ERRCODE_INVALID_PARAMETER_VALUE);
    }

    #[pg_test]
    fn seed_needs_a_superuser() {
        Spi::run("CREATE ROLE tso_plain NOLOGIN").unwrap();
        Spi::run("SET LOCAL ROLE tso_plain").unwrap();
        assert_eq!(sqlstate_of(|| tso_seed(now_ms() as i64)), ERRCODE_INSUFFICIENT_PRIVILEGE);
    }

    #[pg_test]
    fn public_cannot_write_the_tables_or_seed() {
        Spi::run("CREATE ROLE tso_reader NOLOGIN").unwrap();
        let check = |sql: &str| Spi::get_one::<bool>(sql).unwrap().unwrap();
        for table in ["tsoracle.high_water", "tsoracle.seq", "tsoracle.lease"] {
            for privilege in ["INSERT", "UPDATE", "DELETE", "TRUNCATE"] {
                assert!(
                    !check(&format!(
                        "SELECT has_table_privilege('tso_reader', '{table}', '{privilege}')"
                    )),
                    "{privilege} on {table} must not be granted"
                );
            }
        }
        // The high-water is public knowledge (monitoring, standbys); counters and leases are not.
        assert!(check("SELECT has_table_privilege('tso_reader', 'tsoracle.high_water', 'SELECT')"));
        assert!(!check("SELECT has_table_privilege('tso_reader', 'tsoracle.seq', 'SELECT')"));
        assert!(!check("SELECT has_table_privilege('tso_reader', 'tsoracle.lease', 'SELECT')"));
        assert!(!check(
            "SELECT has_function_privilege('tso_reader', 'tso_seed(bigint)', 'EXECUTE')"
        ));
        assert!(check("SELECT has_function_privilege('tso_reader', 'tso_next()', 'EXECUTE')"));
        assert!(check("SELECT has_function_privilege('tso_reader', 'tso_status()', 'EXECUTE')"));
    }
}
