//! The group commit: every pending call in ONE transaction, then every answer; and who may
//! do what (owners of keys and leases, superusers, names the database can store).

use super::checks::Checks;
use super::leases::mutate_leases;
use super::sequences::{advance_sequences, SeqStatements};
use super::state::{strict_mode_refusal, Worker};
use crate::pg::clock;
use crate::shmem::{self, Reply, ReplyCode, Request, ORACLE, QUEUE};
use pgrx::bgworkers::BackgroundWorker;
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
                if let Some(why) = strict_mode_refusal() {
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
        crate::pg::replica::confirm_replicated();
        if refused.is_none() {
            self.signals.confirm_until(started, crate::pg::guc::window_ahead_ms());
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
        shmem::queue::wake_waiters(waiters);
        self.signals.broadcast_answers();
    }
}
