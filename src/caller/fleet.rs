//! On the oracle of a fleet (docs/fleet.md): a member's session registers its member, reports
//! the member's resolved timestamp, and is served timestamps only once the registration is
//! durable; a superuser removes a member that is gone for good.

use crate::pg::clock;
use crate::pg::error::TsoError;
use crate::shmem::fleet::{MemberSlot, Slots, FLEET};
use crate::shmem::{self};
use pgrx::pg_sys;
use std::cell::Cell;
use tsoracle_core::fleet::{
    first_entry, hold_after, may_take_over, report_held, takeover, RunClaim, Takeover,
};

thread_local! {
    /// The member this session registered (its system identifier), after its hello.
    static REGISTERED: Cell<Option<u64>> = const { Cell::new(None) };
    /// Where this session last found its member's slot: a hint, checked on every use (the
    /// slot must still be used by that system identifier), so that a round trip reads one
    /// slot instead of searching `tsoracle.max_members` of them.
    static SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// The role member `system_id` is admitted for (`tsoracle.fleet_admission`), if any.
fn admitted_role(system_id: u64) -> Result<Option<u32>, TsoError> {
    // Read-only SPI (`Spi::get_one_with_args` would give the hello's transaction an id).
    pgrx::Spi::connect(|client| {
        client
            .select(
                "SELECT (SELECT role::pg_catalog.int8 FROM ONLY tsoracle.fleet_admission \
                         WHERE system_id OPERATOR(pg_catalog.=) $1)",
                None,
                &[(system_id as i64).into()],
            )?
            .first()
            .get_one::<i64>()
    })
    .map(|r| r.map(|oid| oid as u32))
    .map_err(|e| TsoError::Internal(format!("could not read tsoracle.fleet_admission: {e}")))
}

/// The name of the role `oid`, if there is one.
fn named_role(oid: pg_sys::Oid) -> Option<String> {
    // SAFETY: a syscache lookup; with noerr = true a missing role gives NULL, copied at once.
    unsafe {
        let name = pg_sys::GetUserNameFromId(oid, true);
        (!name.is_null()).then(|| std::ffi::CStr::from_ptr(name).to_string_lossy().into_owned())
    }
}

/// A role's name (`role N` for one dropped since).
pub fn role_name(oid: u32) -> String {
    named_role(pg_sys::Oid::from(oid)).unwrap_or_else(|| format!("role {oid}"))
}

/// Only a cluster a superuser admitted, under the role it is admitted for, says hello: any
/// other is refused before it touches the fleet (no slot, nothing of `R_f`).
fn check_admitted(system_id: u64, role: u32) -> Result<(), TsoError> {
    match admitted_role(system_id)? {
        Some(r) if r == role => Ok(()),
        Some(r) => Err(TsoError::MemberOfAnotherRole {
            system_id: system_id as i64,
            admitted: role_name(r),
            role: role_name(role),
        }),
        None => {
            Err(TsoError::MemberNotAdmitted { system_id: system_id as i64, role: role_name(role) })
        }
    }
}

/// Once per backend that says hello: at its exit, the slots it spoke for show no session.
fn forget_session_at_exit() {
    thread_local! { static HOOKED: Cell<bool> = const { Cell::new(false) }; }
    if !HOOKED.replace(true) {
        // SAFETY: registering a static function that takes no argument, once per process.
        unsafe { pg_sys::before_shmem_exit(Some(forget_session), pg_sys::Datum::from(0usize)) };
    }
}

/// No pgrx guard: nothing in it raises an error or panics (`SharedFleet::forget_session`).
unsafe extern "C-unwind" fn forget_session(_code: i32, _arg: pg_sys::Datum) {
    FLEET.forget_session(my_pid());
}

fn session_role() -> u32 {
    // SAFETY: the session user is set for every backend that runs SQL.
    unsafe { pg_sys::GetSessionUserId() }.to_u32()
}

fn my_pid() -> i32 {
    // SAFETY: a plain read of this process's pid.
    unsafe { pg_sys::MyProcPid }
}

/// Register the member `system_id` for this session (its hello), its own `R` being `reported`
/// (0: none yet), the run of its cluster it speaks for being `claim`. A member seen before
/// keeps its entry; a new one starts below everything the oracle will issue
/// (`tsoracle_core::fleet::first_entry`). Only the role that registered a member may speak for
/// it. A run that takes the entry over without proving that the run before it ended
/// (`tsoracle_core::fleet::takeover`) holds the entry where it is until a superuser releases it.
pub fn register(system_id: u64, reported: u64, claim: Option<RunClaim>) -> Result<(), TsoError> {
    // Until this hello is answered, this session speaks for no member: a hello that fails
    // (its wait below cut short) leaves none, not the one an earlier hello registered here.
    REGISTERED.set(None);
    let signals = shmem::signals()?;
    let role = session_role();
    let not_loaded = || {
        TsoError::NotServing(
            "the oracle's worker has not read the fleet's members (tsoracle.fleet_member) yet"
                .into(),
        )
    };
    // Read once the worker serves this schema (its tables are there), before the lock.
    if !FLEET.share().loaded {
        return Err(not_loaded());
    }
    check_admitted(system_id, role)?;
    forget_session_at_exit();
    let mut fleet = FLEET.exclusive();
    if !fleet.loaded {
        return Err(not_loaded());
    }
    match fleet.find(system_id) {
        Some(i) => {
            let m = &mut fleet.members_mut()[i];
            if !m.holds() {
                return Err(TsoError::NotServing(format!(
                    "member {system_id} was removed from the fleet (tso_fleet_remove()): a superuser re-admits it on the oracle with SELECT tso_fleet_admit({system_id})"
                )));
            }
            let now = clock::mono_ms();
            let silence = crate::pg::guc::extension_timeout_ms().max(0) as u64;
            if m.session_pid != my_pid()
                && alive(m.session_pid)
                && !may_take_over(now, m.heard_mono_ms, silence)
            {
                return Err(TsoError::MemberInUse {
                    system_id: system_id as i64,
                    pid: m.session_pid,
                });
            }
            let how = takeover(m.run, claim);
            let held = hold_after(how, m.entry(), m.held_at);
            if how == Takeover::Unproven && m.held_at.is_none() {
                pgrx::warning!(
                    "tsoracle fleet: member {} is now spoken for by another run of its cluster (started at {} µs, after {}), which does not prove that the run before it (started at {} µs) has ended: a copy of the member started beside it, or a restart after a crash; its entry is held at {} until a superuser who knows that run has ended runs SELECT tso_fleet_admit({}) on the oracle",
                    system_id as i64,
                    claim.map_or(0, |c| c.run),
                    claim.map_or(0, |c| c.prev),
                    m.run,
                    m.resolved,
                    system_id as i64
                );
            }
            let run = claim.map_or(0, |c| c.run);
            // Admitted for another role since it registered (a shared role split): the new
            // one speaks for it from now on, kept before it is served.
            let moved = m.held_at != held || m.run != run || m.role != role;
            m.role = role;
            if moved {
                // Kept before this session is served (`check_served`): the oracle's restart
                // or failover must not forget which run speaks, nor the hold.
                m.persisted = false;
            }
            m.held_at = held;
            m.run = run;
            m.session_pid = my_pid();
            m.heard_mono_ms = now;
            drop(fleet);
            if moved {
                signals.wake_worker();
            }
        }
        None => {
            let Some(i) = fleet.free() else {
                return Err(TsoError::TooManyMembers(fleet.members().len()));
            };
            let entry = first_entry(reported, signals.window.next_ts());
            fleet.members_mut()[i] = MemberSlot {
                used: true,
                system_id,
                role,
                resolved: entry.resolved(),
                held_by_pid: 0,
                registered_ms: clock::now_ms(),
                reported_ms: 0,
                session_pid: my_pid(),
                heard_mono_ms: clock::mono_ms(),
                persisted: false,
                persisted_resolved: 0,
                removing: false,
                removed: false,
                admitting: false,
                run: claim.map_or(0, |c| c.run),
                held_at: None,
            };
            drop(fleet);
            // The worker makes it durable at its next turn.
            signals.wake_worker();
        }
    }
    // Answered once the run and any hold are kept: the member names this run as the one
    // before its next only after this hello is answered (`Identity::registered` there), so
    // the run it names is one the oracle's restart or failover still knows. Only then does
    // this session speak for the member: a hello that fails here (a timeout, a cancel)
    // leaves it speaking for none, as the statement that failed set nothing of its own
    // (a member's hello also names its connection in the session: its later statements run
    // only where that name holds, src/worker/member/calls.rs).
    wait_persisted(system_id, "keep this member's run in tsoracle.fleet_member")?;
    REGISTERED.set(Some(system_id));
    Ok(())
}

/// The slot of this session's member, if it registered and is still there.
fn mine(what: &'static str) -> Result<u64, TsoError> {
    REGISTERED.get().ok_or(TsoError::MemberNotRegistered(what))
}

/// Before a member is served timestamps: its registration must be durable, so that after a
/// failover the new primary's `R_f` still waits for it.
pub fn check_served() -> Result<(), TsoError> {
    let system_id = mine("tsoracle.member_next()")?;
    let fleet = FLEET.share();
    // A system identifier has one slot at most (a hello finds it before it takes a free
    // one), so the hint, if it still holds this member, is the slot a search would find.
    let hinted =
        fleet.members().get(SLOT.get()).is_some_and(|m| m.used && m.system_id == system_id);
    let found = if hinted { Some(SLOT.get()) } else { fleet.find(system_id) };
    if let Some(i) = found {
        SLOT.set(i);
    }
    match found.map(|i| fleet.members()[i]) {
        // Another session took the member over: this one is served nothing more.
        Some(m) if m.holds() && m.session_pid != my_pid() => Err(TsoError::NotServing(format!(
            "another session speaks for member {system_id} now (process {})",
            m.session_pid
        ))),
        Some(m) if m.persisted && m.holds() => Ok(()),
        Some(m) if m.holds() => Err(TsoError::NotServing(format!(
            "the registration of member {system_id} is not durable yet"
        ))),
        _ => Err(TsoError::NotServing(format!(
            "member {system_id} was removed from the fleet: a superuser re-admits it on the oracle with SELECT tso_fleet_admit({system_id})"
        ))),
    }
}

/// A report of this session's member: its `R`, and the pid of the process holding it there.
pub fn report(resolved: u64, held_by_pid: i32) -> Result<(), TsoError> {
    let system_id = mine("tsoracle.member_report()")?;
    let mut fleet = FLEET.exclusive();
    let Some(i) = fleet.find(system_id).filter(|&i| fleet.members()[i].holds()) else {
        return Err(TsoError::NotServing(format!(
            "member {system_id} was removed from the fleet: a superuser re-admits it on the oracle with SELECT tso_fleet_admit({system_id})"
        )));
    };
    let m = &mut fleet.members_mut()[i];
    if m.session_pid != my_pid() {
        return Err(TsoError::NotServing(format!(
            "another session speaks for member {system_id} now (process {})",
            m.session_pid
        )));
    }
    let mut entry = m.entry();
    report_held(&mut entry, resolved, m.held_at);
    m.resolved = entry.resolved();
    m.held_by_pid = held_by_pid;
    m.reported_ms = clock::now_ms();
    m.heard_mono_ms = clock::mono_ms();
    Ok(())
}

/// Is process `pid` a live backend of this server?
pub fn alive(pid: i32) -> bool {
    // SAFETY: BackendPidGetProc takes ProcArrayLock itself and returns NULL for no process.
    pid != 0 && !unsafe { pg_sys::BackendPidGetProc(pid) }.is_null()
}

/// Remove member `system_id` (superusers only, checked by the caller): refused while a session
/// of it is connected. The worker marks its row removed; this waits for that, up to
/// `tsoracle.extension_timeout_ms`. The member is refused from then on, until [`admit`].
pub fn remove(system_id: u64) -> Result<bool, TsoError> {
    let signals = shmem::signals()?;
    {
        let mut fleet = FLEET.exclusive();
        let Some(i) = fleet.find(system_id) else {
            drop(fleet);
            // Admitted but never registered: its admission goes (a hello registering it
            // meanwhile has a slot, found above by the next call).
            return withdraw(system_id);
        };
        let m = &mut fleet.members_mut()[i];
        if m.removed {
            return Ok(true);
        }
        if alive(m.session_pid) {
            return Err(TsoError::MemberConnected {
                system_id: system_id as i64,
                pid: m.session_pid,
            });
        }
        m.removing = true;
    }
    signals.wake_worker();
    wait_slot(system_id, "mark the member removed in tsoracle.fleet_member", |m| m.removed)
}

/// Wait, up to `tsoracle.extension_timeout_ms`, until the worker has done `what` to member
/// `system_id`'s slot (`done`), or freed it: `true`.
fn wait_slot(
    system_id: u64,
    what: &'static str,
    done: impl Fn(&MemberSlot) -> bool,
) -> Result<bool, TsoError> {
    // The worker wakes no one when it is done: the wait looks again every 50 ms.
    let finished = super::requests::wait_on_latch(|| {
        let fleet = FLEET.share();
        Ok(fleet.find(system_id).is_none_or(|i| done(&fleet.members()[i])).then_some(()))
    })?;
    finished
        .map(|()| true)
        .ok_or(TsoError::WorkerTimeout { waited_ms: crate::pg::guc::extension_timeout_ms(), what })
}

/// Wait until what changed in member `system_id`'s slot is durable (its row written again).
fn wait_persisted(system_id: u64, what: &'static str) -> Result<bool, TsoError> {
    wait_slot(system_id, what, |m| m.persisted)
}

/// Re-admit member `system_id`, removed before (superusers only, checked by the caller): the
/// worker deletes its row, and its next connection registers it anew (below everything the
/// oracle issues from then on). On a member whose entry is held since an unproven takeover
/// ([`register`]): release the hold, the superuser having made sure the run before it ended,
/// durably before this returns. `false` when it is neither.
pub fn admit(system_id: u64) -> Result<bool, TsoError> {
    let signals = shmem::signals()?;
    {
        let mut fleet = FLEET.exclusive();
        let Some(i) = fleet.find(system_id) else { return Ok(false) };
        let m = &mut fleet.members_mut()[i];
        if !m.removed {
            if m.holds() && m.held_at.is_some() {
                pgrx::log!(
                    "tsoracle fleet: member {} released from its hold at {} by a superuser",
                    system_id as i64,
                    m.resolved
                );
                m.held_at = None;
                m.persisted = false;
                drop(fleet);
                signals.wake_worker();
                return wait_persisted(
                    system_id,
                    "release the member's hold in tsoracle.fleet_member",
                );
            }
            return Ok(false);
        }
        m.admitting = true;
    }
    signals.wake_worker();
    // Done once the slot is freed: a member that registers again at once has a new one.
    wait_slot(system_id, "re-admit the member in tsoracle.fleet_member", |m| !m.admitting)
}

/// The admission of a cluster that never registered, deleted in the caller's transaction.
fn withdraw(system_id: u64) -> Result<bool, TsoError> {
    pgrx::Spi::get_one_with_args::<bool>(
        "WITH d AS (DELETE FROM ONLY tsoracle.fleet_admission \
                    WHERE system_id OPERATOR(pg_catalog.=) $1 RETURNING 1) \
         SELECT EXISTS (SELECT FROM d)",
        &[(system_id as i64).into()],
    )
    .map(|d| d.unwrap_or(false))
    .map_err(|e| TsoError::Internal(format!("could not write tsoracle.fleet_admission: {e}")))
}

/// `role` is a role that exists: a `regrole` such as `'-'::regrole` (0) or a bare number
/// names none, and an admission for it no session could ever match.
pub fn existing_role(role: pg_sys::Oid) -> Result<(), TsoError> {
    if role == pg_sys::InvalidOid || named_role(role).is_none() {
        return Err(TsoError::InvalidArgument(format!(
            "no role has the OID {}: name the member's login role",
            role.to_u32()
        )));
    }
    Ok(())
}

/// The role named `name` (PostgreSQL's own `42704` if there is none).
pub fn role_oid(name: &str) -> Result<pg_sys::Oid, TsoError> {
    let name = std::ffi::CString::new(name)
        .map_err(|_| TsoError::InvalidArgument("a role name has no NUL byte".into()))?;
    // SAFETY: a syscache lookup of a NUL-terminated name; a missing role raises PostgreSQL's
    // own error (42704), through pgrx's guard.
    Ok(unsafe { pg_sys::get_role_oid(name.as_ptr(), false) })
}

/// Admit cluster `system_id` to the fleet, bound to role `role` (superusers only,
/// checked by the caller): kept in `tsoracle.fleet_admission` in the caller's transaction,
/// a binding to another role replaced (its member's next hello must come from the new
/// role; a session speaking for it goes on until it ends). A member removed before is
/// re-admitted too ([`admit`]). `true` when anything changed.
pub fn admit_as(system_id: u64, role: pg_sys::Oid) -> Result<bool, TsoError> {
    let own = crate::pg::system_identifier();
    if system_id == own {
        return Err(TsoError::InvalidArgument(format!(
            "{system_id} is this oracle's own system identifier: a member is another cluster"
        )));
    }
    let changed = pgrx::Spi::get_one_with_args::<bool>(
        "WITH a AS (INSERT INTO tsoracle.fleet_admission AS a (system_id, role) \
                    VALUES ($1, $2::pg_catalog.int8::pg_catalog.oid) \
                    ON CONFLICT (system_id) DO UPDATE \
                    SET role = EXCLUDED.role, admitted_at = pg_catalog.now() \
                    WHERE a.role OPERATOR(pg_catalog.<>) EXCLUDED.role RETURNING 1) \
         SELECT EXISTS (SELECT FROM a)",
        &[(system_id as i64).into(), i64::from(role.to_u32()).into()],
    )
    .map_err(|e| TsoError::Internal(format!("could not write tsoracle.fleet_admission: {e}")))?
    .unwrap_or(false);
    let removed = {
        let fleet = FLEET.share();
        fleet.find(system_id).is_some_and(|i| fleet.members()[i].removed)
    };
    let readmitted = removed && admit(system_id)?;
    Ok(changed || readmitted)
}
