//! SQL surface of the dense sequences: `tso_seq`, `tso_seq_batch`, `tso_seq_peek`.
//! `tso_seq` on an existing key of the worker's database advances it in place
//! (`seq_inplace`); every other call is a request to the worker, which group-commits them.

use crate::caller::requests::{check_storable, reply_error, submit, submit_waiting_for_locks};
use crate::caller::window::ensure_primary;
use crate::pg::error::{refuse_in_parallel_mode, OrReport, TsoError};
use crate::pg::guc;
use crate::shmem::{Reply, ReplyCode, Request, RequestKind};
use pgrx::prelude::*;
use tsoracle_core::seq::{validate_count, validate_key};

/// Most keys one `tso_seq_batch()` call may advance (one call fills one queue entry).
pub const MAX_BATCH_KEYS: usize = tsoracle_core::queue::MAX_REQUESTS;

fn checked_key(key: Option<&str>) -> Result<&str, TsoError> {
    let key =
        key.ok_or_else(|| TsoError::InvalidArgument("sequence key must not be NULL".into()))?;
    validate_key(key)?;
    check_storable(key, "sequence key")?;
    Ok(key)
}

fn checked_count(count: Option<i32>) -> Result<u64, TsoError> {
    let count = count.ok_or_else(|| TsoError::InvalidArgument("count must not be NULL".into()))?;
    Ok(validate_count(i64::from(count), guc::max_seq_count())?)
}

/// A block granted: its start, and the key's incarnation (`tsoracle.seq.made`), which a
/// member keeps with the block's end (docs/fleet.md, "What is checked, and refused").
#[derive(Clone, Copy, Debug)]
pub(crate) struct Block {
    pub start: i64,
    pub made: i64,
}

fn block_of(key: &str, count: u64, reply: Reply) -> Result<Block, TsoError> {
    if let Some(e) = reply_error(&reply, &format!("sequence key \"{key}\"")) {
        return Err(e);
    }
    match reply.code {
        ReplyCode::Ok => Ok(Block { start: reply.value, made: reply.made }),
        ReplyCode::SeqOverflow => Err(TsoError::NumericOutOfRange(format!(
            "sequence \"{key}\" cannot grant {count} more values without overflowing bigint"
        ))),
        ReplyCode::TooManyKeys => Err(TsoError::TooManyKeys(guc::max_seq_keys())),
        other => {
            Err(TsoError::Internal(format!("unexpected reply to a sequence advance: {other:?}")))
        }
    }
}

pub(super) fn advance(key: Option<&str>, count: Option<i32>) -> Result<Block, TsoError> {
    refuse_in_parallel_mode("tso_seq()")?;
    let key = checked_key(key)?;
    let count = checked_count(count)?;
    ensure_primary("advance a sequence")?;
    // In place only once the worker found that this cluster may serve on its own: a cluster
    // that has been a member (its standby promoted without tsoracle.oracle) never grants from
    // its own table, whose counters lack the fleet's blocks.
    if crate::shmem::signals()?.may_serve_alone() == Some(true) {
        if let Some((start, made)) = crate::caller::seq_in_place::try_advance(key, count)? {
            return Ok(Block { start, made });
        }
    }
    let replies = submit_waiting_for_locks(&[Request::new(RequestKind::SeqAdvance, key, count)])?;
    let reply = replies.first().copied().ok_or_else(|| TsoError::Internal("no reply".into()))?;
    block_of(key, count, reply)
}

/// Durably advance counter `key` by `count`; returns the value before the advance, so the
/// caller owns `[start, start + count)`. A new key starts at 0.
#[pg_extern(volatile, parallel_unsafe)]
fn tso_seq(key: Option<&str>, count: default!(Option<i32>, 1)) -> i64 {
    advance(key, count).map(|b| b.start).or_report()
}

