//! The group commit: every pending call in ONE transaction, then every answer; and who may
//! do what (owners of keys and leases, superusers, names the database can store).

use super::leases::mutate_leases;
use super::sequences::{advance_sequences, SeqStatements};
use super::Worker;
use crate::clock;
use crate::shmem::{self, Reply, ReplyCode, Request, ORACLE, QUEUE};
use pgrx::bgworkers::BackgroundWorker;
use pgrx::prelude::*;
use std::collections::HashMap;
use tsoracle_core::queue::Ticket;

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
        // One request per row, each carrying its call's generation as its batch.
        let taken: Vec<(Ticket, Request)> = calls
            .iter()
            .flat_map(|(ticket, requests)| {
                requests.iter().map(move |r| (*ticket, Request { batch: ticket.generation, ..*r }))
            })
            .collect();
        // The group's commit starts now: the confirmation it earns dates from here.
        let started = clock::sample();
        let now = started.wall_ms;
        let (window, epoch, ascii_only) = {
            let st = ORACLE.share();
            (st.allocator.high_water_ms(), st.allocator.epoch().unwrap_or(0), st.ascii_names_only)
        };
        let mut leases = self.leases.clone();
        let requests = taken.clone();
        let mut statements = self.seq_statements.take();
        let (replies, high_water, leases, statements, refused) =
            BackgroundWorker::transaction(move || {
                if let Some(why) = super::strict_mode_refusal() {
                    let replies = vec![Reply::err(ReplyCode::Refused); requests.len()];
                    return (replies, window, leases, statements, Some(why));
                }
                let checks = Checks::new(&requests, ascii_only);
                let prepared = statements.get_or_insert_with(SeqStatements::prepare);
                let mut replies = advance_sequences(prepared, &requests, &checks);
                let high_water = mutate_leases(
                    &requests,
                    &mut replies,
                    &mut leases,
                    &checks,
                    now,
                    window,
                    epoch,
                );
                (replies, high_water, leases, statements, None)
            });
        self.seq_statements = statements;
        crate::replica::confirm_replicated();
        if refused.is_none() {
            self.signals.confirm_until(started, crate::guc::window_ahead_ms());
        }
        let before = std::mem::replace(&mut self.leases, leases);
        self.note_lease_deadlines(Some(&before), started);
        self.publish_lease_bounds();
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
        shmem::wake_waiters(waiters);
        self.signals.broadcast_answers();
    }
}

/// Who may do what, for the roles of one group: asked of the catalogs once per role.
pub(super) struct Checks {
    superusers: HashMap<u32, bool>,
    ascii_only: bool,
}

impl Checks {
    pub(super) fn new(requests: &[(Ticket, Request)], ascii_only: bool) -> Checks {
        let mut superusers = HashMap::new();
        for (_, r) in requests {
            superusers
                .entry(r.role)
                // SAFETY: a catalog lookup by OID inside the group's transaction; an unknown
                // OID (a role dropped since) is simply not a superuser.
                .or_insert_with(|| unsafe { pg_sys::superuser_arg(pg_sys::Oid::from(r.role)) });
        }
        Checks { superusers, ascii_only }
    }

    fn is_superuser(&self, role: u32) -> bool {
        self.superusers.get(&role).copied().unwrap_or(false)
    }

    /// May `role` use what `owner` owns? Owner 0 (a key from before owners existed) is
    /// shared by every role that may call the function; otherwise the owner, its members
    /// (as for PostgreSQL's own objects), and superusers.
    pub(super) fn may_use(&self, role: u32, owner: u32) -> bool {
        owner == 0
            || role == owner
            || self.is_superuser(role)
            // SAFETY: a catalog lookup inside the group's transaction.
            || unsafe { pg_sys::has_privs_of_role(pg_sys::Oid::from(role), pg_sys::Oid::from(owner)) }
    }

    /// May `role` manage (renew, release, drop) what `owner` owns? The owner itself or a
    /// superuser (owner 0: shared, as above).
    pub(super) fn may_manage(&self, role: u32, owner: u32) -> bool {
        owner == 0 || role == owner || self.is_superuser(role)
    }

    /// A name the worker's database can store and give back.
    pub(super) fn storable(&self, name: &str) -> bool {
        !self.ascii_only || name.is_ascii()
    }
}

/// 42501, carrying the owner so the caller can name it.
pub(super) fn denied(owner: u32) -> Reply {
    Reply { value: i64::from(owner), ..Reply::err(ReplyCode::PermissionDenied) }
}
