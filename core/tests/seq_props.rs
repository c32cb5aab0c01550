//! Property tests of sequence validation and group-commit splitting.

use proptest::prelude::*;
use tsoracle_core::error::CoreError;
use tsoracle_core::seq::{
    group_by_key, split_group, validate_count, validate_key, MAX_SEQ_KEY_BYTES,
};

/// Keys of 1- to 4-byte characters, around the 128-byte limit.
fn key() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(vec!['a', 'é', '€', '😀']), 0..70)
        .prop_map(|cs| cs.into_iter().collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn key_validation_counts_bytes(k in key()) {
        let ok = (1..=MAX_SEQ_KEY_BYTES).contains(&k.len());
        prop_assert_eq!(validate_key(&k).is_ok(), ok);
    }

    #[test]
    fn count_validation(count in any::<i64>(), max in 1..=1_000_000u64) {
        let got = validate_count(count, max);
        if count >= 1 && count as u64 <= max {
            prop_assert_eq!(got, Ok(count as u64));
        } else {
            prop_assert_eq!(got, Err(CoreError::InvalidCount { got: count, max }));
        }
    }

    /// The blocks are contiguous, in request order, and cover [base, base + sum) exactly.
    #[test]
    fn split_tiles_exactly(base in any::<i64>(), counts in prop::collection::vec(1..=70_000u64, 0..40)) {
        let sum: u64 = counts.iter().sum();
        let end = i128::from(base) + i128::from(sum);
        match split_group(base, &counts) {
            Ok(starts) => {
                prop_assert!(end <= i128::from(i64::MAX));
                prop_assert_eq!(starts.len(), counts.len());
                let mut next = i128::from(base);
                for (&start, &count) in starts.iter().zip(&counts) {
                    prop_assert_eq!(i128::from(start), next);
                    next += i128::from(count);
                }
                prop_assert_eq!(next, end);
            }
            Err(e) => {
                prop_assert!(end > i128::from(i64::MAX));
                prop_assert_eq!(e, CoreError::SeqOverflow { base, total: sum });
            }
        }
    }

    /// Near the top of bigint, overflow is detected exactly at the boundary.
    #[test]
    fn split_detects_overflow(slack in 0..200u64, counts in prop::collection::vec(1..=50u64, 1..10)) {
        let base = i64::MAX - slack as i64;
        let sum: u64 = counts.iter().sum();
        prop_assert_eq!(split_group(base, &counts).is_ok(), sum <= slack);
    }

    /// Grouping then splitting gives every request a disjoint block of its key's counter,
    /// in queue order, and each key's blocks tile its advance exactly.
    #[test]
    fn group_then_split(
        reqs in prop::collection::vec((prop::sample::select(vec!["a", "b", "c", "d"]), 1..=100u64), 0..40),
        bases in prop::collection::vec(-1_000i64..1_000, 4),
    ) {
        let groups = group_by_key(&reqs);
        // Keys distinct, in order of first appearance; every request in exactly one group.
        let mut firsts: Vec<usize> = groups.iter().map(|g| g.2[0]).collect();
        let sorted = { let mut f = firsts.clone(); f.sort_unstable(); f };
        prop_assert_eq!(&firsts, &sorted);
        firsts.dedup();
        prop_assert_eq!(firsts.len(), groups.len());
        let mut seen = vec![false; reqs.len()];
        for (g, (key, total, idx)) in groups.iter().enumerate() {
            prop_assert!(idx.windows(2).all(|w| w[0] < w[1]));
            prop_assert_eq!(*total, idx.iter().map(|&i| reqs[i].1).sum::<u64>());
            let counts: Vec<u64> = idx.iter().map(|&i| reqs[i].1).collect();
            let starts = split_group(bases[g], &counts).unwrap();
            let mut next = bases[g];
            for (&i, &start) in idx.iter().zip(&starts) {
                prop_assert_eq!(reqs[i].0, *key);
                prop_assert!(!seen[i]);
                seen[i] = true;
                prop_assert_eq!(start, next);
                next += reqs[i].1 as i64;
            }
            prop_assert_eq!(next, bases[g] + *total as i64);
        }
        prop_assert!(seen.into_iter().all(|s| s));
    }
}
