//! The worker of a member of a fleet (docs/fleet.md): the proxy between this server's callers
//! and the oracle `tsoracle.oracle` names, as TiDB's PD client and Postgres-XL's GTM proxy
//! were for theirs.
//!
//! - One connection, in pipeline mode; no new round trip starts while `MAX_IN_FLIGHT` are on
//!   it.
//! - Every `tso_next()`-like call waiting when a round trip leaves goes in it: one
//!   `tsoracle.member_next(n)` for all of them (one per `MAX_BATCH` values), `n` their sum,
//!   split in order. Nothing is fetched ahead: each value was issued by the oracle after its
//!   call had begun.
//! - A call leaves at once, in a round trip of its own and the calls queued with it, without
//!   waiting for the round trips in flight to land: its caller wakes the proxy while fewer
//!   than `MAX_IN_FLIGHT` are in flight. With `MAX_IN_FLIGHT` in flight the callers no longer
//!   wake it, and every call queued meanwhile leaves together as one of them lands (group
//!   commit's pattern). So a call pays one round trip to the oracle, not the rest of the one
//!   in flight when it came and then its own: what counts a network away.
//! - Every other call (a block, a lease, the frontier) is one statement of its own.
//! - Every answer carries the oracle's epoch; one older than an epoch already seen (a deposed
//!   primary still answering) is refused, and the connection dropped.
//! - A refusal known to come before anything was done (`57P03`, `25006`) is retried until the
//!   call's own deadline; a timestamp whose answer was lost is fetched again (it was never
//!   handed out: a gap); a block or lease whose answer was lost answers `40003`.
//!
//! - A cluster that served on its own before it joined hands out nothing of the oracle's that
//!   repeats what its own tables hold (`OwnPast`): the oracle must be seeded above them.
//! - After `tso_handover()` the connection is closed, and nothing more is handed out.
//!
//! # Why the pipeline keeps the order
//!
//! Several round trips in flight at once change nothing of what a value means:
//!
//! - **A later statement gets a later value.** A call is taken from the queue only after its
//!   caller queued it, and the round trip that carries it is sent after that: the oracle
//!   issues its values after the call began. A call that began after another returned was
//!   queued after that other's values had reached this process, so after the oracle had
//!   issued them; the oracle's order (a value issued later is greater) puts its values above,
//!   whichever round trip, connection or primary carried each. This holds whatever else is
//!   in flight: the round trips in flight when a call is queued cannot carry it.
//! - **Answers land in the order they were sent.** The oracle's backend runs one
//!   connection's statements one after another and answers them in that order, and `sent`
//!   is matched against them in that order (a sync point per statement: an error ends only
//!   its own). So each answer of `tsoracle.member_next` is above every one before it on the
//!   connection, `member_floor` rises with each landing, and an answer below it is still an
//!   oracle gone back (`land.rs`), never a round trip overtaken by another.
//! - **`R` and leases.** A backend holds its slot at `member_floor` before it queues its call;
//!   every value of a round trip sent after that is above it, and the round trips in flight
//!   before cannot carry its call. A lease in flight holds `R` through the worker's own slot
//!   from the moment it is sent until it lands, however many are in flight (`grants.rs`).
//! - **Blocks and reads** are statements of their own, carried out by the oracle in the order
//!   sent; a block is granted once (`40003` when its answer is lost, never sent again), a read
//!   is read again. **The session filter** is a parameter of every statement: each runs only
//!   on the session its hello named, in flight with others or not.
//! - **A lost connection** loses every round trip in flight at once; each is handled as one
//!   alone would be (a timestamp fetched again on the next connection, above everything
//!   before; a block or lease `40003`).
//!
//! The worker waits on its latch and on the connection's socket together, in its one thread.
//!
//! Files: `mod.rs` the link (connecting, waiting, serving a turn, going down), `send.rs` the
//! calls taken from the queue and sent, `land.rs` the flights in the pipeline as they land,
//! `hello.rs` the hello and the epoch checks, `calls.rs` what each call becomes on the oracle,
//! `grants.rs` the leases granted through this member (`tsoracle.member_lease`),
//! `identity.rs` its identity (`tsoracle.member_identity`), `oracle.rs` its memory of the
//! oracle (`tsoracle.member_oracle`), `past.rs` its own past (`OwnPast`).

mod alone;
mod calls;
mod grants;
mod hello;
mod identity;
mod land;
mod oracle;
mod past;
mod refused;
mod send;

