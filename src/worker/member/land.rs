//! The flights in the pipeline, as they land: each round trip's answer checked (its epoch,
//! this cluster's own past) before its values, blocks or leases are handed out; what may be
//! retried is retried, what was lost answers `40003`.

use super::past;
use super::*;

impl Proxy {
    /// A round trip came back: answer its calls. `Err` when the answer must not be trusted.
    pub(super) fn complete(&mut self, done: Sent) -> Result<(), String> {
        let took = done.at.elapsed();
        let rows = match &done.result {
            Some(r) => r.rows(),
            None => Err(crate::pg::libpq::RemoteError {
                sqlstate: "XX000".into(),
                message: "the oracle sent no result".into(),
                detail: None,
                hint: None,
            }),
        };
        match done.flight {
            Flight::Hello => {
                // A wrong oracle is tried again with the back-off, not at once.
                if let Err(why) = self.hello(rows) {
                    self.down(&why);
                }
                Ok(())
            }
            Flight::Prepare => match rows {
                Ok(_) => Ok(()),
                Err(e) => Err(format!(
                    "the oracle cannot prepare tsoracle.member_next: {} ({})",
                    e.message, e.sqlstate
                )),
            },
            Flight::Heartbeat => match rows {
                Ok(rows) => {
                    let (first, epoch) = first_and_epoch(&rows)?;
                    self.check_epoch(epoch)?;
                    self.check_fetched(first)?;
                    self.signals.member_floor.raise(floor_after(first, 1));
                    self.count(took, 0, 0);
                    Ok(())
                }
                Err(e) if RESET_BY.contains(&e.sqlstate.as_str()) => Err(statement_lost(&e)),
                Err(_) => Ok(()),
            },
            Flight::Report => match rows {
                Ok(rows) => {
                    let epoch = rows
                        .first()
                        .ok_or(OTHER_SESSION)?
                        .first()
                        .cloned()
                        .flatten()
                        .and_then(|e| e.parse::<u64>().ok())
                        .ok_or("the oracle's answer to a report has no epoch")?;
                    self.check_epoch(epoch)
                }
                // Removed from the fleet, or the oracle not ready for it: the hello on a new
                // connection registers it again.
                Err(e) => Err(format!(
                    "the oracle refused this member's report: {} ({})",
                    e.message, e.sqlstate
                )),
            },
            Flight::Next { calls, total } => match rows {
                Ok(rows) => {
                    let read = first_and_epoch(&rows)
                        .and_then(|(first, epoch)| self.check_epoch(epoch).map(|()| first))
                        .and_then(|first| self.check_fetched(first).map(|()| first));
                    let first = match read {
                        Ok(first) => first,
                        Err(why) => {
                            // Handed to no one: fetched again on the next connection.
                            self.retry_next(calls);
                            return Err(why);
                        }
                    };
                    // Raised before anyone gets a value: every later fetch is above it.
                    self.signals.member_floor.raise(floor_after(first, total));
                    self.count(took, calls.len(), u64::from(total));
                    match self.own.check_timestamps(first) {
                        Ok(()) => answer(&answer_next(first, &calls)),
                        Err(below) => {
                            let tickets: Vec<Ticket> = calls.iter().map(|(t, _)| *t).collect();
                            answer(&past::refusals(&tickets, &below, 1));
                        }
                    }
                    Ok(())
                }
                Err(e) if RESET_BY.contains(&e.sqlstate.as_str()) => {
                    // Nothing was issued: fetched again once the statement is prepared again.
                    self.retry_next(calls);
                    Err(statement_lost(&e))
                }
                Err(e) if RETRYABLE.contains(&e.sqlstate.as_str()) => {
                    self.note(&format!(
                        "the oracle refused for now: {} ({})",
                        e.message, e.sqlstate
                    ));
                    self.pause_until = Some(Instant::now() + RETRY_PAUSE);
                    self.retry_next(calls);
                    if e.sqlstate == "25006" {
                        // A standby: find the primary again.
                        return Err(format!("the oracle is a standby: {}", e.message));
                    }
                    Ok(())
                }
                Err(e) => {
                    let mut member = MEMBER.exclusive();
                    let replies: Vec<(Ticket, Vec<Reply>)> = calls
                        .iter()
                        .map(|(t, _)| {
                            member.keep_error(
                                t.generation,
                                &e.sqlstate,
                                &e.message,
                                e.hint.as_deref(),
                            );
                            (*t, vec![remote(*t)])
                        })
                        .collect();
                    drop(member);
                    answer(&replies);
                    Ok(())
                }
            },
            Flight::Call { ticket, requests, since } => {
                let granted = grants_lease(&requests);
                let outcome = self.complete_call(ticket, requests, rows, took, since);
                if granted {
                    self.grants.landed();
                }
                outcome
            }
        }
    }

