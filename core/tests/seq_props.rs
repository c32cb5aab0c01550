//! Property tests of sequence validation and group-commit splitting.

use proptest::prelude::*;
use std::collections::{HashMap, HashSet};
use tsoracle_core::error::CoreError;
use tsoracle_core::seq::{plan_group, validate_count, validate_key, SeqRequest, MAX_SEQ_KEY_BYTES};

/// Keys of 1- to 4-byte characters, around the 128-byte limit.
fn key() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(vec!['a', 'é', '€', '😀']), 0..70)
        .prop_map(|cs| cs.into_iter().collect())
}

/// Keys whose byte length lands within a few bytes of the limit, on either side.
fn boundary_key() -> impl Strategy<Value = String> {
    (prop::collection::vec(prop::sample::select(vec!['a', 'é', '€', '😀']), 140), 121..=135usize)
        .prop_map(|(cs, target)| {
            let mut k = String::new();
            for c in cs {
                if k.len() + c.len_utf8() > target {
                    break;
                }
                k.push(c);
            }
            k
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn key_validation_counts_bytes(k in key()) {
        let ok = (1..=MAX_SEQ_KEY_BYTES).contains(&k.len());
        prop_assert_eq!(validate_key(&k).is_ok(), ok);
    }

    #[test]
    fn key_validation_at_the_boundary(k in boundary_key()) {
        prop_assert!(k.len() >= 118);
        prop_assert_eq!(validate_key(&k).is_ok(), k.len() <= MAX_SEQ_KEY_BYTES);
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

    /// A group commit tiles every key: successful requests of a key get consecutive blocks
    /// starting at the key's current value, in queue order; a failed batch moves nothing;
    /// the stored values are exactly where each key's blocks end; the key cap holds.
    #[test]
    fn plan_group_matches_a_sequential_model(
        reqs in prop::collection::vec(
            (0..12u64, prop::sample::select(vec!["a", "b", "c", "d", "e"]), 1..=100u64), 0..40),
        near_top in prop::collection::vec(any::<bool>(), 5),
        present in prop::collection::vec(any::<bool>(), 5),
        locked in prop::collection::vec(prop::bool::weighted(0.2), 5),
        max_keys in 1..8u64,
    ) {
        let names = ["a", "b", "c", "d", "e"];
        // Batch ids are grouped in first-appearance order, as the extension's queue gives them.
        let requests: Vec<SeqRequest> =
            reqs.iter().map(|&(batch, key, count)| SeqRequest { batch, key, count }).collect();
        let current: HashMap<&str, i64> = names.iter().enumerate()
            .filter(|(i, _)| present[*i])
            .map(|(i, &k)| (k, if near_top[i] { i64::MAX - 150 } else { 1_000 * i as i64 }))
            .collect();
        // Keys another transaction holds locked: existing ones, or new ones being inserted.
        let busy: HashSet<&str> = names.iter().enumerate()
            .filter(|(i, _)| locked[*i]).map(|(_, &k)| k).collect();
        let existing = current.len() as u64;
        let plan = plan_group(&requests, &current, &busy, existing, max_keys.max(existing));
        let cap = max_keys.max(existing);
        prop_assert_eq!(plan.results.len(), requests.len());

        // The model: apply whole batches one by one, in order of first appearance.
        let mut model: HashMap<&str, i64> = current.clone();
        let mut batches: Vec<u64> = Vec::new();
        for r in &requests { if !batches.contains(&r.batch) { batches.push(r.batch); } }
        for b in batches {
            let members: Vec<usize> = (0..requests.len()).filter(|&j| requests[j].batch == b).collect();
            let mut staged = model.clone();
            let mut ok = true;
            let mut starts = Vec::new();
            for &j in &members {
                let r = &requests[j];
                if busy.contains(r.key) { ok = false; break; }
                let base = match staged.get(r.key) {
                    Some(&v) => v,
                    None if (staged.len() as u64) < cap => 0,
                    None => { ok = false; break; }
                };
                match base.checked_add(r.count as i64) {
                    Some(end) => { staged.insert(r.key, end); starts.push(base); }
                    None => { ok = false; break; }
                }
            }
            if ok {
                model = staged;
                for (&j, start) in members.iter().zip(starts) {
                    prop_assert_eq!(&plan.results[j], &Ok(start));
                }
            } else {
                for &j in &members {
                    prop_assert!(plan.results[j].is_err(), "request {} should fail with its batch", j);
                }
            }
        }
        // A busy key is never written, nor any key of a batch that names one.
        for (k, _) in &plan.updates {
            prop_assert!(!busy.contains(k.as_str()), "busy key {} written", k);
        }
        // Stored values: exactly the keys that moved, at the model's values.
        let moved: HashMap<&str, i64> = model.iter()
            .filter(|(k, v)| current.get(*k) != Some(*v))
            .map(|(k, v)| (*k, *v)).collect();
        prop_assert_eq!(plan.updates.len(), moved.len());
        for (k, v) in &plan.updates {
            prop_assert_eq!(moved.get(k.as_str()), Some(v));
        }
        prop_assert!(model.len() as u64 <= cap);
        // Blocks of one key never overlap.
        for k in names {
            let mut blocks: Vec<(i64, u64)> = plan.results.iter().zip(&requests)
                .filter(|(r, q)| r.is_ok() && q.key == k)
                .map(|(r, q)| (*r.as_ref().unwrap(), q.count)).collect();
            blocks.sort();
            for w in blocks.windows(2) {
                prop_assert!(w[0].0 + w[0].1 as i64 <= w[1].0);
            }
        }
    }
}
