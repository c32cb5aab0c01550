//! What a member's call becomes on the oracle (docs/fleet.md): the statement for each kind of
//! request, and the replies read back from its rows. Every statement names a function of
//! schema `tsoracle` with `pg_catalog` types: the member's role on the oracle resolves nothing
//! through a search path.

use crate::shmem::{Reply, ReplyCode, Request, RequestKind};
use std::ffi::CStr;
use tsoracle_core::queue::Ticket;

/// Refusals the oracle answers before doing anything (not serving yet; a standby): the call
/// is sent again until its deadline.
pub(super) const RETRYABLE: [&str; 2] = ["57P03", "25006"];

/// The setting of the oracle session in which a member's hello names its connection.
pub(super) use crate::pg::guc::member_session as session_setting;

/// A statement's text from literals (and macros that expand to literals), NUL-terminated.
macro_rules! sql {
    ($($part:tt)+) => {
        match ::std::ffi::CStr::from_bytes_with_nul(concat!($($part)+, "\0").as_bytes()) {
            Ok(sql) => sql,
            Err(_) => panic!("a statement with a NUL inside"),
        }
    };
}
pub(super) use sql;

/// Statement `$sql`, run only on the oracle session whose hello named this connection (its
/// parameter `$n` is that name: `HELLO` in mod.rs): elsewhere it does nothing (a one-time
/// filter, evaluated before the function) and answers no row.
macro_rules! gated {
    ($sql:literal, $n:literal) => {
        $crate::worker::member::calls::sql!(
            $sql,
            " WHERE pg_catalog.current_setting('",
            $crate::worker::member::calls::session_setting!(),
            "', true) OPERATOR(pg_catalog.=) $",
            $n,
            "::pg_catalog.text"
        )
    };
}
pub(super) use gated;

const SEQ: &CStr = gated!("SELECT start, epoch, made FROM tsoracle.member_seq($1::pg_catalog.text[], $2::pg_catalog.int4[])", 3);
const SEQ_PEEK: &CStr =
    gated!("SELECT next, epoch FROM tsoracle.member_seq_peek($1::pg_catalog.text)", 2);
const SEQ_DROP: &CStr =
    gated!("SELECT dropped, epoch FROM tsoracle.member_seq_drop($1::pg_catalog.text)", 2);
const LEASE_ACQUIRE: &CStr = gated!("SELECT lease_id, ts_lower_bound, ts_upper_bound, expires_at_ms, lease_epoch, epoch FROM tsoracle.member_lease_acquire($1::pg_catalog.text, $2::pg_catalog.int8, $3::pg_catalog.int4, $4::pg_catalog.bool)", 5);
const LEASE_RENEW: &CStr = gated!("SELECT lease_id, ts_lower_bound, ts_upper_bound, expires_at_ms, lease_epoch, epoch FROM tsoracle.member_lease_renew($1::pg_catalog.int8, $2::pg_catalog.bool)", 3);
const LEASE_RELEASE: &CStr =
    gated!("SELECT $1::pg_catalog.int8, tsoracle.member_lease_release($1::pg_catalog.int8)", 2);
const FRONTIER: &CStr = gated!("SELECT frontier, epoch FROM tsoracle.member_safe_frontier()", 1);

/// Why a statement answered no row: it ran on an oracle session whose hello did not name this
/// connection, and did nothing there.
pub(super) const OTHER_SESSION: &str = "the oracle answered from a session this member's hello did not name, and did nothing: its statements reach other backends than the one that said its hello (tsoracle.oracle through a pooler in transaction mode?); connect to the oracle directly or through a pooler in session mode";

/// A text array literal of `items`, each quoted.
fn text_array<'a>(items: impl Iterator<Item = &'a str>) -> String {
    let quoted: Vec<String> =
        items.map(|s| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))).collect();
    format!("{{{}}}", quoted.join(","))
}

/// The statement and parameters that carry out one call on the oracle, but for the last (the
/// connection's name in its session); `None` for a call no statement carries (it is refused).
pub(super) fn call_statement(requests: &[Request]) -> Option<(&'static CStr, Vec<String>)> {
    let first = requests.first()?;
    let all = |kind: RequestKind| requests.iter().all(|r| r.kind == kind);
    let legacy = |r: &Request| if r.legacy { "true" } else { "false" }.to_string();
    Some(match first.kind {
        RequestKind::SeqAdvance if all(RequestKind::SeqAdvance) => (
            SEQ,
            vec![
                text_array(requests.iter().map(|r| r.name())),
                format!(
                    "{{{}}}",
                    requests.iter().map(|r| r.count.to_string()).collect::<Vec<_>>().join(",")
                ),
            ],
        ),
        _ if requests.len() != 1 => return None,
        RequestKind::SeqPeek => (SEQ_PEEK, vec![first.name().to_string()]),
        RequestKind::SeqDrop => (SEQ_DROP, vec![first.name().to_string()]),
        RequestKind::LeaseAcquire => (
            LEASE_ACQUIRE,
            vec![
                first.name().to_string(),
                first.arg.to_string(),
                first.count.to_string(),
                legacy(first),
            ],
        ),
        RequestKind::LeaseRenew => (LEASE_RENEW, vec![first.arg.to_string(), legacy(first)]),
        RequestKind::LeaseRelease => (LEASE_RELEASE, vec![first.arg.to_string()]),
        RequestKind::SafeFrontier => (FRONTIER, Vec::new()),
        RequestKind::SeqAdvance | RequestKind::Next => return None,
    })
}

