//! The server's two clocks (docs/allocator.md, "Clock steps"):
//!
//! - the **wall clock** (`CLOCK_REALTIME`) in Unix milliseconds: the physical part of every
//!   timestamp and how close it is to real time. It can step either way (NTP, an operator, a
//!   VM resumed), so no guarantee rests on how far it moved;
//! - the **monotonic clock** (`CLOCK_MONOTONIC_COARSE`: it never steps, and it is the same
//!   clock for every process of the machine): every elapsed-time bound a guarantee rests on
//!   (the serve-until gate, lease deadlines in the worker's life, the pace of the reference
//!   clock) is measured on it, together with the wall clock where that is the more
//!   conservative of the two. The coarse variant costs 5 ns to read against 23 for a precise
//!   one (it is read on every `tso_next()`); its resolution is one kernel tick (4 ms here),
//!   which every bound allows for. It does not count time the machine spends suspended: the
//!   wall clock, which does, is checked too.
//!
//! `clock_gettime` directly: both are read on the hot path of `tso_next()`, and `SystemTime`
//! arithmetic costs as much again.
//!
//! Test builds only (cargo feature `clock-fault`): the wall clock every process reads is
//! offset by the setting `tsoracle.test_clock_offset_ms`, kept in shared memory (the
//! postmaster stores it there when it reloads its configuration), so the tests step the clock
//! of the whole cluster at one instant, under load. A release build has neither the setting
//! nor the offset.

/// One reading of both clocks.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub wall_ms: u64,
    pub mono_ms: u64,
}

fn read(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out-pointer; CLOCK_REALTIME and CLOCK_MONOTONIC_COARSE exist on every
    // Linux PostgreSQL 15+ runs on (2.6.32+).
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 || ts.tv_sec < 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// Milliseconds since the Unix epoch; 0 for a clock set before 1970 (the allocator then
/// keeps issuing above its last value, which is always safe).
pub fn now_ms() -> u64 {
    let wall = read(libc::CLOCK_REALTIME);
    #[cfg(feature = "clock-fault")]
    let wall = crate::shmem::SIGNALS
        .get()
        .map_or(wall, |s| wall.saturating_add_signed(s.test_clock_offset_ms()));
    wall
}

/// Milliseconds of the monotonic clock (since boot, suspended time not counted), at the
/// resolution of a kernel tick.
pub fn mono_ms() -> u64 {
    read(libc::CLOCK_MONOTONIC_COARSE)
}

pub fn sample() -> Sample {
    Sample { wall_ms: now_ms(), mono_ms: mono_ms() }
}
