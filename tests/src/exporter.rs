//! Prometheus's side: postgres_exporter (Debian's `prometheus-postgres-exporter` 0.11.1) run
//! against a test node with the queries the repository ships
//! (`contrib/prometheus/queries.yaml`, [`QUERIES_YAML`]), its `/metrics` scraped over HTTP and
//! parsed ([`Metrics`]), and `promtool` (Debian's `prometheus` 2.42) for the alert rules
//! ([`ALERT_RULES`], [`ALERT_RULES_TEST`]).
//!
//! # What runs
//!
//! One `prometheus-postgres-exporter` per [`Exporter`], in the foreground as a child of the
//! test, as the OS user that runs the servers, in a directory of its own under the test
//! directory. It connects to the node with `DATA_SOURCE_NAME` (as the role it is given, so a
//! test can prove the privileges the monitoring guide asks for are enough) and runs the
//! shipped queries only: `--disable-default-metrics --disable-settings-metrics` and the
//! default collectors (`database`, `bgwriter`) off. Like PgBouncer's configuration
//! ([`crate::pooler`]), the queries file is copied byte for byte into that directory first.
//! It listens on a free loopback port (the start is retried on another if it cannot bind).
//!
//! The exporter runs every query at every scrape (no caching), so a scrape shows the state of
//! the server at that moment.
//!
//! # Cleanup
//!
//! Dropping an [`Exporter`] SIGKILLs and reaps the process and deletes its directory (after a
//! panic it prints the tail of its log first; `TSORACLE_KEEP_FAILED=1` keeps the directory).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::error::HarnessError;
use crate::node::{make_base_dir, pg_user, pick_port, run_cmd, user_ids, Node};
use crate::patroni::http;
use crate::process::{chown, command_as, open_log, read_tail};
use crate::Result;

/// The postgres_exporter queries the repository ships.
pub const QUERIES_YAML: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../contrib/prometheus/queries.yaml");
/// The example alert rules the repository ships.
pub const ALERT_RULES: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../contrib/prometheus/tsoracle-alerts.yml");
/// Their unit tests, for `promtool test rules`.
pub const ALERT_RULES_TEST: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../contrib/prometheus/tsoracle-alerts.test.yml");
/// The exporter binary (`TSORACLE_POSTGRES_EXPORTER` overrides).
pub const EXPORTER_BIN: &str = "/usr/bin/prometheus-postgres-exporter";
/// The promtool binary (`TSORACLE_PROMTOOL` overrides).
pub const PROMTOOL_BIN: &str = "/usr/bin/promtool";
/// How long the exporter may take to answer its first scrape.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one scrape may take.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(20);

/// A running postgres_exporter (see the module documentation).
pub struct Exporter {
    name: String,
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
    log: PathBuf,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter").field("name", &self.name).field("port", &self.port).finish()
    }
}

impl Exporter {
    /// Start an exporter for database `postgres` of `node`, connecting as `user`; returns once
    /// it answers a scrape.
    pub fn start(name: &str, node: &Node, user: &str) -> Result<Exporter> {
        Exporter::start_in(name, node, user, "postgres")
    }

    /// [`Exporter::start`] for database `dbname` of `node`.
    pub fn start_in(name: &str, node: &Node, user: &str, dbname: &str) -> Result<Exporter> {
        let dsn = format!(
            "host=127.0.0.1 port={} user={user} dbname={dbname} sslmode=disable connect_timeout=5",
            node.port()
        );
        Exporter::start_as(name, None, &dsn, |queries, port| {
            vec![
                format!("--web.listen-address=127.0.0.1:{port}"),
                format!("--extend.query-path={}", queries.display()),
                "--disable-default-metrics".into(),
                "--disable-settings-metrics".into(),
                "--no-collector.database".into(),
                "--no-collector.bgwriter".into(),
                "--log.level=info".into(),
            ]
        })
    }

