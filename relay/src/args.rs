//! The command line (clap): every flag also from an environment variable `TSORACLE_RELAY_*`,
//! the command line winning. Beyond what clap checks: an oracle and at least one cluster,
//! each cluster a name of its own, every connection string one libpq can read.

use crate::pq;
use clap::{ColorChoice, Parser};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

/// How the relay ends (docs/operations/relay.md, "Exit codes").
pub mod exit {
    /// `--until` was passed, or `--help`/`--version`.
    pub const DONE: u8 = 0;
    /// Anything else: the output or the cursor cannot be written, a row is not JSON.
    pub const FAILED: u8 = 1;
    /// A flag or variable is missing, unknown or malformed.
    pub const BAD_ARGUMENTS: u8 = 2;
    /// The oracle or a cluster could not be reached (or is a standby) within
    /// `--connect-wait-ms` of the start.
    pub const CANNOT_CONNECT: u8 = 3;
    /// The cursor file is not a cursor, or does not match the output file.
    pub const CURSOR_MISMATCH: u8 = 4;
    /// The metrics address cannot be listened on.
    pub const METRICS_UNAVAILABLE: u8 = 5;
}

const ABOUT: &str = "Emits every committed row of every cluster's outbox exactly once, in the \
fleet's timestamp order, as JSON lines {\"ts\": ..., \"cluster\": ..., \"row\": {...}}.";

const LONG_ABOUT: &str = "Emits every committed row of every cluster's outbox exactly once, in \
the fleet's timestamp order, as JSON lines {\"ts\": ..., \"cluster\": ..., \"row\": {...}}.

Each round it reads the fleet's resolved timestamp R_f from the oracle (tso_fleet_resolved(), \
in a statement of its own), then every cluster's rows with cursor < ts <= R_f, merged; then \
R_f is the cursor. It reads each cluster's primary only: a standby is refused.

Connection strings are libpq's, read as psql reads them: sslmode (disable, require, verify-ca, \
verify-full) with sslrootcert, sslcert and sslkey; passfile and ~/.pgpass; service; several \
hosts with target_session_attrs. Keep passwords out of them (a passfile).";

const AFTER_HELP: &str = "Exit codes: 0 done (--until passed), 1 failed (output or cursor \
not writable), 2 bad arguments, 3 cannot connect at the start, 4 the cursor file does not \
match the output, 5 the metrics address cannot be listened on.
See docs/operations/relay.md.";

/// A cluster of the fleet: its name in the output, and its connection string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    pub name: String,
    pub conninfo: String,
}

fn parse_cluster(v: &str) -> Result<Cluster, String> {
    let (name, conninfo) = v
        .split_once('=')
        .map(|(n, c)| (n.trim(), c.trim()))
        .filter(|(n, c)| !n.is_empty() && !n.contains(char::is_whitespace) && !c.is_empty())
        .ok_or_else(|| "takes NAME=CONNINFO".to_string())?;
    Ok(Cluster { name: name.into(), conninfo: conninfo.into() })
}

fn parse_addr(v: &str) -> Result<SocketAddr, String> {
    v.to_socket_addrs()
        .map_err(|e| format!("takes HOST:PORT ({e})"))?
        .next()
        .ok_or_else(|| "takes HOST:PORT (the host has no address)".to_string())
}

#[derive(Debug, Clone, Parser)]
#[command(
    name = "tsoracle-relay",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_help = AFTER_HELP,
    color = ColorChoice::Never
)]
pub struct Args {
    /// The oracle's libpq connection string (R_f is read there; a standby of the oracle
    /// serves an older R_f, which is safe).
    #[arg(long, env = "TSORACLE_RELAY_ORACLE", value_name = "CONNINFO", hide_env_values = true)]
    pub oracle: Option<String>,

