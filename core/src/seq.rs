//! Dense sequences (docs/sequences.md). The counters live in
//! PostgreSQL; the core only validates requests and splits a group commit: the worker
//! advances each key once by the total of all its pending requests, and every requester
//! gets its own slice of `[base, base + total)`, in queue order.

use std::collections::HashMap;

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
/// and starts at 0); `existing_keys` is how many keys the table holds and `max_keys` the cap.
/// Batches are taken in queue order; each request gets the block `[start, start + count)`
/// that follows the previous one of its key, so the blocks of a key tile with no gap and no
/// overlap. A batch with an entry that would overflow bigint or exceed the key cap fails
/// whole and moves nothing.
pub fn plan_group(
    requests: &[SeqRequest<'_>],
    current: &HashMap<&str, i64>,
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
            match i64::try_from(r.count).ok().and_then(|c| base.checked_add(c)) {
                Some(end) => {
                    staged.insert(r.key, end);
                    starts.push(base);
                }
                None => {
                    failure = Some(CoreError::SeqOverflow { base, total: r.count });
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
        let plan = plan_group(&reqs, &current, 1, 100);
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
        let plan = plan_group(&reqs, &current, 1, 100);
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
        let plan = plan_group(&reqs, &current, 2, 3);
        assert_eq!(plan.results[0], Ok(3));
        assert_eq!(plan.results[1], Ok(0));
        assert_eq!(plan.results[2], Err(CoreError::TooManySeqKeys { max: 3 }));
    }
}