use super::state::{refuse, set_phase, Worker};
use crate::pg::clock;
use crate::pg::guc;
use crate::pg::libpq::{checked_conninfo, Conn, Event, LibpqError, PgResult, Progress};
use crate::pg::wait_set::SocketWait;
use crate::shmem::member::{Text, MEMBER};
use crate::shmem::{self, Phase, Reply, ReplyCode, Request, RequestKind, Signals, QUEUE};
pub(crate) use alone::{marked, wait_until_alone};
use calls::{
    answer_call, answer_next, call_statement, lost, remote, rereadable, OTHER_SESSION, RETRYABLE,
};
use grants::{grants_lease, Grants};
use identity::Identity;
pub(crate) use past::{due as past_due, keep as keep_past, kept as past_kept};
use pgrx::bgworkers::BackgroundWorker;
use pgrx::prelude::*;
use std::collections::VecDeque;
use std::ffi::CStr;
use std::time::{Duration, Instant};
use tsoracle_core::allocator::MAX_BATCH;
use tsoracle_core::member::{floor_after, parse_next_answer, OwnPast};
use tsoracle_core::queue::{EntryState, Ticket};

/// What the oracle answers when this connection's prepared `tsoracle.member_next` is gone
/// (`26000`: a `DISCARD ALL`, a pooler between) or no longer matches the function
/// (`0A000`: the extension was updated under it): the connection is made again.
const RESET_BY: [&str; 2] = ["26000", "0A000"];

/// Round trips in flight at once on the connection. Callers wake the proxy while fewer are in
/// flight (their calls leave at once); at this many they do not, and their calls leave as one
/// lands, with every call queued meanwhile.
const MAX_IN_FLIGHT: usize = 8;

/// How long calls refused for now (`57P03`, `25006`) wait before they are sent again.
const RETRY_PAUSE: Duration = Duration::from_millis(20);

/// The hello also names this connection in its oracle session (`calls::session_setting!`, a
/// setting tsoracle defines): every later statement carries that name as its last
/// parameter and runs only where the setting holds it (`calls::gated!`), so that a statement
/// that reaches another backend — through a pooler in transaction mode, one that said another
/// member's hello — does nothing and answers no row (`calls::OTHER_SESSION`; `NEXT` applies
/// the filter itself and answers NULL there).
const HELLO: &CStr = calls::sql!(
    "SELECT system_id, version, epoch, pg_catalog.set_config('",
    calls::session_setting!(),
    "', $4::pg_catalog.text, false) FROM tsoracle.member_hello($1::pg_catalog.int8, $2::pg_catalog.text, $3::pg_catalog.int8)"
);
const REPORT: &CStr =
    calls::gated!("SELECT tsoracle.member_report($1::pg_catalog.int8, $2::pg_catalog.int4)", 3);
/// Every round trip for values: one function, which filters on the session itself (`$2`) and
/// answers `{first,epoch}` as text, cheaper for the oracle than a filter and an array.
const NEXT: &CStr =
    calls::sql!("SELECT tsoracle.member_next($1::pg_catalog.int4, $2::pg_catalog.text)");
/// `NEXT`, prepared once per connection right after the hello: the oracle's backend then only
/// executes it, with no parsing or planning per round trip.
const NEXT_PREPARED: &CStr = c"tsoracle_member_next";

/// What one round trip carries.
pub(super) enum Flight {
    Hello,
    /// The preparation of `NEXT`, queued behind the hello.
    Prepare,
    /// Values for the resolved timestamp of an idle member (`member_floor`), handed to no one.
    Heartbeat,
    /// This member's resolved timestamp, for the fleet's (`tsoracle.member_report`).
    Report,
    /// Coalesced `tso_next()`-like calls: each with its count, in the order of the values.
    Next {
        calls: Vec<(Ticket, u32)>,
        total: u32,
    },
    /// One call of another kind, taken from the queue at `since` (kept across retries).
    Call {
        ticket: Ticket,
        requests: Vec<Request>,
        since: Instant,
    },
}

struct Sent {
    flight: Flight,
    at: Instant,
    result: Option<PgResult>,
}

/// A call to send (again) once the connection serves, until its deadline.
struct Waiting {
    ticket: Ticket,
    requests: Vec<Request>,
    since: Instant,
}

