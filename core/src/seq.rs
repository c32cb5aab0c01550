//! Dense sequences (seeds: "Dense sequences: a separate counter"). The counters live in
//! PostgreSQL; the core only validates requests and splits a group commit: the worker
//! advances each key once by the total of all its pending requests, and every requester
//! gets its own slice of `[base, base + total)`, in queue order.

use std::collections::HashMap;

use crate::error::CoreError;

pub const MAX_SEQ_KEY_BYTES: usize = 128;

/// A key is 1 to 128 bytes (bytes, not characters: that is what the index stores).
pub fn validate_key(key: &str) -> Result<(), CoreError> {
    if key.is_empty() || key.len() > MAX_SEQ_KEY_BYTES {
        return Err(CoreError::InvalidSeqKey {
            got: key.len(),
            max: MAX_SEQ_KEY_BYTES,
        });
    }
    Ok(())
}

/// A SQL count must be in `1..=max_count`.
pub fn validate_count(count: i64, max_count: u64) -> Result<u64, CoreError> {
    match u64::try_from(count) {
        Ok(c) if (1..=max_count).contains(&c) => Ok(c),
        _ => Err(CoreError::InvalidCount {
            got: count,
            max: max_count,
        }),
    }
}

/// The start of each request's block, in order, tiling `[base, base + sum(counts))`
/// exactly. `base` is the counter's value before the group's single advance. Fails with
/// `SeqOverflow` if the end does not fit in a bigint.
pub fn split_group(base: i64, counts: &[u64]) -> Result<Vec<i64>, CoreError> {
    let overflow = || CoreError::SeqOverflow {
        base,
        total: counts.iter().fold(0u64, |sum, &c| sum.saturating_add(c)),
    };
    let mut next = base;
    counts
        .iter()
        .map(|&count| {
            let start = next;
            next = i64::try_from(count)
                .ok()
                .and_then(|c| next.checked_add(c))
                .ok_or_else(overflow)?;
            Ok(start)
        })
        .collect()
}

/// Groups pending `(key, count)` requests by key, keys in order of first appearance, each
/// with its total (saturating; `split_group` then reports the overflow) and the indices of
/// its requests in queue order.
pub fn group_by_key<'a>(reqs: &[(&'a str, u64)]) -> Vec<(&'a str, u64, Vec<usize>)> {
    let mut groups: Vec<(&'a str, u64, Vec<usize>)> = Vec::new();
    let mut slot: HashMap<&'a str, usize> = HashMap::new();
    for (i, &(key, count)) in reqs.iter().enumerate() {
        let g = *slot.entry(key).or_insert_with(|| {
            groups.push((key, 0, Vec::new()));
            groups.len() - 1
        });
        let group = &mut groups[g];
        group.1 = group.1.saturating_add(count);
        group.2.push(i);
    }
    groups
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
    fn split() {
        assert_eq!(split_group(10, &[1, 5, 2]), Ok(vec![10, 11, 16]));
        assert_eq!(split_group(10, &[]), Ok(vec![]));
        assert_eq!(split_group(i64::MAX - 3, &[1, 2]), Ok(vec![i64::MAX - 3, i64::MAX - 2]));
        assert_eq!(
            split_group(i64::MAX - 3, &[1, 3]),
            Err(CoreError::SeqOverflow { base: i64::MAX - 3, total: 4 })
        );
        assert!(split_group(0, &[u64::MAX]).is_err());
    }

    #[test]
    fn grouping() {
        let reqs = [("a", 1), ("b", 2), ("a", 3), ("c", 4), ("b", 5)];
        assert_eq!(
            group_by_key(&reqs),
            vec![("a", 4, vec![0, 2]), ("b", 7, vec![1, 4]), ("c", 4, vec![3])]
        );
        assert!(group_by_key(&[]).is_empty());
    }
}
