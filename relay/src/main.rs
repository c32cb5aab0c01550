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

use cursor::{open_output, Cursor};
use merge::{merge, Row};
use postgres::{Client, NoTls};
use std::fs::File;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("{0}\n\n{usage}", usage = args::USAGE)]
    Args(String),
    #[error("{}", args::USAGE)]
    Help,
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Cursor(String),
    #[error("a row is not JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// A connection made again after any error.
struct Conn {
    name: String,
    conninfo: String,
    client: Option<Client>,
    /// Read from a primary only: a standby may not have replayed every row at or below `R_f`
    /// yet (its replay lags, or is paused), and the cursor would move past them for good.
    primary_only: bool,
}

impl Conn {
    fn new(name: &str, conninfo: &str, primary_only: bool) -> Self {
        Conn { name: name.into(), conninfo: conninfo.into(), client: None, primary_only }
    }

    /// A new connection, refused if it must reach a primary and reaches a standby.
    fn connect(&self) -> Result<Client, String> {
        let mut c = Client::connect(&self.conninfo, NoTls).map_err(|e| {
            let why = e.as_db_error().map_or_else(|| e.to_string(), |d| d.message().to_string());
            format!("{}: {why}", self.name)
        })?;
        if self.primary_only {
            let standby = c
                .query_one("SELECT pg_catalog.pg_is_in_recovery()", &[])
                .map_err(|e| format!("{}: {e}", self.name))?
                .get::<_, bool>(0);
            if standby {
                return Err(format!(
                    "{} is a standby: the relay reads each cluster's primary only, which has every row at or below R_f (add target_session_attrs=read-write to its connection string)",
                    self.name
                ));
            }
        }
        Ok(c)
    }

    fn query(
        &mut self,
        sql: &str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<Vec<postgres::Row>, String> {
        let result = match &mut self.client {
            Some(c) => c.query(sql, params),
            None => self.client.insert(self.connect()?).query(sql, params),
        };
        result.map_err(|e| {
            self.client = None;
            let why = e.as_db_error().map_or_else(|| e.to_string(), |d| d.message().to_string());
            format!("{}: {why}", self.name)
        })
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

fn run() -> Result<(), RelayError> {
    let a = args::parse(std::env::args().skip(1))?;
    let mut cursor = match &a.cursor {
        Some(p) => Cursor::load(p)?.unwrap_or_default(),
        None => Cursor::default(),
    };
    let mut output = match &a.output {
        Some(p) => Output::File(open_output(p, &cursor)?),
        None => Output::Stdout(std::io::stdout()),
    };
    // R_f may come from a standby of the oracle (as far as it has replayed: an older R_f);
    // the rows only from each cluster's primary.
    let mut oracle = Conn::new("oracle", &a.oracle, false);
    let mut clusters: Vec<Conn> =
        a.clusters.iter().map(|c| Conn::new(&c.name, &c.conninfo, true)).collect();
    let (table, column) = (args::quote_ident(&a.table), args::quote_ident(&a.column));
    let select = format!(
        "SELECT {column}, pg_catalog.row_to_json(t)::pg_catalog.text FROM {table} AS t \
         WHERE {column} > $1 AND {column} <= $2 ORDER BY {column}"
    );
    let started = Instant::now();
    let mut emitted: u64 = 0;
    let mut last_progress = Instant::now() - Duration::from_secs(60);
    let mut first = true;
    let mut oracle_call: Option<String> = None;
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
                Ok(rows) => match rows.first() {
                    Some(r) => {
                        oracle_call =
                            Some(format!("SELECT {}.tso_fleet_resolved()", r.get::<_, String>(0)))
                    }
                    None => {
                        eprintln!("tsoracle-relay: the oracle has no extension tsoracle in this database; retrying");
                        continue;
                    }
                },
                Err(why) => {
                    eprintln!("tsoracle-relay: cannot reach the oracle: {why}; retrying");
                    continue;
                }
            }
        }
        let Some(call) = oracle_call.as_deref() else { continue };
        // R_f, in a statement of its own.
        let resolved = match oracle.query(call, &[]) {
            Ok(rows) => rows.first().map_or(0, |r| r.get::<_, i64>(0)),
            Err(why) => {
                eprintln!(
                    "tsoracle-relay: cannot read the fleet's resolved timestamp: {why}; retrying"
                );
                oracle_call = None;
                continue;
            }
        };
        if resolved > cursor.resolved {
            // Then every cluster's rows in (cursor, R_f], in later statements.
            let mut per_cluster = Vec::with_capacity(clusters.len());
            let mut failed = None;
            for c in &mut clusters {
                match c.query(&select, &[&cursor.resolved, &resolved]) {
                    Ok(rows) => per_cluster.push(
                        rows.iter()
                            .map(|r| Row { ts: r.get(0), json: r.get(1) })
                            .collect::<Vec<_>>(),
                    ),
                    Err(why) => {
                        failed = Some(why);
                        break;
                    }
                }
            }
            if let Some(why) = failed {
                eprintln!("tsoracle-relay: cannot read the outbox of {why}; retrying the round");
                continue;
            }
            let mut text = Vec::new();
            let mut rows = 0u64;
            for (c, row) in merge(per_cluster) {
                let line = serde_json::json!({
                    "ts": row.ts,
                    "cluster": a.clusters[c].name,
                    "row": serde_json::from_str::<serde_json::Value>(&row.json)?,
                });
                serde_json::to_writer(&mut text, &line)?;
                text.push(b'\n');
                rows += 1;
            }
            let offset = output.write(&text)?;
            cursor = Cursor { resolved, offset };
            if let Some(p) = &a.cursor {
                cursor.save(p)?;
            }
            emitted += rows;
        }
        if last_progress.elapsed() >= Duration::from_secs(1) {
            last_progress = Instant::now();
            let secs = started.elapsed().as_secs_f64().max(0.001);
            eprintln!(
                "tsoracle-relay: through {} ({} ms behind the clock): {emitted} rows, {:.0} rows/s",
                cursor.resolved,
                (now_ms() - (cursor.resolved >> 18)).max(0),
                emitted as f64 / secs
            );
        }
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(RelayError::Help) => {
            println!("{}", args::USAGE);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tsoracle-relay: {e}");
            ExitCode::from(2)
        }
    }
}
