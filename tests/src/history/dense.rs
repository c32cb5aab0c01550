//! Dense blocks of per-key counters: [`DenseCall`], the [`DenseHistory`] that records them,
//! and the check per key for overlap, real-time order and tiling (see the
//! [module documentation](super)).

use std::collections::BTreeMap;
use std::time::Instant;

use super::gaps::explain_gaps;
use super::spans::{find_overlap, find_real_time_violation, rel_ms, Span};
use super::Recorder;

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
#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::at;

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
}
