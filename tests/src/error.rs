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
