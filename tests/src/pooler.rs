//! PgBouncer (Debian's `pgbouncer` 1.18) in front of test nodes, run with the configuration
//! the repository ships (`contrib/pgbouncer/pgbouncer.ini`, [`PGBOUNCER_INI`]).
//!
//! # What runs
//!
//! One `pgbouncer` process, in the foreground as a child of the test, as the OS user that runs
//! the servers (`postgres`, `TSORACLE_PG_USER` overrides: PgBouncer refuses to run as root),
//! in a directory of its own under the test directory (like a node's). It reads a file the
//! harness writes there, `pgbouncer.ini`: the shipped file line for line, except that
//!
//! - the machine-local settings ([`LOCAL_SETTINGS`]: `listen_addr = 127.0.0.1`, a free
//!   `listen_port`, an empty `unix_socket_dir`, and `auth_file`, `logfile`, `pidfile` in the
//!   directory) get this PgBouncer's values where the shipped file sets them;
//! - `[databases]` holds the test's entries ([`PgBouncerOpts::database`], e.g.
//!   `tx = host=127.0.0.1 port=<node> dbname=postgres pool_size=4`) instead of the shipped `*`;
//! - `stats_users` names the first user, so [`PgBouncer::show_config`] can read `SHOW CONFIG`.
//!
//! so every other setting of the shipped file applies, and `the_pooler_runs_the_shipped_
//! configuration` checks it against `SHOW CONFIG`. (An earlier harness wrote `%include
//! <shipped file>` and set the local settings in a `[pgbouncer]` section after it: PgBouncer
//! 1.18 then ran with its defaults — session pooling, `auth_type = md5` — not the file's.) A
//! database entry may set pool options of its own (`pool_size`, `pool_mode`), as PgBouncer
//! allows per database.
//!
//! Clients authenticate to PgBouncer with SCRAM-SHA-256 (the shipped `auth_type`) against
//! the users and passwords of [`PgBouncerOpts::user`] in `auth_file`; PgBouncer connects to the
//! node as the same user (the harness's nodes trust loopback connections).
//!
//! # Ports
//!
//! Chosen like the nodes' ([`pick_port`]); if PgBouncer cannot bind its port (a race with
//! another process), the start is retried on a fresh one.
//!
//! # Clients
//!
//! PgBouncer 1.18 refuses the startup parameter `options`, so pooled connections carry no
//! `-c statement_timeout`: [`create_role`] gives the role the pooler's clients log in as a
//! `statement_timeout` of [`STATEMENT_TIMEOUT_MS`] on the server instead, which bounds every
//! call made through the pooler. In transaction pooling a client has a server connection for
//! one transaction only, so loads call with unnamed statements ([`crate::Endpoint::pooled`]).
//!
//! # Cancels
//!
//! [`PgBouncer::psql`] runs `psql` through the pooler and [`Psql::interrupt`] sends it SIGINT,
//! as Ctrl-C does: psql sends the cancel request with libpq's `PQcancel`, which keeps the
//! cancel connection open until the other end closes it. PgBouncer 1.18 forwards a cancel
//! request to the server over a new server connection, and drops it if the client's cancel
//! connection has closed by then — which the `postgres` crate's `cancel_query` does at once
//! (it shuts the connection down after writing), so its cancels do not get through.
//!
//! # Cleanup
//!
//! Dropping a [`PgBouncer`] (also while a test panics) SIGKILLs the process, reaps it and
//! deletes the directory; after a panic it first prints the tail of PgBouncer's log, and with
//! `TSORACLE_KEEP_FAILED=1` keeps the directory. The process also gets `PR_SET_PDEATHSIG`, so
//! it dies with the test.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use postgres::{Client, NoTls};

use crate::error::HarnessError;
use crate::load::Endpoint;
use crate::node::{make_base_dir, pg_bin_dir, pg_user, pick_port, scrub_env, Node};
use crate::process::{chown, open_log, read_tail, server_command};
use crate::Result;

