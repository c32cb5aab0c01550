//! The background worker: the only process that writes the durable tables.
//!
//! It starts when recovery ends (server start, crash restart, promotion of a standby), runs
//! the fence before anything is served, then keeps the timestamp window ahead of the clock.
//! Every write is its own transaction with `synchronous_commit = on`, committed before the
//! allocator is allowed to serve from it.

use crate::clock::now_ms;
use crate::guc;
use crate::shmem::{self, Phase, Reply, ReplyCode, Request, RequestKind, Signals, LEASE_BOUNDS, MAX_LEASES, ORACLE, QUEUE};
use tsoracle_core::queue::Ticket;
use tsoracle_core::timestamp::MAX_SQL_PHYSICAL_MS;
use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags};
use pgrx::prelude::*;
use pgrx::spi::OwnedPreparedStatement;
use pgrx::PgOid;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tsoracle_core::allocator::WindowExtension;
use tsoracle_core::error::CoreError;
use tsoracle_core::lease::{AcquireOutcome, Lease, LeaseTable};
use tsoracle_core::seq::{plan_group, SeqRequest};

pub const WORKER_TYPE: &str = "tsoracle worker";

/// The extension version (SQL objects) this library serves; the worker waits (57P03,
/// `outdated_schema`) while the extension in `tsoracle.database` is at another one.
pub const EXTENSION_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Settings the worker forces at override level, above postgresql.conf, `ALTER SYSTEM`,
/// `ALTER DATABASE … SET` and `ALTER ROLE … SET`: it runs as a superuser in a database that
/// others may own, so nothing they set may change what its SQL means or whether it runs.
const FORCED_SETTINGS: [(&std::ffi::CStr, &std::ffi::CStr); 14] = [
    // Every name the worker uses resolves in pg_catalog first; pg_temp (its own) last.
    (c"search_path", c"pg_catalog, pg_temp"),
    // Run as the session user (the bootstrap superuser), whatever `role` a database sets.
    (c"role", c"none"),
    // Every commit durable (and on synchronous standbys) before it is served from.
    (c"synchronous_commit", c"on"),
    // No timeout aborts a durable write halfway; no setting makes the worker read-only.
    (c"statement_timeout", c"0"),
    (c"lock_timeout", c"0"),
    (c"idle_in_transaction_session_timeout", c"0"),
    (c"idle_session_timeout", c"0"),
    (c"default_transaction_read_only", c"off"),
    (c"default_transaction_isolation", c"read committed"),
    (c"default_transaction_deferrable", c"off"),
    // Triggers and rules fire as designed; an ERROR never becomes FATAL.
    (c"session_replication_role", c"origin"),
    (c"exit_on_error", c"off"),
    (c"transform_null_equals", c"off"),
    (c"standard_conforming_strings", c"on"),
];

/// Register the worker with the postmaster (from `_PG_init`, while preloading).
pub fn register() {
    BackgroundWorkerBuilder::new(WORKER_TYPE)
        .set_type(WORKER_TYPE)
        .set_library("tsoracle")
        .set_function("tsoracle_worker_main")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(Some(Duration::from_secs(1)))
        .load();
}

unsafe extern "C-unwind" {
    /// PostgreSQL's SIGTERM handler for backends (the raw symbol: pgrx's `pg_sys::die` is a
    /// Rust wrapper, not a signal handler).
    fn die(postgres_signal_arg: std::ffi::c_int);
}

/// Why the serving loop stopped.
enum Stop {
    /// SIGTERM or postmaster death: leave.
    Exit,
    /// The durable row no longer matches our epoch (table recreated, restored): fence again.
    Refence,
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn tsoracle_worker_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP);
    unsafe {
        // SIGTERM is PostgreSQL's own `die`: it ends a synchronous-replication wait (so a
        // shutdown never hangs on a missing standby), and `confirm_replicated` then refuses
        // to serve from that commit.
        pg_sys::pqsignal(libc::SIGTERM, Some(die));
        // A query cancel ends such a wait too, and leaves no trace afterwards: ignore it.
        libc::signal(libc::SIGINT, libc::SIG_IGN);
    }

    let Ok(signals) = shmem::signals() else {
        pgrx::warning!("tsoracle worker started without shared memory; exiting");
        return;
    };

    set_phase(signals, Phase::Starting);
    ORACLE.exclusive().worker_started_ms = now_ms();
    let database = guc::database();
    crate::restore::IN_WORKER.store(true, std::sync::atomic::Ordering::Relaxed);
    BackgroundWorker::connect_worker_to_spi(Some(&database), None);

    // Requests a previous worker took may or may not have been committed: say so.
    let waiters = match QUEUE.exclusive() {
        Ok(mut queue) => queue.queue().fail_taken(Reply::err(ReplyCode::Unknown)),
        Err(_) => Vec::new(),
    };
    shmem::wake_waiters(waiters);
    signals.broadcast_answers();
    unsafe {
        signals.set_worker(pg_sys::MyLatch, pg_sys::MyProcPid);
        pg_sys::before_shmem_exit(Some(on_worker_exit), pg_sys::Datum::from(0usize));
    }
    force_settings();
    if let Some(why) = unsafe_session() {
        refuse(signals, &why);
        return;
    }
    note_database_encoding();

    pgrx::log!("tsoracle worker started (database \"{database}\")");
    let mut worker = Worker { signals, leases: LeaseTable::new(), seq_statements: None };
    loop {
        if !wait_for_extension(signals, &database) {
            break;
        }
        if !worker.fence(0) {
            return;
        }
        match worker.serve() {
            Stop::Exit => break,
            Stop::Refence => continue,
        }
    }
    // Exit code 1: the postmaster restarts us unless it is shutting down, so even a stray
    // pg_terminate_backend() cannot leave the cluster without a worker.
    unsafe { pg_sys::proc_exit(1) };
}