    /// A cluster of the fleet and its primary's connection string; once per cluster. In the
    /// environment variable, clusters are separated by ';'.
    #[arg(
        long = "cluster",
        env = "TSORACLE_RELAY_CLUSTERS",
        value_name = "NAME=CONNINFO",
        value_parser = parse_cluster,
        value_delimiter = ';',
        hide_env_values = true
    )]
    pub clusters: Vec<Cluster>,

    /// The outbox table on every cluster (optionally schema.table).
    #[arg(long, env = "TSORACLE_RELAY_TABLE", value_name = "TABLE", default_value = "outbox")]
    pub table: String,

    /// Its timestamp column (bigint, DEFAULT tso_next()).
    #[arg(long, env = "TSORACLE_RELAY_COLUMN", value_name = "COLUMN", default_value = "ts")]
    pub column: String,

    /// Append to FILE (default: standard output). A restart cuts FILE back to what the cursor
    /// covers, so every row is in FILE exactly once.
    #[arg(long, env = "TSORACLE_RELAY_OUTPUT", value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Where the relay records how far it has emitted [default: FILE.cursor with --output;
    /// none for standard output].
    #[arg(long, env = "TSORACLE_RELAY_CURSOR", value_name = "FILE")]
    pub cursor: Option<PathBuf>,

    /// Milliseconds between rounds.
    #[arg(
        long,
        env = "TSORACLE_RELAY_INTERVAL_MS",
        value_name = "MS",
        default_value_t = 200,
        value_parser = clap::value_parser!(u64).range(1..=3_600_000)
    )]
    pub interval_ms: u64,

    /// Stop (exit 0) once the cursor has passed this timestamp.
    #[arg(long, env = "TSORACLE_RELAY_UNTIL", value_name = "TS", allow_negative_numbers = true)]
    pub until: Option<i64>,

    /// Serve Prometheus metrics at http://HOST:PORT/metrics (port 0: any free port; the
    /// address is logged).
    #[arg(long, env = "TSORACLE_RELAY_METRICS_ADDR", value_name = "HOST:PORT", value_parser = parse_addr)]
    pub metrics_addr: Option<SocketAddr>,

    /// Milliseconds between progress lines on standard error (0: none).
    #[arg(
        long,
        env = "TSORACLE_RELAY_PROGRESS_MS",
        value_name = "MS",
        default_value_t = 1000,
        value_parser = clap::value_parser!(u64).range(0..=86_400_000)
    )]
    pub progress_ms: u64,

    /// How long to keep trying, at the start, to reach the oracle and every cluster's primary
    /// before exiting with 3 (afterwards every error is retried).
    #[arg(
        long,
        env = "TSORACLE_RELAY_CONNECT_WAIT_MS",
        value_name = "MS",
        default_value_t = 30_000,
        value_parser = clap::value_parser!(u64).range(0..=86_400_000)
    )]
    pub connect_wait_ms: u64,
}

/// What the arguments say, checked: exit code 2 and one line if not.
#[derive(Debug, Clone)]
pub struct Config {
    pub oracle: String,
    pub clusters: Vec<Cluster>,
    pub table: String,
    pub column: String,
    pub output: Option<PathBuf>,
    pub cursor: Option<PathBuf>,
    pub interval_ms: u64,
    pub until: Option<i64>,
    pub metrics_addr: Option<SocketAddr>,
    pub progress_ms: u64,
    pub connect_wait_ms: u64,
}

/// Why the relay will not start with these arguments.
#[derive(Debug)]
pub enum Refusal {
    /// `--help` or `--version`: print this on standard output, exit 0.
    Show(String),
    /// One line for standard error, exit 2.
    Bad(String),
}

/// A clap error on one line: its first line, and the lines a colon leads to.
fn clap_line(e: &clap::Error) -> String {
    let text = e.to_string();
    let mut lines = text.lines().map(str::trim);
    let mut line = lines.next().unwrap_or_default().trim_start_matches("error: ").to_string();
    while line.ends_with(':') {
        match lines.next().filter(|l| !l.is_empty()) {
            Some(next) => line = format!("{line} {next}"),
            None => break,
        }
    }
    line
}

/// Parse `argv` (with the program name first) and the environment.
pub fn parse<I, T>(argv: I) -> Result<Config, Refusal>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let a = match Args::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => {
            use clap::error::ErrorKind;
            return Err(match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => Refusal::Show(e.to_string()),
                _ => Refusal::Bad(clap_line(&e)),
            });
        }
    };
    check(a).map_err(Refusal::Bad)
}

