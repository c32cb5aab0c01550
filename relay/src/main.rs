//! `tsoracle-relay`: every committed row of every cluster's outbox in a tsoracle fleet,
//! exactly once, in the fleet's timestamp order (README, "Reading a fleet in order").
//!
//! Each round follows the documented protocol: the fleet's resolved timestamp `R_f` from the
//! oracle in a statement of its own (`SELECT tso_fleet_resolved()`), then, in later statements
//! (so in snapshots taken after it), every cluster's rows with `cursor < ts <= R_f`; merged,
//! written, synced; then `R_f` becomes the cursor. No transaction of any cluster may still
//! commit a row at or below `R_f`, so nothing is missed; nothing at or below the cursor is read
//! again, so nothing is emitted twice.

mod args;
mod cursor;
mod merge;
mod metrics;
mod pq;

use args::{exit, Config, Refusal};
use cursor::{open_output, Cursor};
use merge::{merge, Row};
use metrics::Metrics;
use std::fs::File;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Cursor(String),
    #[error("cannot connect to {0}")]
    Connect(String),
    #[error("--metrics-addr {0}")]
    Metrics(String),
    #[error("a row is not JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Data(String),
}

impl RelayError {
    fn exit_code(&self) -> u8 {
        match self {
            RelayError::Cursor(_) => exit::CURSOR_MISMATCH,
            RelayError::Connect(_) => exit::CANNOT_CONNECT,
            RelayError::Metrics(_) => exit::METRICS_UNAVAILABLE,
            RelayError::Io(_) | RelayError::Json(_) | RelayError::Data(_) => exit::FAILED,
        }
    }
}

/// The name the relay's sessions have on the servers, unless the connection string names one.
const APPLICATION_NAME: &str = "tsoracle-relay";

/// A connection made again after any error.
struct Conn {
    name: String,
    conninfo: String,
    client: Option<pq::Client>,
    /// Read from a primary only: a standby may not have replayed every row at or below `R_f`
    /// yet (its replay lags, or is paused), and the cursor would move past them for good.
    primary_only: bool,
}

impl Conn {
    fn new(name: &str, conninfo: &str, primary_only: bool) -> Self {
        Conn { name: name.into(), conninfo: conninfo.into(), client: None, primary_only }
    }

    /// A new connection, refused if it must reach a primary and reaches a standby.
    fn connect(&self) -> Result<pq::Client, String> {
        let mut c = pq::Client::connect(&self.conninfo, APPLICATION_NAME)
            .map_err(|e| format!("{}: {e}", self.name))?;
        if self.primary_only {
            let rows = c
                .query("SELECT pg_catalog.pg_is_in_recovery()", &[])
                .map_err(|e| format!("{}: {e}", self.name))?;
            if rows.first().and_then(|r| r.first()).is_some_and(|v| v.as_deref() == Some("t")) {
                return Err(format!(
                    "{}: it is a standby: the relay reads each cluster's primary only, which has every row at or below R_f (add target_session_attrs=read-write to its connection string)",
                    self.name
                ));
            }
        }
        Ok(c)
    }

    /// The connection (a new one if there is none).
    fn ensure(&mut self) -> Result<&mut pq::Client, String> {
        let client = match self.client.take() {
            Some(c) => c,
            None => self.connect()?,
        };
        Ok(self.client.insert(client))
    }

    fn query(&mut self, sql: &str, params: &[&str]) -> Result<pq::Rows, String> {
        let result = self.ensure()?.query(sql, params);
        result.map_err(|e| {
            self.client = None;
            format!("{}: {e}", self.name)
        })
    }
}

/// Column `col` of `row` as a number.
fn int_at(row: &[Option<String>], col: usize, what: &str) -> Result<Option<i64>, RelayError> {
    match row.get(col).and_then(|v| v.as_deref()) {
        None => Ok(None),
        Some(v) => v
            .parse()
            .map(Some)
            .map_err(|_| RelayError::Data(format!("{what} is not a bigint: {v:?}"))),
    }
}

enum Output {
    File(File),
    Stdout(std::io::Stdout),
}

