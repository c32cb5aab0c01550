//! The group commit: every pending call in ONE transaction, then every answer; and who may
//! do what (owners of keys and leases, superusers, names the database can store).

use super::checks::Checks;
use super::high_water::RaiseError;
use super::leases::{mutate_leases, LeaseGrant};
use super::sequences::{advance_sequences, SeqStatements};
use super::state::{strict_mode_refusal, Worker};
use crate::pg::clock;
use crate::pg::locks::{relation_blocker, Blocker};
use crate::pg::xact::{subtransaction, transaction};
use crate::shmem::holders::WorkerHold;
use crate::shmem::{self, Reply, ReplyCode, Request, RequestKind, ORACLE, QUEUE};
use pgrx::pg_sys;
use tsoracle_core::lease::stamp_from_ms;
use tsoracle_core::locks::ROW_EXCLUSIVE;
use tsoracle_core::queue::Ticket;

/// `tsoracle.lease`'s OID, to name who holds it.
fn lease_table() -> Option<pg_sys::Oid> {
    // SAFETY: syscache lookups by fixed names inside the transaction (missing_ok).
    unsafe {
        let schema = pg_sys::get_namespace_oid(c"tsoracle".as_ptr(), true);
        (schema != pg_sys::InvalidOid)
            .then(|| pg_sys::get_relname_relid(c"lease".as_ptr(), schema))
            .filter(|&relid| relid != pg_sys::InvalidOid)
    }
}