    pub(super) fn complete_call(
        &mut self,
        ticket: Ticket,
        requests: Vec<Request>,
        rows: Result<Vec<Vec<Option<String>>>, crate::pg::libpq::RemoteError>,
        took: Duration,
        since: Instant,
    ) -> Result<(), String> {
        match rows {
            Ok(rows) => {
                let read = answer_call(&requests, &rows)
                    .and_then(|(replies, epoch)| self.check_epoch(epoch).map(|()| replies));
                let replies = match read {
                    Ok(replies) => replies,
                    Err(why) => {
                        // Carried out or not, its answer cannot be trusted: 40003.
                        answer(&[lost(ticket, &requests)]);
                        return Err(why);
                    }
                };
                self.count(took, 1, 0);
                if let Err(below) =
                    self.grants.above_resolved(self.signals, &self.own, &requests, &replies)
                {
                    if let Some(renewal) = renewal_of(&requests, &replies) {
                        // An acquire the oracle answered with a grant made before (its answer
                        // lost, the lease granted again idempotently): renewed, so that its
                        // holder stamps above R. Sent again; its caller waits.
                        pgrx::log!("tsoracle member: {below}; renewing it before it is handed out");
                        self.waiting.push(Waiting { ticket, requests: vec![renewal], since });
                        return Ok(());
                    }
                    if past::check(&self.own, &requests, &replies).is_ok() {
                        // Never from a correct oracle: granted there, handed to no one (40003).
                        self.note(&below.to_string());
                        answer(&[lost(ticket, &requests)]);
                        return Ok(());
                    }
                }
                if let Err(below) = past::check(&self.own, &requests, &replies) {
                    // Granted on the oracle, handed to no one: a gap, a lease never used.
                    answer(&past::refusals(&[ticket], &below, requests.len()));
                    return Ok(());
                }
                if let Err(why) = self.grants.note(&requests, &replies) {
                    // Granted on the oracle but not kept here: handed to no one (40003).
                    self.note(&why);
                    answer(&[lost(ticket, &requests)]);
                    return Ok(());
                }
                past::handed_out(&mut self.own, &requests, &replies);
                answer(&[(ticket, replies)]);
                Ok(())
            }
            Err(e) if RETRYABLE.contains(&e.sqlstate.as_str()) => {
                self.pause_until = Some(Instant::now() + RETRY_PAUSE);
                self.waiting.push(Waiting { ticket, requests, since });
                if e.sqlstate == "25006" {
                    return Err(format!("the oracle is a standby: {}", e.message));
                }
                Ok(())
            }
            Err(e) => {
                MEMBER.exclusive().keep_error(
                    ticket.generation,
                    &e.sqlstate,
                    &e.message,
                    e.hint.as_deref(),
                );
                answer(&[(ticket, vec![remote(ticket); requests.len()])]);
                Ok(())
            }
        }
    }
}

/// The renewal that replaces a single lease acquire answered with `replies`: the same lease,
/// by the same role, asked as the acquire was (`legacy` kept).
fn renewal_of(requests: &[Request], replies: &[Reply]) -> Option<Request> {
    match (requests, replies) {
        ([r], [reply]) if r.kind == RequestKind::LeaseAcquire && reply.code == ReplyCode::Ok => {
            Some(Request {
                kind: RequestKind::LeaseRenew,
                count: 0,
                name_len: 0,
                arg: reply.value,
                ..*r
            })
        }
        _ => None,
    }
}

impl Proxy {
    /// Refuse an answer that starts below what this member fetched before in this server's
    /// life (`tsoracle_core::member::above_fetched`): never from a correct oracle; the
    /// connection is not trusted (its calls are sent again, or fail 57P03 at their deadline).
    fn check_fetched(&mut self, first: u64) -> Result<(), String> {
        tsoracle_core::member::above_fetched(first, self.signals.member_floor.get())
            .map_err(|e| format!("{e}; looking for the oracle's current primary"))
    }
}

fn statement_lost(e: &crate::pg::libpq::RemoteError) -> String {
    format!(
        "the oracle lost this connection's prepared tsoracle.member_next ({}: {}); connecting again",
        e.sqlstate, e.message
    )
}

/// The answer to `NEXT`: NULL from a session whose hello did not name this connection.
fn first_and_epoch(rows: &[Vec<Option<String>>]) -> Result<(u64, u64), String> {
    let row = rows.first().ok_or("the oracle answered tsoracle.member_next with no row")?;
    let answer = row.first().ok_or_else(|| format!("the oracle answered an empty row: {row:?}"))?;
    answer
        .as_deref()
        .ok_or(OTHER_SESSION)
        .map(parse_next_answer)?
        .ok_or_else(|| format!("the oracle answered a malformed row: {row:?}"))
}