/// Apply [`FORCED_SETTINGS`] at override level.
fn force_settings() {
    BackgroundWorker::transaction(|| {
        for (name, value) in FORCED_SETTINGS {
            // SAFETY: valid NUL-terminated strings; inside a transaction, as the check hooks
            // of some settings (role, search_path) expect.
            unsafe {
                pg_sys::SetConfigOption(
                    name.as_ptr(),
                    value.as_ptr(),
                    pg_sys::GucContext::PGC_SUSET,
                    pg_sys::GucSource::PGC_S_OVERRIDE,
                )
            };
        }
    });
}

/// Why the session cannot be trusted to do the worker's job, if it cannot: it must run as
/// a superuser, as itself (database or role settings could have changed the session user).
fn unsafe_session() -> Option<String> {
    BackgroundWorker::transaction(|| {
        // SAFETY: plain reads of the session state, inside a transaction.
        let (superuser, same_user) =
            unsafe { (pg_sys::superuser(), pg_sys::GetUserId() == pg_sys::GetSessionUserId()) };
        (!(superuser && same_user)).then(|| {
            format!(
                "the tsoracle worker does not run as a superuser in database \"{}\" (database or role settings such as session_authorization change its user); remove them and restart",
                guc::database()
            )
        })
    })
}

/// Keys and holders must be ASCII where the worker's database is not UTF8 (they could not
/// be read back as Rust strings otherwise).
fn note_database_encoding() {
    // SAFETY: a plain read of the database encoding, fixed for the life of the connection.
    let utf8 = unsafe { pg_sys::GetDatabaseEncoding() } == pg_sys::pg_enc::PG_UTF8 as i32;
    ORACLE.exclusive().ascii_names_only = !utf8;
}