enum Link {
    /// No connection; the next attempt not before this instant.
    Down(Instant),
    Connecting {
        conn: Conn,
        want: Progress,
        started: Instant,
    },
    /// Connected; `ready` once the oracle answered the hello. `waits` waits on the latch and
    /// the connection's socket (which stays the same while connected); declared first, it is
    /// freed before the connection closes its socket.
    Up {
        waits: SocketWait,
        conn: Conn,
        ready: bool,
        flushed: bool,
    },
}

pub(super) struct Proxy {
    signals: &'static Signals,
    conninfo: String,
    link: Link,
    sent: VecDeque<Sent>,
    waiting: Vec<Waiting>,
    backoff_ms: u64,
    last_next: Instant,
    last_report: Instant,
    worker: Worker,
    warned: Option<Instant>,
    /// After a refusal to retry, nothing is sent again before this instant.
    pause_until: Option<Instant>,
    /// Leases granted through this member, as its resolved timestamp must respect them.
    grants: Grants,
    /// What this cluster issued on its own, before it joined the fleet.
    own: OwnPast,
    /// The oracle's epoch as `tsoracle.member_oracle` keeps it.
    durable_epoch: u64,
    /// The identity it registers under (`tsoracle.member_identity`).
    identity: Identity,
    /// The last hello's refusal, when callers are told it as it came (`refused.rs`).
    refused: Option<crate::pg::libpq::RemoteError>,
    /// This connection's name in its oracle session, set by its hello (`HELLO`).
    session: String,
    /// Connections made by this process: part of `session`.
    connections: u64,
}

/// `tsoracle.oracle` as libpq reads it, with any password hidden; a connection string libpq
/// cannot read is refused (`None`, after shutdown): it only changes with a restart.
pub(super) fn checked(signals: &'static Signals, conninfo: &str) -> Option<String> {
    match checked_conninfo(conninfo) {
        Ok(shown) => Some(shown),
        Err(e) => {
            MEMBER.exclusive().last_error =
                Text::new(&format!("tsoracle.oracle is not a valid connection string: {e}"));
            refuse(signals, &format!("tsoracle.oracle is not a valid connection string: {e}"));
            None
        }
    }
}

/// Serve this member until shutdown.
pub(super) fn run(signals: &'static Signals, conninfo: String, shown: String) {
    {
        let mut st = MEMBER.exclusive();
        st.oracle = Text::new(&shown);
        st.connected = false;
    }
    pgrx::log!("tsoracle worker is a member of the oracle {shown}");
    // make bench's report and scripts/test-package.sh find such a build by this text.
    #[cfg(feature = "handoff-floor")]
    pgrx::warning!(
        "tsoracle was built with the feature handoff-floor: this member answers tso_next() without its oracle, for make bench only; its values are not the fleet's"
    );
    let Some(own) = past::load() else { return };
    // The leases granted through this member before it (or its worker) restarted hold its R
    // before anything is served.
    let Some(grants) = Grants::load() else { return };
    let Some(identity) = Identity::load() else { return };
    let mut proxy = Proxy {
        signals,
        conninfo,
        link: Link::Down(Instant::now()),
        sent: VecDeque::new(),
        waiting: Vec::new(),
        backoff_ms: 100,
        last_next: Instant::now(),
        last_report: Instant::now(),
        worker: Worker::new(signals),
        warned: None,
        pause_until: None,
        grants,
        own,
        durable_epoch: 0,
        identity,
        refused: None,
        session: String::new(),
        connections: 0,
    };
    set_phase(signals, Phase::Starting);
    loop {
        if signals.handover_requested() {
            // Also for a worker restarted after tso_handover(): it stays handed over.
            return proxy.hand_over();
        }
        proxy.wait();
        proxy.step();
        proxy.grants.prune();
        if proxy.ready() {
            proxy.worker.publish_resolved();
        } else {
            // Cut off from its oracle, it still commits: its standbys show they replay.
            proxy.worker.member_beat();
        }
    }
}

impl Proxy {
    fn ready(&self) -> bool {
        matches!(self.link, Link::Up { ready: true, .. })
    }

