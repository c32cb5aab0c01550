//! Client-observed histories and their checkers.
//!
//! # Timestamps: [`History`]
//!
//! Each call is `(start, end, node, result, count)`: `start` taken just before the request was
//! sent, `end` just after the answer arrived; a successful call covers the values
//! `[first, first + count)` (count 1 for `tso_next()`); a failed call holds the error text and
//! covers nothing we know of. [`History::check`] verifies:
//!
//! * **uniqueness**: no two successful calls' ranges overlap (so no value was issued twice);
//! * **real-time order**: if call A ended before call B began (`A.end < B.start`), then every
//!   value of A is below every value of B (`A.last < B.first`). Calls that overlap in time may
//!   be ordered either way. Across a restart this is "never go back": the calls before the
//!   outage ended before the calls after it began.
//!
//! Both run in O(n log n): uniqueness sorts by first value; real-time order sorts the calls by
//! start and by end and sweeps, keeping the largest last value among the calls that ended
//! before the current call's start.
//!
//! # Dense blocks: [`DenseHistory`]
//!
//! For per-key counters (`tso_seq(key, count)` → start of `[start, start + count)`): per key, the
//! successful blocks must not overlap, must respect real-time order (as above), and must tile
//! `[0, total)` exactly, where `total` is given (e.g. read back from the server) or else the end
//! of the highest block. A gap is allowed only if it is explained by errored calls of that key:
//! the gaps must be partitionable into blocks whose sizes are the counts of distinct errored
//! calls (a request whose caller failed may still have been committed: a burnt block).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

// ====================================================================== timestamps

/// One call of a timestamp function as the client saw it.
#[derive(Clone, Debug)]
pub struct Call {
    pub start: Instant,
    pub end: Instant,
    pub node: String,
    /// First value of the batch, or the error text.
    pub result: Result<i64, String>,
    /// Number of values asked for (the batch covers `[first, first + count)`).
    pub count: i64,
}

impl Call {
    pub fn first(&self) -> Option<i64> {
        self.result.as_ref().ok().copied()
    }

    /// The last value of a successful call.
    pub fn last(&self) -> Option<i64> {
        self.first().map(|f| f + self.count - 1)
    }

    pub fn is_ok(&self) -> bool {
        self.result.is_ok()
    }
}

/// Counts per node in a [`HistoryReport`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeCounts {
    pub ok_calls: usize,
    pub err_calls: usize,
    pub values: i64,
}

/// What a passing check saw.
#[derive(Clone, Debug, Default)]
pub struct HistoryReport {
    pub calls: usize,
    pub ok_calls: usize,
    pub err_calls: usize,
    /// Number of values issued to successful calls (sum of their counts).
    pub values: i64,
    pub min_value: Option<i64>,
    pub max_value: Option<i64>,
    pub per_node: BTreeMap<String, NodeCounts>,
}

/// Why a history is wrong; each names the calls involved.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Violation {
    #[error("malformed call {call}: {reason}")]
    Malformed { call: String, reason: String },
    #[error("values issued twice: {a} overlaps {b}")]
    Overlap { a: String, b: String },
    #[error("real-time order violated: {earlier} ended before {later} began, but the later call's first value is not above the earlier call's last value")]
    RealTime { earlier: String, later: String },
}

/// A thread-safe, append-only record of calls of type `T`; clones share the same record.
/// [`History`] records timestamp calls, [`DenseHistory`] sequence blocks.
#[derive(Clone, Debug)]
pub struct Recorder<T> {
    origin: Instant,
    calls: Arc<Mutex<Vec<T>>>,
}

impl<T: Clone> Default for Recorder<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Clone> Recorder<T> {
    pub fn new() -> Self {
        Recorder { origin: Instant::now(), calls: Arc::new(Mutex::new(Vec::new())) }
    }

    /// Reference instant for readable reports (times are printed relative to it).
    pub fn origin(&self) -> Instant {
        self.origin
    }

    pub fn record(&self, call: T) {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).push(call);
    }

    /// A copy of the calls recorded so far.
    pub fn calls(&self) -> Vec<T> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn len(&self) -> usize {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `f` of the calls recorded so far, without copying them.
    pub fn with_calls<R>(&self, f: impl FnOnce(&[T]) -> R) -> R {
        let g = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        f(&g)
    }
}

/// Timestamp calls: checked for uniqueness and real-time order.
pub type History = Recorder<Call>;

impl History {
    pub fn record_ok(&self, start: Instant, end: Instant, node: &str, first: i64, count: i64) {
        self.record(Call { start, end, node: node.to_string(), result: Ok(first), count });
    }

    pub fn record_err(
        &self,
        start: Instant,
        end: Instant,
        node: &str,
        error: impl Into<String>,
        count: i64,
    ) {
        self.record(Call { start, end, node: node.to_string(), result: Err(error.into()), count });
    }

    /// Successful calls that started at or after `t`.
    pub fn ok_calls_started_after(&self, t: Instant) -> usize {
        self.with_calls(|c| c.iter().filter(|c| c.is_ok() && c.start >= t).count())
    }