impl Output {
    /// Write the round's lines, make them durable; the output's length after them.
    fn write(&mut self, text: &[u8]) -> Result<u64, RelayError> {
        match self {
            Output::File(f) => {
                f.write_all(text)?;
                f.sync_data()?;
                Ok(f.metadata()?.len())
            }
            Output::Stdout(s) => {
                let mut s = s.lock();
                s.write_all(text)?;
                s.flush()?;
                Ok(0)
            }
        }
    }
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Reach the oracle and every cluster's primary, retrying for up to `wait`: a relay whose
/// servers cannot be reached (a wrong address, an untrusted certificate, a standby) says so
/// and exits instead of waiting for ever; once started, it retries every error.
fn connect_all(
    oracle: &mut Conn,
    clusters: &mut [Conn],
    wait: Duration,
    pause: Duration,
    m: &Metrics,
) -> Result<(), RelayError> {
    let began = Instant::now();
    loop {
        let mut failed = None;
        for c in std::iter::once(&mut *oracle).chain(clusters.iter_mut()) {
            if let Err(why) = c.ensure() {
                failed = Some((c.name.clone(), why));
                break;
            }
        }
        let Some((source, why)) = failed else { return Ok(()) };
        m.error(&source, &why);
        if began.elapsed() >= wait {
            return Err(RelayError::Connect(why));
        }
        eprintln!("tsoracle-relay: cannot connect to {why}; retrying");
        std::thread::sleep(pause);
    }
}

fn run(a: Config) -> Result<(), RelayError> {
    let mut cursor = match &a.cursor {
        Some(p) => Cursor::load(p)?.unwrap_or_default(),
        None => Cursor::default(),
    };
    let mut output = match &a.output {
        Some(p) => Output::File(open_output(p, &cursor)?),
        None => Output::Stdout(std::io::stdout()),
    };
    let names: Vec<String> = a.clusters.iter().map(|c| c.name.clone()).collect();
    let m = Metrics::new(&names);
    m.start_at(cursor.resolved);
    if let Some(addr) = a.metrics_addr {
        let bound = m.serve(addr).map_err(|e| RelayError::Metrics(format!("{addr}: {e}")))?;
        eprintln!("tsoracle-relay: metrics at http://{bound}/metrics");
    }
    // R_f may come from a standby of the oracle (as far as it has replayed: an older R_f);
    // the rows only from each cluster's primary.
    let mut oracle = Conn::new("oracle", &a.oracle, false);
    let mut clusters: Vec<Conn> =
        a.clusters.iter().map(|c| Conn::new(&c.name, &c.conninfo, true)).collect();
    let pause = Duration::from_millis(a.interval_ms.clamp(100, 1000));
    connect_all(&mut oracle, &mut clusters, Duration::from_millis(a.connect_wait_ms), pause, &m)?;
    let (table, column) = (args::quote_ident(&a.table), args::quote_ident(&a.column));
    let select = format!(
        "SELECT {column}, pg_catalog.row_to_json(t)::pg_catalog.text FROM {table} AS t \
         WHERE {column} > $1 AND {column} <= $2 ORDER BY {column}"
    );
    let started = Instant::now();
    let mut emitted: u64 = 0;
    let mut last_progress: Option<Instant> = None;
    let mut first = true;
    let mut oracle_call: Option<String> = None;
    let retry = |source: &str, what: &str, why: &str| {
        eprintln!("tsoracle-relay: {what}: {why}; retrying");
        m.error(source, why);
    };
    loop {
        if a.until.is_some_and(|until| cursor.resolved >= until) {
            eprintln!(
                "tsoracle-relay: the cursor {} passed --until; {emitted} rows",
                cursor.resolved
            );
            return Ok(());
        }
        if !first {
            std::thread::sleep(Duration::from_millis(a.interval_ms));
        }
        first = false;
        // Where the extension lives on the oracle (looked up again after any error): its
        // functions are called by their qualified name, whatever the search_path holds.
        if oracle_call.is_none() {
            match oracle.query(
                "SELECT pg_catalog.quote_ident(n.nspname) FROM pg_catalog.pg_extension e \
                 JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace \
                 WHERE e.extname OPERATOR(pg_catalog.=) 'tsoracle'",
                &[],
            ) {
                Ok(rows) => match rows.first().and_then(|r| r.first().cloned().flatten()) {
                    // R_f, and the oracle's newest value (for the lag metric only).
                    Some(s) => {
                        oracle_call = Some(format!(
                            "SELECT {s}.tso_fleet_resolved(), (SELECT last_issued FROM {s}.tso_status())"
                        ))
                    }
                    None => {
                        let why = "the oracle has no extension tsoracle in this database";
                        retry("oracle", "cannot read R_f", why);
                        continue;
                    }
                },
                Err(why) => {
                    retry("oracle", "cannot reach the oracle", &why);
                    continue;
                }
            }
        }
        let Some(call) = oracle_call.as_deref() else { continue };
        // R_f, in a statement of its own.
        let (resolved, newest) = match oracle.query(call, &[]) {
            Ok(rows) => match rows.first() {
                Some(r) => (int_at(r, 0, "R_f")?.unwrap_or(0), int_at(r, 1, "last_issued")?),
                None => (0, None),
            },
            Err(why) => {
                retry("oracle", "cannot read the fleet's resolved timestamp", &why);
                oracle_call = None;
                continue;
            }
        };
        if let Some(newest) = newest {
            m.lag(metrics::physical_seconds(newest) - metrics::physical_seconds(resolved));
        }
        if resolved > cursor.resolved {
            // Then every cluster's rows in (cursor, R_f], in later statements.
            let (from, to) = (cursor.resolved.to_string(), resolved.to_string());
            let mut per_cluster = Vec::with_capacity(clusters.len());
            let mut failed = None;
            for c in &mut clusters {
                match c.query(&select, &[&from, &to]) {
                    Ok(rows) => {
                        let mut out = Vec::with_capacity(rows.len());
                        let what = format!("{} of {}", a.column, c.name);
                        for r in &rows {
                            let ts = int_at(r, 0, &what)?
                                .ok_or_else(|| RelayError::Data(format!("{what} is NULL")))?;
                            let json = r.get(1).cloned().flatten().unwrap_or_default();
                            out.push(Row { ts, json });
                        }
                        per_cluster.push(out);
                    }
                    Err(why) => {
                        failed = Some((c.name.clone(), why));
                        break;
                    }
                }
            }
            if let Some((source, why)) = failed {
                retry(&source, "cannot read the outbox of a cluster", &why);
                continue;
            }
            let mut text = Vec::new();
            let mut rows = vec![0u64; clusters.len()];
            for (c, row) in merge(per_cluster) {
                let line = serde_json::json!({
                    "ts": row.ts,
                    "cluster": a.clusters[c].name,
                    "row": serde_json::from_str::<serde_json::Value>(&row.json)?,
                });
                serde_json::to_writer(&mut text, &line)?;
                text.push(b'\n');
                rows[c] += 1;
            }
            let offset = output.write(&text)?;
            cursor = Cursor { resolved, offset };
            if let Some(p) = &a.cursor {
                cursor.save(p)?;
            }
            emitted += rows.iter().sum::<u64>();
            m.round(&names, &rows, cursor.resolved);
        }
        let every = Duration::from_millis(a.progress_ms);
        if a.progress_ms > 0 && last_progress.is_none_or(|t| t.elapsed() >= every) {
            last_progress = Some(Instant::now());
            let secs = started.elapsed().as_secs_f64().max(0.001);
            eprintln!(
                "tsoracle-relay: through {} ({} ms behind the clock): {emitted} rows, {:.0} rows/s",
                cursor.resolved,
                (now_ms() - metrics::physical_ms(cursor.resolved)).max(0),
                emitted as f64 / secs
            );
        }
    }
}

fn main() -> ExitCode {
    let config = match args::parse(std::env::args_os()) {
        Ok(c) => c,
        Err(Refusal::Show(text)) => {
            print!("{text}");
            if !text.ends_with('\n') {
                println!();
            }
            return ExitCode::from(exit::DONE);
        }
        Err(Refusal::Bad(why)) => {
            eprintln!("tsoracle-relay: {why}");
            return ExitCode::from(exit::BAD_ARGUMENTS);
        }
    };
    match run(config) {
        Ok(()) => ExitCode::from(exit::DONE),
        Err(e) => {
            eprintln!("tsoracle-relay: {}", e.to_string().replace('\n', " "));
            ExitCode::from(e.exit_code())
        }
    }
}
