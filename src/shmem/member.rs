//! A member of a fleet (docs/fleet.md): what its worker, the proxy to the oracle, shares
//! with the callers — where the next value may start, the oracle's epoch, the counters
//! `tso_member_status()` shows, and the errors the oracle answered calls with.

use pgrx::lwlock::PgLwLock;
use pgrx::shmem::PGRXSharedMemory;
use std::sync::atomic::{AtomicU64, Ordering};

pub use super::text::Text;

/// Room for an error's message, `tso_member_status().last_error` and the oracle's connection
/// string: the longest message of this version is about 400 bytes (with a counter's key
/// of 128 bytes in it).
pub const TEXT_BYTES: usize = 1024;

/// Room for an error's HINT: the longest of this version is about 1,050 bytes (a counter
/// refused below the member's own past, its key of up to 128 bytes twice, quotes doubled).
/// A longer one (an oracle of another version) ends with a note that it was cut, and the
/// member's log has it whole (`tsoracle_core::text::fit`).
pub const HINT_BYTES: usize = 2048;

/// An error the oracle answered one call with, for the caller to raise as its own.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub struct CallError {
    /// The call's queue generation (0: free).
    pub generation: u64,
    pub sqlstate: [u8; 5],
    pub message: Text<TEXT_BYTES>,
    pub hint: Text<HINT_BYTES>,
}

/// How many answered errors are kept for their callers to read.
pub const CALL_ERRORS: usize = 32;

/// State guarded by the member's LWLock. Plain data only: it lives in shared memory. About
/// 100 KB (the errors): read it through the guard, or copy the fields needed, never whole.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct MemberState {
    /// `tsoracle.oracle`, with any password hidden.
    pub oracle: Text<TEXT_BYTES>,
    /// Connected to the oracle and it answered the hello.
    pub connected: bool,
    /// The oracle's server process serving this member (0: none).
    pub oracle_pid: i32,
    /// The highest epoch the oracle answered with: answers from an older one (a deposed
    /// primary) are refused.
    pub oracle_epoch: u64,
    /// The oracle's system identifier.
    pub oracle_system_id: u64,
    pub connects: u64,
    pub round_trips: u64,
    /// Values fetched for `tso_next()`, `tso_next_batch()` and `tso_next_uuid()`.
    pub values_fetched: u64,
    /// Calls served through the oracle (each round trip serves one or more).
    pub calls_served: u64,
    /// Sum of the round trips' durations (µs), for the mean.
    pub round_trip_us_total: u64,
    pub last_round_trip_us: u64,
    /// Why the member does not serve now, or the oracle's last refusal.
    pub last_error: Text<TEXT_BYTES>,
    /// When the last error happened (wall ms; 0: never).
    pub last_error_ms: u64,
    pub errors: [CallError; CALL_ERRORS],
    pub next_error: usize,
}

impl Default for MemberState {
    fn default() -> Self {
        MemberState {
            oracle: Text::default(),
            connected: false,
            oracle_pid: 0,
            oracle_epoch: 0,
            oracle_system_id: 0,
            connects: 0,
            round_trips: 0,
            values_fetched: 0,
            calls_served: 0,
            round_trip_us_total: 0,
            last_round_trip_us: 0,
            last_error: Text::default(),
            last_error_ms: 0,
            errors: [CallError::default(); CALL_ERRORS],
            next_error: 0,
        }
    }
}

impl MemberState {
    /// Why the member does not serve right now (`tso_member_status().last_error`), noted at
    /// `now_ms` (`last_error_at`).
    pub fn note_error(&mut self, why: &str, now_ms: u64) {
        self.last_error = Text::new(why);
        self.last_error_ms = now_ms;
    }

    /// Keep the error the oracle answered the call of `generation` with.
    pub fn keep_error(
        &mut self,
        generation: u64,
        sqlstate: &str,
        message: &str,
        hint: Option<&str>,
    ) {
        let mut code = [b'X'; 5];
        for (c, b) in code.iter_mut().zip(sqlstate.bytes()) {
            *c = b;
        }
        let slot = self.next_error % CALL_ERRORS;
        self.errors[slot] = CallError {
            generation,
            sqlstate: code,
            message: Text::new(message),
            hint: Text::new(hint.unwrap_or("")),
        };
        self.next_error = (slot + 1) % CALL_ERRORS;
    }

    /// The error kept for the call of `generation`, if still there.
    pub fn error_of(&self, generation: u64) -> Option<CallError> {
        self.errors.iter().find(|e| e.generation == generation && generation != 0).copied()
    }
}

// SAFETY: plain data (integers, flags, byte arrays): no pointers and nothing on the heap, so
// it means the same in every process that maps the segment.
unsafe impl PGRXSharedMemory for MemberState {}

// SAFETY: a name of its own among the extension's shared-memory structs (all start with
// `tsoracle_`).
pub static MEMBER: PgLwLock<MemberState> = unsafe { PgLwLock::new(c"tsoracle_member") };

/// Where the next value a member's caller gets from the oracle may start: one past the
/// highest the member has received. Every value fetched later is above it, since the oracle
/// issued those before the fetch was sent. Raised by the worker before it hands values out;
/// read by a caller's hold (`caller::holding`) and by `R` on a member.
#[derive(Debug, Default)]
#[repr(C)]
pub struct MemberFloor(AtomicU64);

impl MemberFloor {
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Raise to `v` (never lowers).
    pub fn raise(&self, v: u64) {
        self.0.fetch_max(v, Ordering::AcqRel);
    }
}