    /// Sleep until the latch is set, the socket is ready as needed, or a tick passes.
    fn wait(&mut self) {
        let tick = if self.waiting.is_empty() {
            guc::resolved_interval_ms().clamp(1, 100) as i64
        } else {
            RETRY_PAUSE.as_millis() as i64
        };
        let (socket, events, timeout) = match &mut self.link {
            Link::Up { flushed, waits, .. } => {
                let events = if *flushed { 0 } else { pg_sys::WL_SOCKET_WRITEABLE };
                waits.wait(events, tick);
                // SAFETY: this process's own latch; reset before anything is looked at again.
                unsafe { pg_sys::ResetLatch(pg_sys::MyLatch) };
                return self.after_wait();
            }
            Link::Down(at) => {
                let left = at.saturating_duration_since(Instant::now()).as_millis() as i64;
                (-1, 0, left.clamp(1, tick))
            }
            Link::Connecting { conn, want, .. } => (
                conn.socket(),
                if *want == Progress::Write {
                    pg_sys::WL_SOCKET_WRITEABLE
                } else {
                    pg_sys::WL_SOCKET_READABLE
                },
                tick,
            ),
        };
        let events = if socket >= 0 { events } else { 0 };
        // SAFETY: waiting on this process's own latch (and on the connection's socket, open
        // while `self.link` holds it); WL_EXIT_ON_PM_DEATH ends the process if the
        // postmaster dies. The latch is reset before anything is looked at again.
        unsafe {
            pg_sys::WaitLatchOrSocket(
                pg_sys::MyLatch,
                (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH | events)
                    as i32,
                socket,
                timeout,
                pg_sys::PG_WAIT_EXTENSION,
            );
            pg_sys::ResetLatch(pg_sys::MyLatch);
        }
        self.after_wait();
    }

