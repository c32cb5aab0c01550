//! The harness's error type.

use std::fmt::Write as _;

#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("I/O error: {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("command failed: {cmd} ({status})\n{output}")]
    Command { cmd: String, status: String, output: String },
    #[error("timed out: {0}")]
    Timeout(String),
    #[error("{}", pg_error_string(.0))]
    Pg(#[from] postgres::Error),
    #[error("{0}")]
    Other(String),
}

impl HarnessError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        HarnessError::Io { context: context.into(), source }
    }

    /// The SQLSTATE, when this is a server error.
    pub fn sqlstate(&self) -> Option<&postgres::error::SqlState> {
        match self {
            HarnessError::Pg(e) => e.code(),
            _ => None,
        }
    }
}

/// A readable one-line description of a `postgres::Error`: for server errors
/// `SQLSTATE 57P03: message (DETAIL: ..) (HINT: ..)`, otherwise the error with its source chain
/// (`postgres::Error`'s own `Display` says only "db error" / "error connecting to server").
pub fn pg_error_string(e: &postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut s = format!("SQLSTATE {}: {}: {}", db.code().code(), db.severity(), db.message());
        if let Some(d) = db.detail() {
            let _ = write!(s, " (DETAIL: {d})");
        }
        if let Some(h) = db.hint() {
            let _ = write!(s, " (HINT: {h})");
        }
        return s;
    }
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(cause) = src {
        let _ = write!(s, ": {cause}");
        src = cause.source();
    }
    s
}

/// Whether a session is useless after `e`, so that a load drops it and connects again — the
/// one classifier of every load and wait loop of the harness:
/// - the connection is closed, or the error did not come from the server (I/O, protocol);
/// - `08xxx` (connection exception);
/// - `25006` (read-only transaction): the session is on a standby — a demoted primary, or a
///   host that was never the primary — and a load that wants the primary must look again;
/// - `57xxx` (operator intervention: shutdown, crash, terminated backend) but `57P03`
///   (tsoracle not serving *yet*: the same session serves once the worker does) and `57014`
///   (a cancel or a statement timeout ends the statement, not the session).
pub fn session_broken(c: &postgres::Client, e: &postgres::Error) -> bool {
    c.is_closed()
        || e.as_db_error().is_none()
        || e.code().is_some_and(|s| {
            let s = s.code();
            s.starts_with("08")
                || s == "25006"
                || (s.starts_with("57") && s != "57P03" && s != "57014")
        })
}