fn check(a: Args) -> Result<Config, String> {
    let oracle = a
        .oracle
        .filter(|o| !o.trim().is_empty())
        .ok_or("--oracle (or TSORACLE_RELAY_ORACLE) is required")?;
    if a.clusters.is_empty() {
        return Err(
            "at least one --cluster NAME=CONNINFO (or TSORACLE_RELAY_CLUSTERS) is required".into(),
        );
    }
    let mut names: Vec<&str> = a.clusters.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("two clusters are named {:?}: each needs a name of its own", w[0]));
    }
    pq::check_conninfo(&oracle).map_err(|e| format!("--oracle: {e}"))?;
    for c in &a.clusters {
        pq::check_conninfo(&c.conninfo).map_err(|e| format!("--cluster {}: {e}", c.name))?;
    }
    for (flag, v) in [("--table", &a.table), ("--column", &a.column)] {
        if v.is_empty() || v.split('.').any(str::is_empty) {
            return Err(format!("{flag} takes a name (or schema.name), got {v:?}"));
        }
    }
    let cursor = a.cursor.or_else(|| {
        a.output.as_ref().map(|o| {
            let mut c = o.clone().into_os_string();
            c.push(".cursor");
            c.into()
        })
    });
    Ok(Config {
        oracle,
        clusters: a.clusters,
        table: a.table,
        column: a.column,
        output: a.output,
        cursor,
        interval_ms: a.interval_ms,
        until: a.until,
        metrics_addr: a.metrics_addr,
        progress_ms: a.progress_ms,
        connect_wait_ms: a.connect_wait_ms,
    })
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
    use clap::CommandFactory;

    fn args(v: &[&str]) -> Result<Config, Refusal> {
        parse(std::iter::once("tsoracle-relay").chain(v.iter().copied()))
    }

    /// The one-line message of a refusal (panics on success or on --help).
    fn refused(v: &[&str]) -> String {
        match args(v) {
            Err(Refusal::Bad(why)) => {
                assert!(!why.contains('\n'), "one line: {why:?}");
                why
            }
            other => panic!("{v:?} was not refused: {other:?}"),
        }
    }

    #[test]
    fn the_command_is_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn every_flag_has_its_environment_variable() {
        let cmd = Args::command();
        for arg in cmd.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if ["help", "version"].contains(&long) {
                continue;
            }
            let env = arg.get_env().unwrap_or_else(|| panic!("--{long} has no variable"));
            let want = if long == "cluster" {
                "TSORACLE_RELAY_CLUSTERS".to_string()
            } else {
                format!("TSORACLE_RELAY_{}", long.to_uppercase().replace('-', "_"))
            };
            assert_eq!(env.to_string_lossy(), want, "--{long}");
        }
    }

    #[test]
    fn reads_clusters_and_defaults() {
        let a = args(&["--oracle", "port=1", "--cluster", "a=port=2 user=x", "--output", "/tmp/o"])
            .unwrap();
        assert_eq!(
            a.clusters,
            vec![Cluster { name: "a".into(), conninfo: "port=2 user=x".into() }]
        );
        assert_eq!(a.table, "outbox");
        assert_eq!(a.column, "ts");
        assert_eq!(a.interval_ms, 200);
        assert_eq!(a.connect_wait_ms, 30_000);
        assert_eq!(a.progress_ms, 1000);
        assert_eq!(a.metrics_addr, None);
        assert_eq!(a.cursor.unwrap(), PathBuf::from("/tmp/o.cursor"));
        let a = args(&[
            "--oracle",
            "postgresql://o/app?sslmode=verify-full",
            "--cluster",
            "a=host=x,y target_session_attrs=read-write;b=service=b",
            "--until",
            "-5",
            "--metrics-addr",
            "127.0.0.1:9300",
        ])
        .unwrap();
        assert_eq!(a.clusters.len(), 2);
        assert_eq!(a.clusters[1], Cluster { name: "b".into(), conninfo: "service=b".into() });
        assert_eq!(a.until, Some(-5));
        assert_eq!(a.metrics_addr, Some("127.0.0.1:9300".parse().unwrap()));
        assert_eq!(a.cursor, None, "standard output has no default cursor");
    }

    #[test]
    fn refuses_what_is_wrong_on_one_line() {
        assert!(refused(&["--cluster", "a=port=2"]).contains("--oracle"));
        assert!(refused(&["--oracle", "x=1"]).contains("--cluster"));
        assert!(refused(&["--oracle", "port=1", "--cluster", "=port=2"]).contains("NAME=CONNINFO"));
        assert!(refused(&["--oracle", "port=1", "--cluster", "a"]).contains("NAME=CONNINFO"));
        assert!(refused(&["--oracle", "port=1", "--cluster", "a=port=1", "--cluster", "a=port=2"])
            .contains("\"a\""));
        let c = ["--oracle", "port=1", "--cluster", "a=port=2"];
        let with = |more: &[&'static str]| -> Vec<&'static str> { [&c[..], more].concat() };
        assert!(refused(&with(&["--interval-ms", "soon"])).contains("--interval-ms"));
        assert!(refused(&with(&["--interval-ms", "0"])).contains("--interval-ms"));
        assert!(refused(&with(&["--until", "later"])).contains("--until"));
        assert!(refused(&with(&["--nope"])).contains("--nope"));
        assert!(refused(&with(&["--metrics-addr", "nowhere"])).contains("--metrics-addr"));
        assert!(refused(&with(&["--table", "a..b"])).contains("--table"));
        assert!(refused(&with(&["--oracle"])).contains("--oracle"));
        let bad = refused(&["--oracle", "port=1 sslmod=require", "--cluster", "a=port=2"]);
        assert!(bad.contains("--oracle") && bad.contains("sslmod"), "{bad}");
        let bad = refused(&["--oracle", "port=1", "--cluster", "a=host='x"]);
        assert!(bad.contains("--cluster a"), "{bad}");
    }

    #[test]
    fn help_and_version_are_shown() {
        match args(&["--help"]) {
            Err(Refusal::Show(text)) => {
                assert!(text.contains("Usage: tsoracle-relay"), "{text}");
                assert!(text.contains("TSORACLE_RELAY_CLUSTERS"), "{text}");
                assert!(text.contains("Exit codes"), "{text}");
            }
            other => panic!("--help: {other:?}"),
        }
        match args(&["--version"]) {
            Err(Refusal::Show(text)) => {
                assert_eq!(text.trim(), format!("tsoracle-relay {}", env!("CARGO_PKG_VERSION")))
            }
            other => panic!("--version: {other:?}"),
        }
    }

    #[test]
    fn quotes_identifiers() {
        assert_eq!(quote_ident("outbox"), "\"outbox\"");
        assert_eq!(quote_ident("app.out\"box"), "\"app\".\"out\"\"box\"");
    }
}
