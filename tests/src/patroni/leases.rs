//! Lease holders, the lease log, and the lease checks. See the [module documentation](super).

use super::*;
use crate::history::Recorder;

/// One lease call as the holder saw it.
#[derive(Clone, Debug)]
pub struct Grant {
    pub start: Instant,
    pub end: Instant,
    /// Label of the session (`pgN/tlT`).
    pub node: String,
    /// Acquire (false) or renewal (true).
    pub renewal: bool,
    /// `(lease_id, ts_upper_bound, expires_at_ms, epoch)`, or the error text.
    pub result: std::result::Result<(i64, i64, i64, i32), String>,
}

/// Lease calls, shared by clones: the harness's [`Recorder`], as for timestamps and blocks.
pub type LeaseLog = Recorder<Grant>;

/// One lease holder: acquires a lease (holder name, epoch 1, `ttl_ms`), renews it every
/// `every`, and when the lease is gone (expired, superseded, unknown) acquires again at the
/// next holder epoch. Every call is recorded in a [`LeaseLog`].
pub struct LeaseHolder {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl LeaseHolder {
    pub fn start(
        target: Target,
        holder: &str,
        ttl_ms: i32,
        every: Duration,
        log: &LeaseLog,
    ) -> LeaseHolder {
        let stop = Arc::new(AtomicBool::new(false));
        let (stop2, log, holder) = (stop.clone(), log.clone(), holder.to_string());
        let handle = std::thread::Builder::new()
            .name("lease-holder".into())
            .spawn(move || lease_worker(target, &holder, ttl_ms, every, log, stop2))
            .expect("spawn the lease holder");
        LeaseHolder { stop, handle: Some(handle) }
    }

    pub fn stop_and_join(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            if let Err(p) = h.join() {
                std::panic::resume_unwind(p);
            }
        }
    }
}

impl Drop for LeaseHolder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

