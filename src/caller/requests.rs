//! Requests to the worker: a call that changes durable state (a new key, a peek, a drop, a
//! lease) goes into this backend's own entry of the request queue, and the caller sleeps on
//! its latch until the worker has answered (bounded by `tsoracle.extension_timeout_ms`).

use crate::pg::error::TsoError;
use crate::pg::guc;
use crate::shmem::member::MEMBER;
use crate::shmem::queue::my_queue_index;
use crate::shmem::{
    self, not_serving, Phase, Reply, ReplyCode, Request, RequestKind, ORACLE, QUEUE,
};
use pgrx::pg_guard;
use pgrx::pg_sys;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use tsoracle_core::queue::{EntryState, Ticket};

/// Like `wait_on`, but on this backend's own latch, which the worker sets when it has
/// answered our requests (PostgreSQL's synchronous replication waits the same way).
pub(super) fn wait_on_latch<T>(
    mut poll: impl FnMut() -> Result<Option<T>, TsoError>,
) -> Result<Option<T>, TsoError> {
    let timeout_ms = guc::extension_timeout_ms();
    let started = Instant::now();
    loop {
        // Reset before looking, so an answer that lands after the look still wakes us.
        // SAFETY: MyLatch is set for every backend before it runs SQL, and this process is
        // its owner, the only one allowed to reset it.
        unsafe { pg_sys::ResetLatch(pg_sys::MyLatch) };
        if let Some(v) = poll()? {
            return Ok(Some(v));
        }
        let left = timeout_ms - started.elapsed().as_millis() as i64;
        if left <= 0 {
            return Ok(None);
        }
        // SAFETY: waiting on our own latch (only its owner may wait on it); with
        // WL_EXIT_ON_PM_DEATH the process exits if the postmaster dies.
        unsafe {
            pg_sys::WaitLatch(
                pg_sys::MyLatch,
                (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
                left.min(50),
                pg_sys::PG_WAIT_EXTENSION,
            )
        };
        pg_sys::check_for_interrupts!();
    }
}

/// As [`submit`], but a call refused only because another transaction held the table or a
/// row it needs (every reply `Busy` or not granted: nothing was handed out) is queued again,
/// as an `INSERT` or `UPDATE` would wait for the lock: a brief lock (pg_repack's swap, a quick
/// `LOCK TABLE`) delays the call instead of failing it (a lock of the caller's own transaction
/// fails it at once). The wait is bounded by the caller's
/// `lock_timeout` if it has one, else by `tsoracle.extension_timeout_ms`, on the monotonic
/// clock; `statement_timeout` and a cancel end it as they end any wait.
pub fn submit_waiting_for_locks(requests: &[Request]) -> Result<Vec<Reply>, TsoError> {
    // SAFETY: a plain read of the backend's own lock_timeout setting.
    let lock_timeout = i64::from(unsafe { pg_sys::LockTimeout });
    let bound_ms = if lock_timeout > 0 { lock_timeout } else { guc::extension_timeout_ms() };
    let started = Instant::now();
    // SAFETY: a plain read of a backend global.
    let me = unsafe { pg_sys::MyProcPid };
    loop {
        let replies = submit(requests)?;
        let busy = replies.iter().any(|r| r.code == ReplyCode::Busy);
        let granted = replies.iter().any(|r| r.code == ReplyCode::Ok);
        // A lock the caller's own transaction holds is never released by waiting.
        let own = replies.iter().any(|r| {
            r.code == ReplyCode::Busy
                && crate::pg::locks::Blocker::decode(r.value)
                    == crate::pg::locks::Blocker::Process(me)
        });
        if !busy || granted || own || started.elapsed().as_millis() as i64 >= bound_ms {
            return Ok(replies);
        }
        // SAFETY: waiting on our own latch (only its owner may wait on it), as above.
        unsafe {
            pg_sys::ResetLatch(pg_sys::MyLatch);
            pg_sys::WaitLatch(
                pg_sys::MyLatch,
                (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
                10,
                pg_sys::PG_WAIT_EXTENSION,
            )
        };
        pg_sys::check_for_interrupts!();
    }
}

/// Hand `requests` to the worker as one call (all in the same group commit) and wait for
/// its answers. The call goes into this backend's own queue entry, so no other backend can
/// keep it from being queued. Waiting is bounded by `tsoracle.extension_timeout_ms`; a
/// caller that leaves (timeout, cancel, terminate, disconnect) after the worker took its
/// call may lose its effect (a gap), which is never given to anyone else.
pub fn submit(requests: &[Request]) -> Result<Vec<Reply>, TsoError> {
    let signals = shmem::signals()?;
    // A member whose worker refuses (a connection string libpq cannot read) says so at once,
    // and so does a cluster that has been a member, started without tsoracle.oracle.
    if (guc::is_member() || signals.may_serve_alone() == Some(false))
        && ORACLE.share().phase == Phase::Refused
    {
        return Err(not_serving(signals, Phase::Refused));
    }
    release_entry_at_exit();
    // SAFETY: plain reads of backend globals, set for every backend that runs SQL.
    let (role, waiter) = unsafe { (pg_sys::GetUserId().to_u32(), pg_sys::MyLatch as usize) };
    let requests: Vec<Request> = requests.iter().map(|r| Request { role, ..*r }).collect();
    let (ticket, will_look) = {
        let mut guard = QUEUE.exclusive()?;
        let mut queue = guard.queue();
        let ticket = queue
            .submit(my_queue_index(), &requests, waiter)
            .map_err(|e| TsoError::Internal(e.to_string()))?;
        (ticket, queue.header.worker_will_look)
    };
    // A worker that takes the queue again by itself (a proxy whose round trip is in flight)
    // needs no wake-up: it read the flag under the lock it takes the calls under.
    if !will_look {
        signals.wake_worker();
    }

    let mut pending = PendingCall { ticket, answered: false };
    let mut looks = 0u32;
    let replies = wait_on_latch(|| {
        looks += 1;
        {
            // Look under a shared lock, and poke the worker again, after a wait, only while
            // it has not taken the call yet (it may have been between lives when we queued
            // it).
            let queue = QUEUE.share()?;
            match queue.state(ticket) {
                Some(EntryState::Done) => {}
                Some(EntryState::Pending) => {
                    let poke = looks > 1 && !queue.header().worker_will_look;
                    drop(queue);
                    // A worker that refuses (handed over, a table it cannot use) takes no
                    // call until it is started again: give up now rather than at the timeout
                    // (below, the call is abandoned; one taken meanwhile is 40003). Looked at
                    // only after a wait: the first look, at once, is on every call's path.
                    if looks > 1 && ORACLE.share().phase == Phase::Refused {
                        return Ok(Some(None));
                    }
                    if poke {
                        signals.wake_worker();
                    }
                    return Ok(None);
                }
                _ => return Ok(None),
            }
        }
        Ok(QUEUE.exclusive()?.queue().take_replies(ticket).map(Some))
    })?
    .flatten();
    match replies {
        Some(replies) if replies.len() == requests.len() => {
            pending.answered = true;
            Ok(replies)
        }
        _ => {
            let maybe_done = pending.abandon();
            let phase = ORACLE.share().phase;
            // On a member, a timestamp or a read lost on the way is simply not returned: the
            // call can be retried (57P03); a block or a lease may have been granted (40003).
            let rereadable = requests.iter().all(|r| {
                matches!(
                    r.kind,
                    RequestKind::Next | RequestKind::SafeFrontier | RequestKind::SeqPeek
                )
            });
            Err(if guc::is_member() && (rereadable || !maybe_done) {
                member_not_answering()
            } else if maybe_done {
                TsoError::OutcomeUnknown(format!(
                    "timed out after {} ms waiting for the tsoracle worker to commit",
                    guc::extension_timeout_ms()
                ))
            } else if phase != Phase::Serving {
                not_serving(signals, phase)
            } else {
                TsoError::WorkerTimeout {
                    waited_ms: guc::extension_timeout_ms(),
                    what: "take the request",
                }
            })
        }
    }
}

/// A call in flight; dropped without an answer (error, cancel) it is abandoned.
struct PendingCall {
    ticket: Ticket,
    answered: bool,
}

impl PendingCall {
    /// Give up the call; true if the worker may already have committed it.
    fn abandon(&mut self) -> bool {
        self.answered = true;
        match QUEUE.exclusive() {
            // Only a refusal or a rolled-back commit says the call was never carried out;
            // "unknown" (the worker restarted mid-commit) may have been.
            Ok(mut queue) => queue
                .queue()
                .abandon(self.ticket, |r| matches!(r.code, ReplyCode::Refused | ReplyCode::Failed)),
            Err(_) => false,
        }
    }
}

impl Drop for PendingCall {
    fn drop(&mut self) {
        if !self.answered {
            self.abandon();
        }
    }
}

/// Once per backend: when it exits by any path (FATAL, `pg_terminate_backend`, client
/// disconnect, `proc_exit`) while a call of its own is queued, give that call up, so the
/// entry is clean for the next backend (PostgreSQL runs `before_shmem_exit` callbacks on
/// every orderly exit; a crash reinitialises shared memory altogether).
fn release_entry_at_exit() {
    static REGISTERED: AtomicBool = AtomicBool::new(false);
    if !REGISTERED.swap(true, Ordering::Relaxed) {
        // SAFETY: registering a callback with a static function and no argument.
        unsafe {
            pg_sys::before_shmem_exit(Some(release_queue_entry), pg_sys::Datum::from(0usize))
        };
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn release_queue_entry(_code: std::ffi::c_int, _arg: pg_sys::Datum) {
    // This backend never holds the queue's LWLock across anything that can exit, so taking
    // it here cannot deadlock with itself.
    if let Ok(mut queue) = QUEUE.exclusive() {
        queue.queue().release_entry(my_queue_index());
    }
}

/// The name of a role, for messages (its OID if it no longer exists).
pub fn role_name(oid: u32) -> String {
    // SAFETY: GetUserNameFromId with noerr = true returns NULL for an unknown role and
    // otherwise a palloc'd NUL-terminated string, which we copy at once.
    let name = unsafe { pg_sys::GetUserNameFromId(pg_sys::Oid::from(oid), true) };
    if name.is_null() {
        format!("with OID {oid}")
    } else {
        // SAFETY: not NULL, so a NUL-terminated string in the current memory context (see
        // above), alive until we have copied it here.
        format!("\"{}\"", unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy())
    }
}

/// Refuse a key or holder the worker's database could not store: where it is not UTF8,
/// names must be ASCII.
pub fn check_storable(name: &str, what: &str) -> Result<(), TsoError> {
    if !name.is_ascii() && ORACLE.share().ascii_names_only {
        return Err(TsoError::InvalidArgument(format!(
            "{what} \"{}\" is not ASCII, and database \"{}\" (tsoracle.database) is not UTF8-encoded: it can hold ASCII names only",
            name.escape_default(),
            guc::database()
        )));
    }
    Ok(())
}

/// The errors any request can be answered with; `what` names the key or lease.
pub fn reply_error(reply: &Reply, what: &str) -> Option<TsoError> {
    match reply.code {
        ReplyCode::PermissionDenied => Some(TsoError::InsufficientPrivilege(format!(
            "{what} belongs to role {}",
            role_name(u32::try_from(reply.value).unwrap_or(0))
        ))),
        ReplyCode::BadEncoding => Some(TsoError::InvalidArgument(format!(
            "{what} cannot be stored: database \"{}\" (tsoracle.database) is not UTF8-encoded and holds ASCII names only",
            guc::database()
        ))),
        ReplyCode::Refused => Some(TsoError::NotServing(
            ORACLE.share().refusal().unwrap_or_else(|| "the tsoracle worker refused the request".into()),
        )),
        ReplyCode::Unknown => {
            Some(TsoError::OutcomeUnknown(format!("the tsoracle worker restarted while committing {what}")))
        }
        ReplyCode::Failed => Some(TsoError::NotServing(format!(
            "the tsoracle worker could not commit {what} and rolled it back (the server log says why)"
        ))),
        ReplyCode::Remote => Some(remote_error(reply, what)),
        ReplyCode::Lost => Some(TsoError::OracleAnswerLost(what.to_string())),
        ReplyCode::Busy => Some(TsoError::Busy {
            what: if reply.table_locked {
                format!("the table that holds {what}")
            } else {
                what.to_string()
            },
            blocker: crate::pg::locks::Blocker::decode(reply.value),
        }),
        _ => None,
    }
}

/// The error the oracle answered a call with (`ReplyCode::Remote`), or what became of it.
fn remote_error(reply: &Reply, what: &str) -> TsoError {
    let generation = u64::try_from(reply.epoch).unwrap_or(0);
    match MEMBER.share().error_of(generation) {
        // Not served in time: retryable, with the member's HINT.
        Some(e) if &e.sqlstate == b"57P03" && e.hint.get().is_none() => {
            TsoError::OracleUnreachable(
                e.message.get().unwrap_or_else(|| format!("the oracle did not serve {what}")),
            )
        }
        Some(e) => TsoError::Oracle {
            sqlstate: e.sqlstate,
            message: e.message.get().unwrap_or_else(|| format!("the oracle refused {what}")),
            hint: e.hint.get(),
        },
        None => TsoError::OracleUnreachable(format!("the oracle refused {what}")),
    }
}

/// Why the member serves nothing now, for a caller that waited in vain.
fn member_not_answering() -> TsoError {
    let st = MEMBER.share();
    TsoError::OracleUnreachable(match (st.connected, st.last_error.get()) {
        (_, Some(why)) => why,
        (true, None) => "no answer within tsoracle.extension_timeout_ms".into(),
        (false, None) => "the member's worker is connecting to the oracle".into(),
    })
}
