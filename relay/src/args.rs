//! The command line.

use crate::RelayError;
use std::path::PathBuf;

pub const USAGE: &str =
    "usage: tsoracle-relay --oracle CONNINFO --cluster NAME=CONNINFO [--cluster NAME=CONNINFO ...]
                      [--table outbox] [--column ts] [--output FILE] [--cursor FILE]
                      [--interval-ms 200] [--until TS]

Emits every committed row of every cluster's outbox exactly once, in the fleet's timestamp
order, as JSON lines {\"ts\": ..., \"cluster\": ..., \"row\": {...}}: each round it reads the
fleet's resolved timestamp R_f from the oracle (tso_fleet_resolved(), in a statement of its
own), then every cluster's rows with cursor < ts <= R_f, merged; then R_f is the cursor.
--output FILE: append to FILE; the cursor (default FILE.cursor) records how far FILE is
written, and a restart cuts FILE back to it, so every row is in FILE exactly once.
Standard output: the cursor is saved after each round is flushed.
--until TS: stop once the cursor has passed TS.";

#[derive(Debug, Clone)]
pub struct Cluster {
    pub name: String,
    pub conninfo: String,
}

#[derive(Debug, Clone)]
pub struct Args {
    pub oracle: String,
    pub clusters: Vec<Cluster>,
    pub table: String,
    pub column: String,
    pub output: Option<PathBuf>,
    pub cursor: Option<PathBuf>,
    pub interval_ms: u64,
    pub until: Option<i64>,
}

fn bad(why: String) -> RelayError {
    RelayError::Args(why)
}

pub fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args, RelayError> {
    let mut a = Args {
        oracle: String::new(),
        clusters: Vec::new(),
        table: "outbox".into(),
        column: "ts".into(),
        output: None,
        cursor: None,
        interval_ms: 200,
        until: None,
    };
    while let Some(flag) = argv.next() {
        let mut value = || argv.next().ok_or_else(|| bad(format!("{flag} needs a value")));
        match flag.as_str() {
            "--oracle" => a.oracle = value()?,
            "--cluster" => {
                let v = value()?;
                let (name, conninfo) = v
                    .split_once('=')
                    .filter(|(n, c)| !n.is_empty() && !n.contains(' ') && !c.is_empty())
                    .ok_or_else(|| bad(format!("--cluster takes NAME=CONNINFO, got {v:?}")))?;
                a.clusters.push(Cluster { name: name.into(), conninfo: conninfo.into() });
            }
            "--table" => a.table = value()?,
            "--column" => a.column = value()?,
            "--output" => a.output = Some(value()?.into()),
            "--cursor" => a.cursor = Some(value()?.into()),
            "--interval-ms" => {
                let v = value()?;
                a.interval_ms = v
                    .parse()
                    .map_err(|_| bad(format!("--interval-ms takes milliseconds, got {v:?}")))?;
            }
            "--until" => {
                let v = value()?;
                a.until = Some(
                    v.parse().map_err(|_| bad(format!("--until takes a timestamp, got {v:?}")))?,
                );
            }
            "-h" | "--help" => return Err(RelayError::Help),
            other => return Err(bad(format!("unknown argument {other:?}"))),
        }
    }
    if a.oracle.is_empty() {
        return Err(bad("--oracle is required".into()));
    }
    if a.clusters.is_empty() {
        return Err(bad("at least one --cluster is required".into()));
    }
    let mut names: Vec<&str> = a.clusters.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    if names.windows(2).any(|w| w[0] == w[1]) {
        return Err(bad("each --cluster needs a name of its own".into()));
    }
    if a.cursor.is_none() {
        a.cursor = a.output.as_ref().map(|o| {
            let mut c = o.clone().into_os_string();
            c.push(".cursor");
            c.into()
        });
    }
    Ok(a)
}

/// `name` (optionally `schema.name`) as a quoted SQL identifier.
pub fn quote_ident(name: &str) -> String {
    name.split('.')
        .map(|part| format!("\"{}\"", part.replace('"', "\"\"")))
        .collect::<Vec<_>>()
        .join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Result<Args, RelayError> {
        parse(v.iter().map(|s| s.to_string()))
    }

    #[test]
    fn reads_clusters_and_defaults() {
        let a = args(&["--oracle", "port=1", "--cluster", "a=port=2 user=x", "--output", "/tmp/o"])
            .unwrap();
        assert_eq!(a.clusters[0].name, "a");
        assert_eq!(a.clusters[0].conninfo, "port=2 user=x");
        assert_eq!(a.table, "outbox");
        assert_eq!(a.cursor.unwrap(), PathBuf::from("/tmp/o.cursor"));
    }

    #[test]
    fn refuses_what_is_wrong() {
        assert!(args(&["--cluster", "a=port=2"]).is_err(), "no oracle");
        assert!(args(&["--oracle", "x"]).is_err(), "no cluster");
        assert!(args(&["--oracle", "x", "--cluster", "=port=2"]).is_err(), "no name");
        assert!(args(&["--oracle", "x", "--cluster", "a"]).is_err(), "no connection string");
        assert!(args(&["--oracle", "x", "--cluster", "a=1", "--cluster", "a=2"]).is_err());
        assert!(args(&["--oracle", "x", "--cluster", "a=1", "--interval-ms", "soon"]).is_err());
        assert!(args(&["--oracle", "x", "--cluster", "a=1", "--nope"]).is_err());
    }

    #[test]
    fn quotes_identifiers() {
        assert_eq!(quote_ident("outbox"), "\"outbox\"");
        assert_eq!(quote_ident("app.out\"box"), "\"app\".\"out\"\"box\"");
    }
}
