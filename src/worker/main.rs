//! Registration with the postmaster, the worker's start, and its exit.

use super::extension::wait_for_extension;
use super::serve::Stop;
use super::settings::{
    force_settings, note_database_encoding, unsafe_session, warn_if_window_exceeds_ha_ttl,
};
use super::state::{hand_over, refuse, set_phase, Worker};
use crate::pg::clock::now_ms;
use crate::pg::guc;
use crate::shmem::{self, Phase, Reply, ReplyCode, ORACLE, QUEUE};
use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::prelude::*;
use std::time::Duration;

pub const WORKER_TYPE: &str = "tsoracle worker";

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
    /// PostgreSQL's SIGINT handler for backends (the raw symbol, as for `die`).
    fn StatementCancelHandler(postgres_signal_arg: std::ffi::c_int);
    /// `utils/timeout.h` (not in pgrx's bindings): whether a timeout has fired.
    fn get_timeout_indicator(id: std::ffi::c_int, reset_indicator: bool) -> bool;
}

/// `LOCK_TIMEOUT` of `utils/timeout.h`'s `TimeoutId`, the same in 15 to 18.
const LOCK_TIMEOUT: std::ffi::c_int = 2;

/// The worker's SIGINT: a lock wait that outlasted `lock_timeout` (its handler signals this
/// process with SIGINT after setting the timeout's indicator) cancels the statement, as in
/// any backend; anything else — `pg_cancel_backend()` — is ignored, since a cancel would end a
/// wait for the synchronous standbys and leave no trace of it.
unsafe extern "C-unwind" fn cancel_on_lock_timeout(postgres_signal_arg: std::ffi::c_int) {
    // SAFETY: both are async-signal-safe: a read of the timeout's flag, and PostgreSQL's own
    // SIGINT handler, which only sets flags and the latch.
    unsafe {
        if get_timeout_indicator(LOCK_TIMEOUT, false) {
            StatementCancelHandler(postgres_signal_arg);
        }
    }
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn tsoracle_worker_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP);
    // SAFETY: installing this process's own handlers as the worker starts: `die` is
    // PostgreSQL's SIGTERM handler for backends (in a worker it only sets flags and the
    // latch), and `cancel_on_lock_timeout` calls its SIGINT handler only for a lock timeout.
    unsafe {
        // SIGTERM is PostgreSQL's own `die`: it ends a synchronous-replication wait (so a
        // shutdown never hangs on a missing standby), and `confirm_replicated` then refuses
        // to serve from that commit.
        crate::pg::compat::set_signal(libc::SIGTERM, Some(die));
        // A query cancel ends such a wait too, and leaves no trace afterwards: only the
        // worker's own lock timeout cancels a statement.
        crate::pg::compat::set_signal(libc::SIGINT, Some(cancel_on_lock_timeout));
    }

    let Ok(signals) = shmem::signals() else {
        pgrx::warning!("tsoracle worker started without shared memory; exiting");
        return;
    };

    set_phase(signals, Phase::Starting);
    ORACLE.exclusive().worker_started_ms = now_ms();
    let database = guc::database();
    crate::pg::mark_worker_process();
    BackgroundWorker::connect_worker_to_spi(Some(&database), None);

    // Requests a previous worker took may or may not have been committed: say so.
    let waiters = match QUEUE.exclusive() {
        Ok(mut queue) => queue.queue().fail_taken(Reply::err(ReplyCode::Unknown)),
        Err(_) => Vec::new(),
    };
    shmem::queue::wake_waiters(waiters);
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
    if let Some(conninfo) = guc::oracle() {
        // A member of a fleet: the proxy to the oracle, and its own resolved timestamp. A
        // connection string libpq cannot read is refused at once, extension or not.
        if let Some(shown) = super::member::checked(signals, &conninfo) {
            if wait_for_extension(signals, &database) {
                super::member::run(signals, conninfo, shown);
            }
        }
        // SAFETY: as at the end of this function.
        unsafe { pg_sys::proc_exit(1) };
    }
    warn_if_window_exceeds_ha_ttl();
    let mut worker = Worker::new(signals);
    loop {
        if signals.handover_requested() {
            // A worker restarted after tso_handover(): this server stays handed over.
            hand_over(signals);
            break;
        }
        if !wait_for_extension(signals, &database) {
            break;
        }
        // A cluster that has been a member serves nothing on its own until it left the fleet.
        if !super::member::wait_until_alone(signals) {
            break;
        }
        if signals.handover_requested() {
            continue;
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

#[pg_guard]
unsafe extern "C-unwind" fn on_worker_exit(_code: i32, _arg: pg_sys::Datum) {
    // A member's worker that exits with a lease grant in flight holds the resolved timestamp
    // in its holder slot (`member/grants.rs`): released on every exit, so R moves again.
    if let Some(slot) = shmem::holders::HOLDERS.mine() {
        slot.clear();
    }
    if let Some(signals) = shmem::signals::SIGNALS.get() {
        signals.set_worker(std::ptr::null_mut(), 0);
        signals.broadcast();
    }
}
