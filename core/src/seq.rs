//! Dense sequences (docs/sequences.md). The counters live in
//! PostgreSQL; the core only validates requests and splits a group commit: the worker
//! advances each key once by the total of all its pending requests, and every requester
//! gets its own slice of `[base, base + total)`, in queue order.

use std::collections::{HashMap, HashSet};

use crate::error::CoreError;

pub const MAX_SEQ_KEY_BYTES: usize = 128;

/// A key is 1 to 128 bytes (bytes, not characters: that is what the index stores).
pub fn validate_key(key: &str) -> Result<(), CoreError> {
    if key.is_empty() || key.len() > MAX_SEQ_KEY_BYTES {
        return Err(CoreError::InvalidSeqKey { got: key.len(), max: MAX_SEQ_KEY_BYTES });
    }
    Ok(())
}

/// A SQL count must be in `1..=max_count`.
pub fn validate_count(count: i64, max_count: u64) -> Result<u64, CoreError> {
    match u64::try_from(count) {
        Ok(c) if (1..=max_count).contains(&c) => Ok(c),
        _ => Err(CoreError::InvalidCount { got: count, max: max_count }),
    }
}

/// The end of the block `[base, base + count)` of a counter at `base`: the value the counter
/// holds once the block is granted. Both the worker's group commit ([`plan_group`]) and the
/// caller's in-place advance take their blocks through it.
pub fn block_end(base: i64, count: u64) -> Result<i64, CoreError> {
    i64::try_from(count)
        .ok()
        .and_then(|c| base.checked_add(c))
        .ok_or(CoreError::SeqOverflow { base, total: count })
}

/// Whether a block written in place may be returned once the caller's wait for synchronous
/// standbys (PostgreSQL's `SyncRepWaitForLSN`) is over. That wait ends without an error on a
/// cancel or terminate: `interrupted` says one was pending when it ended. The block may be
/// returned when the standbys acknowledged its WAL position (`acknowledged >= lsn`), or when
/// the wait was not cut short: it then returned because no synchronous standby is configured,
/// exactly as a commit's does. Anything else loses the block (never returned).
pub fn may_return_after_sync_wait(lsn: u64, acknowledged: u64, interrupted: bool) -> bool {
    acknowledged >= lsn || !interrupted
}

/// One pending request of a group commit. Requests that share `batch` come from one
/// `tso_seq_batch()` call and succeed or fail together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqRequest<'a> {
    pub batch: u64,
    pub key: &'a str,
    pub count: u64,
}

/// What one group commit does: each request's start (or why it failed), and the counter
/// value to store for every key that moved, in order of first appearance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeqPlan {
    pub results: Vec<Result<i64, CoreError>>,
    pub updates: Vec<(String, i64)>,
}