/// Publish why the worker does not serve and stay (not serving) until shutdown: restarting
/// would only fail the same way.
fn refuse(signals: &Signals, why: &str) {
    pgrx::warning!("tsoracle: {why}");
    {
        let mut st = ORACLE.exclusive();
        st.allocator.step_down();
        st.set_refusal(why);
        st.phase = Phase::Refused;
    }
    signals.window.close();
    signals.broadcast();
    while BackgroundWorker::wait_latch(Some(Duration::from_secs(10))) {
        pg_sys::check_for_interrupts!();
        if BackgroundWorker::sighup_received() {
            // SAFETY: reloading the configuration file from the worker's main loop.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn on_worker_exit(_code: i32, _arg: pg_sys::Datum) {
    if let Some(signals) = shmem::SIGNALS.get() {
        signals.set_worker(std::ptr::null_mut(), 0);
        signals.broadcast();
    }
}

fn set_phase(signals: &Signals, phase: Phase) {
    ORACLE.exclusive().phase = phase;
    signals.broadcast();
}

/// The tables this library reads and writes; each must be a member of the extension.
const TABLES: [&str; 3] = ["high_water", "seq", "lease"];

/// What the worker found of the extension in its database.
enum ExtensionState {
    Missing,
    /// Installed at another version than this library's.
    Version(String),
    /// At our version, but the tables in schema tsoracle are not (all) the extension's.
    Foreign,
    Ready,
}

fn extension_state() -> ExtensionState {
    // Read-only SPI: a transaction that got an xid (pgrx's Spi::get_one asks for one) and
    // pruned a catalog page would wait for synchronous standbys at commit. Every name is
    // schema-qualified, and the search_path is pinned anyway.
    let found = BackgroundWorker::transaction(|| {
        Spi::connect(|client| {
            let rows = client.select(
                "SELECT e.extversion::pg_catalog.text, \
                        (SELECT pg_catalog.count(*) FROM pg_catalog.pg_depend d \
                           JOIN pg_catalog.pg_class c ON c.oid = d.objid \
                           JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
                          WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass \
                            AND d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass \
                            AND d.refobjid = e.oid AND d.deptype = 'e' \
                            AND n.nspname = 'tsoracle' AND c.relname = ANY ($1)) \
                   FROM pg_catalog.pg_extension e WHERE e.extname = 'tsoracle'",
                None,
                &[TABLES.map(String::from).to_vec().into()],
            )?;
            if rows.is_empty() {
                return Ok(None);
            }
            let (version, members) = rows.first().get_two::<String, i64>()?;
            Ok::<_, pgrx::spi::Error>(Some((version.unwrap_or_default(), members.unwrap_or(0))))
        })
    });
    match found {
        Ok(None) => ExtensionState::Missing,
        Ok(Some((version, _))) if version != EXTENSION_VERSION => ExtensionState::Version(version),
        Ok(Some((_, members))) if members != TABLES.len() as i64 => ExtensionState::Foreign,
        Ok(Some(_)) => ExtensionState::Ready,
        Err(e) => {
            pgrx::warning!("tsoracle worker could not read pg_extension: {e}");
            ExtensionState::Missing
        }
    }
}

/// Sleep until `CREATE EXTENSION tsoracle` (or `ALTER EXTENSION tsoracle UPDATE`) has made
/// the extension in our database the version this library serves. False on shutdown.
fn wait_for_extension(signals: &Signals, database: &str) -> bool {
    let mut announced = None;
    loop {
        let (phase, message) = match extension_state() {
            ExtensionState::Ready => return true,
            ExtensionState::Missing => (
                Phase::WaitingForExtension,
                format!("tsoracle worker waiting for CREATE EXTENSION tsoracle in database \"{database}\""),
            ),
            ExtensionState::Version(v) => (
                Phase::OutdatedSchema,
                format!(
                    "tsoracle: the extension in database \"{database}\" is at version {v}, this library serves {EXTENSION_VERSION}; run ALTER EXTENSION tsoracle UPDATE"
                ),
            ),
            ExtensionState::Foreign => (
                Phase::Refused,
                format!(
                    "the tables in schema tsoracle of database \"{database}\" are not the extension's own; the worker does not touch them"
                ),
            ),
        };
        if phase == Phase::Refused {
            ORACLE.exclusive().set_refusal(&message);
        }
        set_phase(signals, phase);
        if announced.as_deref() != Some(message.as_str()) {
            if phase == Phase::WaitingForExtension {
                pgrx::log!("{message}");
            } else {
                pgrx::warning!("{message}");
            }
            announced = Some(message);
        }
        // Callers poke the latch, so a fresh CREATE EXTENSION is noticed at once.
        if !BackgroundWorker::wait_latch(Some(Duration::from_secs(1))) {
            return false;
        }
        pg_sys::check_for_interrupts!();
    }
}

/// Strict mode (`tsoracle.require_synchronous_standby`): why nothing may be granted now,
/// if a synchronous standby is required and none is connected. Call inside a transaction.
fn strict_mode_refusal() -> Option<String> {
    if !guc::require_synchronous_standby() {
        return None;
    }
    let synchronous = Spi::connect(|client| {
        client
            .select(
                "SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_replication WHERE sync_state IN ('sync', 'quorum')",
                None,
                &[],
            )?
            .first()
            .get_one::<i64>()
    })
    .ok()
    .flatten()
    .unwrap_or(0);
    (synchronous == 0).then(|| {
        "no synchronous standby is connected and tsoracle.require_synchronous_standby is on: nothing is granted until one is".to_string()
    })
}

/// The worker's own memory: the lease table (durable copy in `tsoracle.lease`, bounds
/// published to shared memory for `tso_safe_frontier()`).
struct Worker {
    signals: &'static Signals,
    leases: LeaseTable,
    /// Plans of the group commit's statements, prepared once per worker life.
    seq_statements: Option<SeqStatements>,
}

/// The two statements of a sequence group commit, kept across transactions (SPI_keepplan):
/// parsing and planning them for every group cost as much as the commit's fsync.
struct SeqStatements {
    lock_counters: OwnedPreparedStatement,
    store_counters: OwnedPreparedStatement,
}

impl SeqStatements {
    fn prepare() -> SeqStatements {
        let text_array = PgOid::BuiltIn(PgBuiltInOids::TEXTARRAYOID);
        let int8_array = PgOid::BuiltIn(PgBuiltInOids::INT8ARRAYOID);
        Spi::connect(|client| {
            let lock_counters = client
                .prepare_mut(
                    "SELECT key, next, owner::pg_catalog.oid::pg_catalog.int8 FROM tsoracle.seq \
                     WHERE key OPERATOR(pg_catalog.=) ANY ($1) ORDER BY key FOR UPDATE",
                    &[text_array],
                )?
                .keep();
            let store_counters = client
                .prepare_mut(
                    "INSERT INTO tsoracle.seq AS s (key, next, owner) \
                     SELECT k, n, o::pg_catalog.oid::pg_catalog.regrole \
                       FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), pg_catalog.unnest($2::pg_catalog.int8[]), \
                                      pg_catalog.unnest($3::pg_catalog.int8[])) AS u(k, n, o) \
                     ON CONFLICT (key) DO UPDATE SET next = GREATEST(s.next, EXCLUDED.next), updated_at = pg_catalog.now()",
                    &[text_array, int8_array, int8_array],
                )?
                .keep();
            Ok::<_, pgrx::spi::Error>(SeqStatements { lock_counters, store_counters })
        })
        .unwrap_or_else(|e| pgrx::error!("tsoracle could not prepare its sequence statements: {e}"))
    }
}

impl Worker {
    /// The failover fence (docs/worker.md): stop serving, load the durable high-water,
    /// persist a bound above it at this timeline, reload the leases, seed the allocator,
    /// serve. `min_floor_ms` > 0 is a `tso_seed()` request. False when the oracle cannot
    /// serve at all (the high-water is at the top of the range): the worker then refuses
    /// until shutdown instead of failing the fence again and again.
    fn fence(&mut self, min_floor_ms: u64) -> bool {
        let started = Instant::now();
        self.signals.window.close();
        let remembered_ms = {
            let mut st = ORACLE.exclusive();
            st.allocator.step_down();
            st.phase = Phase::Fencing;
            st.max_committed_ms
        };
        self.signals.broadcast();

        let timeline = unsafe { pg_sys::GetWALInsertionTimeLine() };
        let advance = guc::failover_advance_ms();
        let fenced = BackgroundWorker::transaction(|| {
            // No row only before the very first fence; a failed read is never taken for one.
            let (prior, prior_epoch) = Spi::connect(|client| {
                let rows = client.select("SELECT physical_ms, epoch FROM tsoracle.high_water WHERE id", None, &[])?;
                if rows.is_empty() {
                    Ok((None, None))
                } else {
                    rows.first().get_two::<i64, i64>()
                }
            })
            .unwrap_or_else(|e| pgrx::error!("tsoracle fence could not read the high-water: {e}"));
            let prior = prior.unwrap_or(0).max(0) as u64;
            // A row written on an older timeline: this server was promoted since.
            let promoted = prior_epoch.is_some_and(|e| e < i64::from(timeline));
            crate::replica::warn_if_unprotected();
            let now = now_ms();
            let floor_ms = (prior.max(remembered_ms) + 1).max(now).max(min_floor_ms);
            if floor_ms > MAX_SQL_PHYSICAL_MS {
                return Err(format!(
                    "the durable high-water ({prior} ms) is at the top of the timestamp range: no timestamp can be issued above it"
                ));
            }
            let requested = floor_ms.saturating_add(advance).min(MAX_SQL_PHYSICAL_MS);
            let (actual, epoch) = Spi::get_two_with_args::<i64, i64>(
                "INSERT INTO tsoracle.high_water AS h (id, physical_ms, epoch) VALUES (true, $1, $2) \
                 ON CONFLICT (id) DO UPDATE SET physical_ms = GREATEST(h.physical_ms, EXCLUDED.physical_ms), \
                     epoch = GREATEST(h.epoch, EXCLUDED.epoch), updated_at = pg_catalog.now() \
                 RETURNING physical_ms, epoch",
                &[(requested as i64).into(), i64::from(timeline).into()],
            )
            .unwrap_or_else(|e| pgrx::error!("tsoracle fence could not persist the high-water: {e}"));
            let leases = load_leases(now);
            Ok((floor_ms, actual.unwrap_or(0).max(0) as u64, epoch.unwrap_or(0).max(0) as u64, leases, promoted))
        });
        let (floor_ms, high_water_ms, epoch, leases, promoted) = match fenced {
            Ok(fenced) => fenced,
            Err(why) => {
                refuse(self.signals, &why);
                return false;
            }
        };
        // Committed (and flushed, and replicated where synchronous standbys are required).
        crate::replica::confirm_replicated();
        self.leases = leases;
        self.publish_lease_bounds();

        {
            let mut st = ORACLE.exclusive();
            let seeded = st.allocator.become_leader(floor_ms, high_water_ms, epoch).and_then(|()| {
                let bound = st.allocator.serving_bound_ms(now_ms(), guc::max_lead_ms());
                self.signals.window.open(floor_ms, bound)
            });
            if let Err(e) = seeded {
                drop(st);
                pgrx::error!("tsoracle fence produced an invalid seed: {e}");
            }
            st.phase = Phase::Serving;
            st.set_refusal("");
            st.timeline = timeline;
            st.max_committed_ms = st.max_committed_ms.max(high_water_ms);
            st.fences += 1;
            st.worker_commits += 1;
            st.last_fence_us = started.elapsed().as_micros() as u64;
            st.seeded_ms = st.seeded_ms.max(min_floor_ms);
            st.last_fence_promoted = promoted;
            self.signals.first_grant_ms.store(0, std::sync::atomic::Ordering::Relaxed);
        }
        self.signals.broadcast();
        pgrx::log!(
            "tsoracle fence complete: epoch {epoch} (timeline {timeline}), serving from {floor_ms} ms, high-water {high_water_ms} ms, {} live leases, took {:.1} ms",
            self.leases.iter().filter(|l| l.is_live(now_ms())).count(),
            started.elapsed().as_secs_f64() * 1000.0
        );
        true
    }

    /// Steady state: keep the window ahead of the clock (within `tsoracle.max_lead_ms`),
    /// answer callers' requests.
    fn serve(&mut self) -> Stop {
        loop {
            let window_ahead = guc::window_ahead_ms();
            // Wake often enough to extend before half of the window is gone.
            let tick = Duration::from_millis((window_ahead / 8).clamp(1, 200));
            if !BackgroundWorker::wait_latch(Some(tick)) {
                return Stop::Exit;
            }
            pg_sys::check_for_interrupts!();
            if BackgroundWorker::sighup_received() {
                unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
            }

            let seed = self.signals.take_seed_request();
            // A caller re-asks while it waits: a seed already applied needs no second fence.
            if seed > 0 && seed > ORACLE.share().seeded_ms {
                if !self.fence(seed) {
                    return Stop::Exit;
                }
                continue;
            }
            if self.signals.take_refence_request() {
                pgrx::log!("tsoracle: durable state was restored underneath the worker; running the fence again");
                return Stop::Refence;
            }

            self.serve_requests();
            self.expire_leases();

            let requested = self.signals.take_extension_request();
            let now = now_ms();
            let max_lead = guc::max_lead_ms();
            let extension = {
                let mut st = ORACLE.exclusive();
                st.allocator.observe_issued(self.signals.window.next_ts());
                // The clock moved: callers may take up to the (higher) lead cap.
                self.signals.window.extend(st.allocator.serving_bound_ms(now, max_lead));
                if requested || st.allocator.needs_capped_extension(now, window_ahead, max_lead) {
                    st.allocator.prepare_capped_extension(now, window_ahead, max_lead).ok().flatten()
                } else {
                    None
                }
            };
            if requested {
                self.signals.broadcast();
            }
            if let Some(extension) = extension {
                if !self.extend(extension) {
                    return Stop::Refence;
                }
            }
        }
    }

    /// Persist a wider window (monotonic, epoch-checked) and let the allocator use it.
    /// False when the durable row is not ours any more and the fence must run again.
    fn extend(&mut self, extension: WindowExtension) -> bool {
        let outcome = BackgroundWorker::transaction(|| match strict_mode_refusal() {
            Some(why) => Err(why),
            None => Ok(persist_high_water(extension)),
        });
        let actual = match outcome {
            Err(why) => {
                ORACLE.exclusive().set_refusal(&why);
                self.signals.broadcast();
                return true;
            }
            Ok(actual) => actual,
        };
        let Some(actual) = actual else {
            // No row at our epoch: the table was recreated or restored underneath us.
            pgrx::warning!("tsoracle high-water row is missing or at another epoch; running the fence again");
            return false;
        };
        crate::replica::confirm_replicated();
        ORACLE.exclusive().set_refusal("");
        match self.commit_high_water(actual, extension.epoch) {
            Ok(()) => {
                ORACLE.exclusive().window_extensions += 1;
                true
            }
            Err(e) => {
                pgrx::warning!("tsoracle window extension rejected ({e}); running the fence again");
                false
            }
        }
    }

    /// Let the allocator serve up to a high-water that is now durable (within the lead cap).
    fn commit_high_water(&self, actual_ms: u64, epoch: u64) -> Result<(), CoreError> {
        let result = {
            let mut st = ORACLE.exclusive();
            let result = st.allocator.commit_window_extension(actual_ms, epoch);
            if result.is_ok() {
                self.signals.window.extend(st.allocator.serving_bound_ms(now_ms(), guc::max_lead_ms()));
                st.worker_commits += 1;
                st.max_committed_ms = st.max_committed_ms.max(actual_ms);
            }
            result
        };
        self.signals.broadcast();
        result
    }

    /// Group commit: take every pending call into ONE transaction, commit once (with
    /// `synchronous_commit = on`), then answer them all.
    fn serve_requests(&mut self) {
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
        let now = now_ms();
        let (window, epoch) = {
            let st = ORACLE.share();
            (st.allocator.high_water_ms(), st.allocator.epoch().unwrap_or(0))
        };
        let ascii_only = ORACLE.share().ascii_names_only;
        let mut leases = self.leases.clone();
        let requests = taken.clone();
        let mut statements = self.seq_statements.take();
        let (replies, high_water, leases, statements, refused) = BackgroundWorker::transaction(move || {
            if let Some(why) = strict_mode_refusal() {
                let replies = vec![Reply::err(ReplyCode::Refused); requests.len()];
                return (replies, window, leases, statements, Some(why));
            }
            let checks = Checks::new(&requests, ascii_only);
            let prepared = statements.get_or_insert_with(SeqStatements::prepare);
            let mut replies = advance_sequences(prepared, &requests, &checks);
            let high_water = mutate_leases(&requests, &mut replies, &mut leases, &checks, now, window, epoch);
            (replies, high_water, leases, statements, None)
        });
        self.seq_statements = statements;
        crate::replica::confirm_replicated();
        self.leases = leases;
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
                queue.header.grouped_calls += calls.len() as u64;
                by_call.iter().filter_map(|(ticket, replies)| queue.answer(*ticket, replies)).collect()
            }
            Err(_) => Vec::new(),
        };
        shmem::wake_waiters(waiters);
        self.signals.broadcast_answers();
    }

    /// Purge leases expired longer than the retention from memory and from the table, and
    /// keep the published bounds (and live count) current as leases lapse.
    fn expire_leases(&mut self) {
        let now = now_ms();
        let horizon = purge_horizon(now);
        if self.leases.iter().any(|l| !l.is_live(horizon)) {
            BackgroundWorker::transaction(|| {
                Spi::run_with_args(
                    "DELETE FROM tsoracle.lease WHERE expires_at_ms OPERATOR(pg_catalog.<=) $1",
                    &[(horizon as i64).into()],
                )
            })
            .unwrap_or_else(|e| pgrx::error!("tsoracle could not delete expired leases: {e}"));
            self.leases.expire(horizon);
        }
        let live = self.leases.iter().filter(|l| l.is_live(now)).count();
        if live != LEASE_BOUNDS.share().len {
            self.publish_lease_bounds();
        }
    }

    /// Publish the bounds of the live leases for `tso_safe_frontier()` in any backend.
    fn publish_lease_bounds(&self) {
        let now = now_ms();
        let mut bounds = LEASE_BOUNDS.exclusive();
        let mut len = 0;
        for lease in self.leases.iter().filter(|l| l.is_live(now)).take(MAX_LEASES) {
            bounds.entries[len] = (lease.ts_upper_bound_ms, lease.expires_at_ms);
            len += 1;
        }
        bounds.len = len;
    }
}

