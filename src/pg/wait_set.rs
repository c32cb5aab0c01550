//! A wait on this process's latch, the postmaster's death and one socket, kept from one wait
//! to the next (PostgreSQL's `WaitEventSet`). `WaitLatchOrSocket` builds an epoll set and
//! closes it again on every call — five system calls around each wait — which a member's
//! proxy, waiting once or twice per round trip to its oracle, cannot afford.

use pgrx::pg_sys;
use std::ffi::c_int;
use std::ptr::NonNull;

/// What a wait returned on: the latch was set, the socket is ready, or the time ran out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Woken {
    pub latch: bool,
    pub socket: bool,
}

/// The latch, the postmaster's death (the process exits) and `socket`, for as long as the
/// value lives; the socket must stay open as long (a closed descriptor leaves the epoll set).
pub struct SocketWait {
    set: NonNull<pg_sys::WaitEventSet>,
    socket_pos: c_int,
    /// The socket events the set waits for now (`WL_SOCKET_READABLE`, `…_WRITEABLE`).
    events: u32,
}

impl SocketWait {
    /// A set for `socket`, waiting for it to be readable.
    pub fn new(socket: pg_sys::pgsocket) -> Self {
        let events = pg_sys::WL_SOCKET_READABLE;
        // SAFETY: a set of three events, allocated for the process's life (freed in Drop);
        // MyLatch is this process's own latch, the only one it may wait on; the socket is
        // open (the caller's promise). Errors (no descriptor left) are raised as ERROR, as
        // WaitLatchOrSocket's would be.
        unsafe {
            let set = crate::pg::compat::create_wait_event_set(3);
            pg_sys::AddWaitEventToSet(
                set,
                pg_sys::WL_LATCH_SET,
                pg_sys::PGINVALID_SOCKET,
                pg_sys::MyLatch,
                std::ptr::null_mut(),
            );
            pg_sys::AddWaitEventToSet(
                set,
                pg_sys::WL_EXIT_ON_PM_DEATH,
                pg_sys::PGINVALID_SOCKET,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            );
            let socket_pos = pg_sys::AddWaitEventToSet(
                set,
                events,
                socket,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            );
            // CreateWaitEventSet allocates with palloc, which raises rather than return NULL.
            let Some(set) = NonNull::new(set) else {
                pgrx::error!("CreateWaitEventSet returned no wait event set");
            };
            SocketWait { set, socket_pos, events }
        }
    }

    /// Wait until the latch is set, the socket is ready for `events` (readable, and writeable
    /// if asked), or `timeout_ms` passed. The latch is not reset here.
    pub fn wait(&mut self, events: u32, timeout_ms: i64) -> Woken {
        let events = pg_sys::WL_SOCKET_READABLE | (events & pg_sys::WL_SOCKET_WRITEABLE);
        if events != self.events {
            // SAFETY: our set, and the position AddWaitEventToSet gave the socket.
            unsafe {
                pg_sys::ModifyWaitEvent(
                    self.set.as_ptr(),
                    self.socket_pos,
                    events,
                    std::ptr::null_mut(),
                )
            };
            self.events = events;
        }
        let mut occurred = [pg_sys::WaitEvent::default(); 3];
        // SAFETY: our set; room for as many events as it holds.
        let n = unsafe {
            pg_sys::WaitEventSetWait(
                self.set.as_ptr(),
                timeout_ms.max(0) as std::ffi::c_long,
                occurred.as_mut_ptr(),
                occurred.len() as c_int,
                pg_sys::PG_WAIT_EXTENSION,
            )
        };
        let mut woken = Woken::default();
        for e in &occurred[..usize::try_from(n).unwrap_or(0)] {
            woken.latch |= e.events & pg_sys::WL_LATCH_SET != 0;
            woken.socket |=
                e.events & (pg_sys::WL_SOCKET_READABLE | pg_sys::WL_SOCKET_WRITEABLE) != 0;
        }
        woken
    }
}

impl Drop for SocketWait {
    fn drop(&mut self) {
        // SAFETY: created by CreateWaitEventSet, freed exactly once, here.
        unsafe { pg_sys::FreeWaitEventSet(self.set.as_ptr()) };
    }
}
