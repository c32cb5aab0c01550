//! The two sweeps both checkers make over the successful calls' spans: two value ranges
//! that intersect, and a call that ended before another began but is not below it; and
//! instants printed relative to a history's origin.

use std::time::Instant;

pub(super) fn rel_ms(t: Instant, origin: Instant) -> String {
    if t >= origin {
        format!("+{:.3}ms", (t - origin).as_secs_f64() * 1e3)
    } else {
        format!("-{:.3}ms", (origin - t).as_secs_f64() * 1e3)
    }
}

/// A successful call's time interval and value range; `idx` points back into the input.
#[derive(Clone, Copy, Debug)]
pub(super) struct Span {
    pub(super) start: Instant,
    pub(super) end: Instant,
    pub(super) first: i64,
    pub(super) last: i64,
    pub(super) idx: usize,
}

/// Two spans whose value ranges intersect, if any. Sorts `spans` by first value.
pub(super) fn find_overlap(spans: &mut [Span]) -> Option<(usize, usize)> {
    spans.sort_by_key(|s| (s.first, s.last));
    let mut reach: Option<(i64, usize)> = None; // (largest last so far, its idx)
    for s in spans.iter() {
        if let Some((last, idx)) = reach {
            if s.first <= last {
                return Some((idx, s.idx));
            }
        }
        if reach.is_none_or(|(l, _)| s.last > l) {
            reach = Some((s.last, s.idx));
        }
    }
    None
}

/// (earlier, later) with `earlier.end < later.start` and `earlier.last >= later.first`, if any.
pub(super) fn find_real_time_violation(spans: &[Span]) -> Option<(usize, usize)> {
    let mut by_start: Vec<&Span> = spans.iter().collect();
    by_start.sort_by_key(|s| s.start);
    let mut by_end: Vec<&Span> = spans.iter().collect();
    by_end.sort_by_key(|s| s.end);
    let mut j = 0;
    let mut best: Option<&Span> = None; // max `last` among spans that ended before
    for b in by_start {
        while j < by_end.len() && by_end[j].end < b.start {
            if best.is_none_or(|m| by_end[j].last > m.last) {
                best = Some(by_end[j]);
            }
            j += 1;
        }
        if let Some(a) = best {
            if a.last >= b.first {
                return Some((a.idx, b.idx));
            }
        }
    }
    None
}