/// Who may do what, for the roles of one group: asked of the catalogs once per role.
struct Checks {
    superusers: HashMap<u32, bool>,
    ascii_only: bool,
}

impl Checks {
    fn new(requests: &[(Ticket, Request)], ascii_only: bool) -> Checks {
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
    fn may_use(&self, role: u32, owner: u32) -> bool {
        owner == 0
            || role == owner
            || self.is_superuser(role)
            // SAFETY: a catalog lookup inside the group's transaction.
            || unsafe { pg_sys::has_privs_of_role(pg_sys::Oid::from(role), pg_sys::Oid::from(owner)) }
    }

    /// May `role` manage (renew, release, drop) what `owner` owns? The owner itself or a
    /// superuser (owner 0: shared, as above).
    fn may_manage(&self, role: u32, owner: u32) -> bool {
        owner == 0 || role == owner || self.is_superuser(role)
    }

    /// A name the worker's database can store and give back.
    fn storable(&self, name: &str) -> bool {
        !self.ascii_only || name.is_ascii()
    }
}

/// An expired lease is kept (no longer live; renewing it says "expired", 55000) for
/// `tsoracle.expired_lease_retention_ms`, then purged (renewing it then says "does not exist").
fn purge_horizon(now_ms: u64) -> u64 {
    now_ms.saturating_sub(guc::expired_lease_retention_ms())
}

/// `UPDATE … GREATEST … WHERE epoch = $2`: the one monotonic path to the high-water.
/// None when the row is not at our epoch.
fn persist_high_water(extension: WindowExtension) -> Option<u64> {
    Spi::get_one_with_args::<i64>(
        "UPDATE tsoracle.high_water SET physical_ms = GREATEST(physical_ms, $1), updated_at = pg_catalog.now() \
         WHERE id AND epoch OPERATOR(pg_catalog.=) $2 RETURNING physical_ms",
        &[(extension.requested_ms as i64).into(), (extension.epoch as i64).into()],
    )
    .ok()
    .flatten()
    .and_then(|ms| u64::try_from(ms).ok())
}

/// The durable leases, without those expired longer than the retention (deleted here).
/// Holders are read as UTF-8 bytes, so that no row can make the fence fail.
fn load_leases(now_ms: u64) -> LeaseTable {
    let horizon = purge_horizon(now_ms);
    Spi::run_with_args(
        "DELETE FROM tsoracle.lease WHERE expires_at_ms OPERATOR(pg_catalog.<=) $1",
        &[(horizon as i64).into()],
    )
    .unwrap_or_else(|e| pgrx::error!("tsoracle could not delete expired leases: {e}"));
    let rows = Spi::connect(|client| {
        client
            .select(
                "SELECT lease_id, pg_catalog.convert_to(holder, 'UTF8'), holder_epoch, ts_upper_bound_ms, \
                        expires_at_ms, ttl_ms, superseded, owner::pg_catalog.oid::pg_catalog.int8 \
                 FROM tsoracle.lease ORDER BY lease_id",
                None,
                &[],
            )?
            .map(|row| {
                Ok(Lease {
                    id: row.get::<i64>(1)?.unwrap_or(0),
                    holder: String::from_utf8_lossy(&row.get::<Vec<u8>>(2)?.unwrap_or_default()).into_owned(),
                    holder_epoch: row.get::<i64>(3)?.unwrap_or(0),
                    ts_upper_bound_ms: row.get::<i64>(4)?.unwrap_or(0).max(0) as u64,
                    expires_at_ms: row.get::<i64>(5)?.unwrap_or(0).max(0) as u64,
                    ttl_ms: row.get::<i64>(6)?.unwrap_or(0).max(0) as u64,
                    superseded: row.get::<bool>(7)?.unwrap_or(false),
                    owner: u32::try_from(row.get::<i64>(8)?.unwrap_or(0)).unwrap_or(0),
                })
            })
            .collect::<Result<Vec<Lease>, pgrx::spi::Error>>()
    })
    .unwrap_or_else(|e| pgrx::error!("tsoracle could not load the leases: {e}"));
    LeaseTable::load(rows, horizon).unwrap_or_else(|e| pgrx::error!("tsoracle lease table is inconsistent: {e}"))
}

/// The lease part of a group commit, in queue order, on the worker's copy of the table.
/// Every acquire and renewal first moves the high-water to at least
/// `max(high_water + 1, now + ttl)`, and its bound is that durable value. Returns the
/// high-water after the group.
fn mutate_leases(
    taken: &[(Ticket, Request)],
    replies: &mut [Reply],
    leases: &mut LeaseTable,
    checks: &Checks,
    now: u64,
    high_water: u64,
    epoch: u64,
) -> u64 {
    let mut high_water = high_water;
    let mut writes: Vec<LeaseWrite> = Vec::new();
    for (i, (_, r)) in taken.iter().enumerate() {
        let reply = match r.kind {
            RequestKind::LeaseAcquire if !checks.storable(r.name()) => Reply::err(ReplyCode::BadEncoding),
            RequestKind::LeaseAcquire => {
                let (holder, holder_epoch, ttl) = (r.name(), r.arg, r.count);
                match leases.active_lease(holder, now) {
                    // A holder name belongs to the role holding its live lease.
                    Some(active) if !checks.may_manage(r.role, active.owner) => {
                        denied(active.owner)
                    }
                    _ => {
                        let bound = lease_bound(high_water, now, ttl);
                        match leases.plan_acquire(holder, holder_epoch, ttl, now, bound, bound as i64, r.role) {
                            Ok(AcquireOutcome::Existing(lease)) => lease_reply(&lease, epoch),
                            Ok(AcquireOutcome::New { .. })
                                if leases.iter().filter(|l| l.is_live(now)).count() >= MAX_LEASES =>
                            {
                                Reply::err(ReplyCode::TooManyLeases)
                            }
                            Ok(AcquireOutcome::New { lease, superseded }) => {
                                leases.apply_acquire(&AcquireOutcome::New { lease: lease.clone(), superseded });
                                high_water = bound;
                                if let Some(old) = superseded {
                                    writes.push(LeaseWrite::Supersede(old));
                                }
                                let reply = lease_reply(&lease, epoch);
                                writes.push(LeaseWrite::Insert(lease));
                                reply
                            }
                            Err(e) => lease_error_reply(&e),
                        }
                    }
                }
            }
            RequestKind::LeaseRenew => match leases.get(r.arg).map(|l| (l.ttl_ms, l.owner)) {
                Some((_, owner)) if !checks.may_manage(r.role, owner) => denied(owner),
                found => {
                    let ttl = found.map_or(0, |(ttl, _)| ttl);
                    let bound = renewal_bound(high_water, now, ttl);
                    match leases.renew(r.arg, ttl, now, bound) {
                        Ok(lease) => {
                            high_water = high_water.max(bound);
                            let reply = lease_reply(&lease, epoch);
                            writes.push(LeaseWrite::Renew(lease));
                            reply
                        }
                        Err(e) => lease_error_reply(&e),
                    }
                }
            },
            RequestKind::LeaseRelease => match leases.get(r.arg).map(|l| l.owner) {
                Some(owner) if !checks.may_manage(r.role, owner) => denied(owner),
                _ => {
                    if leases.release(r.arg).is_some() {
                        writes.push(LeaseWrite::Delete(r.arg));
                    }
                    Reply::ok(r.arg)
                }
            },
            RequestKind::SeqAdvance | RequestKind::SeqPeek | RequestKind::SeqDrop => continue,
        };
        replies[i] = reply;
    }
    if writes.is_empty() {
        return high_water;
    }
    // The bounds must be durable before (in the same commit as) the leases that carry them.
    if high_water > 0 {
        let extension = WindowExtension { requested_ms: high_water, epoch };
        match persist_high_water(extension) {
            Some(actual) if actual >= high_water => high_water = actual,
            _ => pgrx::error!("tsoracle high-water row is missing or at another epoch; leases not granted"),
        }
    }
    for write in writes {
        write.execute();
    }
    high_water
}

/// 42501, carrying the owner so the caller can name it.
fn denied(owner: u32) -> Reply {
    Reply { value: i64::from(owner), ..Reply::err(ReplyCode::PermissionDenied) }
}

/// A new lease's bound, which is also its id: the high-water moved to at least
/// `max(high_water + 1, now + ttl)`, so ids are unique (each is above every earlier bound)
/// and grants do not stack (the high-water moves no further than `now + ttl` unless it is
/// already there).
fn lease_bound(high_water: u64, now: u64, ttl: u64) -> u64 {
    high_water.saturating_add(1).max(now.saturating_add(ttl)).min(MAX_SQL_PHYSICAL_MS)
}

/// A renewal's bound: `max(high_water, now + ttl)` (a renewal makes no id). However often a
/// lease is renewed, the high-water ends no further than `now + ttl`.
fn renewal_bound(high_water: u64, now: u64, ttl: u64) -> u64 {
    high_water.max(now.saturating_add(ttl)).min(MAX_SQL_PHYSICAL_MS)
}

fn lease_error_reply(error: &CoreError) -> Reply {
    Reply::err(match error {
        CoreError::StaleHolderEpoch { .. } => ReplyCode::StaleHolderEpoch,
        CoreError::LeaseNotFound(_) => ReplyCode::LeaseNotFound,
        CoreError::LeaseNotRenewable(_) => ReplyCode::LeaseNotRenewable,
        _ => ReplyCode::Unknown,
    })
}

fn lease_reply(lease: &Lease, epoch: u64) -> Reply {
    Reply {
        code: ReplyCode::Ok,
        value: lease.id,
        bound_ms: lease.ts_upper_bound_ms as i64,
        expires_at_ms: lease.expires_at_ms as i64,
        epoch: epoch as i64,
    }
}

/// One change to `tsoracle.lease`, made inside the group's transaction.
enum LeaseWrite {
    Insert(Lease),
    Supersede(i64),
    Renew(Lease),
    Delete(i64),
}

impl LeaseWrite {
    fn execute(self) {
        let result = match self {
            LeaseWrite::Insert(l) => Spi::run_with_args(
                "INSERT INTO tsoracle.lease (lease_id, holder, holder_epoch, ts_upper_bound_ms, expires_at_ms, ttl_ms, owner) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7::pg_catalog.oid::pg_catalog.regrole)",
                &[
                    l.id.into(),
                    l.holder.into(),
                    l.holder_epoch.into(),
                    (l.ts_upper_bound_ms as i64).into(),
                    (l.expires_at_ms as i64).into(),
                    (l.ttl_ms as i64).into(),
                    i64::from(l.owner).into(),
                ],
            ),
            LeaseWrite::Supersede(id) => Spi::run_with_args(
                "UPDATE tsoracle.lease SET superseded = true WHERE lease_id OPERATOR(pg_catalog.=) $1",
                &[id.into()],
            ),
            LeaseWrite::Renew(l) => Spi::run_with_args(
                "UPDATE tsoracle.lease SET ts_upper_bound_ms = $2, expires_at_ms = $3, renewed_at = pg_catalog.now() \
                 WHERE lease_id OPERATOR(pg_catalog.=) $1",
                &[l.id.into(), (l.ts_upper_bound_ms as i64).into(), (l.expires_at_ms as i64).into()],
            ),
            LeaseWrite::Delete(id) => Spi::run_with_args(
                "DELETE FROM tsoracle.lease WHERE lease_id OPERATOR(pg_catalog.=) $1",
                &[id.into()],
            ),
        };
        result.unwrap_or_else(|e| pgrx::error!("tsoracle could not write a lease: {e}"));
    }
}

/// The sequence part of a group commit: read the touched counters (locked), check who may
/// use them, plan every block in queue order (pure, `plan_group`), write each moved counter
/// once, then drop the keys asked to be dropped.
fn advance_sequences(statements: &SeqStatements, taken: &[(Ticket, Request)], checks: &Checks) -> Vec<Reply> {
    let mut replies = vec![Reply::default(); taken.len()];
    let seq: Vec<(usize, &Request)> = taken
        .iter()
        .enumerate()
        .filter(|(_, (_, r))| matches!(r.kind, RequestKind::SeqAdvance | RequestKind::SeqPeek | RequestKind::SeqDrop))
        .map(|(i, (_, r))| (i, r))
        .collect();
    if seq.is_empty() {
        return replies;
    }
    let keys: Vec<String> = {
        let mut keys: Vec<String> = seq.iter().map(|(_, r)| r.name().to_string()).collect();
        keys.sort_unstable();
        keys.dedup();
        keys
    };
    // key -> (next, owner)
    let current: HashMap<String, (i64, u32)> = Spi::connect_mut(|client| {
        let rows = client.update(&statements.lock_counters, None, &[keys.clone().into()])?;
        rows.map(|row| {
            Ok((
                row.get::<String>(1)?.unwrap_or_default(),
                (row.get::<i64>(2)?.unwrap_or(0), u32::try_from(row.get::<i64>(3)?.unwrap_or(0)).unwrap_or(0)),
            ))
        })
        .collect::<Result<HashMap<_, _>, pgrx::spi::Error>>()
    })
    .unwrap_or_else(|e| pgrx::error!("tsoracle could not read the sequence counters: {e}"));

    // Owners of keys this group creates: the role of the first call that names them.
    let mut owners: HashMap<&str, u32> = current.iter().map(|(k, &(_, owner))| (k.as_str(), owner)).collect();
    // Calls (batches) refused whole: a key they may not use, or cannot store.
    let mut refused: HashMap<u64, ReplyCode> = HashMap::new();
    let mut denied_owner: HashMap<u64, u32> = HashMap::new();
    for &(_, r) in seq.iter().filter(|(_, r)| r.kind == RequestKind::SeqAdvance) {
        if !checks.storable(r.name()) {
            refused.insert(r.batch, ReplyCode::BadEncoding);
            continue;
        }
        let owner = *owners.entry(r.name()).or_insert(r.role);
        if !checks.may_use(r.role, owner) {
            refused.entry(r.batch).or_insert(ReplyCode::PermissionDenied);
            denied_owner.insert(r.batch, owner);
        }
    }

    let advances: Vec<(usize, SeqRequest)> = seq
        .iter()
        .filter(|(_, r)| r.kind == RequestKind::SeqAdvance && !refused.contains_key(&r.batch))
        .map(|&(i, r)| (i, SeqRequest { batch: r.batch, key: r.name(), count: r.count }))
        .collect();
    let creates_keys = advances.iter().any(|(_, r)| !current.contains_key(r.key));
    let existing_keys = if creates_keys {
        Spi::get_one::<i64>("SELECT pg_catalog.count(*) FROM tsoracle.seq")
            .unwrap_or_else(|e| pgrx::error!("tsoracle could not count the sequence keys: {e}"))
            .unwrap_or(0)
            .max(0) as u64
    } else {
        0
    };
    let current_ref: HashMap<&str, i64> = current.iter().map(|(k, &(next, _))| (k.as_str(), next)).collect();
    let requests: Vec<SeqRequest> = advances.iter().map(|(_, r)| r.clone()).collect();
    let plan = plan_group(&requests, &current_ref, existing_keys, guc::max_seq_keys());

    if !plan.updates.is_empty() {
        let keys: Vec<String> = plan.updates.iter().map(|(k, _)| k.clone()).collect();
        let values: Vec<i64> = plan.updates.iter().map(|(_, v)| *v).collect();
        let key_owners: Vec<i64> = keys.iter().map(|k| i64::from(owners.get(k.as_str()).copied().unwrap_or(0))).collect();
        Spi::connect_mut(|client| {
            client.update(&statements.store_counters, None, &[keys.into(), values.into(), key_owners.into()]).map(|_| ())
        })
        .unwrap_or_else(|e| pgrx::error!("tsoracle could not advance the sequence counters: {e}"));
    }

    for ((i, _), result) in advances.iter().zip(&plan.results) {
        replies[*i] = match result {
            Ok(start) => Reply::ok(*start),
            Err(CoreError::SeqOverflow { .. }) => Reply::err(ReplyCode::SeqOverflow),
            Err(_) => Reply::err(ReplyCode::TooManyKeys),
        };
    }
    // Peeks see the counters as this group leaves them; drops come last.
    let after: HashMap<&str, i64> = plan.updates.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    for &(i, r) in &seq {
        let known = current.get(r.name()).map(|&(_, owner)| owner);
        replies[i] = match r.kind {
            RequestKind::SeqAdvance => match refused.get(&r.batch) {
                Some(ReplyCode::PermissionDenied) => denied(denied_owner.get(&r.batch).copied().unwrap_or(0)),
                Some(&code) => Reply::err(code),
                None => continue,
            },
            RequestKind::SeqPeek => match known {
                Some(owner) if !checks.may_use(r.role, owner) => denied(owner),
                _ => match after.get(r.name()).or_else(|| current_ref.get(r.name())) {
                    Some(&next) => Reply::ok(next),
                    None => Reply::err(ReplyCode::Null),
                },
            },
            RequestKind::SeqDrop => match known.or_else(|| owners.get(r.name()).copied().filter(|_| after.contains_key(r.name()))) {
                None => Reply::err(ReplyCode::Null),
                Some(owner) if !checks.may_manage(r.role, owner) => denied(owner),
                Some(_) => {
                    Spi::run_with_args("DELETE FROM tsoracle.seq WHERE key OPERATOR(pg_catalog.=) $1", &[r.name().into()])
                        .unwrap_or_else(|e| pgrx::error!("tsoracle could not drop a sequence key: {e}"));
                    Reply::ok(1)
                }
            },
            _ => continue,
        };
    }
    replies
}
