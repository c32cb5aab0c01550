//! Whether a key's gaps are explained by its errored calls: each errored call may have burnt
//! one block of exactly its count, so the gaps must be partitionable into blocks whose sizes
//! are the counts of distinct errored calls.

use std::collections::BTreeMap;

/// Can the gaps be partitioned into blocks whose sizes are distinct elements of `counts`
/// (each errored call burns at most one block of exactly its count)? `Some(true)` yes,
/// `Some(false)` no, `None` the search budget ran out.
pub(super) fn explain_gaps(gaps: &[i64], counts: &[i64]) -> Option<bool> {
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
