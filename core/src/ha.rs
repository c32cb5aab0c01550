//! An HA manager's timing against the window (docs/operations/patroni.md, "Why a frozen leader
//! cannot go back in time"). A leader frozen or cut off just before it would have renewed its
//! key still issues for up to `loop_wait + retry_timeout + window_ahead_ms` after its last
//! renewal; no other member is promoted before `ttl` after it. Real-time order across that
//! failover needs `window_ahead_ms + ε < ttl − loop_wait − retry_timeout`, where ε is the error
//! between the two leaders' clocks.

/// The clock error the worker asks the settings to leave room for before it stays quiet: the
/// margin below must be at least this.
pub const CLOCK_ERROR_ALLOWANCE_MS: i64 = 1_000;

/// The largest error between the old and the new leader's clocks that a failover of a frozen
/// or cut-off leader tolerates: `ttl − loop_wait − retry_timeout − window_ahead_ms`, in ms.
/// Zero or negative: none (the old leader may still issue after the new one began).
pub fn failover_clock_margin_ms(
    window_ahead_ms: u64,
    ttl_ms: u64,
    loop_wait_ms: u64,
    retry_timeout_ms: u64,
) -> i64 {
    let wide = |v: u64| i128::from(v);
    let margin = wide(ttl_ms) - wide(loop_wait_ms) - wide(retry_timeout_ms) - wide(window_ahead_ms);
    // Saturating: every input is at most u64::MAX, so the i128 difference is exact.
    i64::try_from(margin).unwrap_or(if margin < 0 { i64::MIN } else { i64::MAX })
}

/// Whether the worker should warn: an HA manager's TTL is set (`ttl_ms > 0`) and the margin
/// leaves less than [`CLOCK_ERROR_ALLOWANCE_MS`] for the clocks' error.
pub fn window_too_long_for_ha(
    window_ahead_ms: u64,
    ttl_ms: u64,
    loop_wait_ms: u64,
    retry_timeout_ms: u64,
) -> bool {
    ttl_ms > 0
        && failover_clock_margin_ms(window_ahead_ms, ttl_ms, loop_wait_ms, retry_timeout_ms)
            < CLOCK_ERROR_ALLOWANCE_MS
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_tested_patroni_configuration_leaves_nine_seconds() {
        // ttl 16 s, loop_wait 1 s, retry_timeout 5 s, window_ahead_ms 1 s.
        assert_eq!(failover_clock_margin_ms(1_000, 16_000, 1_000, 5_000), 9_000);
        assert!(!window_too_long_for_ha(1_000, 16_000, 1_000, 5_000));
        // Patroni's defaults (30, 10, 10) with tsoracle's default window of 3 s: 7 s left.
        assert!(!window_too_long_for_ha(3_000, 30_000, 10_000, 10_000));
        // ... and a window of 9.5 s, under half the TTL, leaves 0.5 s: warned.
        assert!(window_too_long_for_ha(9_500, 30_000, 10_000, 10_000));
        // No HA manager: never.
        assert!(!window_too_long_for_ha(600_000, 0, 10_000, 10_000));
    }

    proptest! {
        /// The margin is exactly the inequality's slack, and the warning is its threshold.
        #[test]
        fn the_margin_is_the_inequalitys_slack(
            window in 0u64..1 << 40, ttl in 1u64..1 << 40, lw in 0u64..1 << 40, rt in 0u64..1 << 40,
        ) {
            let m = failover_clock_margin_ms(window, ttl, lw, rt);
            prop_assert_eq!(i128::from(m), i128::from(ttl) - i128::from(lw) - i128::from(rt) - i128::from(window));
            prop_assert_eq!(window_too_long_for_ha(window, ttl, lw, rt), m < CLOCK_ERROR_ALLOWANCE_MS);
        }

        /// A longer window, a longer loop or retry, a shorter TTL never make a warned
        /// configuration quiet.
        #[test]
        fn the_warning_is_monotonic(
            window in 0u64..1 << 40, ttl in 1u64..1 << 40, lw in 0u64..1 << 40, rt in 0u64..1 << 40,
            more in 0u64..1 << 20,
        ) {
            if window_too_long_for_ha(window, ttl, lw, rt) {
                prop_assert!(window_too_long_for_ha(window + more, ttl, lw, rt));
                prop_assert!(window_too_long_for_ha(window, ttl, lw + more, rt));
                prop_assert!(window_too_long_for_ha(window, ttl, lw, rt + more));
                prop_assert!(window_too_long_for_ha(window, ttl.saturating_sub(more).max(1), lw, rt));
            }
        }

        /// Extremes do not overflow.
        #[test]
        fn extremes_saturate(window: u64, ttl: u64, lw: u64, rt: u64) {
            let m = failover_clock_margin_ms(window, ttl, lw, rt);
            prop_assert!(m <= i64::try_from(ttl).unwrap_or(i64::MAX));
        }
    }
}