    /// Start an exporter as the OS user `os_user` (`None`: the servers' own) with
    /// `DATA_SOURCE_NAME` `dsn` and the arguments `args(queries, port)` gives for the copied
    /// queries file and the port it must listen on; returns once it answers a scrape (one
    /// that says `pg_up 0` too: an exporter that cannot log in still answers).
    pub fn start_as(
        name: &str,
        os_user: Option<&str>,
        dsn: &str,
        args: impl Fn(&std::path::Path, u16) -> Vec<String>,
    ) -> Result<Exporter> {
        let (uid, gid) = match os_user {
            Some(user) => user_ids(user)?,
            None => pg_user()?,
        };
        let dir = make_base_dir(&format!("exporter-{name}"), uid, gid)?;
        let mut exporter = Exporter {
            name: name.to_string(),
            log: dir.join("exporter.log"),
            port: pick_port()?,
            child: None,
            dir,
        };
        let shipped = fs::read_to_string(QUERIES_YAML)
            .map_err(|e| HarnessError::io(format!("read {QUERIES_YAML}"), e))?;
        let queries = exporter.dir.join("queries.yaml");
        fs::write(&queries, &shipped)
            .map_err(|e| HarnessError::io(format!("write {}", queries.display()), e))?;
        chown(&queries)?;
        let mut last = String::new();
        for attempt in 0..5 {
            if attempt > 0 {
                exporter.port = pick_port()?;
            }
            let argv = args(&queries, exporter.port);
            match exporter.try_start(dsn, &argv, (uid, gid))? {
                None => return Ok(exporter),
                Some(log) => last = log,
            }
        }
        Err(HarnessError::Other(format!(
            "exporter {name}: could not bind a port after 5 attempts; last log:\n{last}"
        )))
    }