/// The configuration the repository ships, which the pooler runs with.
pub const PGBOUNCER_INI: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../contrib/pgbouncer/pgbouncer.ini");
/// The settings of [`PGBOUNCER_INI`] the harness gives values of its own: those that name a
/// machine's addresses, ports and paths.
pub const LOCAL_SETTINGS: &[&str] =
    &["listen_addr", "listen_port", "unix_socket_dir", "auth_file", "logfile", "pidfile"];
/// The PgBouncer binary (`TSORACLE_PGBOUNCER` overrides).
pub const PGBOUNCER_BIN: &str = "/usr/sbin/pgbouncer";
/// The `statement_timeout` [`create_role`] gives the pooler's roles.
pub const STATEMENT_TIMEOUT_MS: u64 = 60_000;
/// How long PgBouncer may take to accept connections.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Lines of PgBouncer's log printed when a test panics.
pub const LOG_TAIL_LINES: usize = 60;

/// What a [`PgBouncer`] serves: its database entries and its users.
#[derive(Clone, Debug, Default)]
pub struct PgBouncerOpts {
    databases: Vec<(String, String)>,
    users: Vec<(String, String)>,
}

impl PgBouncerOpts {
    pub fn new() -> Self {
        Self::default()
    }

    /// A database entry `name` for the database `postgres` of `node`, with extra PgBouncer
    /// options for this entry (e.g. `pool_size=4`, `pool_mode=session`; empty: the shipped
    /// file's).
    pub fn database(mut self, name: &str, node: &Node, options: &str) -> Self {
        let entry = format!("host=127.0.0.1 port={} dbname=postgres {options}", node.port())
            .trim()
            .to_string();
        self.databases.push((name.to_string(), entry));
        self
    }

    /// A user PgBouncer authenticates (SCRAM) with `password`.
    pub fn user(mut self, name: &str, password: &str) -> Self {
        self.users.push((name.to_string(), password.to_string()));
        self
    }
}

/// A running PgBouncer (see the module documentation).
pub struct PgBouncer {
    name: String,
    /// The user (and password) of `stats_users`.
    stats_user: (String, String),
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
    log: PathBuf,
    stderr: PathBuf,
}

impl std::fmt::Debug for PgBouncer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBouncer").field("name", &self.name).field("port", &self.port).finish()
    }
}

/// `"` doubled, as PgBouncer's `auth_file` quotes names and passwords.
fn auth_quote(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// The key and value of a `key = value` line of a PgBouncer ini file (not a comment, a section
/// header or a blank line).
fn setting_line(line: &str) -> Option<(&str, &str)> {
    let t = line.trim();
    if t.is_empty() || t.starts_with([';', '#', '[']) {
        return None;
    }
    t.split_once('=').map(|(k, v)| (k.trim(), v.trim()))
}

/// The settings of `section` (e.g. `"[pgbouncer]"`) in a PgBouncer ini text, in file order.
pub fn section_settings(text: &str, section: &str) -> Vec<(String, String)> {
    let mut current = "";
    let mut out = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            current = t;
        } else if current == section {
            out.extend(setting_line(line).map(|(k, v)| (k.to_string(), v.to_string())));
        }
    }
    out
}