    /// After any wait: interrupts, and a reload of the configuration if asked.
    fn after_wait(&self) {
        pg_sys::check_for_interrupts!();
        if BackgroundWorker::sighup_received() {
            // SAFETY: reloading the configuration from the worker's main loop, outside any
            // transaction, with no LWLock held.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
    }

    fn step(&mut self) {
        match std::mem::replace(&mut self.link, Link::Down(Instant::now())) {
            Link::Down(at) if Instant::now() < at => self.link = Link::Down(at),
            Link::Down(_) => {
                // A new hello decides again whether callers are told a refusal (refused.rs).
                self.refused = None;
                match Conn::start(&self.conninfo, "tsoracle member") {
                    Ok(conn) => {
                        self.link = Link::Connecting {
                            conn,
                            want: Progress::Write,
                            started: Instant::now(),
                        }
                    }
                    Err(e) => self.down(&format!("cannot connect to the oracle: {e}")),
                }
            }
            Link::Connecting { mut conn, started, .. } => {
                if started.elapsed().as_millis() as i64 > guc::extension_timeout_ms() {
                    return self.down("cannot connect to the oracle: timed out");
                }
                match conn.step() {
                    Ok(Progress::Done) => match self.begin(conn) {
                        Ok(()) => {}
                        Err(e) => self.down(&format!("cannot talk to the oracle: {e}")),
                    },
                    Ok(want) => self.link = Link::Connecting { conn, want, started },
                    Err(e) => self.down(&format!("cannot connect to the oracle: {e}")),
                }
            }
            Link::Up { conn, ready, waits, .. } => {
                self.link = Link::Up { conn, ready, flushed: true, waits };
                if let Err(e) = self.serve() {
                    self.broken(&e.to_string());
                }
            }
        }
        self.answer_refused();
    }

    /// Connected: pipeline mode, then the hello before anything else.
    fn begin(&mut self, mut conn: Conn) -> Result<(), LibpqError> {
        conn.enter_pipeline()?;
        let system_id = self.identity.id();
        // This member's own R (0 before its first value since it started): the oracle
        // registers it at or below that.
        let resolved = crate::shmem::holders::primary_resolved(self.signals).unwrap_or(0);
        // Unique to this connection among every member's: the system identifier, this
        // process and its count of connections.
        self.connections += 1;
        // SAFETY: a plain read of this process's pid.
        let pid = unsafe { pgrx::pg_sys::MyProcPid };
        self.session = format!("{system_id}.{pid}.{}", self.connections);
        conn.send(
            HELLO,
            &[
                system_id.to_string(),
                // The run it speaks for, after the version (`tsoracle_core::fleet::RunClaim`).
                self.identity.claim().version_text(crate::pg::EXTENSION_VERSION),
                resolved.to_string(),
                self.session.clone(),
            ],
        )?;
        MEMBER.exclusive().oracle_pid = conn.backend_pid();
        self.sent.push_back(Sent { flight: Flight::Hello, at: Instant::now(), result: None });
        // Behind the hello in the pipeline: a refused hello is the error reported; calls are
        // sent only once the hello answered, so after this.
        conn.send_prepare(NEXT_PREPARED, NEXT)?;
        self.sent.push_back(Sent { flight: Flight::Prepare, at: Instant::now(), result: None });
        let flushed = conn.flush()?;
        let waits = SocketWait::new(conn.socket());
        self.link = Link::Up { conn, ready: false, flushed, waits };
        Ok(())
    }

    /// One turn on a live connection: read what arrived, answer what it completes, send what
    /// waits.
    fn serve(&mut self) -> Result<(), LibpqError> {
        let Link::Up { conn, .. } = &mut self.link else { return Ok(()) };
        // Read whatever woke us: with TLS, libpq may hold decrypted input the socket no
        // longer shows, so the read is not skipped on a latch-only wake.
        conn.consume()?;
        // Results come per round trip: the query's result, the end of its results, its sync
        // point. With nothing in flight (or only the end of results again) there is nothing
        // more to read: libpq answers "no result" without end in pipeline mode.
        let mut ends = 0;
        while !self.sent.is_empty() && ends < 2 {
            let Link::Up { conn, .. } = &mut self.link else { return Ok(()) };
            match conn.next_event() {
                None => break,
                Some(Event::Result(r)) => {
                    ends = 0;
                    if let Some(s) = self.sent.front_mut() {
                        if s.result.is_none() {
                            s.result = Some(r);
                        }
                    }
                }
                Some(Event::Boundary) => ends += 1,
                Some(Event::Sync) => {
                    ends = 0;
                    if let Some(done) = self.sent.pop_front() {
                        if let Err(why) = self.complete(done) {
                            // Not to be trusted (an older epoch, a bad answer): reconnect.
                            self.broken(&why);
                            return Ok(());
                        }
                    }
                }
            }
        }
        // In-flight round trips that outlived the callers' wait: the connection is stuck.
        if let Some(oldest) = self.sent.front() {
            if oldest.at.elapsed().as_millis() as i64 > guc::extension_timeout_ms() {
                self.broken("the oracle did not answer within tsoracle.extension_timeout_ms");
                return Ok(());
            }
        }
        self.expire_waiting();
        if matches!(self.link, Link::Up { ready: true, .. }) {
            self.send_waiting()?;
        }
        if let Link::Up { conn, flushed, .. } = &mut self.link {
            *flushed = conn.flush()?;
        }
        Ok(())
    }

    /// `tso_handover()` on this member: it serves nothing more until the server restarts.
    /// The connection is closed first, so that no answer still on its way is handed out;
    /// every call waiting is refused, and a block or lease in flight answers `40003`.
    fn hand_over(mut self) {
        {
            let mut st = crate::shmem::ORACLE.exclusive();
            st.set_refusal(crate::shmem::oracle::HANDED_OVER);
            st.phase = Phase::Refused;
        }
        self.signals.broadcast();
        self.link = Link::Down(Instant::now());
        MEMBER.exclusive().connected = false;
        MEMBER.exclusive().oracle_pid = 0;
        let refused = |t: Ticket, n: usize| (t, vec![Reply::err(ReplyCode::Refused); n]);
        let mut replies = Vec::new();
        for sent in std::mem::take(&mut self.sent) {
            match sent.flight {
                Flight::Next { calls, .. } => {
                    replies.extend(calls.iter().map(|(t, _)| refused(*t, 1)))
                }
                Flight::Call { ticket, requests, .. } if rereadable(&requests) => {
                    replies.push(refused(ticket, requests.len()))
                }
                Flight::Call { ticket, requests, .. } => replies.push(lost(ticket, &requests)),
                Flight::Hello | Flight::Prepare | Flight::Heartbeat | Flight::Report => {}
            }
        }
        for w in std::mem::take(&mut self.waiting) {
            replies.push(refused(w.ticket, w.requests.len()));
        }
        if let Ok(mut guard) = QUEUE.exclusive() {
            let mut queue = guard.queue();
            replies.extend(queue.take_pending().into_iter().map(|(t, r)| refused(t, r.len())));
            queue.header.worker_will_look = false;
        }
        answer(&replies);
        self.grants.none_in_flight();
        pgrx::log!(
            "tsoracle member: handed over; every timestamp it fetched is below {}; serving nothing more until the server restarts",
            self.signals.member_floor.get()
        );
        refuse(self.signals, crate::shmem::oracle::HANDED_OVER);
    }

    fn count(&self, took: Duration, calls: usize, values: u64) {
        let us = took.as_micros() as u64;
        let mut st = MEMBER.exclusive();
        st.round_trips += 1;
        st.round_trip_us_total += us;
        st.last_round_trip_us = us;
        st.calls_served += calls as u64;
        st.values_fetched += values;
    }

    fn retry_next(&mut self, calls: Vec<(Ticket, u32)>) {
        let now = Instant::now();
        self.waiting.extend(calls.into_iter().map(|(ticket, count)| Waiting {
            ticket,
            requests: vec![Request::new(RequestKind::Next, "", u64::from(count))],
            since: now,
        }));
    }

    /// Calls that waited here (unsent, or refused at each try) nearly until their callers'
    /// deadline: answered 57P03 with the last error, so that their queue entries are free.
    fn expire_waiting(&mut self) {
        // Before the caller's own deadline (it began as the call was queued, a little
        // earlier): a call refused at every try until then was never granted (57P03), which
        // only this process knows; a caller that gives up first must say 40003.
        let deadline = Duration::from_millis(guc::extension_timeout_ms() as u64 * 4 / 5);
        let (expired, keep): (Vec<Waiting>, Vec<Waiting>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|w| w.since.elapsed() > deadline);
        self.waiting = keep;
        if expired.is_empty() {
            return;
        }
        let mut st = MEMBER.exclusive();
        let why = st.last_error.get().unwrap_or_else(|| {
            "the oracle did not answer within tsoracle.extension_timeout_ms".into()
        });
        let replies: Vec<(Ticket, Vec<Reply>)> = expired
            .iter()
            .map(|w| {
                st.keep_error(w.ticket.generation, "57P03", &why, None);
                (w.ticket, vec![remote(w.ticket); w.requests.len()])
            })
            .collect();
        drop(st);
        answer(&replies);
    }

    /// Record why the member does not serve right now.
    fn note(&mut self, why: &str) {
        {
            MEMBER.exclusive().note_error(why, clock::now_ms());
        }
        if self.warned.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
            self.warned = Some(Instant::now());
            pgrx::warning!("tsoracle member: {why}");
        }
    }

