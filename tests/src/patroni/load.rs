//! A load of timestamps and sequence blocks that follows the leader. See the [module documentation](super).

use super::*;
use crate::load::LoadStats;

/// Options of a [`PatroniLoad`].
#[derive(Clone, Debug)]
pub struct PatroniLoadOptions {
    pub threads: usize,
    /// Keys of `tso_seq`.
    pub seq_keys: Vec<String>,
    /// Share of `tso_seq` calls; of the rest, half `tso_next()`, half `tso_next_batch(k)`.
    pub seq_share: f64,
    pub max_batch: i32,
    pub max_seq: i32,
    pub statement_timeout_ms: u64,
    /// Sleep after a failed connection or a broken session.
    pub backoff: Duration,
}

impl Default for PatroniLoadOptions {
    fn default() -> Self {
        PatroniLoadOptions {
            threads: 16,
            seq_keys: vec!["k0".into(), "k1".into(), "k2".into()],
            seq_share: 0.3,
            max_batch: 64,
            max_seq: 5,
            statement_timeout_ms: 20_000,
            backoff: Duration::from_millis(20),
        }
    }
}

/// Where a load thread connects.
#[derive(Clone, Debug)]
pub enum Target {
    /// The leader, found through the hosts in order (read-write); reconnect after errors.
    Leader(Vec<HostPort>),
    /// One member directly, connected once: the thread ends when that session breaks.
    Direct { hosts: Vec<HostPort>, port: u16 },
}

/// Client threads calling `tso_next()`, `tso_next_batch(k)` and `tso_seq(key, k)`, recording
/// every call (errors too, with the count asked for) under the session's label.
pub struct PatroniLoad {
    stop: Arc<AtomicBool>,
    handles: Vec<JoinHandle<LoadStats>>,
}

impl PatroniLoad {
    pub fn start(
        target: Target,
        opts: PatroniLoadOptions,
        ts: &History,
        dense: &DenseHistory,
    ) -> PatroniLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let handles = (0..opts.threads)
            .map(|i| {
                let (target, opts, ts, dense, stop) =
                    (target.clone(), opts.clone(), ts.clone(), dense.clone(), stop.clone());
                std::thread::Builder::new()
                    .name(format!("patroni-load-{i}"))
                    .spawn(move || load_worker(target, opts, ts, dense, stop))
                    .expect("spawn a load thread")
            })
            .collect();
        PatroniLoad { stop, handles }
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Stop and wait for the threads (a thread blocked on a frozen server waits for it).
    pub fn stop_and_join(mut self) -> LoadStats {
        self.stop();
        let mut total = LoadStats::default();
        for h in self.handles.drain(..) {
            match h.join() {
                Ok(s) => total.merge(s),
                Err(p) => std::panic::resume_unwind(p),
            }
        }
        total
    }
}

impl Drop for PatroniLoad {
    fn drop(&mut self) {
        // Not joined: a thread may be blocked on a frozen server until the cluster is torn down.
        self.stop.store(true, Ordering::SeqCst);
    }
}

pub(super) fn connect_target(
    target: &Target,
    statement_timeout_ms: u64,
) -> Result<(Client, String)> {
    let (mut c, hosts) = match target {
        Target::Leader(hosts) => {
            (connect_read_write(hosts, HOST_CONNECT_TIMEOUT, statement_timeout_ms)?, hosts)
        }
        Target::Direct { hosts, port } => {
            (connect_one(*port, true, HOST_CONNECT_TIMEOUT, statement_timeout_ms)?, hosts)
        }
    };
    let label = session_label(&mut c, hosts)?;
    Ok((c, label))
}

pub(super) fn load_worker(
    target: Target,
    opts: PatroniLoadOptions,
    ts: History,
    dense: DenseHistory,
    stop: Arc<AtomicBool>,
) -> LoadStats {
    let mut rng = SplitMix64::from_entropy();
    let mut stats = LoadStats::default();
    let direct = matches!(target, Target::Direct { .. });
    let mut conn: Option<(Client, String)> = None;
    let mut connected_once = false;
    while !stop.load(Ordering::SeqCst) {
        let Some((client, label)) = conn.as_mut() else {
            if direct && connected_once {
                break; // a direct session is never replaced
            }
            match connect_target(&target, opts.statement_timeout_ms) {
                Ok(c) => {
                    stats.connects += 1;
                    connected_once = true;
                    conn = Some(c);
                }
                Err(e) => {
                    stats.connect_failures += 1;
                    stats.note(format!("connect: {e}"));
                    if direct {
                        break;
                    }
                    std::thread::sleep(opts.backoff);
                }
            }
            continue;
        };
        let start = Instant::now();
        if !opts.seq_keys.is_empty() && rng.chance(opts.seq_share) {
            let key =
                &opts.seq_keys[rng.range_inclusive(0, opts.seq_keys.len() as i64 - 1) as usize];
            let k = rng.range_inclusive(1, opts.max_seq as i64) as i32;
            let res = client
                .query_one("SELECT tso_seq($1::text, $2::int)", &[key, &k])
                .and_then(|row| row.try_get::<_, i64>(0));
            let end = Instant::now();
            match res {
                Ok(first) => {
                    stats.ok_calls += 1;
                    dense.record_ok(start, end, label, key, first, k as i64);
                }
                Err(e) => {
                    stats.err_calls += 1;
                    let msg = pg_error_string(&e);
                    stats.note(msg.clone());
                    dense.record_err(start, end, label, key, msg, k as i64);
                    if session_broken(client, &e) {
                        conn = None;
                        std::thread::sleep(opts.backoff);
                    } else if e.code() == Some(&SqlState::CANNOT_CONNECT_NOW) {
                        std::thread::sleep(opts.backoff);
                    }
                }
            }
        } else {
            let k: i32 = if rng.chance(0.5) {
                1
            } else {
                rng.range_inclusive(1, opts.max_batch as i64) as i32
            };
            let res = if k == 1 {
                client.query_one("SELECT tso_next()", &[])
            } else {
                client.query_one("SELECT tso_next_batch($1)", &[&k])
            }
            .and_then(|row| row.try_get::<_, i64>(0));
            let end = Instant::now();
            match res {
                Ok(first) => {
                    stats.ok_calls += 1;
                    ts.record_ok(start, end, label, first, k as i64);
                }
                Err(e) => {
                    stats.err_calls += 1;
                    let msg = pg_error_string(&e);
                    stats.note(msg.clone());
                    ts.record_err(start, end, label, msg, k as i64);
                    if session_broken(client, &e) {
                        conn = None;
                        std::thread::sleep(opts.backoff);
                    } else if e.code() == Some(&SqlState::CANNOT_CONNECT_NOW) {
                        std::thread::sleep(opts.backoff);
                    }
                }
            }
        }
    }
    stats
}
