//! The background worker: the only process that writes the durable tables.
//!
//! It starts when recovery ends (server start, crash restart, promotion of a standby), runs
//! the fence before anything is served, then keeps the timestamp window ahead of the clock.
//! Every write is its own transaction with `synchronous_commit = on`, committed before the
//! allocator is allowed to serve from it.

use crate::clock::now_ms;
use crate::guc;
use crate::shmem::{self, Phase, Reply, ReplyCode, Request, RequestKind, Signals, Ticket, ORACLE, QUEUE};
use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags};
use pgrx::prelude::*;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tsoracle_core::allocator::WindowExtension;
use tsoracle_core::error::CoreError;
use tsoracle_core::seq::{plan_group, SeqRequest};

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
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    // A query cancel during a synchronous-replication wait makes PostgreSQL report the commit
    // as done although the standby may not have it. Nobody may cancel this worker's waits.
    unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };

    let Ok(signals) = shmem::signals() else {
        pgrx::warning!("tsoracle worker started without shared memory; exiting");
        return;
    };

    set_phase(signals, Phase::Starting);
    let database = guc::database();
    BackgroundWorker::connect_worker_to_spi(Some(&database), None);

    // Requests a previous worker took may or may not have been committed: say so.
    QUEUE.exclusive().fail_taken();
    signals.broadcast_answers();
    unsafe {
        signals.set_worker(pg_sys::MyLatch, pg_sys::MyProcPid);
        pg_sys::before_shmem_exit(Some(on_worker_exit), pg_sys::Datum::from(0usize));
    }
    BackgroundWorker::transaction(|| {
        // Session-level: wins over postgresql.conf, so every commit of ours is durable (and
        // waits for synchronous standbys) whatever the server default is.
        Spi::run("SET synchronous_commit = on; SET statement_timeout = 0; SET lock_timeout = 0; SET idle_in_transaction_session_timeout = 0")
    })
    .unwrap_or_else(|e| pgrx::error!("tsoracle worker could not configure its session: {e}"));

    pgrx::log!("tsoracle worker started (database \"{database}\")");
    loop {
        if !wait_for_extension(signals, &database) {
            break;
        }
        fence(signals, 0);
        match serve(signals) {
            Stop::Exit => break,
            Stop::Refence => continue,
        }
    }
    // Exit code 1: the postmaster restarts us unless it is shutting down, so even a stray
    // pg_terminate_backend() cannot leave the cluster without a worker.
    unsafe { pg_sys::proc_exit(1) };
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

/// Sleep until `CREATE EXTENSION tsoracle` has run in our database. False on shutdown.
fn wait_for_extension(signals: &Signals, database: &str) -> bool {
    let mut announced = false;
    loop {
        let present = BackgroundWorker::transaction(|| {
            Spi::get_one::<bool>("SELECT to_regclass('tsoracle.high_water') IS NOT NULL")
        })
        .ok()
        .flatten()
        .unwrap_or(false);
        if present {
            return true;
        }
        set_phase(signals, Phase::WaitingForExtension);
        if !announced {
            pgrx::log!("tsoracle worker waiting for CREATE EXTENSION tsoracle in database \"{database}\"");
            announced = true;
        }
        // Callers poke the latch, so a fresh CREATE EXTENSION is noticed at once.
        if !BackgroundWorker::wait_latch(Some(Duration::from_secs(1))) {
            return false;
        }
    }
}

