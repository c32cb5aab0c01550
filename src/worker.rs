//! The background worker: the only process that writes the durable tables.
//!
//! It starts when recovery ends (server start, crash restart, promotion of a standby), runs
//! the fence before anything is served, then keeps the timestamp window ahead of the clock.
//! Every write is its own transaction with `synchronous_commit = on`, committed before the
//! allocator is allowed to serve from it.

use crate::clock::now_ms;
use crate::guc;
use crate::shmem::{
    self, Phase, Reply, ReplyCode, Request, RequestKind, Signals, Ticket, LEASE_BOUNDS, MAX_LEASES, ORACLE, QUEUE,
};
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
    BackgroundWorker::connect_worker_to_spi(Some(&database), None);

    // Requests a previous worker took may or may not have been committed: say so.
    let waiters = QUEUE.exclusive().fail_taken();
    shmem::wake_waiters(waiters);
    signals.broadcast_answers();
    unsafe {
        signals.set_worker(pg_sys::MyLatch, pg_sys::MyProcPid);
        pg_sys::before_shmem_exit(Some(on_worker_exit), pg_sys::Datum::from(0usize));
    }
    // Override-level settings win over postgresql.conf, ALTER SYSTEM/ROLE/DATABASE: every
    // commit of ours is durable (and waits for synchronous standbys) whatever the server
    // default is, and no timeout aborts a durable write halfway.
    for (name, value) in [
        (c"synchronous_commit", c"on"),
        (c"statement_timeout", c"0"),
        (c"lock_timeout", c"0"),
        (c"idle_in_transaction_session_timeout", c"0"),
    ] {
        unsafe {
            pg_sys::SetConfigOption(
                name.as_ptr(),
                value.as_ptr(),
                pg_sys::GucContext::PGC_SUSET,
                pg_sys::GucSource::PGC_S_OVERRIDE,
            )
        };
    }

    pgrx::log!("tsoracle worker started (database \"{database}\")");
    let mut worker = Worker { signals, leases: LeaseTable::new(), seq_statements: None };
    loop {
        if !wait_for_extension(signals, &database) {
            break;
        }
        worker.fence(0);
        match worker.serve() {
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

/// The tables this library reads and writes.
const TABLES: [&str; 3] = ["tsoracle.high_water", "tsoracle.seq", "tsoracle.lease"];

/// Sleep until `CREATE EXTENSION tsoracle` has run in our database and its tables are the
/// ones this library needs. False on shutdown.
fn wait_for_extension(signals: &Signals, database: &str) -> bool {
    let mut announced = None;
    loop {
        // Read-only SPI: a transaction that got an xid (pgrx's Spi::get_one asks for one)
        // and pruned a catalog page would wait for synchronous standbys at commit.
        let missing = BackgroundWorker::transaction(|| {
            Spi::connect(|client| {
                client
                    .select(
                        "SELECT count(*) FROM unnest($1::text[]) AS t(name) WHERE to_regclass(t.name) IS NULL",
                        None,
                        &[TABLES.map(String::from).to_vec().into()],
                    )?
                    .first()
                    .get_one::<i64>()
            })
        })
        .ok()
        .flatten()
        .unwrap_or(TABLES.len() as i64);
        let phase = match missing {
            0 => return true,
            n if n == TABLES.len() as i64 => Phase::WaitingForExtension,
            _ => Phase::OutdatedSchema,
        };
        set_phase(signals, phase);
        if announced != Some(phase) {
            match phase {
                Phase::OutdatedSchema => pgrx::warning!(
                    "tsoracle: the tables in schema tsoracle of database \"{database}\" are incomplete for this library version; run ALTER EXTENSION tsoracle UPDATE"
                ),
                _ => pgrx::log!("tsoracle worker waiting for CREATE EXTENSION tsoracle in database \"{database}\""),
            }
            announced = Some(phase);
        }
        // Callers poke the latch, so a fresh CREATE EXTENSION is noticed at once.
        if !BackgroundWorker::wait_latch(Some(Duration::from_secs(1))) {
            return false;
        }
        pg_sys::check_for_interrupts!();
    }
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
                    "SELECT key, next FROM tsoracle.seq WHERE key = ANY($1) ORDER BY key FOR UPDATE",
                    &[text_array],
                )?
                .keep();
            let store_counters = client
                .prepare_mut(
                    "INSERT INTO tsoracle.seq AS s (key, next) SELECT * FROM unnest($1::text[], $2::bigint[]) \
                     ON CONFLICT (key) DO UPDATE SET next = GREATEST(s.next, EXCLUDED.next), updated_at = now()",
                    &[text_array, int8_array],
                )?
                .keep();
            Ok::<_, pgrx::spi::Error>(SeqStatements { lock_counters, store_counters })
        })
        .unwrap_or_else(|e| pgrx::error!("tsoracle could not prepare its sequence statements: {e}"))
    }
}

