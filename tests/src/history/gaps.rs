//! Whether a key's gaps are explained by its errored calls: each errored call may have burnt
//! one block of exactly its count, so the gaps must be partitionable into blocks whose sizes
//! are the counts of distinct errored calls.

use std::collections::{BTreeMap, HashSet};

/// Can the gaps be partitioned into blocks whose sizes are distinct elements of `counts`
/// (each errored call burns at most one block of exactly its count)? `Some(true)` yes,
/// `Some(false)` no, `None` the search budget ran out.
///
/// The search fills one gap at a time with a multiset of the sizes still free. Two prunings
/// keep it small: a gap is filled only along choices after which its remainder is still a sum
/// of the sizes left (a subset-sum table per gap), and a choice is taken only if every gap not
/// yet filled is, on its own, still a sum of the sizes left. States that failed are
/// remembered.
pub(super) fn explain_gaps(gaps: &[i64], counts: &[i64]) -> Option<bool> {
    if gaps.iter().any(|&g| g < 0) || counts.iter().any(|&c| c <= 0) {
        return Some(false);
    }
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
            _ if g == 0 => {}
            _ => rest.push(g),
        }
    }
    if rest.is_empty() {
        return Some(true);
    }
    rest.sort_unstable_by(|a, b| b.cmp(a));
    // Sums are tracked in bitsets up to the largest gap: bound it so a table stays small.
    let widest = usize::try_from(rest[0]).ok().filter(|&w| w <= 1 << 20)?;
    let sizes: Vec<(i64, i64)> = mult.into_iter().rev().filter(|&(_, m)| m > 0).collect();
    let (s, m): (Vec<i64>, Vec<i64>) = sizes.into_iter().unzip();
    let sizes: Vec<usize> = s.iter().map(|&x| usize::try_from(x).unwrap_or(usize::MAX)).collect();
    let gaps: Vec<usize> = rest.iter().map(|&g| g as usize).collect();
    let mut search = Search {
        gaps,
        sizes,
        mult: m,
        bits: widest + 1,
        failed: HashSet::new(),
        budget: 2_000_000,
    };
    search.fill_gap(0)
}

/// Bitset of the sums `0..len`.
#[derive(Clone)]
struct Sums(Vec<u64>);

impl Sums {
    fn zero(bits: usize) -> Sums {
        let mut v = vec![0u64; bits.div_ceil(64)];
        v[0] = 1;
        Sums(v)
    }

    fn has(&self, i: usize) -> bool {
        self.0.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1)
    }

    /// `self | (self << shift)`, truncated to the set's width; whether anything changed.
    fn or_shifted(&mut self, from: &Sums, shift: usize, bits: usize) -> bool {
        let words = self.0.len();
        let (ws, bs) = (shift / 64, shift % 64);
        let mut changed = false;
        for i in (ws..words).rev() {
            let lo = from.0[i - ws] << bs;
            let hi = if bs > 0 && i > ws { from.0[i - ws - 1] >> (64 - bs) } else { 0 };
            let add = lo | hi;
            if add & !self.0[i] != 0 {
                self.0[i] |= add;
                changed = true;
            }
        }
        let tail = bits % 64;
        if tail != 0 {
            if let Some(last) = self.0.last_mut() {
                *last &= (1u64 << tail) - 1;
            }
        }
        changed
    }
}

struct Search {
    /// Gaps not taken by a block of their own size, largest first.
    gaps: Vec<usize>,
    /// Distinct sizes, largest first, and how many of each are still free.
    sizes: Vec<usize>,
    mult: Vec<i64>,
    /// Width of the sum tables: the largest gap plus one.
    bits: usize,
    /// `(gap index, free sizes)` from which no filling exists.
    failed: HashSet<(usize, Vec<i64>)>,
    budget: u64,
}

impl Search {
    fn spend(&mut self, cost: u64) -> Option<()> {
        self.budget = self.budget.checked_sub(cost)?;
        Some(())
    }