/// The failover fence (DESIGN.md): stop serving, load the durable high-water, persist a
/// bound above it at this timeline, seed the allocator, serve. `min_floor_ms` > 0 is a
/// `tso_seed()` request.
fn fence(signals: &Signals, min_floor_ms: u64) {
    let started = Instant::now();
    let remembered_ms = {
        let mut st = ORACLE.exclusive();
        st.allocator.step_down();
        st.phase = Phase::Fencing;
        st.max_committed_ms
    };
    signals.broadcast();

    let timeline = unsafe { pg_sys::GetWALInsertionTimeLine() };
    let advance = guc::failover_advance_ms();
    let (floor_ms, high_water_ms, epoch) = BackgroundWorker::transaction(|| {
        let prior = Spi::get_one::<i64>("SELECT physical_ms FROM tsoracle.high_water WHERE id")
            .ok()
            .flatten()
            .unwrap_or(0)
            .max(0) as u64;
        let floor_ms = (prior.max(remembered_ms) + 1).max(now_ms()).max(min_floor_ms);
        let requested = floor_ms.saturating_add(advance);
        let (actual, epoch) = Spi::get_two_with_args::<i64, i64>(
            "INSERT INTO tsoracle.high_water AS h (id, physical_ms, epoch) VALUES (true, $1, $2) \
             ON CONFLICT (id) DO UPDATE SET physical_ms = GREATEST(h.physical_ms, EXCLUDED.physical_ms), \
                 epoch = GREATEST(h.epoch, EXCLUDED.epoch), updated_at = now() \
             RETURNING physical_ms, epoch",
            &[(requested as i64).into(), i64::from(timeline).into()],
        )
        .unwrap_or_else(|e| pgrx::error!("tsoracle fence could not persist the high-water: {e}"));
        let actual = actual.unwrap_or(0).max(0) as u64;
        let epoch = epoch.unwrap_or(0).max(0) as u64;
        (floor_ms, actual, epoch)
    });
    // Committed (and flushed, and replicated where synchronous standbys are required).
    crate::replica::confirm_durable();

    {
        let mut st = ORACLE.exclusive();
        if let Err(e) = st.allocator.become_leader(floor_ms, high_water_ms, epoch) {
            drop(st);
            pgrx::error!("tsoracle fence produced an invalid seed: {e}");
        }
        st.phase = Phase::Serving;
        st.timeline = timeline;
        st.max_committed_ms = st.max_committed_ms.max(high_water_ms);
        st.fences += 1;
        st.worker_commits += 1;
        st.last_fence_us = started.elapsed().as_micros() as u64;
        st.seeded_ms = st.seeded_ms.max(min_floor_ms);
    }
    signals.broadcast();
    pgrx::log!(
        "tsoracle fence complete: epoch {epoch} (timeline {timeline}), serving from {floor_ms} ms, high-water {high_water_ms} ms, took {:.1} ms",
        started.elapsed().as_secs_f64() * 1000.0
    );
}

/// Steady state: keep the window ahead of the clock, answer callers' requests.
fn serve(signals: &Signals) -> Stop {
    loop {
        let window_ahead = guc::window_ahead_ms();
        // Wake often enough to extend before half of the window is gone.
        let tick = Duration::from_millis((window_ahead / 8).clamp(1, 200));
        if !BackgroundWorker::wait_latch(Some(tick)) {
            return Stop::Exit;
        }
        if BackgroundWorker::sighup_received() {
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }

        let seed = signals.take_seed_request();
        if seed > 0 {
            fence(signals, seed);
            continue;
        }

        serve_requests(signals);

        let requested = signals.take_extension_request();
        let now = now_ms();
        let extension = {
            let st = ORACLE.share();
            if requested || st.allocator.needs_extension(now, window_ahead) {
                st.allocator.prepare_window_extension(now, window_ahead).ok()
            } else {
                None
            }
        };
        if let Some(extension) = extension {
            if !extend(signals, extension) {
                return Stop::Refence;
            }
        }
    }
}

/// Persist a wider window (monotonic, epoch-checked) and let the allocator use it.
/// False when the durable row is not ours any more and the fence must run again.
fn extend(signals: &Signals, extension: WindowExtension) -> bool {
    let actual = BackgroundWorker::transaction(|| {
        Spi::get_one_with_args::<i64>(
            "UPDATE tsoracle.high_water SET physical_ms = GREATEST(physical_ms, $1), updated_at = now() \
             WHERE id AND epoch = $2 RETURNING physical_ms",
            &[(extension.requested_ms as i64).into(), (extension.epoch as i64).into()],
        )
    });
    let actual = match actual {
        Ok(Some(ms)) if ms >= 0 => ms as u64,
        // No row at our epoch: the table was recreated or restored underneath us.
        Ok(_) | Err(_) => {
            pgrx::warning!("tsoracle high-water row is missing or at another epoch; running the fence again");
            return false;
        }
    };
    crate::replica::confirm_durable();

    let result = {
        let mut st = ORACLE.exclusive();
        let result = st.allocator.commit_window_extension(actual, extension.epoch);
        if result.is_ok() {
            st.window_extensions += 1;
            st.worker_commits += 1;
            st.max_committed_ms = st.max_committed_ms.max(actual);
        }
        result
    };
    signals.broadcast();
    match result {
        Ok(()) => true,
        Err(e) => {
            pgrx::warning!("tsoracle window extension rejected ({e}); running the fence again");
            false
        }
    }
}