    /// Wait (bounded: 30 s, then panic) until at least `n` successful calls started at or
    /// after `since`.
    #[track_caller]
    pub fn wait_progress(&self, since: Instant, n: usize, what: &str) {
        let deadline = Instant::now() + std::time::Duration::from_secs(30);
        while self.ok_calls_started_after(since) < n {
            assert!(
                Instant::now() < deadline,
                "{what}: fewer than {n} successful calls in 30 s ({} so far)",
                self.ok_calls_started_after(since)
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Successful calls entirely inside `[from, to]`.
    pub fn ok_calls_within(&self, from: Instant, to: Instant) -> usize {
        self.with_calls(|c| {
            c.iter().filter(|c| c.is_ok() && c.start >= from && c.end <= to).count()
        })
    }

    /// Smallest first and largest last value of the successful calls entirely inside
    /// `[from, to]`.
    pub fn value_range_within(&self, from: Instant, to: Instant) -> Option<(i64, i64)> {
        self.with_calls(|c| {
            let mut it = c.iter().filter(|c| c.is_ok() && c.start >= from && c.end <= to);
            let first = it.next()?;
            let mut lo = first.first()?;
            let mut hi = first.last()?;
            for c in it {
                lo = lo.min(c.first()?);
                hi = hi.max(c.last()?);
            }
            Some((lo, hi))
        })
    }

    /// Largest value issued to a successful call.
    pub fn max_value(&self) -> Option<i64> {
        self.with_calls(|c| c.iter().filter_map(Call::last).max())
    }

    /// Check uniqueness and real-time order (see the module documentation).
    pub fn check(&self) -> Result<HistoryReport, Violation> {
        self.with_calls(|c| check_calls_from(c, Some(self.origin)))
    }

    /// [`History::check`], panicking with the violation.
    #[track_caller]
    pub fn assert_valid(&self) -> HistoryReport {
        match self.check() {
            Ok(r) => r,
            Err(v) => panic!("history check failed: {v}"),
        }
    }
}

fn rel_ms(t: Instant, origin: Instant) -> String {
    if t >= origin {
        format!("+{:.3}ms", (t - origin).as_secs_f64() * 1e3)
    } else {
        format!("-{:.3}ms", (origin - t).as_secs_f64() * 1e3)
    }
}

fn describe(c: &Call, origin: Instant) -> String {
    let what = match &c.result {
        Ok(f) => format!("ok [{}, {}) (count {})", f, f.saturating_add(c.count), c.count),
        Err(e) => format!("error {e:?} (count {})", c.count),
    };
    format!("<{} {} during {}..{}>", c.node, what, rel_ms(c.start, origin), rel_ms(c.end, origin))
}

/// Check a slice of calls (times reported relative to the earliest start).
pub fn check_calls(calls: &[Call]) -> Result<HistoryReport, Violation> {
    check_calls_from(calls, None)
}

fn check_calls_from(calls: &[Call], origin: Option<Instant>) -> Result<HistoryReport, Violation> {
    let origin =
        origin.or_else(|| calls.iter().map(|c| c.start).min()).unwrap_or_else(Instant::now);
    let mut report = HistoryReport { calls: calls.len(), ..Default::default() };
    let mut spans: Vec<Span> = Vec::with_capacity(calls.len());
    for (i, c) in calls.iter().enumerate() {
        if c.end < c.start {
            return Err(Violation::Malformed {
                call: describe(c, origin),
                reason: "ends before it starts".into(),
            });
        }
        let per_node = report.per_node.entry(c.node.clone()).or_default();
        match c.result {
            Err(_) => {
                report.err_calls += 1;
                per_node.err_calls += 1;
            }
            Ok(first) => {
                if c.count < 1 {
                    return Err(Violation::Malformed {
                        call: describe(c, origin),
                        reason: "successful call with count < 1".into(),
                    });
                }
                if first < 0 || first.checked_add(c.count).is_none() {
                    return Err(Violation::Malformed {
                        call: describe(c, origin),
                        reason: "value out of range".into(),
                    });
                }
                report.ok_calls += 1;
                report.values += c.count;
                per_node.ok_calls += 1;
                per_node.values += c.count;
                let last = first + c.count - 1;
                report.min_value = Some(report.min_value.map_or(first, |m| m.min(first)));
                report.max_value = Some(report.max_value.map_or(last, |m| m.max(last)));
                spans.push(Span { start: c.start, end: c.end, first, last, idx: i });
            }
        }
    }
    if let Some((a, b)) = find_overlap(&mut spans) {
        return Err(Violation::Overlap {
            a: describe(&calls[a], origin),
            b: describe(&calls[b], origin),
        });
    }
    if let Some((a, b)) = find_real_time_violation(&spans) {
        return Err(Violation::RealTime {
            earlier: describe(&calls[a], origin),
            later: describe(&calls[b], origin),
        });
    }
    Ok(report)
}

/// A successful call's time interval and value range; `idx` points back into the input.
#[derive(Clone, Copy, Debug)]
struct Span {
    start: Instant,
    end: Instant,
    first: i64,
    last: i64,
    idx: usize,
}

/// Two spans whose value ranges intersect, if any. Sorts `spans` by first value.
fn find_overlap(spans: &mut [Span]) -> Option<(usize, usize)> {
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
fn find_real_time_violation(spans: &[Span]) -> Option<(usize, usize)> {
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

// ====================================================================== dense blocks

/// One call of a dense-block function (`tso_seq(key, count)`) as the client saw it.
#[derive(Clone, Debug)]
pub struct DenseCall {
    pub start: Instant,
    pub end: Instant,
    pub node: String,
    pub key: String,
    /// Start of the block, or the error text.
    pub result: Result<i64, String>,
    pub count: i64,
}

/// Per-key result of a passing dense check.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyReport {
    pub ok_calls: usize,
    pub err_calls: usize,
    /// The tiled range is `[0, total)`.
    pub total: i64,
    /// Values covered by successful blocks.
    pub covered: i64,
    /// Uncovered ranges `[a, b)`, each explained by errored calls.
    pub gaps: Vec<(i64, i64)>,
}

#[derive(Clone, Debug, Default)]
pub struct DenseReport {
    pub keys: BTreeMap<String, KeyReport>,
}

#[derive(Clone, Debug, thiserror::Error)]
pub enum DenseViolation {
    #[error("key {key:?}: malformed call {call}: {reason}")]
    Malformed { key: String, call: String, reason: String },
    #[error("key {key:?}: blocks overlap: {a} and {b}")]
    Overlap { key: String, a: String, b: String },
    #[error("key {key:?}: real-time order violated: {earlier} ended before {later} began, but the later block is not above it")]
    RealTime { key: String, earlier: String, later: String },
    #[error("key {key:?}: block {call} reaches beyond the total {total}")]
    BeyondTotal { key: String, call: String, total: i64 },
    #[error("key {key:?}: gaps {gaps:?} are not explained by the errored calls' counts {errored_counts:?}{}", if *.inconclusive { " (search budget exhausted)" } else { "" })]
    UnexplainedGaps {
        key: String,
        gaps: Vec<(i64, i64)>,
        errored_counts: Vec<i64>,
        inconclusive: bool,
    },
}

/// Sequence blocks: checked per key for overlap, real-time order and tiling.
pub type DenseHistory = Recorder<DenseCall>;

impl DenseHistory {
    pub fn record_ok(
        &self,
        start: Instant,
        end: Instant,
        node: &str,
        key: &str,
        first: i64,
        count: i64,
    ) {
        self.record(DenseCall {
            start,
            end,
            node: node.into(),
            key: key.into(),
            result: Ok(first),
            count,
        });
    }

    pub fn record_err(
        &self,
        start: Instant,
        end: Instant,
        node: &str,
        key: &str,
        error: impl Into<String>,
        count: i64,
    ) {
        self.record(DenseCall {
            start,
            end,
            node: node.into(),
            key: key.into(),
            result: Err(error.into()),
            count,
        });
    }

    /// Check every key; `totals` (key → counter value read back from the server) makes the
    /// tiling exact up to that value, otherwise up to the end of the highest block.
    pub fn check(
        &self,
        totals: Option<&BTreeMap<String, i64>>,
    ) -> Result<DenseReport, DenseViolation> {
        let calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        check_dense_from(&calls, totals, Some(self.origin))
    }
}

fn describe_dense(c: &DenseCall, origin: Instant) -> String {
    let what = match &c.result {
        Ok(f) => format!("ok [{}, {}) (count {})", f, f.saturating_add(c.count), c.count),
        Err(e) => format!("error {e:?} (count {})", c.count),
    };
    format!("<{} {} during {}..{}>", c.node, what, rel_ms(c.start, origin), rel_ms(c.end, origin))
}

/// Check dense blocks per key (see the module documentation).
pub fn check_dense(
    calls: &[DenseCall],
    totals: Option<&BTreeMap<String, i64>>,
) -> Result<DenseReport, DenseViolation> {
    check_dense_from(calls, totals, None)
}

fn check_dense_from(
    calls: &[DenseCall],
    totals: Option<&BTreeMap<String, i64>>,
    origin: Option<Instant>,
) -> Result<DenseReport, DenseViolation> {
    let origin =
        origin.or_else(|| calls.iter().map(|c| c.start).min()).unwrap_or_else(Instant::now);
    let mut by_key: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, c) in calls.iter().enumerate() {
        by_key.entry(c.key.as_str()).or_default().push(i);
    }
    if let Some(t) = totals {
        for k in t.keys() {
            by_key.entry(k.as_str()).or_default();
        }
    }
    let mut report = DenseReport::default();
    for (key, idxs) in by_key {
        let kr = check_key(key, calls, &idxs, totals.and_then(|t| t.get(key)).copied(), origin)?;
        report.keys.insert(key.to_string(), kr);
    }
    Ok(report)
}

fn check_key(
    key: &str,
    calls: &[DenseCall],
    idxs: &[usize],
    total: Option<i64>,
    origin: Instant,
) -> Result<KeyReport, DenseViolation> {
    let mut kr = KeyReport::default();
    let mut spans = Vec::new();
    let mut errored = Vec::new();
    for &i in idxs {
        let c = &calls[i];
        let malformed = |reason: &str| DenseViolation::Malformed {
            key: key.into(),
            call: describe_dense(c, origin),
            reason: reason.into(),
        };
        if c.end < c.start {
            return Err(malformed("ends before it starts"));
        }
        match c.result {
            Err(_) => {
                kr.err_calls += 1;
                if c.count >= 1 {
                    errored.push(c.count);
                }
            }
            Ok(first) => {
                if c.count < 1 {
                    return Err(malformed("successful call with count < 1"));
                }
                if first < 0 || first.checked_add(c.count).is_none() {
                    return Err(malformed("block out of range (dense counters start at 0)"));
                }
                kr.ok_calls += 1;
                kr.covered += c.count;
                spans.push(Span {
                    start: c.start,
                    end: c.end,
                    first,
                    last: first + c.count - 1,
                    idx: i,
                });
            }
        }
    }
    if let Some((a, b)) = find_overlap(&mut spans) {
        return Err(DenseViolation::Overlap {
            key: key.into(),
            a: describe_dense(&calls[a], origin),
            b: describe_dense(&calls[b], origin),
        });
    }
    if let Some((a, b)) = find_real_time_violation(&spans) {
        return Err(DenseViolation::RealTime {
            key: key.into(),
            earlier: describe_dense(&calls[a], origin),
            later: describe_dense(&calls[b], origin),
        });
    }
    // `spans` is sorted by first value now.
    let highest = spans.iter().map(|s| s.last + 1).max().unwrap_or(0);
    let total = total.unwrap_or(highest);
    if let Some(s) = spans.iter().find(|s| s.last + 1 > total) {
        return Err(DenseViolation::BeyondTotal {
            key: key.into(),
            call: describe_dense(&calls[s.idx], origin),
            total,
        });
    }
    kr.total = total;
    let mut pos = 0i64;
    for s in &spans {
        if s.first > pos {
            kr.gaps.push((pos, s.first));
        }
        pos = s.last + 1;
    }
    if pos < total {
        kr.gaps.push((pos, total));
    }
    if !kr.gaps.is_empty() {
        let lens: Vec<i64> = kr.gaps.iter().map(|(a, b)| b - a).collect();
        match explain_gaps(&lens, &errored) {
            Some(true) => {}
            verdict => {
                errored.sort_unstable();
                return Err(DenseViolation::UnexplainedGaps {
                    key: key.into(),
                    gaps: kr.gaps.clone(),
                    errored_counts: errored,
                    inconclusive: verdict.is_none(),
                });
            }
        }
    }
    Ok(kr)
}

/// Can the gaps be partitioned into blocks whose sizes are distinct elements of `counts`
/// (each errored call burns at most one block of exactly its count)? `Some(true)` yes,
/// `Some(false)` no, `None` the search budget ran out.
fn explain_gaps(gaps: &[i64], counts: &[i64]) -> Option<bool> {
    let gap_sum: i128 = gaps.iter().map(|&g| g as i128).sum();
    let count_sum: i128 = counts.iter().map(|&c| c as i128).sum();
    if gap_sum > count_sum {
        return Some(false);
    }
    // Multiset of sizes.
    let mut mult: BTreeMap<i64, i64> = BTreeMap::new();
    for &c in counts {
        *mult.entry(c).or_default() += 1;
    }
    // A gap equal to an available size can take that block: any solution can be rearranged
    // so that it does (swap the block with whatever filled the gap; the sums are equal).
    let mut rest = Vec::new();
    for &g in gaps {
        match mult.get_mut(&g) {
            Some(m) if *m > 0 => *m -= 1,
            _ => rest.push(g),
        }
    }
    if rest.is_empty() {
        return Some(true);
    }
    rest.sort_unstable_by(|a, b| b.cmp(a));
    let sizes: Vec<(i64, i64)> = mult.into_iter().rev().filter(|&(_, m)| m > 0).collect();
    let (s, mut m): (Vec<i64>, Vec<i64>) = sizes.into_iter().unzip();
    if rest.len().saturating_mul(s.len() + 1) > 100_000 {
        return None;
    }
    let mut budget: u64 = 2_000_000;
    fill(&rest, 0, rest[0], 0, &s, &mut m, &mut budget)
}

/// Fill gap `gi` (remaining `rem`) using sizes from index `si` on, then the next gaps.
fn fill(
    gaps: &[i64],
    gi: usize,
    rem: i64,
    si: usize,
    sizes: &[i64],
    mult: &mut [i64],
    budget: &mut u64,
) -> Option<bool> {
    if *budget == 0 {
        return None;
    }
    *budget -= 1;
    if rem == 0 {
        return if gi + 1 == gaps.len() {
            Some(true)
        } else {
            fill(gaps, gi + 1, gaps[gi + 1], 0, sizes, mult, budget)
        };
    }
    if si == sizes.len() {
        return Some(false);
    }
    let size = sizes[si];
    let kmax = mult[si].min(rem / size);
    let mut exhausted = false;
    for k in (0..=kmax).rev() {
        mult[si] -= k;
        let r = fill(gaps, gi, rem - k * size, si + 1, sizes, mult, budget);
        mult[si] += k;
        match r {
            Some(true) => return Some(true),
            Some(false) => {}
            None => exhausted = true,
        }
        if exhausted {
            return None;
        }
    }
    Some(false)
}

// ====================================================================== tests

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;
    use std::time::Duration;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    fn ok(base: Instant, s: u64, e: u64, first: i64, count: i64) -> Call {
        Call { start: at(base, s), end: at(base, e), node: "n".into(), result: Ok(first), count }
    }

    fn err(base: Instant, s: u64, e: u64, count: i64) -> Call {
        Call {
            start: at(base, s),
            end: at(base, e),
            node: "n".into(),
            result: Err("boom".into()),
            count,
        }
    }

    #[test]
    fn empty_history_passes() {
        let r = check_calls(&[]).unwrap();
        assert_eq!(r.calls, 0);
        assert_eq!(r.max_value, None);
    }

    #[test]
    fn sequential_and_concurrent_calls_pass() {
        let b = Instant::now();
        let calls = vec![
            ok(b, 0, 1, 10, 1),
            ok(b, 2, 3, 11, 5), // [11, 16)
            // two concurrent calls may come back in either order
            ok(b, 4, 10, 30, 1),
            ok(b, 5, 9, 20, 10), // [20, 30)
            ok(b, 11, 12, 31, 1),
            err(b, 12, 13, 1),
        ];
        let r = check_calls(&calls).unwrap();
        assert_eq!(r.calls, 6);
        assert_eq!(r.ok_calls, 5);
        assert_eq!(r.err_calls, 1);
        assert_eq!(r.values, 1 + 5 + 1 + 10 + 1);
        assert_eq!(r.min_value, Some(10));
        assert_eq!(r.max_value, Some(31));
        assert_eq!(r.per_node["n"].ok_calls, 5);
    }

    #[test]
    fn duplicate_value_is_caught() {
        let b = Instant::now();
        let calls = vec![ok(b, 0, 5, 10, 1), ok(b, 1, 4, 10, 1)];
        assert!(matches!(check_calls(&calls), Err(Violation::Overlap { .. })));
    }

    #[test]
    fn overlapping_batches_are_caught() {
        let b = Instant::now();
        // [10, 20) and [19, 21) share 19, even though the calls overlap in time.
        let calls = vec![ok(b, 0, 5, 10, 10), ok(b, 1, 4, 19, 2)];
        assert!(matches!(check_calls(&calls), Err(Violation::Overlap { .. })));
        // A batch swallowed by a bigger one that started earlier in value order.
        let calls = vec![ok(b, 0, 1, 0, 100), ok(b, 2, 3, 200, 1), ok(b, 4, 5, 50, 1)];
        assert!(check_calls(&calls).is_err());
    }

    #[test]
    fn going_back_in_real_time_is_caught() {
        let b = Instant::now();
        // A ended at 1 before B began at 2, but B's value is lower.
        let calls = vec![ok(b, 0, 1, 100, 1), ok(b, 2, 3, 50, 1)];
        match check_calls(&calls) {
            Err(Violation::RealTime { earlier, later }) => {
                assert!(earlier.contains("[100, 101)"), "{earlier}");
                assert!(later.contains("[50, 51)"), "{later}");
            }
            other => panic!("expected a real-time violation, got {other:?}"),
        }
        // A batch's last value counts, not its first: [100, 110) then 105.
        let calls = vec![ok(b, 0, 1, 100, 10), ok(b, 2, 3, 110, 1), ok(b, 5, 6, 95, 1)];
        assert!(matches!(check_calls(&calls), Err(Violation::RealTime { .. })));
        // The violating earlier call is not the most recent one.
        let calls = vec![
            ok(b, 0, 1, 1000, 1),
            ok(b, 2, 30, 2000, 1),
            ok(b, 3, 4, 1001, 1),
            ok(b, 5, 6, 999, 1),
        ];
        assert!(matches!(check_calls(&calls), Err(Violation::RealTime { .. })));
    }

    #[test]
    fn restart_regression_is_caught_and_errors_do_not_hide_it() {
        let b = Instant::now();
        let calls = vec![
            ok(b, 0, 1, 500, 1),
            ok(b, 1, 2, 501, 1),
            err(b, 3, 40, 1), // the outage
            err(b, 3, 41, 64),
            ok(b, 50, 51, 490, 1), // after restart: went back
        ];
        assert!(matches!(check_calls(&calls), Err(Violation::RealTime { .. })));
    }

    #[test]
    fn touching_instants_are_concurrent() {
        let b = Instant::now();
        // A.end == B.start: not "ended before", so any order is fine.
        let calls = vec![ok(b, 0, 2, 100, 1), ok(b, 2, 3, 50, 1)];
        assert!(check_calls(&calls).is_ok());
    }

    #[test]
    fn malformed_calls_are_rejected() {
        let b = Instant::now();
        assert!(matches!(check_calls(&[ok(b, 0, 1, 5, 0)]), Err(Violation::Malformed { .. })));
        assert!(matches!(check_calls(&[ok(b, 0, 1, -1, 1)]), Err(Violation::Malformed { .. })));
        assert!(matches!(
            check_calls(&[ok(b, 0, 1, i64::MAX, 2)]),
            Err(Violation::Malformed { .. })
        ));
        assert!(matches!(check_calls(&[ok(b, 3, 1, 5, 1)]), Err(Violation::Malformed { .. })));
    }

    #[test]
    fn recorder_is_shared_and_queries_work() {
        let h = History::new();
        let b = h.origin();
        let h2 = h.clone();
        std::thread::spawn(move || h2.record_ok(at(b, 0), at(b, 1), "x", 7, 3)).join().unwrap();
        h.record_err(at(b, 2), at(b, 3), "x", "down", 1);
        h.record_ok(at(b, 4), at(b, 5), "y", 20, 1);
        assert_eq!(h.len(), 3);
        assert_eq!(h.max_value(), Some(20));
        assert_eq!(h.ok_calls_started_after(at(b, 2)), 1);
        assert_eq!(h.ok_calls_within(at(b, 0), at(b, 1)), 1);
        assert_eq!(h.value_range_within(at(b, 0), at(b, 10)), Some((7, 20)));
        let r = h.assert_valid();
        assert_eq!(r.per_node["x"], NodeCounts { ok_calls: 1, err_calls: 1, values: 3 });
        h.record_ok(at(b, 6), at(b, 7), "y", 8, 1);
        assert!(h.check().is_err());
    }

    /// The O(n log n) checker agrees with the obvious O(n²) one on random histories.
    #[test]
    fn fast_checker_matches_brute_force() {
        fn brute(calls: &[Call]) -> bool {
            let ok: Vec<&Call> = calls.iter().filter(|c| c.is_ok()).collect();
            for a in &ok {
                for b in &ok {
                    if std::ptr::eq(*a, *b) {
                        continue;
                    }
                    let (af, al, bf, bl) = (
                        a.first().unwrap(),
                        a.last().unwrap(),
                        b.first().unwrap(),
                        b.last().unwrap(),
                    );
                    if af <= bl && bf <= al {
                        return false;
                    }
                    if a.end < b.start && al >= bf {
                        return false;
                    }
                }
            }
            true
        }
        let base = Instant::now();
        let mut rng = SplitMix64::new(42);
        let (mut valid, mut invalid) = (0, 0);
        for _ in 0..3000 {
            let n = rng.range_inclusive(0, 12) as usize;
            // Linearizable by construction: values handed out in order of a linearization
            // point inside each call's interval...
            let mut calls: Vec<(u64, Call)> = (0..n)
                .map(|_| {
                    let s = rng.range_inclusive(0, 50) as u64;
                    let e = s + rng.range_inclusive(0, 10) as u64;
                    let lp = rng.range_inclusive(s as i64, e as i64) as u64;
                    let count = rng.range_inclusive(1, 4);
                    let c = if rng.chance(0.15) {
                        err(base, s, e, count)
                    } else {
                        ok(base, s, e, 0, count)
                    };
                    (lp, c)
                })
                .collect();
            calls.sort_by_key(|(lp, _)| *lp);
            let mut next = 100;
            for (_, c) in calls.iter_mut() {
                if c.is_ok() {
                    c.result = Ok(next);
                    next += c.count + rng.range_inclusive(0, 2);
                }
            }
            let mut calls: Vec<Call> = calls.into_iter().map(|(_, c)| c).collect();
            // ... then sometimes corrupted.
            if !calls.is_empty() && rng.chance(0.5) {
                let i = rng.range_inclusive(0, calls.len() as i64 - 1) as usize;
                if let Ok(f) = calls[i].result {
                    calls[i].result = Ok((f + rng.range_inclusive(-8, 8)).max(0));
                }
            }
            let expect = brute(&calls);
            assert_eq!(check_calls(&calls).is_ok(), expect, "history: {calls:#?}");
            if expect {
                valid += 1;
            } else {
                invalid += 1;
            }
        }
        assert!(
            valid > 500 && invalid > 200,
            "generator coverage: {valid} valid, {invalid} invalid"
        );
    }

    // ------------------------------------------------------------------ dense

    fn dok(base: Instant, s: u64, e: u64, key: &str, first: i64, count: i64) -> DenseCall {
        DenseCall {
            start: at(base, s),
            end: at(base, e),
            node: "n".into(),
            key: key.into(),
            result: Ok(first),
            count,
        }
    }

    fn derr(base: Instant, s: u64, e: u64, key: &str, count: i64) -> DenseCall {
        DenseCall {
            start: at(base, s),
            end: at(base, e),
            node: "n".into(),
            key: key.into(),
            result: Err("cancelled".into()),
            count,
        }
    }

    #[test]
    fn dense_exact_tiling_passes() {
        let b = Instant::now();
        let calls = vec![
            dok(b, 0, 1, "a", 0, 10),
            dok(b, 2, 9, "a", 10, 5),
            dok(b, 3, 4, "a", 15, 1), // concurrent with the one above
            dok(b, 0, 1, "b", 0, 3),
            dok(b, 5, 6, "b", 3, 3),
        ];
        let r = check_dense(&calls, None).unwrap();
        assert_eq!(
            r.keys["a"],
            KeyReport { ok_calls: 3, err_calls: 0, total: 16, covered: 16, gaps: vec![] }
        );
        assert_eq!(r.keys["b"].total, 6);
        let totals: BTreeMap<String, i64> = [("a".to_string(), 16), ("b".to_string(), 6)].into();
        assert!(check_dense(&calls, Some(&totals)).is_ok());
    }

    #[test]
    fn dense_overlap_is_caught() {
        let b = Instant::now();
        let calls = vec![dok(b, 0, 1, "a", 0, 10), dok(b, 0, 2, "a", 9, 2)];
        assert!(matches!(check_dense(&calls, None), Err(DenseViolation::Overlap { .. })));
        // The same range on different keys is fine.
        let calls = vec![dok(b, 0, 1, "a", 0, 10), dok(b, 0, 2, "b", 0, 10)];
        assert!(check_dense(&calls, None).is_ok());
    }

    #[test]
    fn dense_unexplained_gap_is_caught() {
        let b = Instant::now();
        let calls = vec![dok(b, 0, 1, "a", 0, 10), dok(b, 2, 3, "a", 12, 1)];
        match check_dense(&calls, None) {
            Err(DenseViolation::UnexplainedGaps { gaps, inconclusive, .. }) => {
                assert_eq!(gaps, vec![(10, 12)]);
                assert!(!inconclusive);
            }
            other => panic!("expected unexplained gap, got {other:?}"),
        }
        // Not starting at 0 is a gap too.
        let calls = vec![dok(b, 0, 1, "a", 5, 1)];
        assert!(matches!(check_dense(&calls, None), Err(DenseViolation::UnexplainedGaps { .. })));
    }

    #[test]
    fn dense_gap_explained_by_errored_calls() {
        let b = Instant::now();
        // Gap [10, 12) = one burnt block of 2.
        let calls = vec![dok(b, 0, 1, "a", 0, 10), derr(b, 1, 2, "a", 2), dok(b, 2, 3, "a", 12, 1)];
        let r = check_dense(&calls, None).unwrap();
        assert_eq!(r.keys["a"].gaps, vec![(10, 12)]);
        assert_eq!(r.keys["a"].err_calls, 1);
        // Gap of 5 = 3 + 2 from two errored calls; the gap of 1 = a third.
        let calls = vec![
            derr(b, 0, 1, "a", 3),
            dok(b, 0, 1, "a", 5, 1),
            derr(b, 0, 1, "a", 2),
            derr(b, 0, 1, "a", 1),
            dok(b, 0, 1, "a", 7, 1),
        ];
        assert!(check_dense(&calls, None).is_ok(), "{:?}", check_dense(&calls, None));
        // An errored call of another key does not explain this key's gap.
        let calls = vec![dok(b, 0, 1, "a", 0, 10), derr(b, 1, 2, "b", 2), dok(b, 2, 3, "a", 12, 1)];
        assert!(matches!(check_dense(&calls, None), Err(DenseViolation::UnexplainedGaps { .. })));
    }

    #[test]
    fn dense_gap_with_wrong_sizes_is_caught() {
        let b = Instant::now();
        // Gap of 5, errored counts 3 and 3: total is enough, but no subset sums to 5.
        let calls = vec![derr(b, 0, 1, "a", 3), derr(b, 0, 1, "a", 3), dok(b, 0, 1, "a", 5, 1)];
        assert!(matches!(check_dense(&calls, None), Err(DenseViolation::UnexplainedGaps { .. })));
        // Two gaps of 2, one errored call of 2: each errored call burns one block only.
        let calls = vec![derr(b, 0, 1, "a", 2), dok(b, 0, 1, "a", 2, 1), dok(b, 0, 1, "a", 5, 1)];
        assert!(matches!(check_dense(&calls, None), Err(DenseViolation::UnexplainedGaps { .. })));
    }

    #[test]
    fn dense_totals_make_the_tiling_exact() {
        let b = Instant::now();
        let calls = vec![dok(b, 0, 1, "a", 0, 10)];
        let t = |n: i64| -> BTreeMap<String, i64> { [("a".to_string(), n)].into() };
        // Trailing gap [10, 14) with nothing to explain it.
        assert!(matches!(
            check_dense(&calls, Some(&t(14))),
            Err(DenseViolation::UnexplainedGaps { .. })
        ));
        // A block beyond the counter's value.
        assert!(matches!(
            check_dense(&calls, Some(&t(8))),
            Err(DenseViolation::BeyondTotal { .. })
        ));
        // The trailing gap explained by a burnt block.
        let mut with_err = calls.clone();
        with_err.push(derr(b, 1, 2, "a", 4));
        let r = check_dense(&with_err, Some(&t(14))).unwrap();
        assert_eq!(r.keys["a"].gaps, vec![(10, 14)]);
        // A key with a total but no calls at all.
        let none: BTreeMap<String, i64> = [("a".to_string(), 10), ("z".to_string(), 3)].into();
        assert!(matches!(
            check_dense(&calls, Some(&none)),
            Err(DenseViolation::UnexplainedGaps { .. })
        ));
    }

    #[test]
    fn dense_real_time_violation_is_caught() {
        let b = Instant::now();
        // Tiles [0, 20) exactly, but the block handed out later in real time is the lower one.
        let calls = vec![dok(b, 0, 1, "a", 10, 10), dok(b, 2, 3, "a", 0, 10)];
        assert!(matches!(check_dense(&calls, None), Err(DenseViolation::RealTime { .. })));
    }

    #[test]
    fn dense_malformed_is_caught() {
        let b = Instant::now();
        assert!(matches!(
            check_dense(&[dok(b, 0, 1, "a", 0, 0)], None),
            Err(DenseViolation::Malformed { .. })
        ));
        assert!(matches!(
            check_dense(&[dok(b, 0, 1, "a", -3, 3)], None),
            Err(DenseViolation::Malformed { .. })
        ));
    }

    #[test]
    fn gap_explanation_search() {
        assert_eq!(explain_gaps(&[], &[]), Some(true));
        assert_eq!(explain_gaps(&[4], &[]), Some(false));
        assert_eq!(explain_gaps(&[4], &[4]), Some(true));
        assert_eq!(explain_gaps(&[4], &[1, 1, 1, 1]), Some(true));
        assert_eq!(explain_gaps(&[4], &[1, 1, 1]), Some(false));
        assert_eq!(explain_gaps(&[7, 5], &[3, 4, 2, 3]), Some(true)); // 7 = 4 + 3, 5 = 3 + 2
        assert_eq!(explain_gaps(&[7, 5], &[6, 6]), Some(false));
        assert_eq!(explain_gaps(&[6, 6], &[3, 3, 3, 3]), Some(true));
        assert_eq!(explain_gaps(&[6, 6], &[4, 4, 2, 2]), Some(true));
        assert_eq!(explain_gaps(&[6, 6], &[5, 4, 2, 1]), Some(true)); // 5+1, 4+2
        assert_eq!(explain_gaps(&[6, 6], &[5, 5, 1, 1]), Some(true));
        assert_eq!(explain_gaps(&[6, 6], &[5, 5, 2]), Some(false));
        // Many uniform burnt blocks stay cheap.
        let gaps = vec![64; 500];
        let counts = vec![16; 2000];
        assert_eq!(explain_gaps(&gaps, &counts), Some(true));
        let counts = vec![16; 1999];
        assert_eq!(explain_gaps(&gaps, &counts), Some(false));
    }

    #[test]
    fn gap_explanation_matches_brute_force() {
        // Brute force: assign every errored call to a gap or to nothing.
        fn brute(gaps: &[i64], counts: &[i64]) -> bool {
            fn go(i: usize, rem: &mut Vec<i64>, counts: &[i64]) -> bool {
                if i == counts.len() {
                    return rem.iter().all(|&r| r == 0);
                }
                if go(i + 1, rem, counts) {
                    return true;
                }
                for g in 0..rem.len() {
                    if rem[g] >= counts[i] {
                        rem[g] -= counts[i];
                        let ok = go(i + 1, rem, counts);
                        rem[g] += counts[i];
                        if ok {
                            return true;
                        }
                    }
                }
                false
            }
            go(0, &mut gaps.to_vec(), counts)
        }
        let mut rng = SplitMix64::new(7);
        for _ in 0..2000 {
            let gaps: Vec<i64> =
                (0..rng.range_inclusive(0, 3)).map(|_| rng.range_inclusive(1, 9)).collect();
            let counts: Vec<i64> =
                (0..rng.range_inclusive(0, 6)).map(|_| rng.range_inclusive(1, 6)).collect();
            assert_eq!(
                explain_gaps(&gaps, &counts),
                Some(brute(&gaps, &counts)),
                "gaps {gaps:?} counts {counts:?}"
            );
        }
    }
}