impl Worker {
    /// The failover fence (DESIGN.md): stop serving, load the durable high-water, persist a
    /// bound above it at this timeline, reload the leases, seed the allocator, serve.
    /// `min_floor_ms` > 0 is a `tso_seed()` request.
    fn fence(&mut self, min_floor_ms: u64) {
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
        let (floor_ms, high_water_ms, epoch, leases, promoted) = BackgroundWorker::transaction(|| {
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
            let requested = floor_ms.saturating_add(advance);
            let (actual, epoch) = Spi::get_two_with_args::<i64, i64>(
                "INSERT INTO tsoracle.high_water AS h (id, physical_ms, epoch) VALUES (true, $1, $2) \
                 ON CONFLICT (id) DO UPDATE SET physical_ms = GREATEST(h.physical_ms, EXCLUDED.physical_ms), \
                     epoch = GREATEST(h.epoch, EXCLUDED.epoch), updated_at = now() \
                 RETURNING physical_ms, epoch",
                &[(requested as i64).into(), i64::from(timeline).into()],
            )
            .unwrap_or_else(|e| pgrx::error!("tsoracle fence could not persist the high-water: {e}"));
            let leases = load_leases(now);
            (floor_ms, actual.unwrap_or(0).max(0) as u64, epoch.unwrap_or(0).max(0) as u64, leases, promoted)
        });
        // Committed (and flushed, and replicated where synchronous standbys are required).
        crate::replica::confirm_replicated();
        self.leases = leases;
        self.publish_lease_bounds();

        {
            let mut st = ORACLE.exclusive();
            let seeded = st
                .allocator
                .become_leader(floor_ms, high_water_ms, epoch)
                .and_then(|()| self.signals.window.open(floor_ms, high_water_ms));
            if let Err(e) = seeded {
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
            st.last_fence_promoted = promoted;
            self.signals.first_grant_ms.store(0, std::sync::atomic::Ordering::Relaxed);
        }
        self.signals.broadcast();
        pgrx::log!(
            "tsoracle fence complete: epoch {epoch} (timeline {timeline}), serving from {floor_ms} ms, high-water {high_water_ms} ms, {} live leases, took {:.1} ms",
            self.leases.iter().filter(|l| l.is_live(now_ms())).count(),
            started.elapsed().as_secs_f64() * 1000.0
        );
    }

    /// Steady state: keep the window ahead of the clock, answer callers' requests.
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
            if seed > 0 {
                self.fence(seed);
                continue;
            }

            self.serve_requests();
            self.expire_leases();

            let requested = self.signals.take_extension_request();
            let now = now_ms();
            let extension = {
                let mut st = ORACLE.exclusive();
                st.allocator.observe_issued(self.signals.window.next_ts());
                if requested || st.allocator.needs_extension(now, window_ahead) {
                    st.allocator.prepare_window_extension(now, window_ahead).ok()
                } else {
                    None
                }
            };
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
        let actual = BackgroundWorker::transaction(|| persist_high_water(extension));
        let Some(actual) = actual else {
            // No row at our epoch: the table was recreated or restored underneath us.
            pgrx::warning!("tsoracle high-water row is missing or at another epoch; running the fence again");
            return false;
        };
        crate::replica::confirm_replicated();
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

    /// Let the allocator serve up to a high-water that is now durable.
    fn commit_high_water(&self, actual_ms: u64, epoch: u64) -> Result<(), CoreError> {
        let result = {
            let mut st = ORACLE.exclusive();
            let result = st.allocator.commit_window_extension(actual_ms, epoch);
            if result.is_ok() {
                self.signals.window.extend(st.allocator.high_water_ms());
                st.worker_commits += 1;
                st.max_committed_ms = st.max_committed_ms.max(actual_ms);
            }
            result
        };
        self.signals.broadcast();
        result
    }

    /// Group commit: take every pending request into ONE transaction, commit once (with
    /// `synchronous_commit = on`), then answer them all.
    fn serve_requests(&mut self) {
        let taken = QUEUE.exclusive().take_pending();
        if taken.is_empty() {
            return;
        }
        let now = now_ms();
        let (window, epoch) = {
            let st = ORACLE.share();
            (st.allocator.high_water_ms(), st.allocator.epoch().unwrap_or(0))
        };
        let mut leases = self.leases.clone();
        let requests = taken.clone();
        let mut statements = self.seq_statements.take();
        let (replies, high_water, leases, statements) = BackgroundWorker::transaction(move || {
            let prepared = statements.get_or_insert_with(SeqStatements::prepare);
            let mut replies = advance_sequences(prepared, &requests);
            let high_water = mutate_leases(&requests, &mut replies, &mut leases, now, window, epoch);
            (replies, high_water, leases, statements)
        });
        self.seq_statements = statements;
        crate::replica::confirm_replicated();
        self.leases = leases;
        self.publish_lease_bounds();
        if high_water > window {
            if let Err(e) = self.commit_high_water(high_water, epoch) {
                // The requests are committed; the allocator simply keeps its smaller window.
                pgrx::warning!("tsoracle could not widen the window after lease grants: {e}");
            }
        } else {
            ORACLE.exclusive().worker_commits += 1;
        }
        let waiters: Vec<_> = {
            let mut queue = QUEUE.exclusive();
            queue.group_commits += 1;
            queue.grouped_requests += taken.len() as u64;
            taken.iter().zip(replies).filter_map(|(&(ticket, _), reply)| queue.answer(ticket, reply)).collect()
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
                    "DELETE FROM tsoracle.lease WHERE expires_at_ms <= $1",
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

/// An expired lease is kept (no longer live; renewing it says "expired", 55000) for
/// `tsoracle.expired_lease_retention_ms`, then purged (renewing it then says "does not exist").
fn purge_horizon(now_ms: u64) -> u64 {
    now_ms.saturating_sub(guc::expired_lease_retention_ms())
}

/// `UPDATE … GREATEST … WHERE epoch = $2`: the one monotonic path to the high-water.
/// None when the row is not at our epoch.
fn persist_high_water(extension: WindowExtension) -> Option<u64> {
    Spi::get_one_with_args::<i64>(
        "UPDATE tsoracle.high_water SET physical_ms = GREATEST(physical_ms, $1), updated_at = now() \
         WHERE id AND epoch = $2 RETURNING physical_ms",
        &[(extension.requested_ms as i64).into(), (extension.epoch as i64).into()],
    )
    .ok()
    .flatten()
    .and_then(|ms| u64::try_from(ms).ok())
}

/// The durable leases, without those expired longer than the retention (deleted here).
fn load_leases(now_ms: u64) -> LeaseTable {
    let horizon = purge_horizon(now_ms);
    Spi::run_with_args("DELETE FROM tsoracle.lease WHERE expires_at_ms <= $1", &[(horizon as i64).into()])
        .unwrap_or_else(|e| pgrx::error!("tsoracle could not delete expired leases: {e}"));
    let rows = Spi::connect(|client| {
        client
            .select(
                "SELECT lease_id, holder, holder_epoch, ts_upper_bound_ms, expires_at_ms, ttl_ms, superseded \
                 FROM tsoracle.lease ORDER BY lease_id",
                None,
                &[],
            )?
            .map(|row| {
                Ok(Lease {
                    id: row.get::<i64>(1)?.unwrap_or(0),
                    holder: row.get::<String>(2)?.unwrap_or_default(),
                    holder_epoch: row.get::<i64>(3)?.unwrap_or(0),
                    ts_upper_bound_ms: row.get::<i64>(4)?.unwrap_or(0).max(0) as u64,
                    expires_at_ms: row.get::<i64>(5)?.unwrap_or(0).max(0) as u64,
                    ttl_ms: row.get::<i64>(6)?.unwrap_or(0).max(0) as u64,
                    superseded: row.get::<bool>(7)?.unwrap_or(false),
                })
            })
            .collect::<Result<Vec<Lease>, pgrx::spi::Error>>()
    })
    .unwrap_or_else(|e| pgrx::error!("tsoracle could not load the leases: {e}"));
    LeaseTable::load(rows, horizon).unwrap_or_else(|e| pgrx::error!("tsoracle lease table is inconsistent: {e}"))
}

/// The lease part of a group commit, in queue order, on the worker's copy of the table.
/// Every acquire and renewal first moves the high-water to at least
/// `max(high_water + 1, now) + ttl` (seeds: "Serving leases"), and its bound is that
/// durable value. Returns the high-water after the group.
fn mutate_leases(
    taken: &[(Ticket, Request)],
    replies: &mut [Reply],
    leases: &mut LeaseTable,
    now: u64,
    high_water: u64,
    epoch: u64,
) -> u64 {
    let mut high_water = high_water;
    let mut writes: Vec<LeaseWrite> = Vec::new();
    for (i, (_, r)) in taken.iter().enumerate() {
        let reply = match r.kind {
            RequestKind::LeaseAcquire => {
                let (holder, holder_epoch, ttl) = (r.name(), r.arg, r.count);
                let bound = lease_bound(high_water, now, ttl);
                match leases.plan_acquire(holder, holder_epoch, ttl, now, bound, bound as i64) {
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
            RequestKind::LeaseRenew => {
                let ttl = leases.get(r.arg).map_or(0, |l| l.ttl_ms);
                let bound = lease_bound(high_water, now, ttl);
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
            RequestKind::LeaseRelease => {
                if leases.release(r.arg).is_some() {
                    writes.push(LeaseWrite::Delete(r.arg));
                }
                Reply::ok(r.arg)
            }
            RequestKind::SeqAdvance | RequestKind::SeqPeek => continue,
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

/// A lease's bound: the high-water moved to at least `max(high_water + 1, now) + ttl`.
fn lease_bound(high_water: u64, now: u64, ttl: u64) -> u64 {
    high_water.saturating_add(1).max(now).saturating_add(ttl)
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
                "INSERT INTO tsoracle.lease (lease_id, holder, holder_epoch, ts_upper_bound_ms, expires_at_ms, ttl_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
                &[
                    l.id.into(),
                    l.holder.into(),
                    l.holder_epoch.into(),
                    (l.ts_upper_bound_ms as i64).into(),
                    (l.expires_at_ms as i64).into(),
                    (l.ttl_ms as i64).into(),
                ],
            ),
            LeaseWrite::Supersede(id) => {
                Spi::run_with_args("UPDATE tsoracle.lease SET superseded = true WHERE lease_id = $1", &[id.into()])
            }
            LeaseWrite::Renew(l) => Spi::run_with_args(
                "UPDATE tsoracle.lease SET ts_upper_bound_ms = $2, expires_at_ms = $3, renewed_at = now() WHERE lease_id = $1",
                &[l.id.into(), (l.ts_upper_bound_ms as i64).into(), (l.expires_at_ms as i64).into()],
            ),
            LeaseWrite::Delete(id) => {
                Spi::run_with_args("DELETE FROM tsoracle.lease WHERE lease_id = $1", &[id.into()])
            }
        };
        result.unwrap_or_else(|e| pgrx::error!("tsoracle could not write a lease: {e}"));
    }
}

/// The sequence part of a group commit: read the touched counters (locked), plan every
/// block in queue order (pure, `plan_group`), write each moved counter once.
fn advance_sequences(statements: &SeqStatements, taken: &[(Ticket, Request)]) -> Vec<Reply> {
    let mut replies = vec![Reply::default(); taken.len()];
    let seq: Vec<(usize, &Request)> = taken
        .iter()
        .enumerate()
        .filter(|(_, (_, r))| matches!(r.kind, RequestKind::SeqAdvance | RequestKind::SeqPeek))
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
    let current: HashMap<String, i64> = Spi::connect_mut(|client| {
        let rows = client.update(&statements.lock_counters, None, &[keys.clone().into()])?;
        rows.map(|row| Ok((row.get::<String>(1)?.unwrap_or_default(), row.get::<i64>(2)?.unwrap_or(0))))
            .collect::<Result<HashMap<_, _>, pgrx::spi::Error>>()
    })
    .unwrap_or_else(|e| pgrx::error!("tsoracle could not read the sequence counters: {e}"));

    let advances: Vec<(usize, SeqRequest)> = seq
        .iter()
        .filter(|(_, r)| r.kind == RequestKind::SeqAdvance)
        .map(|&(i, r)| (i, SeqRequest { batch: r.batch, key: r.name(), count: r.count }))
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
        Spi::connect_mut(|client| client.update(&statements.store_counters, None, &[keys.into(), values.into()]).map(|_| ()))
            .unwrap_or_else(|e| pgrx::error!("tsoracle could not advance the sequence counters: {e}"));
    }

    for ((i, _), result) in advances.iter().zip(&plan.results) {
        replies[*i] = match result {
            Ok(start) => Reply::ok(*start),
            Err(CoreError::SeqOverflow { .. }) => Reply::err(ReplyCode::SeqOverflow),
            Err(_) => Reply::err(ReplyCode::TooManyKeys),
        };
    }
    // Peeks see the counters as this group leaves them.
    let after: HashMap<&str, i64> = plan.updates.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    for &(i, r) in &seq {
        if r.kind == RequestKind::SeqPeek {
            replies[i] = match after.get(r.name()).or_else(|| current.get(r.name())) {
                Some(&next) => Reply::ok(next),
                None => Reply::err(ReplyCode::Null),
            };
        }
    }
    replies
}