/// Group commit: take every pending request into ONE transaction, commit once (with
/// `synchronous_commit = on`), then answer them all.
fn serve_requests(signals: &Signals) {
    let taken = QUEUE.exclusive().take_pending();
    if taken.is_empty() {
        return;
    }
    let replies = BackgroundWorker::transaction(|| advance_sequences(&taken));
    crate::replica::confirm_durable();
    {
        let mut queue = QUEUE.exclusive();
        for (&(ticket, _), reply) in taken.iter().zip(replies) {
            queue.answer(ticket, reply);
        }
        queue.group_commits += 1;
        queue.grouped_requests += taken.len() as u64;
    }
    ORACLE.exclusive().worker_commits += 1;
    signals.broadcast_answers();
}

/// The sequence part of a group commit: read the touched counters (locked), plan every
/// block in queue order (pure, `plan_group`), write each moved counter once.
fn advance_sequences(taken: &[(Ticket, Request)]) -> Vec<Reply> {
    let keys: Vec<String> = {
        let mut keys: Vec<String> = taken.iter().map(|(_, r)| r.name().to_string()).collect();
        keys.sort_unstable();
        keys.dedup();
        keys
    };
    let current: HashMap<String, i64> = Spi::connect_mut(|client| {
        let rows = client.update(
            "SELECT key, next FROM tsoracle.seq WHERE key = ANY($1) ORDER BY key FOR UPDATE",
            None,
            &[keys.clone().into()],
        )?;
        rows.map(|row| Ok((row.get::<String>(1)?.unwrap_or_default(), row.get::<i64>(2)?.unwrap_or(0))))
            .collect::<Result<HashMap<_, _>, pgrx::spi::Error>>()
    })
    .unwrap_or_else(|e| pgrx::error!("tsoracle could not read the sequence counters: {e}"));

    let advances: Vec<(usize, SeqRequest)> = taken
        .iter()
        .enumerate()
        .filter(|(_, (_, r))| r.kind == RequestKind::SeqAdvance)
        .map(|(i, (_, r))| (i, SeqRequest { batch: r.batch, key: r.name(), count: r.count }))
        .collect();
    let creates_keys = advances.iter().any(|(_, r)| !current.contains_key(r.key));
    let existing_keys = if creates_keys {
        Spi::get_one::<i64>("SELECT count(*) FROM tsoracle.seq")
            .unwrap_or_else(|e| pgrx::error!("tsoracle could not count the sequence keys: {e}"))
            .unwrap_or(0)
            .max(0) as u64
    } else {
        0
    };
    let current_ref: HashMap<&str, i64> = current.iter().map(|(k, &v)| (k.as_str(), v)).collect();
    let requests: Vec<SeqRequest> = advances.iter().map(|(_, r)| r.clone()).collect();
    let plan = plan_group(&requests, &current_ref, existing_keys, guc::max_seq_keys());

    if !plan.updates.is_empty() {
        let (keys, values): (Vec<String>, Vec<i64>) = plan.updates.iter().cloned().unzip();
        Spi::run_with_args(
            "INSERT INTO tsoracle.seq AS s (key, next) SELECT * FROM unnest($1::text[], $2::bigint[]) \
             ON CONFLICT (key) DO UPDATE SET next = GREATEST(s.next, EXCLUDED.next), updated_at = now()",
            &[keys.into(), values.into()],
        )
        .unwrap_or_else(|e| pgrx::error!("tsoracle could not advance the sequence counters: {e}"));
    }

    let mut replies = vec![Reply::default(); taken.len()];
    for ((i, _), result) in advances.iter().zip(&plan.results) {
        replies[*i] = match result {
            Ok(start) => Reply { code: ReplyCode::Ok, value: *start },
            Err(CoreError::SeqOverflow { .. }) => Reply { code: ReplyCode::SeqOverflow, value: 0 },
            Err(_) => Reply { code: ReplyCode::TooManyKeys, value: 0 },
        };
    }
    // Peeks see the counters as this group leaves them.
    let after: HashMap<&str, i64> = plan.updates.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    for (i, (_, r)) in taken.iter().enumerate() {
        if r.kind == RequestKind::SeqPeek {
            replies[i] = match after.get(r.name()).or_else(|| current.get(r.name())) {
                Some(&next) => Reply { code: ReplyCode::Ok, value: next },
                None => Reply { code: ReplyCode::Null, value: 0 },
            };
        }
    }
    replies
}