impl Worker {
    /// Group commit: take every pending call into ONE transaction, commit once (with
    /// `synchronous_commit = on`), then answer them all.
    pub(super) fn serve_requests(&mut self) {
        let calls = match QUEUE.exclusive() {
            Ok(mut queue) => queue.queue().take_pending(),
            Err(_) => return,
        };
        if calls.is_empty() {
            return;
        }
        // A restore committed since this worker last looked whether the cluster may serve on
        // its own: it may have brought a member's mark (`member::alone`). These calls are
        // served only if it did not (the fence that follows looks again); else, or if the
        // mark cannot be read, they are refused (retryable).
        if self.signals.may_serve_alone().is_none() && !matches!(super::member::marked(), Ok(false))
        {
            let refused: Vec<(Ticket, Vec<Reply>)> = calls
                .iter()
                .map(|(ticket, requests)| {
                    (*ticket, vec![Reply::err(ReplyCode::Refused); requests.len()])
                })
                .collect();
            super::member::answer(&refused);
            return;
        }
        // One request per row, each carrying its call's generation as its batch.
        let taken: Vec<(Ticket, Request)> = calls
            .iter()
            .flat_map(|(ticket, requests)| {
                requests.iter().map(move |r| (*ticket, Request { batch: ticket.generation, ..*r }))
            })
            .collect();
        // The group's commit starts now: the confirmation it earns dates from here.
        let started = clock::sample();
        let (window, epoch, ascii_only) = {
            let st = ORACLE.share();
            (st.allocator.high_water_ms(), st.allocator.epoch().unwrap_or(0), st.ascii_names_only)
        };
        // Grants and renewals of leases: the lowest value their holders may stamp, above every
        // R handed out before they are published (the hold lasts until then). Without a
        // window to take from, one past the window: R cannot pass it before the worker
        // extends the window, which it does after publishing.
        let grants = taken
            .iter()
            .any(|(_, r)| matches!(r.kind, RequestKind::LeaseAcquire | RequestKind::LeaseRenew));
        let hold = grants.then(|| WorkerHold::take(self.signals)).flatten();
        let stamp_from_ms =
            hold.as_ref().map_or(window.saturating_add(1), |h| stamp_from_ms(h.issued));
        let deadlines = self.lease_deadlines.clone();
        let grant = LeaseGrant { now: started, stamp_from_ms, deadlines: &deadlines };
        let leases_before = self.leases.clone();
        let requests = taken.clone();
        let mut statements = self.seq_statements.take();
        let group = transaction(|| {
            if let Some(why) = strict_mode_refusal() {
                let replies = vec![Reply::err(ReplyCode::Refused); requests.len()];
                return (replies, window, leases_before.clone(), Some(why));
            }
            let checks = Checks::new(&requests, ascii_only);
            if statements.is_none() {
                statements = Some(SeqStatements::prepare().unwrap_or_else(|e| {
                    pgrx::error!("tsoracle could not prepare its sequence statements: {e}")
                }));
            }
            let mut replies = match &statements {
                Some(prepared) => advance_sequences(prepared, &requests, &checks),
                None => vec![Reply::default(); requests.len()],
            };
            // The lease part in a subtransaction of its own: a lease row or table it cannot
            // lock in time fails the lease calls of this group only.
            let lease_part = subtransaction(|| {
                let mut leases = leases_before.clone();
                let mut lease_replies = replies.clone();
                mutate_leases(
                    &requests,
                    &mut lease_replies,
                    &mut leases,
                    &checks,
                    &grant,
                    window,
                    epoch,
                )
                .map(|high_water| (lease_replies, leases, high_water))
            });
            match lease_part {
                Ok(Ok((lease_replies, leases, high_water))) => {
                    (lease_replies, high_water, leases, None)
                }
                failure => {
                    let reply = match &failure {
                        Err(e) if e.is_lock_not_available() => Reply::table_busy(
                            lease_table()
                                .map_or(Blocker::Unknown, |t| relation_blocker(t, ROW_EXCLUSIVE)),
                        ),
                        Ok(Err(RaiseError::Unavailable(why) | RaiseError::Refused(why))) => {
                            pgrx::warning!(
                                "tsoracle could not raise the high-water for leases: {why}"
                            );
                            Reply::err(ReplyCode::Failed)
                        }
                        other => {
                            pgrx::warning!("tsoracle could not grant leases: {other:?}");
                            Reply::err(ReplyCode::Failed)
                        }
                    };
                    for ((_, r), slot) in requests.iter().zip(replies.iter_mut()) {
                        if matches!(
                            r.kind,
                            RequestKind::LeaseAcquire
                                | RequestKind::LeaseRenew
                                | RequestKind::LeaseRelease
                        ) {
                            *slot = reply;
                        }
                    }
                    (replies, window, leases_before.clone(), None)
                }
            }
        });
        self.seq_statements = statements;
        let (replies, high_water, leases, refused) = match group {
            Ok(group) => group,
            Err(e) => {
                pgrx::warning!("tsoracle could not commit a group of requests: {e}");
                let reply = if e.is_lock_not_available() {
                    Reply::table_busy(Blocker::Unknown)
                } else {
                    Reply::err(ReplyCode::Failed)
                };
                (vec![reply; taken.len()], window, self.leases.clone(), None)
            }
        };
        crate::pg::replica::confirm_replicated();
        if refused.is_none() {
            self.signals.confirm_until(started, crate::pg::guc::window_ahead_ms());
        }
        let before = std::mem::replace(&mut self.leases, leases);
        self.note_lease_deadlines(Some(&before), started);
        self.publish_lease_bounds();
        // Published: R is held by the grants now; the worker's own hold can go.
        drop(hold);
        if let Some(why) = refused {
            ORACLE.exclusive().set_refusal(&why);
        } else if high_water > window {
            if let Err(e) = self.commit_high_water(high_water, epoch) {
                // The requests are committed; the allocator simply keeps its smaller window.
                pgrx::warning!("tsoracle could not widen the window after lease grants: {e}");
            }
        } else {
            ORACLE.exclusive().worker_commits += 1;
        }
        // Replies back per call, in the order of its requests.
        let mut by_call: Vec<(Ticket, Vec<Reply>)> = Vec::with_capacity(calls.len());
        for ((ticket, _), reply) in taken.iter().zip(replies) {
            match by_call.last_mut() {
                Some((t, replies)) if t == ticket => replies.push(reply),
                _ => by_call.push((*ticket, vec![reply])),
            }
        }
        let waiters: Vec<usize> = match QUEUE.exclusive() {
            Ok(mut guard) => {
                let mut queue = guard.queue();
                queue.header.group_commits += 1;
                queue.header.grouped_requests += taken.len() as u64;
                by_call
                    .iter()
                    .filter_map(|(ticket, replies)| queue.answer(*ticket, replies))
                    .collect()
            }
            Err(_) => Vec::new(),
        };
        shmem::queue::wake_waiters(waiters);
        self.signals.broadcast_answers();
    }
}
