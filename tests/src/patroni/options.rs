//! Settings of a Patroni cluster. See the [module documentation](super).

/// Settings of a Patroni cluster (see [`render_config`] for where each one goes).
#[derive(Clone, Debug)]
pub struct PatroniOpts {
    /// Number of members (2 or more).
    pub members: usize,
    /// Patroni's `ttl` (seconds): the leader key expires this long after the leader's last
    /// update; only then may another member take over.
    pub ttl: u32,
    /// Patroni's `loop_wait` (seconds): the leader updates its key once per loop.
    pub loop_wait: u32,
    /// Patroni's `retry_timeout` (seconds): a leader that cannot update its key for this long
    /// demotes itself. Patroni wants `loop_wait + 2 * retry_timeout <= ttl`.
    pub retry_timeout: u32,
    /// Patroni's `synchronous_mode_strict`.
    pub synchronous_mode_strict: bool,
    /// How Patroni talks to etcd.
    pub dcs: Dcs,
    /// Cluster-wide PostgreSQL parameters (`bootstrap.dcs.postgresql.parameters`), applied
    /// after [`DEFAULT_PARAMETERS`] (same name: replaced).
    pub parameters: Vec<(String, String)>,
}

/// The cluster-wide PostgreSQL parameters of the harness (`bootstrap.dcs.postgresql.parameters`);
/// [`PatroniOpts::all_parameters`] adds `tsoracle.ha_ttl_ms` (Patroni's `ttl` in ms, so that the
/// worker warns if `window_ahead_ms` is too large for it).
///
/// A primary issues timestamps only until `tsoracle.window_ahead_ms` after the start of its last
/// commit its synchronous standby acknowledged; with the default `ttl 16`, `loop_wait 1`,
/// `retry_timeout 5`: `window_ahead_ms = 1 s < ttl - loop_wait - retry_timeout = 10 s`, leaving
/// 9 s for clock error (docs/operations/patroni.md). `tsoracle.extension_timeout_ms` is how long a
/// caller of a primary that can no longer commit waits before it gets 57P03 (and reconnects,
/// which finds the new leader).
pub const DEFAULT_PARAMETERS: &[(&str, &str)] = &[
    ("shared_preload_libraries", "tsoracle"),
    ("tsoracle.window_ahead_ms", "1000"),
    ("tsoracle.extension_timeout_ms", "1000"),
    ("synchronous_commit", "on"),
    ("wal_level", "replica"),
    ("hot_standby", "on"),
    ("wal_log_hints", "on"),
    ("max_connections", "100"),
    ("max_wal_senders", "10"),
    ("max_replication_slots", "10"),
    ("wal_keep_size", "128MB"),
    ("shared_buffers", "32MB"),
];

/// Patroni's etcd client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dcs {
    /// `etcd:` (etcd's v2 API, served by etcd 3.4 with `--enable-v2`). Patroni renews its
    /// leader key with a compare-and-swap on its own name (`prevValue`), so a leader that
    /// wakes after its key expired cannot take the key back from a new leader.
    EtcdV2,
    /// `etcd3:` (the v3 API). In Patroni 3.0.2 (Debian bookworm) a leader that wakes after
    /// its lease expired grants itself a new lease and writes the leader key unconditionally,
    /// taking the key back from the member elected meanwhile, which then demotes itself and
    /// is rewound: its whole term is discarded (fixed in Patroni 3.0.3, patroni/patroni#2689).
    EtcdV3,
}

impl Default for PatroniOpts {
    fn default() -> Self {
        PatroniOpts {
            members: 3,
            ttl: 16,
            loop_wait: 1,
            retry_timeout: 5,
            synchronous_mode_strict: false,
            dcs: Dcs::EtcdV2,
            parameters: Vec::new(),
        }
    }
}

impl PatroniOpts {
    pub fn parameter(mut self, name: &str, value: impl ToString) -> Self {
        self.parameters.push((name.to_string(), value.to_string()));
        self
    }

    /// [`DEFAULT_PARAMETERS`], then `tsoracle.ha_ttl_ms`, `ha_loop_wait_ms` and
    /// `ha_retry_timeout_ms` (`ttl`, `loop_wait`, `retry_timeout` in ms), then
    /// [`PatroniOpts::parameters`] applied in order.
    pub fn all_parameters(&self) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> =
            DEFAULT_PARAMETERS.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        v.insert(2, ("tsoracle.ha_ttl_ms".to_string(), (u64::from(self.ttl) * 1000).to_string()));
        v.insert(
            3,
            (
                "tsoracle.ha_loop_wait_ms".to_string(),
                (u64::from(self.loop_wait) * 1000).to_string(),
            ),
        );
        v.insert(
            4,
            (
                "tsoracle.ha_retry_timeout_ms".to_string(),
                (u64::from(self.retry_timeout) * 1000).to_string(),
            ),
        );
        for (k, val) in &self.parameters {
            match v.iter_mut().find(|(name, _)| name == k) {
                Some(slot) => slot.1 = val.clone(),
                None => v.push((k.clone(), val.clone())),
            }
        }
        v
    }
}
