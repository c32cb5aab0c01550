//! The calls, taken from the queue and sent: every `tso_next()`-like call waiting when a
//! round trip leaves goes in it (one `tsoracle.member_next(n)` per `MAX_BATCH` values), every
//! other call is a statement of its own; a call whose caller gave up is never sent.

use super::*;

impl Proxy {
    /// Send the calls waiting here and in the queue, while the pipeline has room.
    pub(super) fn send_waiting(&mut self) -> Result<(), LibpqError> {
        if self.sent.len() >= MAX_IN_FLIGHT {
            return Ok(());
        }
        if self.pause_until.is_some_and(|at| Instant::now() < at) {
            // Paused with nothing in flight: no landing will take the queue, callers wake us.
            if self.sent.is_empty() {
                if let Ok(mut guard) = QUEUE.exclusive() {
                    guard.queue().header.worker_will_look = false;
                }
            }
            return Ok(());
        }
        let mut calls: Vec<Waiting> = std::mem::take(&mut self.waiting);
        let mut given_up: Vec<Waiting> = Vec::new();
        let now = Instant::now();
        if let Ok(mut guard) = QUEUE.exclusive() {
            let mut queue = guard.queue();
            // A call whose caller gave up while it waited here (told 57P03, or 40003 and to
            // check with tso_seq_peek()) is never sent: a grant after the caller's check
            // would contradict it. Decided under the lock the caller gives up under.
            (given_up, calls) = calls
                .into_iter()
                .partition(|w| queue.state(w.ticket) == Some(EntryState::Abandoned));
            calls.extend(queue.take_pending().into_iter().map(|(ticket, requests)| Waiting {
                ticket,
                requests,
                since: now,
            }));
            // With MAX_IN_FLIGHT round trips in flight after this turn, the calls queued from
            // now on are taken as one lands: their callers need not wake this process. With
            // fewer, they wake it, and leave at once (the pipeline: mod.rs).
            // (A build for the hand-off floor answers tso_next() at once: nothing in flight.)
            let sending = calls.iter().any(|w| {
                (is_next(w) && !cfg!(feature = "handoff-floor"))
                    || call_statement(&w.requests).is_some()
            });
            queue.header.worker_will_look = self.sent.len() + usize::from(sending) >= MAX_IN_FLIGHT;
        }
        // Answered only to free their entries: nobody waits for them.
        answer(
            &given_up
                .iter()
                .map(|w| (w.ticket, vec![Reply::err(ReplyCode::Refused); w.requests.len()]))
                .collect::<Vec<_>>(),
        );
        let (nexts, others): (Vec<Waiting>, Vec<Waiting>) = calls.into_iter().partition(is_next);
        if !matches!(self.link, Link::Up { .. }) {
            self.waiting.extend(nexts);
            self.waiting.extend(others);
            return Ok(());
        }
        // The tso_next() calls: one round trip for as many as MAX_BATCH values hold.
        let mut group: Vec<(Ticket, u32)> = Vec::new();
        let mut total: u32 = 0;
        let mut flights: Vec<Flight> = Vec::new();
        for w in &nexts {
            let count = u32::try_from(w.requests[0].count).unwrap_or(MAX_BATCH).clamp(1, MAX_BATCH);
            if total + count > MAX_BATCH {
                flights.push(Flight::Next { calls: std::mem::take(&mut group), total });
                total = 0;
            }
            group.push((w.ticket, count));
            total += count;
        }
        if !group.is_empty() {
            flights.push(Flight::Next { calls: group, total });
        }
        // A call whose statement could not be queued (the connection broke) was not sent: it
        // waits here for the next connection, blocks and leases included.
        let mut failed: Option<LibpqError> = None;
        for flight in flights {
            let Flight::Next { total, calls } = flight else { continue };
            #[cfg(feature = "handoff-floor")]
            {
                answer_without_oracle(total, &calls);
                continue;
            }
            #[cfg_attr(feature = "handoff-floor", allow(unreachable_code))]
            if failed.is_none() {
                let params = [total.to_string(), self.session.clone()];
                match self.queue_statement(|conn| conn.send_prepared(NEXT_PREPARED, &params)) {
                    Ok(()) => {
                        let flight = Flight::Next { calls, total };
                        self.sent.push_back(Sent { flight, at: Instant::now(), result: None });
                        self.last_next = Instant::now();
                        continue;
                    }
                    Err(e) => failed = Some(e),
                }
            }
            self.retry_next(calls);
        }
        for w in others {
            let Some((sql, mut params)) = call_statement(&w.requests) else {
                answer(&[(w.ticket, vec![Reply::err(ReplyCode::Refused); w.requests.len()])]);
                continue;
            };
            if failed.is_none() {
                params.push(self.session.clone());
                match self.queue_statement(|conn| conn.send(sql, &params)) {
                    Ok(()) => {
                        if grants_lease(&w.requests) {
                            self.grants.sent(self.signals);
                        }
                        self.sent.push_back(Sent {
                            flight: Flight::Call {
                                ticket: w.ticket,
                                requests: w.requests,
                                since: w.since,
                            },
                            at: Instant::now(),
                            result: None,
                        });
                        continue;
                    }
                    Err(e) => {
                        failed = Some(e);
                        // Part of it may have reached the oracle before the connection broke:
                        // a block or a lease is not sent again (40003), a read is.
                        if !rereadable(&w.requests) {
                            answer(&[lost(w.ticket, &w.requests)]);
                            continue;
                        }
                    }
                }
            }
            self.waiting.push(w);
        }
        if let Some(e) = failed {
            return Err(e);
        }
        let Link::Up { conn, .. } = &mut self.link else { return Ok(()) };
        // An idle member still moves its resolved timestamp: a value now and then.
        if self.sent.is_empty()
            && self.last_next.elapsed().as_millis() as u64 >= guc::resolved_interval_ms()
        {
            conn.send_prepared(NEXT_PREPARED, &["1".to_string(), self.session.clone()])?;
            self.sent.push_back(Sent {
                flight: Flight::Heartbeat,
                at: Instant::now(),
                result: None,
            });
            self.last_next = Instant::now();
        }
        // This member's R for the fleet's R_f, every tsoracle.resolved_interval_ms.
        if self.sent.len() < MAX_IN_FLIGHT
            && self.last_report.elapsed().as_millis() as u64 >= guc::resolved_interval_ms()
        {
            if let Ok(r) = crate::shmem::holders::primary_resolved(self.signals) {
                let held_by = crate::shmem::holders::oldest_hold().1.map_or(0, |o| o.pid);
                conn.send(REPORT, &[r.to_string(), held_by.to_string(), self.session.clone()])?;
                self.sent.push_back(Sent {
                    flight: Flight::Report,
                    at: Instant::now(),
                    result: None,
                });
            }
            self.last_report = Instant::now();
        }
        Ok(())
    }

