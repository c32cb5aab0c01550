//! The background worker: the only process that writes the durable tables.
//!
//! It starts when recovery ends (server start, crash restart, promotion of a standby), runs
//! the fence before anything is served, then keeps the timestamp window ahead of the clock.
//! Every write is its own transaction with `synchronous_commit = on`, committed before the
//! allocator is allowed to serve from it.

//!
//! One concern per file: `fence` (the fence and the durable leases it loads), `sequences`
//! (the counters' part of a group commit), `leases` (the leases' part, their expiry and the
//! published bounds), `requests` (the group commit itself and who may do what); here: start,
//! hardening, waiting for the extension, and the serving loop that keeps the window ahead.

mod fence;
mod leases;
mod requests;
mod resolved;
mod sequences;

use crate::clock::{self, now_ms};
use crate::guc;
use crate::shmem::{self, Phase, Reply, ReplyCode, Signals, ORACLE, QUEUE};
use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::prelude::*;
use std::time::Duration;
use tsoracle_core::allocator::WindowExtension;
use tsoracle_core::clock::Step;
use tsoracle_core::error::CoreError;
use tsoracle_core::lease::LeaseTable;

pub const WORKER_TYPE: &str = "tsoracle worker";

/// The extension version (SQL objects) this library serves; the worker waits (57P03,
/// `outdated_schema`) while the extension in `tsoracle.database` is at another one.
pub const EXTENSION_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Settings the worker forces at override level, above postgresql.conf, `ALTER SYSTEM`,
/// `ALTER DATABASE … SET` and `ALTER ROLE … SET`: it runs as a superuser in a database that
/// others may own, so nothing they set may change what its SQL means or whether it runs.
const FORCED_SETTINGS: [(&std::ffi::CStr, &std::ffi::CStr); 15] = [
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
    // The group commit's kept statements run one generic plan. The plan cache otherwise
    // re-plans them for every group (their custom plans look cheaper): 12 % of the worker's
    // CPU under one `tso_seq` client, measured with perf.
    (c"plan_cache_mode", c"force_generic_plan"),
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
    // SAFETY: installing this process's own handlers as the worker starts: `die` is
    // PostgreSQL's SIGTERM handler for backends (in a worker it only sets flags and the
    // latch), and an ignored SIGINT has no handler.
    unsafe {
        // SIGTERM is PostgreSQL's own `die`: it ends a synchronous-replication wait (so a
        // shutdown never hangs on a missing standby), and `confirm_replicated` then refuses
        // to serve from that commit.
        crate::compat::set_signal(libc::SIGTERM, Some(die));
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
    // SAFETY: plain reads of this process's globals: MyLatch is its PGPROC latch (in shared
    // memory, so any backend may set it) and MyProcPid its pid. The exit callback is a static
    // function that uses no argument.
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
    warn_if_window_exceeds_ha_ttl();
    let mut worker = Worker {
        signals,
        leases: LeaseTable::new(),
        lease_deadlines: std::collections::HashMap::new(),
        seq_statements: None,
        // The first publication an interval after the worker starts.
        resolved_published_mono_ms: clock::mono_ms(),
    };
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
    // SAFETY: called outside any transaction, with no lock guard alive; proc_exit runs the
    // exit callbacks and never returns, so what is still in scope is only leaked by a process
    // that is exiting.
    unsafe { pg_sys::proc_exit(1) };
}

/// Under an HA manager, a primary cut off from its synchronous standby still issues for up
/// to `window_ahead_ms` (its last confirmed commit ages out), and the manager elects a new
/// primary no sooner than its TTL: real-time order across the failover needs
/// `window_ahead_ms + clock error < ttl`. Warn unless the window is at most half the TTL.
fn warn_if_window_exceeds_ha_ttl() {
    let (window, ttl) = (guc::window_ahead_ms(), guc::ha_ttl_ms());
    if ttl > 0 && window.saturating_mul(2) > ttl {
        pgrx::warning!(
            "tsoracle.window_ahead_ms ({window} ms) is more than half of tsoracle.ha_ttl_ms ({ttl} ms): a primary frozen or cut off from its synchronous standby could issue timestamps after a new primary is elected; lower window_ahead_ms so that window_ahead_ms + clock error < ttl with room to spare"
        );
    }
}

/// Say in the server log that the wall clock stepped, and what the oracle does about it.
fn log_clock_step(step: Option<Step>) {
    let (direction, ms) = match step {
        None => return,
        Some(Step::Back(ms)) => ("back", ms),
        Some(Step::Forward(ms)) => ("forward", ms),
    };
    let lead = ORACLE.share().clock.lead_ms();
    pgrx::warning!(
        "tsoracle: the wall clock stepped {direction} by {ms} ms; timestamps go on above the last one issued, the lead cap is measured from a reference clock {lead} ms ahead of the wall clock, which closes the gap at half the pace of real time"
    );
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
const TABLES: [&str; 4] = ["high_water", "seq", "lease", "resolved"];

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
    /// When each lease stops holding the frontier on the monotonic clock (`clock::mono_ms`).
    lease_deadlines: std::collections::HashMap<i64, u64>,
    /// When the resolved timestamp was last published, or considered (`clock::mono_ms`).
    resolved_published_mono_ms: u64,
    /// Plans of the group commit's statements, prepared once per worker life.
    seq_statements: Option<sequences::SeqStatements>,
}

impl Worker {
    /// Steady state: keep the window ahead of the clock (within `tsoracle.max_lead_ms`),
    /// answer callers' requests.
    fn serve(&mut self) -> Stop {
        loop {
            let window_ahead = guc::window_ahead_ms();
            // Wake often enough to extend before half of the window is gone, and to publish
            // the resolved timestamp on time.
            let tick = Duration::from_millis(
                (window_ahead / 8).clamp(1, 200).min(guc::resolved_interval_ms().max(1)),
            );
            if !BackgroundWorker::wait_latch(Some(tick)) {
                return Stop::Exit;
            }
            pg_sys::check_for_interrupts!();
            if BackgroundWorker::sighup_received() {
                // SAFETY: called from the worker's main loop, between transactions, where no
                // LWLock is held.
                unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
                warn_if_window_exceeds_ha_ttl();
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
            self.publish_resolved();

            let requested = self.signals.take_extension_request();
            let sample = clock::sample();
            let now = sample.wall_ms;
            let max_lead = guc::max_lead_ms();
            // Issuing stops window_ahead_ms after the last confirmed commit began: renew it at
            // half time, with a commit that changes nothing if nothing else is due.
            let heartbeat = self.signals.serve_left_ms(sample) <= window_ahead / 2;
            let (extension, step) = {
                let mut st = ORACLE.exclusive();
                let step = st.clock.observe(sample.wall_ms, sample.mono_ms);
                let reference = st.clock.reference_ms();
                st.allocator.observe_issued(self.signals.window.next_ts());
                // The clock moved: callers may take up to the (higher) lead cap.
                self.signals.window.extend(st.allocator.serving_bound_ms(reference, max_lead));
                let wider = (requested
                    || st.allocator.needs_capped_extension(now, reference, window_ahead, max_lead))
                .then(|| {
                    st.allocator
                        .prepare_capped_extension(now, reference, window_ahead, max_lead)
                        .ok()
                        .flatten()
                })
                .flatten();
                let unchanged = st.allocator.epoch().map(|epoch| WindowExtension {
                    requested_ms: st.allocator.high_water_ms(),
                    epoch,
                });
                (wider.or(unchanged.filter(|_| heartbeat)), step)
            };
            log_clock_step(step);
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
        let commit_started = clock::sample();
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
            pgrx::warning!(
                "tsoracle high-water row is missing or at another epoch; running the fence again"
            );
            return false;
        };
        crate::replica::confirm_replicated();
        self.signals.confirm_until(commit_started, guc::window_ahead_ms());
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
                let reference = st.clock.reference_ms();
                self.signals
                    .window
                    .extend(st.allocator.serving_bound_ms(reference, guc::max_lead_ms()));
                st.worker_commits += 1;
                st.max_committed_ms = st.max_committed_ms.max(actual_ms);
            }
            result
        };
        self.signals.broadcast();
        result
    }
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