/// `shipped` with `local` settings given these values (each must be set there, in
/// `[pgbouncer]`), its `[databases]` entries replaced by `databases`, and `stats_users`
/// added: the file a test's PgBouncer runs (see the module documentation).
pub fn local_config(
    shipped: &str,
    databases: &[(String, String)],
    local: &[(&str, String)],
    stats_user: &str,
) -> Result<String> {
    let mut out =
        String::from(";; written by the tsoracle-tests harness (tests/src/pooler.rs) from\n");
    out.push_str(&format!(";; {PGBOUNCER_INI}: local settings and [databases] replaced\n"));
    let (mut section, mut seen) = (String::new(), Vec::new());
    let mut sections = Vec::new();
    for line in shipped.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            section = t.to_string();
            sections.push(section.clone());
            out.push_str(line);
            out.push('\n');
            match t {
                "[databases]" => {
                    for (db, entry) in databases {
                        out.push_str(&format!("{db} = {entry}\n"));
                    }
                }
                "[pgbouncer]" => out.push_str(&format!("stats_users = {stats_user}\n")),
                _ => {}
            }
            continue;
        }
        let key = setting_line(line).map(|(k, _)| k);
        if key.is_some() && section == "[databases]" {
            continue;
        }
        match key.and_then(|k| local.iter().find(|(l, _)| *l == k)) {
            Some((k, v)) if section == "[pgbouncer]" => {
                out.push_str(&format!("{k} = {v}\n"));
                seen.push(*k);
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    let missing: Vec<&str> = local.iter().map(|(k, _)| *k).filter(|k| !seen.contains(k)).collect();
    let sections_missing =
        ["[databases]", "[pgbouncer]"].iter().any(|s| !sections.iter().any(|have| have == s));
    if !missing.is_empty() || sections_missing {
        return Err(HarnessError::Other(format!(
            "{PGBOUNCER_INI} must have [databases] and [pgbouncer] and set {missing:?} in [pgbouncer]"
        )));
    }
    Ok(out)
}

fn write_owned(path: &Path, text: &str) -> Result<()> {
    fs::write(path, text).map_err(|e| HarnessError::io(format!("write {}", path.display()), e))?;
    chown(path)
}

impl PgBouncer {
    /// Write the configuration and start PgBouncer; returns once it accepts connections.
    pub fn start(name: &str, opts: PgBouncerOpts) -> Result<PgBouncer> {
        if opts.databases.is_empty() || opts.users.is_empty() {
            return Err(HarnessError::Other("PgBouncer needs a database and a user".into()));
        }
        let (uid, gid) = pg_user()?;
        let dir = make_base_dir(&format!("pgbouncer-{name}"), uid, gid)?;
        let mut bouncer = PgBouncer {
            name: name.to_string(),
            stats_user: opts.users[0].clone(),
            log: dir.join("pgbouncer.log"),
            stderr: dir.join("pgbouncer.stderr"),
            port: pick_port()?,
            child: None,
            dir,
        };
        let shipped = fs::read_to_string(PGBOUNCER_INI)
            .map_err(|e| HarnessError::io(format!("read {PGBOUNCER_INI}"), e))?;
        let users: String = opts
            .users
            .iter()
            .map(|(u, p)| format!("{} {}\n", auth_quote(u), auth_quote(p)))
            .collect();
        let userlist = bouncer.dir.join("userlist.txt");
        write_owned(&userlist, &users)?;
        let mut last = String::new();
        for attempt in 0..5 {
            if attempt > 0 {
                bouncer.port = pick_port()?;
            }
            bouncer.write_config(&opts, &shipped, &userlist)?;
            match bouncer.try_start()? {
                None => return Ok(bouncer),
                Some(log) => last = log,
            }
        }
        Err(HarnessError::Other(format!(
            "pgbouncer {name}: could not bind a port after 5 attempts; last output:\n{last}"
        )))
    }

    fn write_config(&self, opts: &PgBouncerOpts, shipped: &str, userlist: &Path) -> Result<()> {
        let local = [
            ("listen_addr", "127.0.0.1".to_string()),
            ("listen_port", self.port.to_string()),
            ("unix_socket_dir", String::new()),
            ("auth_file", userlist.display().to_string()),
            ("logfile", self.log.display().to_string()),
            ("pidfile", self.dir.join("pgbouncer.pid").display().to_string()),
        ];
        debug_assert!(local.iter().map(|(k, _)| *k).eq(LOCAL_SETTINGS.iter().copied()));
        let text = local_config(shipped, &opts.databases, &local, &self.stats_user.0)?;
        write_owned(&self.config_path(), &text)
    }

    /// One start. `Ok(None)`: accepting connections; `Ok(Some(output))`: the port was busy.
    fn try_start(&mut self) -> Result<Option<String>> {
        let offset = fs::metadata(&self.log).map(|m| m.len()).unwrap_or(0);
        let bin = std::env::var("TSORACLE_PGBOUNCER").unwrap_or_else(|_| PGBOUNCER_BIN.into());
        let (out, err) = open_log(&self.stderr)?;
        let mut cmd = server_command(&bin, &self.dir, true)?;
        cmd.arg(self.config_path()).stdout(out).stderr(err);
        let mut child = cmd.spawn().map_err(|e| HarnessError::io(format!("spawn {bin}"), e))?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) =
                child.try_wait().map_err(|e| HarnessError::io("wait pgbouncer", e))?
            {
                let output = format!("{}\n{}", self.new_log(offset), read_tail(&self.stderr, 20));
                if output.contains("Address already in use") {
                    return Ok(Some(output));
                }
                return Err(HarnessError::Other(format!(
                    "pgbouncer {}: exited during start ({status}):\n{output}",
                    self.name
                )));
            }
            // "process up" is logged once the listening sockets are open.
            if self.new_log(offset).contains("process up")
                && std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            {
                self.child = Some(child);
                return Ok(None);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(HarnessError::Timeout(format!(
                    "pgbouncer {}: not accepting connections after {START_TIMEOUT:?}:\n{}",
                    self.name,
                    self.new_log(offset)
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn new_log(&self, offset: u64) -> String {
        let text = fs::read(&self.log).unwrap_or_default();
        String::from_utf8_lossy(&text[(offset as usize).min(text.len())..]).into_owned()
    }

    /// The file PgBouncer was started with (the shipped one with the local settings).
    pub fn config_path(&self) -> PathBuf {
        self.dir.join("pgbouncer.ini")
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `SHOW CONFIG` of the running PgBouncer (its admin console, as the `stats_users` user):
    /// setting name to value.
    pub fn show_config(&self) -> Result<std::collections::BTreeMap<String, String>> {
        let (user, password) = &self.stats_user;
        let mut c = self.connect("pgbouncer", user, password)?;
        let mut out = std::collections::BTreeMap::new();
        for m in c.simple_query("SHOW CONFIG")? {
            if let postgres::SimpleQueryMessage::Row(r) = m {
                if let (Some(k), Some(v)) = (r.get(0), r.get(1)) {
                    out.insert(k.to_string(), v.to_string());
                }
            }
        }
        Ok(out)
    }

    /// PgBouncer's process ID.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// libpq connection string for database entry `db` as `user`.
    pub fn conninfo(&self, db: &str, user: &str, password: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={user} password={password} dbname={db} connect_timeout=5",
            self.port
        )
    }

    /// An endpoint for the loads ([`Endpoint::pooled`]).
    pub fn endpoint(&self, db: &str, user: &str, password: &str) -> Endpoint {
        Endpoint::pooled(&format!("{}/{db}", self.name), &self.conninfo(db, user, password))
    }

    /// One connection through the pooler (no startup `options`: see the module documentation).
    pub fn connect(&self, db: &str, user: &str, password: &str) -> Result<Client> {
        let mut cfg = postgres::Config::new();
        cfg.host("127.0.0.1")
            .port(self.port)
            .user(user)
            .password(password)
            .dbname(db)
            .application_name("tsoracle-tests")
            .connect_timeout(Duration::from_secs(5));
        Ok(cfg.connect(NoTls)?)
    }

    /// Start `psql` (from the node's binaries, [`pg_bin_dir`]) through the pooler as `user`,
    /// running each of `commands` (`-c`, in order, going on after an error) with verbose
    /// errors (the SQLSTATE in each `ERROR:` line), unaligned tuples-only output.
    pub fn psql(&self, db: &str, user: &str, password: &str, commands: &[&str]) -> Result<Psql> {
        let mut cmd = Command::new(pg_bin_dir().join("psql"));
        scrub_env(&mut cmd);
        cmd.env("PGPASSWORD", password)
            .args(["-X", "-A", "-t", "-v", "VERBOSITY=verbose", "-h", "127.0.0.1", "-p"])
            .arg(self.port.to_string())
            .args(["-U", user, "-d", db]);
        for c in commands {
            cmd.arg("-c").arg(c);
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| HarnessError::io("spawn psql", e))?;
        let reader = |pipe: Option<Box<dyn Read + Send>>| {
            pipe.map(|mut p| {
                std::thread::spawn(move || {
                    let mut v = Vec::new();
                    let _ = p.read_to_end(&mut v);
                    v
                })
            })
        };
        let stdout = reader(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
        let stderr = reader(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
        Ok(Psql { child: Some(child), stdout, stderr })
    }

    /// The last `lines` lines of PgBouncer's log.
    pub fn log_tail(&self, lines: usize) -> String {
        read_tail(&self.log, lines)
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        if panicking {
            eprintln!(
                "----- pgbouncer {} (port {}): last {LOG_TAIL_LINES} lines of {} -----\n{}\n{}\n----- end of pgbouncer {} -----",
                self.name,
                self.port,
                self.log.display(),
                self.log_tail(LOG_TAIL_LINES),
                read_tail(&self.stderr, 10),
                self.name
            );
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let keep = panicking && std::env::var_os("TSORACLE_KEEP_FAILED").is_some_and(|v| v == "1");
        if keep {
            eprintln!("[harness] keeping pgbouncer {} at {}", self.name, self.dir.display());
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// A `psql` run through the pooler (see [`PgBouncer::psql`]).
pub struct Psql {
    child: Option<Child>,
    stdout: Option<JoinHandle<Vec<u8>>>,
    stderr: Option<JoinHandle<Vec<u8>>>,
}

/// How a [`Psql`] ended.
#[derive(Debug)]
pub struct PsqlOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Psql {
    /// SIGINT, as Ctrl-C would: psql sends a cancel request for its running statement to the
    /// pooler with libpq's `PQcancel`, which waits until the other end closes the connection.
    pub fn interrupt(&self) -> Result<()> {
        let child = self.child.as_ref().ok_or_else(|| HarnessError::Other("psql ended".into()))?;
        // SAFETY: kill(2) on our own child, not yet reaped (so its pid is not reused).
        if unsafe { libc::kill(child.id() as i32, libc::SIGINT) } != 0 {
            return Err(HarnessError::io("kill -INT psql", std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Wait (bounded) for psql to exit; its output.
    pub fn wait(mut self, timeout: Duration) -> Result<PsqlOutput> {
        let mut child =
            self.child.take().ok_or_else(|| HarnessError::Other("psql ended".into()))?;
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = child.try_wait().map_err(|e| HarnessError::io("wait psql", e))? {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(HarnessError::Timeout(format!("psql still running after {timeout:?}")));
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let text = |h: Option<JoinHandle<Vec<u8>>>| {
            String::from_utf8_lossy(&h.and_then(|h| h.join().ok()).unwrap_or_default()).into_owned()
        };
        Ok(PsqlOutput {
            status,
            stdout: text(self.stdout.take()),
            stderr: text(self.stderr.take()),
        })
    }
}

impl Drop for Psql {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Create the login role `role` the pooler's clients use, a member of `member_of`, with a
/// `statement_timeout` of [`STATEMENT_TIMEOUT_MS`] (their connections cannot carry one: see
/// the module documentation). Run as a superuser on the node, not through the pooler.
pub fn create_role(c: &mut Client, role: &str, member_of: &[&str]) -> Result<()> {
    c.batch_execute(&format!(
        "CREATE ROLE {role} LOGIN; ALTER ROLE {role} SET statement_timeout = {STATEMENT_TIMEOUT_MS}"
    ))?;
    for group in member_of {
        c.batch_execute(&format!("GRANT {group} TO {role}"))?;
    }
    Ok(())
}