    /// Could not connect: try again after a back-off.
    fn down(&mut self, why: &str) {
        self.note(why);
        // Nothing in flight any more: callers wake this process again.
        if let Ok(mut guard) = QUEUE.exclusive() {
            guard.queue().header.worker_will_look = false;
        }
        MEMBER.exclusive().connected = false;
        MEMBER.exclusive().oracle_pid = 0;
        set_phase(self.signals, Phase::Starting);
        self.link = Link::Down(Instant::now() + Duration::from_millis(self.backoff_ms));
        self.backoff_ms = (self.backoff_ms * 2).min(1000);
        self.lost_in_flight();
    }

    /// The connection broke (or must not be trusted): reconnect.
    fn broken(&mut self, why: &str) {
        self.backoff_ms = 100;
        self.down(why);
    }

    /// What was in flight on a connection that is gone: timestamps are fetched again (those
    /// lost were never handed out); blocks and leases may have been granted (`40003`).
    fn lost_in_flight(&mut self) {
        let mut unknown = Vec::new();
        for sent in std::mem::take(&mut self.sent) {
            match sent.flight {
                Flight::Next { calls, .. } => self.retry_next(calls),
                Flight::Call { ticket, requests, since } => {
                    if grants_lease(&requests) {
                        self.grants.landed();
                    }
                    if rereadable(&requests) {
                        self.waiting.push(Waiting { ticket, requests, since });
                    } else {
                        unknown.push(lost(ticket, &requests));
                    }
                }
                Flight::Hello | Flight::Prepare | Flight::Heartbeat | Flight::Report => {}
            }
        }
        answer(&unknown);
    }
}

/// A `tso_next()`-like call: coalesced with the others into one `tsoracle.member_next`.
fn is_next(w: &Waiting) -> bool {
    w.requests.len() == 1 && w.requests[0].kind == RequestKind::Next
}

/// Hand the replies to their callers and wake them.
pub(super) fn answer(replies: &[(Ticket, Vec<Reply>)]) {
    if replies.is_empty() {
        return;
    }
    let waiters: Vec<usize> = match QUEUE.exclusive() {
        Ok(mut guard) => {
            let mut queue = guard.queue();
            replies.iter().filter_map(|(t, r)| queue.answer(*t, r)).collect()
        }
        Err(_) => Vec::new(),
    };
    shmem::queue::wake_waiters(waiters);
    if let Ok(signals) = shmem::signals() {
        signals.broadcast_answers();
    }
}
