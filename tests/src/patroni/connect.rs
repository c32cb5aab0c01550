//! Connections that find the leader the way applications do, and session labels. See the [module documentation](super).

use super::*;

/// One host of a multi-host target.
#[derive(Clone, Debug)]
pub struct HostPort {
    pub name: String,
    pub port: u16,
}

/// Connect to the first host (in order) that accepts a read-write session, each attempt
/// bounded by `per_host` like libpq's `connect_timeout` (see the module documentation).
/// `statement_timeout_ms` is set for the session.
pub fn connect_read_write(
    hosts: &[HostPort],
    per_host: Duration,
    statement_timeout_ms: u64,
) -> Result<Client> {
    let mut errors = Vec::new();
    for h in hosts {
        match connect_one(h.port, true, per_host, statement_timeout_ms) {
            Ok(c) => return Ok(c),
            Err(e) => errors.push(format!("{}: {e}", h.name)),
        }
    }
    Err(HarnessError::Other(format!("no read-write host: {}", errors.join("; "))))
}

/// One bounded connection attempt to `127.0.0.1:port` as `postgres` (read-write only if
/// asked); the attempt runs in a helper thread that is abandoned on timeout.
pub fn connect_one(
    port: u16,
    read_write: bool,
    timeout: Duration,
    statement_timeout_ms: u64,
) -> Result<Client> {
    let mut cfg = postgres::Config::new();
    cfg.host("127.0.0.1")
        .port(port)
        .user("postgres")
        .dbname("postgres")
        .application_name("tsoracle-patroni")
        .connect_timeout(timeout)
        .options(&format!("-c statement_timeout={statement_timeout_ms}"));
    if read_write {
        cfg.target_session_attrs(postgres::config::TargetSessionAttrs::ReadWrite);
    }
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(format!("connect-{port}"))
        .spawn(move || {
            let _ = tx.send(cfg.connect(NoTls));
        })
        .map_err(|e| HarnessError::io("spawn connect thread", e))?;
    match rx.recv_timeout(timeout) {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => {
            Err(HarnessError::Timeout(format!("connect to port {port}: no answer in {timeout:?}")))
        }
    }
}

/// `pgN/tlT`: the member behind this session and the timeline it is primary on.
pub fn session_label(
    c: &mut Client,
    hosts: &[HostPort],
) -> std::result::Result<String, postgres::Error> {
    let r = c.query_one(
        "SELECT inet_server_port(), ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int",
        &[],
    )?;
    let port: i32 = r.try_get(0)?;
    let tl: i32 = r.try_get(1)?;
    let name = hosts
        .iter()
        .find(|h| i32::from(h.port) == port)
        .map(|h| h.name.clone())
        .unwrap_or_else(|| format!("port{port}"));
    Ok(format!("{name}/tl{tl}"))
}

/// The timeline of a label `pgN/tlT`.
pub fn label_timeline(label: &str) -> Option<i64> {
    label.rsplit_once("/tl")?.1.parse().ok()
}

/// The member of a label `pgN/tlT`.
pub fn label_member(label: &str) -> &str {
    label.split_once('/').map_or(label, |(m, _)| m)
}