    /// Sums of the free sizes from each index on (`tables[j]` for sizes `j..`, the last one
    /// `{0}`).
    fn suffix_tables(&mut self) -> Option<Vec<Sums>> {
        let n = self.sizes.len();
        let mut tables = vec![Sums::zero(self.bits); n + 1];
        for j in (0..n).rev() {
            let mut acc = tables[j + 1].clone();
            let mut last = acc.clone();
            for _ in 0..self.mult[j] {
                if self.sizes[j] >= self.bits {
                    break;
                }
                self.spend(acc.0.len() as u64)?;
                let mut next = Sums(vec![0; acc.0.len()]);
                if !next.or_shifted(&last, self.sizes[j], self.bits) {
                    break;
                }
                acc.or_shifted(&next, 0, self.bits);
                last = next;
            }
            tables[j] = acc;
        }
        Some(tables)
    }

    /// Fill gaps `gi..`; every earlier gap is filled.
    fn fill_gap(&mut self, gi: usize) -> Option<bool> {
        if gi == self.gaps.len() {
            return Some(true);
        }
        let key = (gi, self.mult.clone());
        if self.failed.contains(&key) {
            return Some(false);
        }
        let tables = self.suffix_tables()?;
        let free: i128 =
            self.sizes.iter().zip(&self.mult).map(|(&s, &m)| s as i128 * m as i128).sum();
        let wanted: i128 = self.gaps[gi..].iter().map(|&g| g as i128).sum();
        let possible = wanted <= free && self.gaps[gi..].iter().all(|&g| tables[0].has(g));
        let found = if possible { self.pick(gi, 0, self.gaps[gi], &tables)? } else { false };
        if !found {
            self.failed.insert(key);
        }
        Some(found)
    }

    /// Fill the rest `rem` of gap `gi` with sizes from index `si` on (`tables` as of the
    /// gap's start: the sizes before `si` are no longer used for this gap).
    fn pick(&mut self, gi: usize, si: usize, rem: usize, tables: &[Sums]) -> Option<bool> {
        self.spend(1)?;
        if rem == 0 {
            return self.fill_gap(gi + 1);
        }
        if si == self.sizes.len() || !tables[si].has(rem) {
            return Some(false);
        }
        let size = self.sizes[si];
        let kmax = (self.mult[si] as usize).min(rem / size);
        for k in (0..=kmax).rev() {
            let left = rem - k * size;
            if !tables[si + 1].has(left) {
                continue;
            }
            self.mult[si] -= k as i64;
            let r = self.pick(gi, si + 1, left, tables);
            self.mult[si] += k as i64;
            if r? {
                return Some(true);
            }
        }
        Some(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

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
        // From a CI run of kill9_while_the_worker_flushes: 21 = 16 + 5, 56, 154 = 99 + 42 + 13,
        // 212 = 99 + 80 + 33, 287 = 80 + 78 + 77 + 52 (the search before this one ran out of
        // budget on it).
        let counts = [
            5, 6, 12, 13, 16, 17, 18, 19, 24, 26, 27, 33, 34, 34, 39, 41, 41, 42, 49, 52, 56, 60,
            65, 77, 78, 80, 80, 99, 99,
        ];
        assert_eq!(explain_gaps(&[56, 212, 154, 21, 287], &counts), Some(true));
        assert_eq!(explain_gaps(&[56, 212, 154, 21, 287, 1], &counts), Some(false));
    }

    #[test]
    fn planted_gaps_are_always_explained() {
        // Histories like the kill -9 suites': calls of 1..=100, some burnt, runs of burnt
        // blocks merged into one gap. A partition exists by construction: the search must find
        // it, not run out of budget.
        let mut rng = SplitMix64::new(11);
        for (lo, hi) in [(10, 60), (50, 200), (100, 400)] {
            for _ in 0..100 {
                let n = rng.range_inclusive(lo, hi);
                let counts: Vec<i64> = (0..n).map(|_| rng.range_inclusive(1, 100)).collect();
                let mut burnt: Vec<i64> =
                    counts.iter().copied().filter(|_| rng.range_inclusive(1, 10) <= 4).collect();
                for i in (1..burnt.len()).rev() {
                    burnt.swap(i, rng.range_inclusive(0, i as i64) as usize);
                }
                let (mut gaps, mut run) = (Vec::new(), 0);
                for b in burnt {
                    run += b;
                    if rng.range_inclusive(1, 10) <= 3 {
                        gaps.push(run);
                        run = 0;
                    }
                }
                if run > 0 {
                    gaps.push(run);
                }
                assert_eq!(
                    explain_gaps(&gaps, &counts),
                    Some(true),
                    "gaps {gaps:?} counts {counts:?}"
                );
            }
        }
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