/// Advance several keys atomically (one commit, all or nothing), in request order.
// pgrx derives the result columns from the signature: the TableIterator type is spelled inline.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_unsafe)]
fn tso_seq_batch(
    keys: Option<Vec<Option<String>>>,
    counts: Option<Vec<Option<i32>>>,
) -> TableIterator<'static, (name!(key, String), name!(start, i64), name!(count, i32))> {
    TableIterator::new(
        batch(keys, counts)
            .map(|blocks| {
                blocks.into_iter().map(|(key, b, count)| (key, b.start, count)).collect::<Vec<_>>()
            })
            .or_report(),
    )
}

pub(super) fn batch(
    keys: Option<Vec<Option<String>>>,
    counts: Option<Vec<Option<i32>>>,
) -> Result<Vec<(String, Block, i32)>, TsoError> {
    refuse_in_parallel_mode("tso_seq_batch()")?;
    let (Some(keys), Some(counts)) = (keys, counts) else {
        return Err(TsoError::InvalidArgument("keys and counts must not be NULL".into()));
    };
    if keys.is_empty() {
        return Err(TsoError::InvalidArgument("keys must not be empty".into()));
    }
    if keys.len() != counts.len() {
        return Err(TsoError::InvalidArgument(format!(
            "keys and counts must have the same length, got {} and {}",
            keys.len(),
            counts.len()
        )));
    }
    if keys.len() > MAX_BATCH_KEYS {
        return Err(TsoError::InvalidArgument(format!(
            "at most {MAX_BATCH_KEYS} keys per call, got {}",
            keys.len()
        )));
    }
    let mut requests = Vec::with_capacity(keys.len());
    for (i, (key, count)) in keys.iter().zip(&counts).enumerate() {
        let key = checked_key(key.as_deref())?;
        if keys[..i].iter().any(|k| k.as_deref() == Some(key)) {
            return Err(TsoError::InvalidArgument(format!("key \"{key}\" appears more than once")));
        }
        requests.push(Request::new(RequestKind::SeqAdvance, key, checked_count(*count)?));
    }
    ensure_primary("advance a sequence")?;
    let replies = submit_waiting_for_locks(&requests)?;
    requests
        .iter()
        .zip(replies)
        .map(|(r, reply)| {
            Ok((r.name().to_string(), block_of(r.name(), r.count, reply)?, r.count as i32))
        })
        .collect()
}

/// The start the next `tso_seq(key)` would get; NULL for a key never advanced.
#[pg_extern(volatile, parallel_unsafe)]
fn tso_seq_peek(key: Option<&str>) -> Option<i64> {
    peek(key).or_report()
}

pub(super) fn peek(key: Option<&str>) -> Result<Option<i64>, TsoError> {
    refuse_in_parallel_mode("tso_seq_peek()")?;
    let key = checked_key(key)?;
    ensure_primary("read a sequence")?;
    let reply = one_reply(Request::new(RequestKind::SeqPeek, key, 0))?;
    if let Some(e) = reply_error(&reply, &format!("sequence key \"{key}\"")) {
        return Err(e);
    }
    match reply.code {
        ReplyCode::Ok => Ok(Some(reply.value)),
        ReplyCode::Null => Ok(None),
        other => Err(TsoError::Internal(format!("unexpected reply to a peek: {other:?}"))),
    }
}

fn one_reply(request: Request) -> Result<Reply, TsoError> {
    submit(&[request])?.first().copied().ok_or_else(|| TsoError::Internal("no reply".into()))
}

/// Remove counter `key` (its owner or a superuser): it is forgotten, and a later
/// `tso_seq(key)` starts it again at 0 as a new key. False if there was no such key.
#[pg_extern(volatile, parallel_unsafe)]
fn tso_seq_drop(key: Option<&str>) -> bool {
    drop_key(key).or_report()
}