    /// Queue one statement on the live connection.
    pub(super) fn queue_statement(
        &mut self,
        send: impl FnOnce(&mut Conn) -> Result<(), LibpqError>,
    ) -> Result<(), LibpqError> {
        match &mut self.link {
            Link::Up { conn, .. } => send(conn),
            _ => Err(LibpqError::Connection("not connected to the oracle".into())),
        }
    }
}

/// Built with the cargo feature `handoff-floor` only (`make bench`'s hand-off floor, never an
/// installation): the values of a round trip made up here, above the clock and every earlier
/// one, the oracle not asked. What is left of a member's call is the hand-off between its
/// backend and this process: the floor of any design in which a statement waits for another
/// process (BENCHMARKS.md, "A member of a fleet"). `member_floor` is left alone: it is the
/// floor of what the oracle answers, and the heartbeats still go to the oracle; raised by
/// values made up here, it would make the proxy refuse the oracle's next heartbeat as an
/// oracle gone back, and connect again (what broke this floor after 0.5.0).
#[cfg(feature = "handoff-floor")]
fn answer_without_oracle(total: u32, calls: &[(Ticket, u32)]) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_max(clock::now_ms() << tsoracle_core::timestamp::LOGICAL_BITS, Ordering::Relaxed);
    let first = NEXT.fetch_add(u64::from(total), Ordering::Relaxed);
    answer(&answer_next(first, calls));
}