fn int(row: &[Option<String>], i: usize) -> Result<Option<i64>, String> {
    match row.get(i) {
        None => Err(format!("the oracle answered a row without column {i}: {row:?}")),
        Some(None) => Ok(None),
        Some(Some(v)) => match v.as_str() {
            "t" => Ok(Some(1)),
            "f" => Ok(Some(0)),
            _ => v.parse::<i64>().map(Some).map_err(|_| format!("the oracle answered {v:?}")),
        },
    }
}

fn required(row: &[Option<String>], i: usize) -> Result<i64, String> {
    int(row, i)?.ok_or_else(|| format!("the oracle answered NULL in column {i}"))
}

/// The replies to one call from its rows, and the epoch they came with.
pub(super) fn answer_call(
    requests: &[Request],
    rows: &[Vec<Option<String>>],
) -> Result<(Vec<Reply>, u64), String> {
    let first = requests.first().ok_or("a call without requests")?;
    if rows.is_empty() {
        return Err(OTHER_SESSION.into());
    }
    let epoch_col = match first.kind {
        RequestKind::LeaseAcquire | RequestKind::LeaseRenew => 5,
        _ => 1,
    };
    let epoch = rows
        .first()
        .map(|row| required(row, epoch_col))
        .transpose()?
        .and_then(|e| u64::try_from(e).ok())
        .ok_or("the oracle answered no epoch")?;
    let replies = match first.kind {
        RequestKind::SeqAdvance => {
            if rows.len() != requests.len() {
                return Err(format!(
                    "the oracle answered {} blocks for {} keys",
                    rows.len(),
                    requests.len()
                ));
            }
            // Each block with the key's incarnation, which the member checks (and keeps)
            // against the blocks it handed out before.
            rows.iter()
                .map(|row| Ok(Reply { made: required(row, 2)?, ..Reply::ok(required(row, 0)?) }))
                .collect::<Result<_, String>>()?
        }
        RequestKind::SeqPeek => vec![match int(&rows[0], 0)? {
            Some(v) => Reply::ok(v),
            None => Reply::err(ReplyCode::Null),
        }],
        RequestKind::SeqDrop => vec![match required(&rows[0], 0)? {
            1 => Reply::ok(1),
            _ => Reply::err(ReplyCode::Null),
        }],
        RequestKind::LeaseAcquire | RequestKind::LeaseRenew => {
            let row = &rows[0];
            vec![Reply {
                code: ReplyCode::Ok,
                value: required(row, 0)?,
                from_ms: required(row, 1)?,
                bound_ms: required(row, 2)?,
                expires_at_ms: required(row, 3)?,
                epoch: required(row, 4)?,
                table_locked: false,
                made: 0,
            }]
        }
        RequestKind::LeaseRelease => vec![Reply::ok(first.arg)],
        RequestKind::SafeFrontier => vec![Reply::ok(required(&rows[0], 0)?)],
        RequestKind::Next => return Err("a timestamp call answered as another kind".into()),
    };
    Ok((replies, epoch))
}

/// The coalesced calls' values: `[first, first + total)` split in the calls' order.
pub(super) fn answer_next(first: u64, calls: &[(Ticket, u32)]) -> Vec<(Ticket, Vec<Reply>)> {
    let counts: Vec<u32> = calls.iter().map(|(_, c)| *c).collect();
    calls
        .iter()
        .zip(tsoracle_core::member::split(first, &counts))
        .map(|((ticket, _), start)| (*ticket, vec![Reply::ok(start as i64)]))
        .collect()
}

/// The reply to a call the oracle answered with an error, kept in `shmem::member::MEMBER` under
/// the call's generation (`Reply::epoch`) for its caller to raise.
pub(super) fn remote(ticket: Ticket) -> Reply {
    Reply { epoch: ticket.generation as i64, ..Reply::err(ReplyCode::Remote) }
}

/// The answer to a call that may have been carried out on the oracle but whose answer is
/// not known: `40003` for each of its requests, never sent again.
pub(super) fn lost(ticket: Ticket, requests: &[Request]) -> (Ticket, Vec<Reply>) {
    (ticket, vec![Reply::err(ReplyCode::Lost); requests.len()])
}

/// A call that only reads (the safe frontier, a peek): sent again if its answer was lost.
pub(super) fn rereadable(requests: &[Request]) -> bool {
    requests.iter().all(|r| matches!(r.kind, RequestKind::SafeFrontier | RequestKind::SeqPeek))
}
