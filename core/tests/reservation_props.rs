//! Properties of a statement's reservation on a member (`tsoracle_core::reservation`).

use proptest::prelude::*;
use std::collections::HashSet;
use tsoracle_core::reservation::Reservation;

/// What a backend does: a call of the current statement, or a new statement.
#[derive(Clone, Debug)]
enum Step {
    Call,
    NewStatement,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(prop_oneof![8 => Just(Step::Call), 1 => Just(Step::NewStatement)], 1..400)
}

proptest! {
    /// Against an oracle that answers every fetch above everything it answered before (and
    /// other members' fetches in between, `skip`): each value is handed out once, values
    /// increase within a statement, a statement's first value comes from a fetch of its own
    /// (so it is above everything fetched before the statement began), and no fetch asks
    /// more than the cap.
    #[test]
    fn values_are_unique_increasing_and_a_statement_fetches_its_own(
        steps in steps(),
        cap in 1u32..=64,
        skip in prop::collection::vec(0u64..1000, 400),
    ) {
        let mut oracle_next = 1u64;
        let mut r = Reservation::EMPTY;
        let mut statement = 0u64;
        let mut seen = HashSet::new();
        let mut last_in_statement: Option<u64> = None;
        let mut fetched_before_statement = 0u64;
        let mut fetches = 0usize;
        for (i, step) in steps.iter().enumerate() {
            match step {
                Step::NewStatement => {
                    statement += 1;
                    last_in_statement = None;
                    fetched_before_statement = oracle_next;
                }
                Step::Call => {
                    let v = match r.take(statement) {
                        Some(v) => v,
                        None => {
                            let size = r.next_size(statement, cap);
                            prop_assert!((1..=cap).contains(&size));
                            oracle_next += skip[i % skip.len()];
                            let first = oracle_next;
                            oracle_next += u64::from(size);
                            fetches += 1;
                            r = Reservation::fetched(statement, first, size);
                            first
                        }
                    };
                    prop_assert!(seen.insert(v), "{} handed out twice", v);
                    prop_assert!(v >= fetched_before_statement, "{} is from before the statement", v);
                    if let Some(last) = last_in_statement {
                        prop_assert!(v > last, "{} after {} in one statement", v, last);
                    }
                    last_in_statement = Some(v);
                }
            }
        }
        prop_assert!(fetches <= seen.len());
    }

    /// `n` calls of one statement take at most `log2(cap) + 1 + n / cap` fetches.
    #[test]
    fn a_long_statement_takes_few_fetches(n in 1u64..200_000, cap_log in 0u32..=18) {
        let cap = 1u32 << cap_log;
        let mut r = Reservation::EMPTY;
        let mut next = 1u64;
        let mut fetches = 0u64;
        for _ in 0..n {
            if r.take(7).is_none() {
                let size = r.next_size(7, cap);
                r = Reservation::fetched(7, next, size);
                next += u64::from(size);
                fetches += 1;
            }
        }
        prop_assert!(fetches <= u64::from(cap_log) + 1 + n / u64::from(cap), "{} fetches for {} values, cap {}", fetches, n, cap);
    }
}
