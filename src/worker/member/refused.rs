//! A hello the oracle refuses for a reason that retrying does not change (issue 55): the
//! fleet is full (`53400`, `tsoracle.max_members`), the cluster is not admitted, or not for
//! the role it logs in as (`42501`, with a HINT), or the two run tsoracle versions that do
//! not work together (`0A000` from an oracle of 0.6 on, `22023` from one of 0.5: the member
//! was upgraded before its oracle, or they are two minor versions apart). The member's callers are told at once,
//! with the oracle's SQLSTATE, message and HINT, instead of waiting for an oracle that will
//! not serve them until `tsoracle.extension_timeout_ms` and hearing a bare `57P03`. The
//! worker goes on saying hello (with its back-off): once a place is free it serves again.
//!
//! Only calls never sent are answered here (a refused hello comes before any call on its
//! connection; calls that waited from an earlier connection are timestamps and reads, sent
//! again there, or were already answered `40003`): nothing answered this way was granted.

use super::{answer, remote, Link, Proxy, Waiting, MEMBER, QUEUE};
use crate::pg::libpq::RemoteError;
use crate::shmem::{Reply, ReplyCode};
use tsoracle_core::queue::{EntryState, Ticket};

/// The SQLSTATEs of a refused hello handed on to the callers as they came.
const HANDED_ON: [&str; 3] = ["53400", "0A000", "22023"];

impl Proxy {
    /// The oracle answered a hello with `e`: kept if it is to be handed on, forgotten
    /// otherwise.
    pub(super) fn hello_refused(&mut self, e: &RemoteError) {
        self.refused = (super::identity::refused_admission(e)
            || HANDED_ON.contains(&e.sqlstate.as_str()))
        .then(|| {
            let mut e = e.clone();
            // An oracle of 0.5 says only "install the same minor version on both".
            if e.hint.is_none() && e.message.contains("minor version") {
                e.hint = Some(crate::pg::error::UPGRADE_ORACLE_FIRST.into());
            }
            e
        });
    }

    /// While the last hello was refused so and no connection serves: every call waiting here
    /// or in the queue is answered with the oracle's error.
    pub(super) fn answer_refused(&mut self) {
        let Some(e) = &self.refused else { return };
        if matches!(self.link, Link::Up { ready: true, .. }) {
            return;
        }
        let mut calls: Vec<Waiting> = std::mem::take(&mut self.waiting);
        if let Ok(mut guard) = QUEUE.exclusive() {
            let mut queue = guard.queue();
            calls.extend(queue.take_pending().into_iter().map(|(ticket, requests)| Waiting {
                ticket,
                requests,
                since: std::time::Instant::now(),
            }));
            // Nothing in flight: callers wake this process for their calls.
            queue.header.worker_will_look = false;
            // A caller that gave up meanwhile only has its entry freed (answering an
            // abandoned entry frees it).
            let (given_up, live): (Vec<Waiting>, Vec<Waiting>) = calls
                .into_iter()
                .partition(|w| queue.state(w.ticket) == Some(EntryState::Abandoned));
            for w in given_up {
                queue.answer(w.ticket, &vec![Reply::err(ReplyCode::Refused); w.requests.len()]);
            }
            calls = live;
        }
        if calls.is_empty() {
            return;
        }
        let message = format!("the oracle refused this member: {}", e.message);
        let replies: Vec<(Ticket, Vec<Reply>)> = {
            let mut st = MEMBER.exclusive();
            calls
                .iter()
                .map(|w| {
                    st.keep_error(w.ticket.generation, &e.sqlstate, &message, e.hint.as_deref());
                    (w.ticket, vec![remote(w.ticket); w.requests.len()])
                })
                .collect()
        };
        answer(&replies);
    }
}