    /// One start. `Ok(None)`: it answered a scrape; `Ok(Some(log))`: the port was busy.
    fn try_start(&mut self, dsn: &str, args: &[String], ids: (u32, u32)) -> Result<Option<String>> {
        let bin =
            std::env::var("TSORACLE_POSTGRES_EXPORTER").unwrap_or_else(|_| EXPORTER_BIN.into());
        let (out, err) = open_log(&self.log)?;
        let offset = fs::metadata(&self.log).map(|m| m.len()).unwrap_or(0);
        let mut cmd = command_as(&bin, &self.dir, true, ids);
        cmd.env("DATA_SOURCE_NAME", dsn).args(args).stdout(out).stderr(err);
        let mut child = cmd.spawn().map_err(|e| HarnessError::io(format!("spawn {bin}"), e))?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) =
                child.try_wait().map_err(|e| HarnessError::io("wait exporter", e))?
            {
                let log = self.new_log(offset);
                if log.contains("address already in use") {
                    return Ok(Some(log));
                }
                return Err(HarnessError::Other(format!(
                    "exporter {}: exited during start ({status}):\n{log}",
                    self.name
                )));
            }
            if let Ok((200, body)) = http(self.port, "GET", "/metrics", Duration::from_secs(5)) {
                if body.contains("pg_up") {
                    self.child = Some(child);
                    return Ok(None);
                }
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(HarnessError::Timeout(format!(
                    "exporter {}: no scrape answered after {START_TIMEOUT:?}:\n{}",
                    self.name,
                    self.new_log(offset)
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn new_log(&self, offset: u64) -> String {
        let text = fs::read(&self.log).unwrap_or_default();
        String::from_utf8_lossy(&text[(offset as usize).min(text.len())..]).into_owned()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `GET /metrics`, parsed.
    pub fn scrape(&self) -> Result<Metrics> {
        match http(self.port, "GET", "/metrics", SCRAPE_TIMEOUT)? {
            (200, body) => Metrics::parse(&body),
            (status, body) => Err(HarnessError::Other(format!(
                "exporter {}: GET /metrics answered {status}: {body}",
                self.name
            ))),
        }
    }

    /// The last `lines` lines of the exporter's log.
    pub fn log_tail(&self, lines: usize) -> String {
        read_tail(&self.log, lines)
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        if panicking {
            eprintln!(
                "----- exporter {} (port {}): last 30 lines of {} -----\n{}\n----- end of exporter {} -----",
                self.name,
                self.port,
                self.log.display(),
                self.log_tail(30),
                self.name
            );
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let keep = panicking && std::env::var_os("TSORACLE_KEEP_FAILED").is_some_and(|v| v == "1");
        if keep {
            eprintln!("[harness] keeping exporter {} at {}", self.name, self.dir.display());
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

// ================================================================================ /metrics

/// One sample of a scrape.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A scrape in the Prometheus text format (version 0.0.4): every `# TYPE` and every sample.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// Metric name → its `# TYPE` (`counter`, `gauge`, ...).
    pub types: BTreeMap<String, String>,
    pub samples: Vec<Sample>,
}

impl Metrics {
    /// Parse a scrape; a line that is not a comment, a `# TYPE` or a sample is an error.
    pub fn parse(text: &str) -> Result<Metrics> {
        let mut m = Metrics::default();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest
                    .split_once(' ')
                    .ok_or_else(|| HarnessError::Other(format!("bad TYPE line {line:?}")))?;
                m.types.insert(name.to_string(), kind.trim().to_string());
            } else if !line.starts_with('#') {
                m.samples.push(parse_sample(line)?);
            }
        }
        Ok(m)
    }

    /// The `# TYPE` of `name`.
    pub fn kind(&self, name: &str) -> Option<&str> {
        self.types.get(name).map(String::as_str)
    }

    /// Every sample of `name`.
    pub fn samples_of(&self, name: &str) -> Vec<&Sample> {
        self.samples.iter().filter(|s| s.name == name).collect()
    }

    /// The value of `name`, which must have exactly one sample.
    pub fn value(&self, name: &str) -> Result<f64> {
        match self.samples_of(name).as_slice() {
            [s] => Ok(s.value),
            other => Err(HarnessError::Other(format!(
                "{name}: {} samples in the scrape: {other:?}",
                other.len()
            ))),
        }
    }

    /// The names of every sample starting with `prefix`.
    pub fn names_with_prefix(&self, prefix: &str) -> BTreeSet<String> {
        self.samples.iter().filter(|s| s.name.starts_with(prefix)).map(|s| s.name.clone()).collect()
    }
}

/// `name{label="value",...} value [timestamp]`; label values with `\\`, `\"` and `\n` escapes.
fn parse_sample(line: &str) -> Result<Sample> {
    let bad = |why: &str| HarnessError::Other(format!("bad sample line ({why}): {line:?}"));
    let name_end = line.find(['{', ' ']).ok_or_else(|| bad("no value"))?;
    let name = line[..name_end].to_string();
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices().peekable();
        let mut end = None;
        loop {
            // Skip separators, then read `key="value"` or the closing brace.
            while let Some(&(_, c)) = chars.peek() {
                if c == ',' || c == ' ' {
                    chars.next();
                } else {
                    break;
                }
            }
            match chars.peek() {
                Some(&(i, '}')) => {
                    end = Some(i);
                    break;
                }
                None => break,
                _ => {}
            }
            let mut key = String::new();
            for (_, c) in chars.by_ref() {
                if c == '=' {
                    break;
                }
                key.push(c);
            }
            if chars.next().map(|(_, c)| c) != Some('"') {
                return Err(bad("label value not quoted"));
            }
            let mut value = String::new();
            loop {
                match chars.next().map(|(_, c)| c) {
                    Some('\\') => match chars.next().map(|(_, c)| c) {
                        Some('n') => value.push('\n'),
                        Some(c) => value.push(c),
                        None => return Err(bad("dangling escape")),
                    },
                    Some('"') => break,
                    Some(c) => value.push(c),
                    None => return Err(bad("unterminated label value")),
                }
            }
            labels.insert(key.trim().to_string(), value);
        }
        let end = end.ok_or_else(|| bad("no closing brace"))?;
        rest = &body[end + 1..];
    }
    let value_text = rest.split_whitespace().next().ok_or_else(|| bad("no value"))?;
    let value = match value_text {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v.parse().map_err(|_| bad("value is not a number"))?,
    };
    Ok(Sample { name, labels, value })
}

// ================================================================================ promtool

/// Run `promtool` with `args`; its output when it exits 0.
pub fn promtool(args: &[&str]) -> Result<String> {
    let bin = std::env::var("TSORACLE_PROMTOOL").unwrap_or_else(|_| PROMTOOL_BIN.into());
    let mut cmd = Command::new(&bin);
    cmd.args(args);
    run_cmd(cmd, Duration::from_secs(60))
}
