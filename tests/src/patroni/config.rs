//! The Patroni configuration file of a member, rendered as the operations guide shows it. See the [module documentation](super).

use super::*;

/// Where one member lives: the inputs of [`render_config`].
#[derive(Clone, Debug)]
pub struct MemberConfig {
    pub scope: String,
    pub name: String,
    pub api_port: u16,
    pub pg_port: u16,
    /// `host:port` of the etcd client URL.
    pub etcd: String,
    pub data_dir: String,
    /// Directory of the Unix socket (Patroni's own connections) and of the pgpass file.
    pub run_dir: String,
    /// The PostgreSQL server binaries.
    pub bin_dir: String,
}

pub(super) fn yaml_scalar(v: &str) -> String {
    if !v.is_empty() && v.chars().all(|c| c.is_ascii_digit()) {
        v.to_string()
    } else {
        format!("'{}'", v.replace('\'', "''"))
    }
}

/// The Patroni configuration file of one member.
///
/// * `bootstrap.dcs` is the cluster-wide configuration, written to etcd by the member that
///   bootstraps: timings, `synchronous_mode`, `use_pg_rewind`, and the PostgreSQL parameters
///   every member runs with (among them `shared_preload_libraries: tsoracle`).
/// * `postgresql` is this member's: addresses, data directory, roles, `pg_hba` (trust on
///   loopback: a test cluster), local parameters (its socket directory, log format).
/// * `watchdog: off`: these machines have no watchdog device (see the README for production).
pub fn render_config(m: &MemberConfig, opts: &PatroniOpts) -> String {
    let mut params = String::new();
    for (k, v) in opts.all_parameters() {
        params.push_str(&format!("        {k}: {}\n", yaml_scalar(&v)));
    }
    format!(
        "\
scope: {scope}
namespace: /tsoracle/
name: {name}

log:
  level: INFO
  format: '%(asctime)s {name} %(levelname)s: %(message)s'

restapi:
  listen: 127.0.0.1:{api}
  connect_address: 127.0.0.1:{api}

{dcs}:
  hosts: {etcd}

bootstrap:
  dcs:
    ttl: {ttl}
    loop_wait: {loop_wait}
    retry_timeout: {retry_timeout}
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    synchronous_mode_strict: {strict}
    synchronous_node_count: 1
    failsafe_mode: false
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
{params}  initdb:
  - encoding: UTF8
  - locale: C
  - auth-local: trust
  - auth-host: trust

postgresql:
  listen: 127.0.0.1:{pg}
  connect_address: 127.0.0.1:{pg}
  data_dir: {data_dir}
  bin_dir: {bin_dir}
  pgpass: {run_dir}/pgpass
  use_unix_socket: true
  authentication:
    superuser:
      username: postgres
      password: postgres
    replication:
      username: replicator
      password: replicator
  parameters:
    unix_socket_directories: '{run_dir}'
    logging_collector: 'off'
    log_line_prefix: '%m [%p] {name} %b: '
    lc_messages: 'C'
  pg_hba:
  - local all all trust
  - local replication all trust
  - host all all 127.0.0.1/32 trust
  - host replication all 127.0.0.1/32 trust

watchdog:
  mode: 'off'

tags:
  nofailover: false
  noloadbalance: false
  clonefrom: false
  nosync: false
",
        scope = m.scope,
        name = m.name,
        api = m.api_port,
        dcs = match opts.dcs {
            Dcs::EtcdV2 => "etcd",
            Dcs::EtcdV3 => "etcd3",
        },
        etcd = m.etcd,
        ttl = opts.ttl,
        loop_wait = opts.loop_wait,
        retry_timeout = opts.retry_timeout,
        strict = opts.synchronous_mode_strict,
        pg = m.pg_port,
        data_dir = m.data_dir,
        bin_dir = m.bin_dir,
        run_dir = m.run_dir,
    )
}
