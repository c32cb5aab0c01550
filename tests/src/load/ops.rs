//! Ready-made operations for [`super::Load`].

use super::{Got, Op};
use std::sync::Arc;

/// `SELECT tso_next()`.
pub fn tso_next() -> Op {
    Arc::new(|c, _| Ok(Got::Batch(c.query_one("SELECT tso_next()", &[])?.try_get(0)?, 1)))
}

/// `SELECT tso_next_batch(k)`, k uniform in `1..=max`.
pub fn tso_next_batch(max: i32) -> Op {
    Arc::new(move |c, rng| {
        let k = rng.range_inclusive(1, max as i64) as i32;
        Ok(Got::Batch(c.query_one("SELECT tso_next_batch($1)", &[&k])?.try_get(0)?, k as i64))
    })
}

/// Half `tso_next()`, half `tso_next_batch(k)` with k uniform in `1..=max_batch`; one
/// batch in 200 asks for a random size up to the maximum (262144), which uses up a whole
/// millisecond's logical space.
pub fn mixed(max_batch: i32) -> Op {
    Arc::new(move |c, rng| {
        if rng.chance(0.5) {
            Ok(Got::Batch(c.query_one("SELECT tso_next()", &[])?.try_get(0)?, 1))
        } else {
            let max = if rng.chance(0.005) { crate::tso::MAX_BATCH } else { max_batch };
            let k = rng.range_inclusive(1, max as i64) as i32;
            Ok(Got::Batch(c.query_one("SELECT tso_next_batch($1)", &[&k])?.try_get(0)?, k as i64))
        }
    })
}

/// `SELECT tso_next_uuid()`: the timestamp it carries, decoded by the harness (a UUID that
/// is not version 7 fails the load).
pub fn tso_next_uuid() -> Op {
    Arc::new(|c, _| {
        let text: String = c.query_one("SELECT tso_next_uuid()::text", &[])?.try_get(0)?;
        let ts = crate::tso::uuid_timestamp(&text)
            .unwrap_or_else(|e| panic!("tso_next_uuid() returned {e}"));
        Ok(Got::Batch(ts, 1))
    })
}

/// A third each: `tso_next()`, `tso_next_uuid()` (recorded as the timestamp it carries, so
/// the history checks the UUIDs' order: their bytes are ordered like their timestamps) and
/// [`mixed`]'s batches.
pub fn mixed_with_uuid(max_batch: i32) -> Op {
    let (uuid, batches) = (tso_next_uuid(), mixed(max_batch));
    Arc::new(move |c, rng| if rng.chance(1.0 / 3.0) { uuid(c, rng) } else { batches(c, rng) })
}

/// The table [`statements`] writes: `ts` stamped by its default, `i` the row's place in its
/// statement, `batch` the statement.
pub const STAMPED: &str =
    "CREATE TABLE stamped (batch bigint NOT NULL, i int NOT NULL, ts bigint NOT NULL DEFAULT tso_next())";

