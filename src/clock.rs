//! The server's wall clock in Unix milliseconds.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch; 0 for a clock set before 1970 (the allocator then
/// keeps issuing above its last value, which is always safe).
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
