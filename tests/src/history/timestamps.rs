//! Timestamp calls: [`Call`], the [`History`] that records them, and the check for
//! uniqueness and real-time order (see the [module documentation](super)).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::spans::{find_overlap, find_real_time_violation, rel_ms, Span};
use super::Recorder;

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
    /// The statement the value belongs to, when one statement took several (each recorded
    /// as a call of its own, in the statement's order): they must increase.
    pub statement: Option<u64>,
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
    #[error("values do not increase within one statement: {earlier} then {later}")]
    NotIncreasing { earlier: String, later: String },
}

/// Timestamp calls: checked for uniqueness and real-time order.
pub type History = Recorder<Call>;

impl History {
    pub fn record_ok(&self, start: Instant, end: Instant, node: &str, first: i64, count: i64) {
        self.record(Call {
            start,
            end,
            node: node.to_string(),
            result: Ok(first),
            count,
            statement: None,
        });
    }

    /// One statement's values, in the order it took them: each a call of its own, tied to
    /// the statement, so the check also finds values that do not increase within it.
    pub fn record_statement(&self, start: Instant, end: Instant, node: &str, values: &[i64]) {
        static STATEMENTS: AtomicU64 = AtomicU64::new(0);
        let id = STATEMENTS.fetch_add(1, Ordering::Relaxed);
        for &v in values {
            self.record(Call {
                start,
                end,
                node: node.to_string(),
                result: Ok(v),
                count: 1,
                statement: Some(id),
            });
        }
    }

    pub fn record_err(
        &self,
        start: Instant,
        end: Instant,
        node: &str,
        error: impl Into<String>,
        count: i64,
    ) {
        self.record(Call {
            start,
            end,
            node: node.to_string(),
            result: Err(error.into()),
            count,
            statement: None,
        });
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

    /// Successful calls on `node` that started at or after `t`.
    pub fn ok_calls_on_started_after(&self, node: &str, t: Instant) -> usize {
        self.with_calls(|c| {
            c.iter().filter(|c| c.is_ok() && c.node == node && c.start >= t).count()
        })
    }

    /// Wait (bounded: 30 s, then panic) until each of `nodes` served at least `n` successful
    /// calls that started at or after `since`: progress of the whole, not of its fastest part.
    #[track_caller]
    pub fn wait_progress_on(&self, nodes: &[&str], since: Instant, n: usize, what: &str) {
        let deadline = Instant::now() + std::time::Duration::from_secs(30);
        for node in nodes {
            while self.ok_calls_on_started_after(node, since) < n {
                assert!(
                    Instant::now() < deadline,
                    "{what}: {node} served fewer than {n} successful calls in 30 s ({} so far)",
                    self.ok_calls_on_started_after(node, since)
                );
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }

    /// The longest stretch of `[from, to]` in which no successful call ended: how long the
    /// callers went without an answer.
    pub fn longest_gap_within(&self, from: Instant, to: Instant) -> std::time::Duration {
        let mut ends: Vec<Instant> = self.with_calls(|c| {
            c.iter().filter(|c| c.is_ok() && c.end >= from && c.end < to).map(|c| c.end).collect()
        });
        ends.sort_unstable();
        let mut last = from;
        let mut gap = std::time::Duration::ZERO;
        for t in ends.into_iter().chain(std::iter::once(to)) {
            gap = gap.max(t.duration_since(last));
            last = t;
        }
        gap
    }

    /// Successful calls on `node` entirely inside `[from, to]`.
    pub fn ok_calls_on_within(&self, node: &str, from: Instant, to: Instant) -> usize {
        self.with_calls(|c| {
            c.iter()
                .filter(|c| c.is_ok() && c.node == node && c.start >= from && c.end <= to)
                .count()
        })
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
    // Each statement's last value so far, and its call.
    let mut statements: BTreeMap<u64, (i64, usize)> = BTreeMap::new();
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
                if let Some(id) = c.statement {
                    if let Some(&(before, j)) = statements.get(&id) {
                        if first <= before {
                            return Err(Violation::NotIncreasing {
                                earlier: describe(&calls[j], origin),
                                later: describe(c, origin),
                            });
                        }
                    }
                    statements.insert(id, (last, i));
                }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::at;
    use crate::rng::SplitMix64;

    fn ok(base: Instant, s: u64, e: u64, first: i64, count: i64) -> Call {
        Call {
            start: at(base, s),
            end: at(base, e),
            node: "n".into(),
            result: Ok(first),
            count,
            statement: None,
        }
    }

    fn err(base: Instant, s: u64, e: u64, count: i64) -> Call {
        Call {
            start: at(base, s),
            end: at(base, e),
            node: "n".into(),
            result: Err("boom".into()),
            count,
            statement: None,
        }
    }

    #[test]
    fn empty_history_passes() {
        let r = check_calls(&[]).unwrap();
        assert_eq!(r.calls, 0);
        assert_eq!(r.max_value, None);
    }

    #[test]
    fn a_statements_values_must_increase_and_a_later_statement_be_above() {
        let b = Instant::now();
        let h = History::default();
        h.record_statement(at(b, 0), at(b, 5), "n", &[10, 12, 17]);
        h.record_statement(at(b, 1), at(b, 4), "m", &[11, 13]);
        h.record_statement(at(b, 6), at(b, 7), "m", &[18, 19]);
        assert_eq!(h.check().unwrap().values, 7);
        let h = History::default();
        h.record_statement(at(b, 0), at(b, 5), "n", &[10, 17, 12]);
        assert!(matches!(h.check(), Err(Violation::NotIncreasing { .. })), "{:?}", h.check());
        let h = History::default();
        h.record_statement(at(b, 0), at(b, 5), "n", &[10, 12, 17]);
        h.record_statement(at(b, 6), at(b, 7), "n", &[16, 20]);
        assert!(matches!(h.check(), Err(Violation::RealTime { .. })), "{:?}", h.check());
        let h = History::default();
        h.record_statement(at(b, 0), at(b, 5), "n", &[10, 12]);
        h.record_statement(at(b, 1), at(b, 7), "m", &[11, 12]);
        assert!(matches!(h.check(), Err(Violation::Overlap { .. })), "{:?}", h.check());
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
}
