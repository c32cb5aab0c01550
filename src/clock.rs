//! The server's wall clock in Unix milliseconds.

/// Milliseconds since the Unix epoch; 0 for a clock set before 1970 (the allocator then
/// keeps issuing above its last value, which is always safe). `clock_gettime` directly:
/// this is on the hot path of `tso_next()`, and `SystemTime` arithmetic costs as much again.
pub fn now_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out-pointer; CLOCK_REALTIME always exists.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) } != 0 || ts.tv_sec < 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}
