//! The merge: each cluster's rows of one round, already in timestamp order, into one order
//! across the fleet (ties, which only a caller that stamps several rows with one value makes,
//! in the clusters' order).

/// One row: its timestamp and its JSON.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub ts: i64,
    pub json: String,
}

/// Rows of every cluster (`per_cluster[i]` sorted by `ts`), merged: (cluster index, row).
pub fn merge(per_cluster: Vec<Vec<Row>>) -> Vec<(usize, Row)> {
    let mut all: Vec<(usize, usize, Row)> = per_cluster
        .into_iter()
        .enumerate()
        .flat_map(|(c, rows)| rows.into_iter().enumerate().map(move |(i, r)| (c, i, r)))
        .collect();
    all.sort_by_key(|(c, i, r)| (r.ts, *c, *i));
    all.into_iter().map(|(c, _, r)| (c, r)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(ts: i64) -> Row {
        Row { ts, json: format!("{{\"v\":{ts}}}") }
    }

    #[test]
    fn one_order_across_clusters() {
        let merged =
            merge(vec![vec![row(1), row(5), row(9)], vec![row(2), row(3)], vec![], vec![row(5)]]);
        let order: Vec<(usize, i64)> = merged.iter().map(|(c, r)| (*c, r.ts)).collect();
        assert_eq!(order, vec![(0, 1), (1, 2), (1, 3), (0, 5), (3, 5), (0, 9)]);
    }
}