/// Statements that take several values, each recorded with its values in the statement's
/// order: a multi-row `INSERT … SELECT` and a multi-row `INSERT … VALUES` into `stamped`
/// ([`STAMPED`]), a `COPY` into it (its values read back after), `SELECT tso_next()` over
/// `k` rows, and single calls. `k` is uniform in `2..=max_rows`.
pub fn statements(max_rows: i32) -> Op {
    Arc::new(move |c, rng| {
        let k = rng.range_inclusive(2, i64::from(max_rows)) as i32;
        let batch = (rng.next_u64() >> 1) as i64;
        let by_i = |rows: Vec<postgres::Row>| -> Result<Got, postgres::Error> {
            let mut v: Vec<(i32, i64)> = rows
                .iter()
                .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
                .collect::<Result<_, postgres::Error>>()?;
            v.sort_unstable();
            Ok(Got::Statement(v.into_iter().map(|(_, ts)| ts).collect()))
        };
        match rng.range_inclusive(0, 4) {
            0 => by_i(c.query(
                "INSERT INTO stamped (batch, i) SELECT $1, g FROM generate_series(1, $2::int) g RETURNING i, ts",
                &[&batch, &k],
            )?),
            1 => {
                let values: Vec<String> = (1..=k).map(|i| format!("({batch}, {i})")).collect();
                by_i(c.query(
                    &format!("INSERT INTO stamped (batch, i) VALUES {} RETURNING i, ts", values.join(", ")),
                    &[],
                )?)
            }
            2 => {
                use std::io::Write;
                let mut w = c.copy_in("COPY stamped (batch, i) FROM STDIN")?;
                let data: String = (1..=k).map(|i| format!("{batch}\t{i}\n")).collect();
                if let Err(e) = w.write_all(data.as_bytes()) {
                    // The server's error, which the writer carries as an I/O error.
                    let text = e.to_string();
                    return match e.into_inner().map(|b| b.downcast::<postgres::Error>()) {
                        Some(Ok(pg)) => Err(*pg),
                        _ => panic!("COPY: {text}"),
                    };
                }
                w.finish()?;
                by_i(c.query("SELECT i, ts FROM stamped WHERE batch = $1", &[&batch])?)
            }
            3 => by_i(c.query(
                "SELECT g, tso_next() FROM generate_series(1, $1::int) g",
                &[&k],
            )?),
            _ => Ok(Got::Batch(c.query_one("SELECT tso_next()", &[])?.try_get(0)?, 1)),
        }
    })
}

/// Any statement returning one bigint, count 1.
pub fn statement(sql: &str) -> Op {
    let sql = sql.to_string();
    Arc::new(move |c, _| Ok(Got::Batch(c.query_one(sql.as_str(), &[])?.try_get(0)?, 1)))
}

/// The same operations with unnamed statements (`query_typed`: parse, bind, execute and
/// sync in one round trip), for a transaction pooler ([`super::Endpoint::pooled`]): it
/// gives a client a server connection per transaction, so a statement prepared by name
/// in one round trip may be executed in the next on another server connection, which
/// does not know it (PgBouncer 1.18 has no prepared statements in transaction pooling).
pub mod unnamed {
    use super::super::{Got, Op};
    use postgres::types::Type;
    use std::sync::Arc;

    /// `SELECT tso_next()`.
    pub fn tso_next() -> Op {
        Arc::new(|c, _| Ok(Got::Batch(c.query_typed_one("SELECT tso_next()", &[])?.try_get(0)?, 1)))
    }

    fn batch(c: &mut postgres::Client, k: i32) -> Result<Got, postgres::Error> {
        let row = c.query_typed_one("SELECT tso_next_batch($1)", &[(&k, Type::INT4)])?;
        Ok(Got::Batch(row.try_get(0)?, k as i64))
    }

    /// `SELECT tso_next_uuid()`, recorded as the timestamp it carries.
    pub fn tso_next_uuid() -> Op {
        Arc::new(|c, _| {
            let text: String =
                c.query_typed_one("SELECT tso_next_uuid()::text", &[])?.try_get(0)?;
            let ts = crate::tso::uuid_timestamp(&text)
                .unwrap_or_else(|e| panic!("tso_next_uuid() returned {e}"));
            Ok(Got::Batch(ts, 1))
        })
    }

    /// As [`super::mixed_with_uuid`]: a third each of `tso_next_uuid()`, `tso_next()` and
    /// `tso_next_batch(k)` (k uniform in `1..=max_batch`, one in 200 up to the maximum).
    pub fn mixed_with_uuid(max_batch: i32) -> Op {
        let (next, uuid) = (tso_next(), tso_next_uuid());
        Arc::new(move |c, rng| {
            if rng.chance(1.0 / 3.0) {
                uuid(c, rng)
            } else if rng.chance(0.5) {
                next(c, rng)
            } else {
                let max = if rng.chance(0.005) { crate::tso::MAX_BATCH } else { max_batch };
                batch(c, rng.range_inclusive(1, max as i64) as i32)
            }
        })
    }
}