pub(super) fn drop_key(key: Option<&str>) -> Result<bool, TsoError> {
    refuse_in_parallel_mode("tso_seq_drop()")?;
    let key = checked_key(key)?;
    ensure_primary("drop a sequence")?;
    let reply = one_reply(Request::new(RequestKind::SeqDrop, key, 0))?;
    if let Some(e) = reply_error(&reply, &format!("sequence key \"{key}\"")) {
        return Err(e);
    }
    match reply.code {
        ReplyCode::Ok => Ok(true),
        ReplyCode::Null => Ok(false),
        other => Err(TsoError::Internal(format!("unexpected reply to a drop: {other:?}"))),
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use super::*;
    use crate::pg::testing::{can_execute, sqlstate_of};
    use pgrx::PgSqlErrorCode::*;

    #[pg_test]
    fn blocks_of_a_key_tile_and_peek_shows_the_next() {
        assert_eq!(tso_seq_peek(Some("tile")), None, "an unknown key peeks as NULL");
        assert_eq!(tso_seq(Some("tile"), Some(5)), 0, "a new key starts at 0");
        assert_eq!(tso_seq(Some("tile"), Some(3)), 5);
        assert_eq!(tso_seq(Some("tile"), Some(1)), 8);
        assert_eq!(tso_seq_peek(Some("tile")), Some(9));
        assert_eq!(
            Spi::get_one::<i64>("SELECT tso_seq('tile')").unwrap(),
            Some(9),
            "count defaults to 1"
        );
        assert_eq!(tso_seq(Some("other"), Some(2)), 0, "keys are independent");
    }

    #[pg_test]
    fn the_block_is_not_rolled_back_with_the_caller() {
        // The pg_test transaction itself is rolled back at the end; the worker committed.
        let start = tso_seq(Some("durable"), Some(10));
        let durable =
            Spi::get_one::<i64>("SELECT next FROM tsoracle.seq WHERE key = 'durable'").unwrap();
        assert_eq!(durable, Some(start + 10));
    }

    #[pg_test]
    fn bad_keys_are_22023() {
        assert_eq!(sqlstate_of(|| tso_seq(None, Some(1))), ERRCODE_INVALID_PARAMETER_VALUE);
        assert_eq!(sqlstate_of(|| tso_seq(Some(""), Some(1))), ERRCODE_INVALID_PARAMETER_VALUE);
        let long = "k".repeat(129);
        assert_eq!(sqlstate_of(|| tso_seq(Some(&long), Some(1))), ERRCODE_INVALID_PARAMETER_VALUE);
        // 65 two-byte characters: 130 bytes, although only 65 characters.
        let wide = "é".repeat(65);
        assert_eq!(sqlstate_of(|| tso_seq(Some(&wide), Some(1))), ERRCODE_INVALID_PARAMETER_VALUE);
        assert_eq!(tso_seq(Some(&"é".repeat(64)), Some(1)), 0, "128 bytes is allowed");
        assert_eq!(sqlstate_of(|| tso_seq_peek(None)), ERRCODE_INVALID_PARAMETER_VALUE);
    }

    #[pg_test]
    fn a_dropped_key_starts_again_at_0() {
        assert_eq!(tso_seq(Some("dropme"), Some(7)), 0);
        assert!(drop_key(Some("dropme")).unwrap(), "the key existed");
        assert_eq!(tso_seq_peek(Some("dropme")), None, "it is gone");
        assert!(!drop_key(Some("dropme")).unwrap(), "dropping it again finds nothing");
        assert_eq!(tso_seq(Some("dropme"), Some(1)), 0, "a new key starts at 0");
    }

    #[pg_test]
    fn sequences_are_a_privilege() {
        Spi::run("CREATE ROLE tso_no_seq NOLOGIN; CREATE ROLE tso_seq_role NOLOGIN IN ROLE tsoracle_seq_user").unwrap();
        for f in [
            "tso_seq(text, integer)",
            "tso_seq_batch(text[], integer[])",
            "tso_seq_peek(text)",
            "tso_seq_drop(text)",
        ] {
            assert!(!can_execute("tso_no_seq", f), "PUBLIC must not execute {f}");
            assert!(can_execute("tso_seq_role", f), "tsoracle_seq_user executes {f}");
        }
        tso_seq(Some("owned"), Some(1));
        let owner = Spi::get_one::<bool>(
            "SELECT owner = current_user::regrole FROM tsoracle.seq WHERE key = 'owned'",
        )
        .unwrap();
        assert_eq!(owner, Some(true), "a new key belongs to the role that created it");
    }

    #[pg_test]
    fn bad_counts_are_22023() {
        assert_eq!(sqlstate_of(|| tso_seq(Some("c"), Some(0))), ERRCODE_INVALID_PARAMETER_VALUE);
        assert_eq!(sqlstate_of(|| tso_seq(Some("c"), Some(-1))), ERRCODE_INVALID_PARAMETER_VALUE);
        assert_eq!(sqlstate_of(|| tso_seq(Some("c"), None)), ERRCODE_INVALID_PARAMETER_VALUE);
        assert_eq!(
            sqlstate_of(|| tso_seq(Some("c"), Some(65_537))),
            ERRCODE_INVALID_PARAMETER_VALUE
        );
        Spi::run("SET LOCAL tsoracle.max_seq_count = 10").unwrap();
        assert_eq!(sqlstate_of(|| tso_seq(Some("c"), Some(11))), ERRCODE_INVALID_PARAMETER_VALUE);
        assert_eq!(tso_seq(Some("c"), Some(10)), 0);
        assert_eq!(tso_seq_peek(Some("c")), Some(10), "nothing was taken by the rejected calls");
    }

    #[pg_test]
    fn batch_advances_in_request_order() {
        let rows =
            batch(Some(vec![Some("b1".into()), Some("b2".into())]), Some(vec![Some(3), Some(4)]))
                .unwrap();
        let starts: Vec<(String, i64, i32)> =
            rows.iter().map(|(k, b, c)| (k.clone(), b.start, *c)).collect();
        assert_eq!(starts, vec![("b1".into(), 0, 3), ("b2".into(), 0, 4)]);
        // Each new key with its incarnation, a timestamp the worker issued: the later key's
        // is higher (made in the same group, in key order).
        assert!(rows[0].1.made > 0 && rows[1].1.made > rows[0].1.made, "{rows:?}");
        let again = Spi::get_one::<i64>(
            "SELECT sum(start)::bigint FROM tso_seq_batch(ARRAY['b2','b1'], ARRAY[1,1])",
        )
        .unwrap();
        assert_eq!(again, Some(4 + 3));
    }

    #[pg_test]
    fn bad_batches_are_22023_and_advance_nothing() {
        let k = |s: &str| Some(s.to_string());
        // The arguments of tso_seq_batch: keys, counts.
        type Case = (Option<Vec<Option<String>>>, Option<Vec<Option<i32>>>);
        let cases: Vec<Case> = vec![
            (None, Some(vec![Some(1)])),
            (Some(vec![k("x")]), None),
            (Some(vec![]), Some(vec![])),
            (Some(vec![k("x"), k("y")]), Some(vec![Some(1)])),
            (Some(vec![k("x"), k("x")]), Some(vec![Some(1), Some(1)])),
            (Some(vec![k("x"), None]), Some(vec![Some(1), Some(1)])),
            (Some(vec![k("x"), k("y")]), Some(vec![Some(1), None])),
            (Some(vec![k("x"), k("y")]), Some(vec![Some(1), Some(0)])),
            (Some(vec![k("x"), k("")]), Some(vec![Some(1), Some(1)])),
            (
                Some((0..=MAX_BATCH_KEYS).map(|i| k(&format!("m{i}"))).collect()),
                Some(vec![Some(1); MAX_BATCH_KEYS + 1]),
            ),
        ];
        for (keys, counts) in cases {
            let shown = format!("{keys:?} / {counts:?}");
            assert_eq!(
                sqlstate_of(move || batch(keys, counts).or_report()),
                ERRCODE_INVALID_PARAMETER_VALUE,
                "{shown}"
            );
        }
        assert_eq!(tso_seq_peek(Some("x")), None, "no rejected batch advanced x");
    }
}
