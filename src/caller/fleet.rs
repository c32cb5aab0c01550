//! On the oracle of a fleet (docs/fleet.md): a member's session registers its member, reports
//! the member's resolved timestamp, and is served timestamps only once the registration is
//! durable; a superuser removes a member that is gone for good.

use crate::pg::clock;
use crate::pg::error::TsoError;
use crate::shmem::fleet::{MemberSlot, FLEET, MAX_MEMBERS};
use crate::shmem::{self};
use pgrx::pg_sys;
use std::cell::Cell;
use tsoracle_core::fleet::first_entry;

thread_local! {
    /// The member this session registered (its system identifier), after its hello.
    static REGISTERED: Cell<Option<u64>> = const { Cell::new(None) };
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
/// (0: none yet). A member seen before keeps its entry; a new one starts below everything the
/// oracle will issue (`tsoracle_core::fleet::first_entry`). Only the role that registered a
/// member may speak for it.
pub fn register(system_id: u64, reported: u64) -> Result<(), TsoError> {
    let signals = shmem::signals()?;
    let role = session_role();
    let mut fleet = FLEET.exclusive();
    if !fleet.loaded {
        return Err(TsoError::NotServing(
            "the oracle's worker has not read the fleet's members (tsoracle.fleet_member) yet"
                .into(),
        ));
    }
    match fleet.find(system_id) {
        Some(i) => {
            let m = &mut fleet.members[i];
            if m.removing {
                return Err(TsoError::NotServing(format!(
                    "member {system_id} is being removed from the fleet"
                )));
            }
            if m.role != role {
                return Err(TsoError::InsufficientPrivilege(format!(
                    "member {system_id} of the fleet was registered by role {}, not by this session's role {role}: each member speaks for itself only",
                    m.role
                )));
            }
            m.session_pid = my_pid();
        }
        None => {
            let Some(i) = fleet.free() else {
                return Err(TsoError::TooManyMembers(MAX_MEMBERS));
            };
            let entry = first_entry(reported, signals.window.next_ts());
            fleet.members[i] = MemberSlot {
                used: true,
                system_id,
                role,
                resolved: entry.resolved(),
                held_by_pid: 0,
                registered_ms: clock::now_ms(),
                reported_ms: 0,
                session_pid: my_pid(),
                persisted: false,
                persisted_resolved: 0,
                removing: false,
            };
            drop(fleet);
            // The worker makes it durable at its next turn.
            signals.wake_worker();
        }
    }
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
    match fleet.find(system_id).map(|i| fleet.members[i]) {
        Some(m) if m.persisted && !m.removing => Ok(()),
        Some(m) if !m.removing => Err(TsoError::NotServing(format!(
            "the registration of member {system_id} is not durable yet"
        ))),
        _ => Err(TsoError::NotServing(format!(
            "member {system_id} was removed from the fleet: it registers again on its next connection"
        ))),
    }
}

/// A report of this session's member: its `R`, and the pid of the process holding it there.
pub fn report(resolved: u64, held_by_pid: i32) -> Result<(), TsoError> {
    let system_id = mine("tsoracle.member_report()")?;
    let mut fleet = FLEET.exclusive();
    let Some(i) = fleet.find(system_id).filter(|&i| !fleet.members[i].removing) else {
        return Err(TsoError::NotServing(format!(
            "member {system_id} was removed from the fleet: it registers again on its next connection"
        )));
    };
    let m = &mut fleet.members[i];
    let mut entry = m.entry();
    entry.report(resolved);
    m.resolved = entry.resolved();
    m.held_by_pid = held_by_pid;
    m.reported_ms = clock::now_ms();
    m.session_pid = my_pid();
    Ok(())
}

/// Is process `pid` a live backend of this server?
fn alive(pid: i32) -> bool {
    // SAFETY: BackendPidGetProc takes ProcArrayLock itself and returns NULL for no process.
    pid != 0 && !unsafe { pg_sys::BackendPidGetProc(pid) }.is_null()
}

/// Remove member `system_id` (superusers only, checked by the caller): refused while a session
/// of it is connected. The worker deletes its row; this waits for that, up to
/// `tsoracle.extension_timeout_ms`.
pub fn remove(system_id: u64) -> Result<bool, TsoError> {
    let signals = shmem::signals()?;
    {
        let mut fleet = FLEET.exclusive();
        let Some(i) = fleet.find(system_id) else { return Ok(false) };
        let m = &mut fleet.members[i];
        if alive(m.session_pid) {
            return Err(TsoError::MemberConnected {
                system_id: system_id as i64,
                pid: m.session_pid,
            });
        }
        m.removing = true;
    }
    signals.wake_worker();
    // The worker wakes no one when it is done: the wait looks again every 50 ms.
    let gone = super::requests::wait_on_latch(|| {
        Ok(FLEET.share().find(system_id).is_none().then_some(()))
    })?;
    gone.map(|()| true).ok_or(TsoError::WorkerTimeout {
        waited_ms: crate::pg::guc::extension_timeout_ms(),
        what: "remove the member from tsoracle.fleet_member",
    })
}