pub(super) fn lease_worker(
    target: Target,
    holder: &str,
    ttl_ms: i32,
    every: Duration,
    log: LeaseLog,
    stop: Arc<AtomicBool>,
) {
    let mut conn: Option<(Client, String)> = None;
    let mut lease: Option<i64> = None;
    // Start above any epoch an earlier holder of this name may have used.
    let mut epoch: i64 = 1;
    while !stop.load(Ordering::SeqCst) {
        let Some((c, label)) = conn.as_mut() else {
            match connect_target(&target, 20_000) {
                Ok(x) => conn = Some(x),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
            continue;
        };
        let start = Instant::now();
        let (renewal, res) = match lease {
            Some(id) => (
                true,
                c.query_one("SELECT ts_upper_bound, expires_at_ms, epoch FROM tso_lease_renew($1)", &[&id])
                    .and_then(|r| Ok((id, r.try_get::<_, i64>(0)?, r.try_get::<_, i64>(1)?, r.try_get::<_, i32>(2)?))),
            ),
            None => (
                false,
                c.query_one(
                    "SELECT lease_id, ts_upper_bound, expires_at_ms, epoch FROM tso_lease_acquire($1, $2, $3)",
                    &[&holder, &epoch, &ttl_ms],
                )
                .and_then(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?))),
            ),
        };
        let end = Instant::now();
        match res {
            Ok(g) => {
                lease = Some(g.0);
                log.record(Grant { start, end, node: label.clone(), renewal, result: Ok(g) });
                std::thread::sleep(every);
            }
            Err(e) => {
                log.record(Grant {
                    start,
                    end,
                    node: label.clone(),
                    renewal,
                    result: Err(pg_error_string(&e)),
                });
                let code = e.code().map(|s| s.code().to_string()).unwrap_or_default();
                if code == "55000" || code == "P0002" {
                    // Expired, superseded or purged: a new lease at the next epoch.
                    lease = None;
                    epoch += 1;
                } else if session_broken(c, &e) {
                    conn = None;
                    std::thread::sleep(Duration::from_millis(20));
                } else {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }
}

/// What [`check_leases`] saw.
#[derive(Clone, Debug, Default)]
pub struct LeaseReport {
    pub ok_grants: usize,
    pub err_grants: usize,
    pub acquires: usize,
    pub renewals: usize,
    /// Distinct terms (labels) that granted leases.
    pub terms: BTreeSet<String>,
    /// (grant, timestamp call) pairs compared across terms.
    pub cross_term_pairs: u64,
    pub highest_bound: Option<i64>,
}

/// Check lease grants against the timestamps:
///
/// 1. a grant's `ts_upper_bound` is at or above the physical part of every timestamp returned
///    by a call that ended before the grant began (the bound is the durable high-water,
///    which only rises and bounds everything served);
/// 2. every timestamp served by another term (label) in a call that began after a grant
///    returned is above that grant's bound (docs/reference/leases.md: after a failover, every
///    timestamp is above every lease bound ever granted; and a term older than the grant's
///    must not serve any more);
/// 3. a grant's epoch is the timeline of the term that granted it.
pub fn check_leases(ts: &History, log: &LeaseLog) -> std::result::Result<LeaseReport, String> {
    let calls: Vec<_> = ts.calls().into_iter().filter(|c| c.is_ok()).collect();
    let origin = ts.origin();
    let rel = |t: Instant| -> String {
        if t >= origin {
            format!("+{:.1}ms", (t - origin).as_secs_f64() * 1e3)
        } else {
            format!("-{:.1}ms", (origin - t).as_secs_f64() * 1e3)
        }
    };
    // (1): calls by end, with the running maximum of their last value.
    let mut by_end: Vec<(Instant, i64)> =
        calls.iter().map(|c| (c.end, c.last().unwrap_or(0))).collect();
    by_end.sort_by_key(|x| x.0);
    let mut prefix_max = Vec::with_capacity(by_end.len());
    let mut m = i64::MIN;
    for &(_, last) in &by_end {
        m = m.max(last);
        prefix_max.push(m);
    }
    // (2): per label, calls by start, with the suffix minimum of their first value.
    let mut per_label: BTreeMap<String, (Vec<Instant>, Vec<i64>)> = BTreeMap::new();
    {
        let mut tmp: BTreeMap<String, Vec<(Instant, i64)>> = BTreeMap::new();
        for c in &calls {
            tmp.entry(c.node.clone()).or_default().push((c.start, c.first().unwrap_or(i64::MAX)));
        }
        for (label, mut v) in tmp {
            v.sort_by_key(|x| x.0);
            let mut suffix = vec![i64::MAX; v.len()];
            let mut m = i64::MAX;
            for i in (0..v.len()).rev() {
                m = m.min(v[i].1);
                suffix[i] = m;
            }
            per_label.insert(label, (v.iter().map(|x| x.0).collect(), suffix));
        }
    }
    let mut report = LeaseReport::default();
    for g in log.calls() {
        let Ok((id, bound, _expires, epoch)) = g.result else {
            report.err_grants += 1;
            continue;
        };
        report.ok_grants += 1;
        if g.renewal {
            report.renewals += 1;
        } else {
            report.acquires += 1;
        }
        report.terms.insert(g.node.clone());
        report.highest_bound = Some(report.highest_bound.map_or(bound, |b| b.max(bound)));
        if label_timeline(&g.node) != Some(epoch as i64) {
            return Err(format!(
                "lease {id} granted by {} during {}..{} has epoch {epoch}, not the term's timeline",
                g.node,
                rel(g.start),
                rel(g.end)
            ));
        }
        let n = by_end.partition_point(|x| x.0 < g.start);
        if n > 0 && physical(prefix_max[n - 1]) > bound {
            return Err(format!(
                "lease {id} granted by {} during {}..{} has bound {bound}, below physical {} of a timestamp ({}) returned before the grant began",
                g.node,
                rel(g.start),
                rel(g.end),
                physical(prefix_max[n - 1]),
                prefix_max[n - 1]
            ));
        }
        for (label, (starts, suffix)) in &per_label {
            if *label == g.node {
                continue;
            }
            let i = starts.partition_point(|&s| s <= g.end);
            if i < starts.len() {
                report.cross_term_pairs += (starts.len() - i) as u64;
                if physical(suffix[i]) <= bound {
                    return Err(format!(
                        "{label} served {} (physical {}) in a call that began after lease {id} (bound {bound}) was granted by {} during {}..{}",
                        suffix[i],
                        physical(suffix[i]),
                        g.node,
                        rel(g.start),
                        rel(g.end)
                    ));
                }
            }
        }
    }
    Ok(report)
}