/// Plan a group commit. `current` is each existing key's next value (a key not in it is new
/// and starts at 0); `busy` are keys another transaction holds locked, which this group
/// cannot write; `existing_keys` is how many keys the table holds and `max_keys` the cap.
/// Batches are taken in queue order; each request gets the block `[start, start + count)`
/// that follows the previous one of its key, so the blocks of a key tile with no gap and no
/// overlap. A batch with an entry on a busy key, or that would overflow bigint or exceed the
/// key cap, fails whole and moves nothing; the other batches are planned as if it were not
/// there (one busy key never holds up another).
pub fn plan_group(
    requests: &[SeqRequest<'_>],
    current: &HashMap<&str, i64>,
    busy: &HashSet<&str>,
    existing_keys: u64,
    max_keys: u64,
) -> SeqPlan {
    let mut results: Vec<Option<Result<i64, CoreError>>> = vec![None; requests.len()];
    let mut next: HashMap<&str, i64> = HashMap::new();
    let mut order: Vec<&str> = Vec::new();
    let mut keys = existing_keys;

    for (i, req) in requests.iter().enumerate() {
        if results[i].is_some() {
            continue; // already planned with its batch
        }
        let members: Vec<usize> =
            (i..requests.len()).filter(|&j| requests[j].batch == req.batch).collect();
        // Tentative state for this batch; committed only if every member fits.
        let mut staged: HashMap<&str, i64> = HashMap::new();
        let mut new_keys = 0u64;
        let mut starts = Vec::with_capacity(members.len());
        let mut failure = None;
        for &j in &members {
            let r = &requests[j];
            if busy.contains(r.key) {
                failure = Some(CoreError::SeqKeyBusy(r.key.to_string()));
                break;
            }
            let base = match staged
                .get(r.key)
                .or_else(|| next.get(r.key))
                .or_else(|| current.get(r.key))
            {
                Some(&v) => v,
                None => {
                    new_keys += 1;
                    if keys + new_keys > max_keys {
                        failure = Some(CoreError::TooManySeqKeys { max: max_keys });
                        break;
                    }
                    0
                }
            };
            match block_end(base, r.count) {
                Ok(end) => {
                    staged.insert(r.key, end);
                    starts.push(base);
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        match failure {
            Some(e) => {
                for &j in &members {
                    results[j] = Some(Err(e.clone()));
                }
            }
            None => {
                keys += new_keys;
                for (&j, start) in members.iter().zip(starts) {
                    results[j] = Some(Ok(start));
                }
                for (key, end) in staged {
                    if next.insert(key, end).is_none() {
                        order.push(key);
                    }
                }
            }
        }
    }
    // Keys were pushed in batch order; keep first appearance stable for readable SQL.
    order.sort_by_key(|k| requests.iter().position(|r| r.key == *k));
    SeqPlan {
        results: results.into_iter().map(|r| r.unwrap_or(Err(CoreError::NotLeader))).collect(),
        updates: order.into_iter().map(|k| (k.to_string(), next[k])).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        assert!(validate_key("orders").is_ok());
        assert_eq!(validate_key(""), Err(CoreError::InvalidSeqKey { got: 0, max: 128 }));
        assert!(validate_key(&"a".repeat(128)).is_ok());
        assert_eq!(
            validate_key(&"a".repeat(129)),
            Err(CoreError::InvalidSeqKey { got: 129, max: 128 })
        );
        // 64 two-byte characters fill the limit; one more byte does not fit.
        assert!(validate_key(&"é".repeat(64)).is_ok());
        assert!(validate_key(&format!("{}a", "é".repeat(64))).is_err());
        assert!(validate_key(&"😀".repeat(32)).is_ok());
        assert!(validate_key(&"😀".repeat(33)).is_err());
    }

    #[test]
    fn counts() {
        assert_eq!(validate_count(1, 65536), Ok(1));
        assert_eq!(validate_count(65536, 65536), Ok(65536));
        for bad in [0, -1, 65537, i64::MIN] {
            assert_eq!(
                validate_count(bad, 65536),
                Err(CoreError::InvalidCount { got: bad, max: 65536 })
            );
        }
    }

    #[test]
    fn plan_tiles_keys_in_queue_order() {
        let reqs = [
            SeqRequest { batch: 1, key: "a", count: 1 },
            SeqRequest { batch: 2, key: "b", count: 2 },
            SeqRequest { batch: 3, key: "a", count: 3 },
        ];
        let current = HashMap::from([("a", 10)]);
        let plan = plan_group(&reqs, &current, &HashSet::new(), 1, 100);
        assert_eq!(plan.results, vec![Ok(10), Ok(0), Ok(11)]);
        assert_eq!(plan.updates, vec![("a".to_string(), 14), ("b".to_string(), 2)]);
    }

    #[test]
    fn a_failing_batch_moves_nothing() {
        let reqs = [
            SeqRequest { batch: 7, key: "a", count: 5 },
            SeqRequest { batch: 7, key: "b", count: 1 },
            SeqRequest { batch: 8, key: "a", count: 1 },
        ];
        let current = HashMap::from([("b", i64::MAX)]);
        let plan = plan_group(&reqs, &current, &HashSet::new(), 1, 100);
        assert!(matches!(plan.results[0], Err(CoreError::SeqOverflow { .. })));
        assert!(matches!(plan.results[1], Err(CoreError::SeqOverflow { .. })));
        assert_eq!(plan.results[2], Ok(0));
        assert_eq!(plan.updates, vec![("a".to_string(), 1)]);
    }

    #[test]
    fn the_key_cap_counts_new_keys_only() {
        let reqs = [
            SeqRequest { batch: 1, key: "old", count: 1 },
            SeqRequest { batch: 2, key: "new1", count: 1 },
            SeqRequest { batch: 3, key: "new2", count: 1 },
        ];
        let current = HashMap::from([("old", 3)]);
        let plan = plan_group(&reqs, &current, &HashSet::new(), 2, 3);
        assert_eq!(plan.results[0], Ok(3));
        assert_eq!(plan.results[1], Ok(0));
        assert_eq!(plan.results[2], Err(CoreError::TooManySeqKeys { max: 3 }));
    }

    #[test]
    fn a_busy_key_fails_its_batches_only() {
        let reqs = [
            SeqRequest { batch: 1, key: "a", count: 1 },
            SeqRequest { batch: 2, key: "b", count: 2 },
            SeqRequest { batch: 2, key: "a", count: 2 },
            SeqRequest { batch: 3, key: "a", count: 3 },
        ];
        let current = HashMap::from([("a", 10), ("b", 5)]);
        let plan = plan_group(&reqs, &current, &HashSet::from(["b"]), 2, 100);
        assert_eq!(plan.results[0], Ok(10));
        assert_eq!(plan.results[1], Err(CoreError::SeqKeyBusy("b".into())));
        assert_eq!(plan.results[2], Err(CoreError::SeqKeyBusy("b".into())), "its whole batch");
        assert_eq!(plan.results[3], Ok(11), "a's blocks tile past the failed batch");
        assert_eq!(plan.updates, vec![("a".to_string(), 14)]);
    }

    mod in_place {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Successive in-place advances of one counter tile `[0, end)`, and agree with the
            /// group commit's plan for the same calls in the same order.
            #[test]
            fn in_place_blocks_tile_like_a_group_commit(counts in proptest::collection::vec(1u64..=65536, 1..60)) {
                let mut next = 0i64;
                let mut starts = Vec::new();
                for &c in &counts {
                    let end = block_end(next, c).unwrap();
                    prop_assert_eq!(end - next, c as i64, "a block holds exactly its count");
                    starts.push(next);
                    next = end;
                }
                let requests: Vec<SeqRequest> = counts
                    .iter()
                    .enumerate()
                    .map(|(i, &count)| SeqRequest { batch: i as u64, key: "k", count })
                    .collect();
                let plan = plan_group(&requests, &HashMap::new(), &HashSet::new(), 0, 1);
                let planned: Vec<i64> = plan.results.into_iter().map(|r| r.unwrap()).collect();
                prop_assert_eq!(planned, starts);
                prop_assert_eq!(plan.updates, vec![("k".to_string(), next)]);
            }

            /// Never past bigint: an advance that would overflow is refused, never wrapped.
            #[test]
            fn block_end_never_wraps(base in 0i64..=i64::MAX, count in 0u64..=u64::MAX) {
                match block_end(base, count) {
                    Ok(end) => prop_assert!(end >= base && (end - base) as u64 == count),
                    Err(e) => {
                        prop_assert_eq!(e, CoreError::SeqOverflow { base, total: count });
                        prop_assert!(i64::try_from(count).map_or(true, |c| base.checked_add(c).is_none()));
                    }
                }
            }

            /// A block is returned after the synchronous-replication wait only if the standbys
            /// acknowledged it, or if nothing cut the wait short.
            #[test]
            fn sync_wait(lsn in 0u64..1000, acknowledged in 0u64..1000, interrupted: bool) {
                let ok = may_return_after_sync_wait(lsn, acknowledged, interrupted);
                prop_assert_eq!(ok, acknowledged >= lsn || !interrupted);
                if interrupted && acknowledged < lsn {
                    prop_assert!(!ok, "a cancelled wait short of the standbys returns nothing");
                }
            }
        }
    }
}
