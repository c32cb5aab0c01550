//! The resolved timestamp's bookkeeping against a model of backends and readers that
//! interleave at the granularity of single atomic reads and writes (every step sequentially
//! consistent, as the fences make them), each backend holding `hold_floor` before its first
//! grant of a transaction: a reader's `R` never passes a value of a transaction
//! that has not ended, no grant after it is at or below it, and the published `R` never
//! decreases.

use proptest::prelude::*;
use tsoracle_core::resolved::{hold_floor, resolved};

#[derive(Clone, Copy, Debug)]
enum Step {
    /// Backend b: first grant of its transaction (publish, then grant) or a further grant.
    Take(usize),
    /// Backend b: the transaction ends (commit or abort); its slot is cleared.
    End(usize),
    /// Reader r: start (read next) or read its next slot or finish.
    Read(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0usize..4).prop_map(Step::Take),
        (0usize..4).prop_map(Step::End),
        (0usize..2).prop_map(Step::Read),
    ]
}

#[derive(Clone, Debug, Default)]
struct Reader {
    /// None: idle. Some((next read, slots read so far, lowest seen)).
    scan: Option<(u64, usize, u64)>,
}

proptest! {
    #[test]
    fn r_never_passes_an_open_transaction_and_never_goes_down(
        steps in proptest::collection::vec(step(), 1..400),
    ) {
        const BACKENDS: usize = 4;
        let mut next = 1u64; // one past the last issued
        let mut slots = [0u64; BACKENDS];
        // Per backend: is a transaction open (published), and the values it took.
        let mut open = [false; BACKENDS];
        let mut taken: Vec<Vec<u64>> = vec![Vec::new(); BACKENDS];
        // Per backend: one past the last value it was granted (0: none yet).
        let mut last_end = [0u64; BACKENDS];
        // The first grant of the transaction is taken and its slot not yet raised to it.
        let mut raise = [false; BACKENDS];
        // Values of transactions that have not ended, for the check.
        let mut readers = vec![Reader::default(); 2];
        let mut published = 0u64;
        for s in steps {
            match s {
                // The first step of a transaction only publishes the lower bound (the end of
                // the backend's last grant, or the window's next as read then); the grant and
                // the raise of the slot to the value granted are later steps, so readers
                // interleave between all three.
                Step::Take(b) if !open[b] => {
                    slots[b] = hold_floor(last_end[b], || next).max(1);
                    open[b] = true;
                }
                Step::Take(b) if raise[b] => {
                    slots[b] = taken[b][0];
                    raise[b] = false;
                }
                Step::Take(b) => {
                    let first = next;
                    next += 1;
                    prop_assert!(first > published, "granted {} at or below R {}", first, published);
                    raise[b] = taken[b].is_empty();
                    taken[b].push(first);
                    last_end[b] = first + 1;
                }
                Step::End(b) => {
                    slots[b] = 0;
                    open[b] = false;
                    raise[b] = false;
                    taken[b].clear();
                }
                Step::Read(r) => {
                    let reader = &mut readers[r];
                    match reader.scan {
                        None => reader.scan = Some((next, 0, u64::MAX)),
                        Some((n, i, lowest)) if i < BACKENDS => {
                            let v = slots[i];
                            let lowest = if v == 0 { lowest } else { lowest.min(v) };
                            reader.scan = Some((n, i + 1, lowest));
                        }
                        Some((n, _, lowest)) => {
                            let r_now = resolved(n, [lowest], None);
                            published = published.max(r_now);
                            reader.scan = None;
                            for (b, values) in taken.iter().enumerate() {
                                for &v in values {
                                    prop_assert!(
                                        v > published,
                                        "R {} passed {} of backend {}'s open transaction", published, v, b
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
