//! A connection to another PostgreSQL server through libpq (the `pq-sys` bindings), for a
//! member's worker and its oracle (docs/fleet.md): non-blocking from the first byte, so that
//! the worker waits on its latch and the connection's socket together, and in pipeline mode,
//! so that several round trips may be in flight on it at once.
//!
//! libpq is the client PostgreSQL's own tools use: a member's `tsoracle.oracle` takes every
//! connection parameter they take (several hosts with `target_session_attrs=read-write`, a
//! passfile, `sslmode=verify-full` with its certificates), read the way they read them.
//!
//! Only the worker's main thread calls this; nothing here calls into the server.

use pq_sys as pq;
use std::ffi::{c_char, c_int, CStr, CString};

/// What went wrong with the connection, in libpq's words.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LibpqError {
    #[error("{0}")]
    BadConninfo(String),
    #[error("{0}")]
    Connection(String),
}

/// Check a connection string the way libpq reads it, and give it back with any password
/// replaced by `********` (for `tso_member_status()` and the log).
pub fn checked_conninfo(conninfo: &str) -> Result<String, LibpqError> {
    let c = CString::new(conninfo)
        .map_err(|_| LibpqError::BadConninfo("the connection string contains a NUL byte".into()))?;
    let mut err: *mut c_char = std::ptr::null_mut();
    // SAFETY: a NUL-terminated string; libpq returns an array it allocated (or NULL with an
    // error message it allocated), both freed below with its own functions.
    let options = unsafe { pq::PQconninfoParse(c.as_ptr(), &mut err) };
    if options.is_null() {
        let why = if err.is_null() {
            "out of memory".to_string()
        } else {
            // SAFETY: a NUL-terminated message from libpq, freed right after the copy.
            let text = unsafe { CStr::from_ptr(err) }.to_string_lossy().trim_end().to_string();
            // SAFETY: allocated by libpq for us.
            unsafe { pq::PQfreemem(err.cast()) };
            text
        };
        return Err(LibpqError::BadConninfo(why));
    }
    let mut shown = Vec::new();
    // SAFETY: the array ends with an entry whose keyword is NULL; every string in it is
    // NUL-terminated and owned by the array until PQconninfoFree.
    unsafe {
        let mut o = options;
        while !(*o).keyword.is_null() {
            if !(*o).val.is_null() {
                let key = CStr::from_ptr((*o).keyword).to_string_lossy().into_owned();
                let val = if key == "password" {
                    "********".to_string()
                } else {
                    CStr::from_ptr((*o).val).to_string_lossy().into_owned()
                };
                shown.push(format!("{key}={}", quoted(&val)));
            }
            o = o.add(1);
        }
        pq::PQconninfoFree(options);
    }
    Ok(shown.join(" "))
}

/// Keywords whose values say nothing about where the oracle is or who connects to it (modes,
/// timeouts, protocol versions): every other value of a connection string is hidden from a
/// role that may not read it (`guc::shown`), a keyword libpq adds later included.
const HARMLESS: &[&str] = &[
    "channel_binding",
    "client_encoding",
    "connect_timeout",
    "gssdelegation",
    "gssencmode",
    "keepalives",
    "keepalives_count",
    "keepalives_idle",
    "keepalives_interval",
    "load_balance_hosts",
    "replication",
    "require_auth",
    "ssl_max_protocol_version",
    "ssl_min_protocol_version",
    "sslcertmode",
    "sslcompression",
    "sslmode",
    "sslnegotiation",
    "sslsni",
    "target_session_attrs",
    "tcp_user_timeout",
];

/// The parts of a connection string a role that may not read it must not see: each value
/// (each host and port of a list) but those of [`HARMLESS`] keywords. A string libpq cannot
/// read gives every word of it, keywords too.
pub fn conninfo_parts(conninfo: &str) -> Vec<String> {
    let words = |v: &str| -> Vec<String> {
        v.split(|c: char| c.is_whitespace() || ",='\\\"".contains(c))
            .filter(|w| w.len() >= 2)
            .map(str::to_string)
            .collect()
    };
    let Ok(c) = CString::new(conninfo) else {
        return words(conninfo);
    };
    let mut err: *mut c_char = std::ptr::null_mut();
    // SAFETY: a NUL-terminated string; libpq returns an array it allocated (or NULL with an
    // error message it allocated), both freed below with its own functions.
    let options = unsafe { pq::PQconninfoParse(c.as_ptr(), &mut err) };
    if options.is_null() {
        if !err.is_null() {
            // SAFETY: allocated by libpq for us.
            unsafe { pq::PQfreemem(err.cast()) };
        }
        return words(conninfo);
    }
    let mut parts = Vec::new();
    // SAFETY: the array ends with an entry whose keyword is NULL; every string in it is
    // NUL-terminated and owned by the array until PQconninfoFree.
    unsafe {
        let mut o = options;
        while !(*o).keyword.is_null() {
            if !(*o).val.is_null() {
                let key = CStr::from_ptr((*o).keyword).to_string_lossy();
                if !HARMLESS.contains(&key.as_ref()) {
                    let val = CStr::from_ptr((*o).val).to_string_lossy().into_owned();
                    parts.extend(
                        val.split(',').map(str::trim).filter(|v| !v.is_empty()).map(str::to_string),
                    );
                    parts.push(val);
                }
            }
            o = o.add(1);
        }
        pq::PQconninfoFree(options);
    }
    parts
}

fn quoted(v: &str) -> String {
    if !v.is_empty() && v.chars().all(|c| c.is_ascii_alphanumeric() || "-_.,:/".contains(c)) {
        v.to_string()
    } else {
        format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"))
    }
}

/// Where a connection attempt stands after one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Wait until the socket is readable, then step again.
    Read,
    /// Wait until the socket is writable, then step again.
    Write,
    /// Connected.
    Done,
}

/// One connection (closed when dropped).
pub struct Conn {
    raw: *mut pq::PGconn,
}

impl Drop for Conn {
    fn drop(&mut self) {
        // SAFETY: our connection, closed once.
        unsafe { pq::PQfinish(self.raw) };
    }
}

impl Conn {
    /// Begin connecting to `conninfo` (checked with [`checked_conninfo`]) as
    /// `application_name`, without blocking; step it with [`Conn::step`].
    pub fn start(conninfo: &str, application_name: &str) -> Result<Conn, LibpqError> {
        let bad = |_| LibpqError::BadConninfo("the connection string contains a NUL byte".into());
        let dbname = CString::new(conninfo).map_err(bad)?;
        let app = CString::new(application_name).map_err(bad)?;
        // application_name first: the connection string, expanded from dbname after it, may
        // set its own.
        let keywords = [c"application_name".as_ptr(), c"dbname".as_ptr(), std::ptr::null()];
        let values = [app.as_ptr(), dbname.as_ptr(), std::ptr::null()];
        // SAFETY: two NULL-terminated arrays of NUL-terminated strings, alive for the call
        // (libpq copies what it keeps); expand_dbname = 1 reads dbname as a connection string.
        let raw = unsafe { pq::PQconnectStartParams(keywords.as_ptr(), values.as_ptr(), 1) };
        if raw.is_null() {
            return Err(LibpqError::Connection("out of memory".into()));
        }
        let conn = Conn { raw };
        // SAFETY: our connection.
        if unsafe { pq::PQstatus(raw) } == pq::ConnStatusType::CONNECTION_BAD {
            return Err(LibpqError::Connection(conn.error()));
        }
        Ok(conn)
    }

    /// One step of connecting (`PQconnectPoll`).
    pub fn step(&mut self) -> Result<Progress, LibpqError> {
        // SAFETY: our connection, in the middle of connecting.
        match unsafe { pq::PQconnectPoll(self.raw) } {
            pq::PostgresPollingStatusType::PGRES_POLLING_READING => Ok(Progress::Read),
            pq::PostgresPollingStatusType::PGRES_POLLING_WRITING => Ok(Progress::Write),
            pq::PostgresPollingStatusType::PGRES_POLLING_OK => Ok(Progress::Done),
            _ => Err(LibpqError::Connection(self.error())),
        }
    }

    /// After connecting: non-blocking sends and pipeline mode.
    pub fn enter_pipeline(&mut self) -> Result<(), LibpqError> {
        // SAFETY: our connection, connected and idle.
        let ok = unsafe {
            pq::PQsetnonblocking(self.raw, 1) == 0 && pq::PQenterPipelineMode(self.raw) == 1
        };
        if ok {
            Ok(())
        } else {
            Err(LibpqError::Connection(self.error()))
        }
    }

    /// The socket to wait on (-1 when there is none).
    pub fn socket(&self) -> c_int {
        // SAFETY: our connection.
        unsafe { pq::PQsocket(self.raw) }
    }

    /// The pid of the server process at the other end.
    pub fn backend_pid(&self) -> i32 {
        // SAFETY: our connection.
        unsafe { pq::PQbackendPID(self.raw) }
    }

    /// libpq's last error message for this connection.
    pub fn error(&self) -> String {
        // SAFETY: our connection; the message is owned by it and copied at once.
        let msg = unsafe { pq::PQerrorMessage(self.raw) };
        if msg.is_null() {
            return "unknown libpq error".into();
        }
        // SAFETY: NUL-terminated, owned by the connection.
        let text = unsafe { CStr::from_ptr(msg) }.to_string_lossy().trim_end().to_string();
        if text.is_empty() {
            "the connection was lost".into()
        } else {
            text
        }
    }

    /// Queue `sql` with text parameters, then a sync point: its own implicit transaction.
    pub fn send(&mut self, sql: &CStr, params: &[String]) -> Result<(), LibpqError> {
        let raw = self.raw;
        self.queue_with(params, |n, values| {
            // SAFETY: our connection; `values` holds `n` NUL-terminated strings alive for the
            // call; NULL types, lengths and formats mean text parameters and a text result.
            unsafe {
                pq::PQsendQueryParams(
                    raw,
                    sql.as_ptr(),
                    n,
                    std::ptr::null(),
                    values,
                    std::ptr::null(),
                    std::ptr::null(),
                    0,
                ) == 1
            }
        })
    }

    /// Queue the preparation of `sql` as the statement `name` (the casts in `sql` give its
    /// parameters' types), then a sync point: parsed and planned once per connection.
    pub fn send_prepare(&mut self, name: &CStr, sql: &CStr) -> Result<(), LibpqError> {
        let raw = self.raw;
        self.queue_with(&[], |_, _| {
            // SAFETY: our connection; NUL-terminated name and text; no parameter types given.
            unsafe { pq::PQsendPrepare(raw, name.as_ptr(), sql.as_ptr(), 0, std::ptr::null()) == 1 }
        })
    }

    /// Queue the statement `name` prepared by [`Conn::send_prepare`] with text parameters,
    /// then a sync point.
    pub fn send_prepared(&mut self, name: &CStr, params: &[String]) -> Result<(), LibpqError> {
        let raw = self.raw;
        self.queue_with(params, |n, values| {
            // SAFETY: our connection; `values` holds `n` NUL-terminated strings alive for the
            // call; NULL lengths and formats mean text parameters and a text result.
            unsafe {
                pq::PQsendQueryPrepared(
                    raw,
                    name.as_ptr(),
                    n,
                    values,
                    std::ptr::null(),
                    std::ptr::null(),
                    0,
                ) == 1
            }
        })
    }

    /// `params` as C strings to `queue` (their count and array), then a sync point.
    fn queue_with(
        &mut self,
        params: &[String],
        queue: impl FnOnce(c_int, *const *const c_char) -> bool,
    ) -> Result<(), LibpqError> {
        let owned: Vec<CString> = params
            .iter()
            .map(|p| CString::new(p.as_str()))
            .collect::<Result<_, _>>()
            .map_err(|_| LibpqError::Connection("a parameter contains a NUL byte".into()))?;
        let ptrs: Vec<*const c_char> = owned.iter().map(|p| p.as_ptr()).collect();
        let n = c_int::try_from(ptrs.len())
            .map_err(|_| LibpqError::Connection("too many parameters".into()))?;
        // SAFETY: our connection (PQpipelineSync only after the query was queued).
        if queue(n, ptrs.as_ptr()) && unsafe { pq::PQpipelineSync(self.raw) } == 1 {
            Ok(())
        } else {
            Err(LibpqError::Connection(self.error()))
        }
    }

    /// Send what is buffered; true when everything went out (else wait until writable).
    pub fn flush(&mut self) -> Result<bool, LibpqError> {
        // SAFETY: our connection.
        match unsafe { pq::PQflush(self.raw) } {
            0 => Ok(true),
            1 => Ok(false),
            _ => Err(LibpqError::Connection(self.error())),
        }
    }

    /// Read what arrived on the socket.
    pub fn consume(&mut self) -> Result<(), LibpqError> {
        // SAFETY: our connection.
        if unsafe { pq::PQconsumeInput(self.raw) } == 1 {
            Ok(())
        } else {
            Err(LibpqError::Connection(self.error()))
        }
    }

    /// The next result that arrived, if any has, without blocking. `Event::Boundary` ends
    /// one query's results; `Event::Sync` ends its pipeline sync point.
    pub fn next_event(&mut self) -> Option<Event> {
        // SAFETY: our connection.
        if unsafe { pq::PQisBusy(self.raw) } == 1 {
            return None;
        }
        // SAFETY: our connection, not busy: PQgetResult does not block.
        let raw = unsafe { pq::PQgetResult(self.raw) };
        if raw.is_null() {
            return Some(Event::Boundary);
        }
        let result = PgResult { raw };
        // SAFETY: a result of ours.
        Some(match unsafe { pq::PQresultStatus(raw) } {
            pq::ExecStatusType::PGRES_PIPELINE_SYNC => Event::Sync,
            _ => Event::Result(result),
        })
    }
}

/// What [`Conn::next_event`] found.
pub enum Event {
    Result(PgResult),
    /// No more results for the current query.
    Boundary,
    /// A sync point was passed.
    Sync,
}

/// One query's result (freed when dropped).
pub struct PgResult {
    raw: *mut pq::PGresult,
}

impl Drop for PgResult {
    fn drop(&mut self) {
        // SAFETY: our result, freed once.
        unsafe { pq::PQclear(self.raw) };
    }
}

/// An error the other server reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteError {
    pub sqlstate: String,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

impl PgResult {
    /// The rows, as text (`None` for NULL), or the error the server reported.
    pub fn rows(&self) -> Result<Vec<Vec<Option<String>>>, RemoteError> {
        // SAFETY: our result.
        let status = unsafe { pq::PQresultStatus(self.raw) };
        match status {
            pq::ExecStatusType::PGRES_TUPLES_OK | pq::ExecStatusType::PGRES_COMMAND_OK => {}
            pq::ExecStatusType::PGRES_PIPELINE_ABORTED => {
                return Err(RemoteError {
                    sqlstate: "57P03".into(),
                    message: "an earlier query of the pipeline failed".into(),
                    detail: None,
                    hint: None,
                })
            }
            _ => return Err(self.error()),
        }
        // SAFETY: our result; indexes within PQntuples × PQnfields.
        unsafe {
            let (n, m) = (pq::PQntuples(self.raw), pq::PQnfields(self.raw));
            Ok((0..n)
                .map(|row| {
                    (0..m)
                        .map(|col| {
                            (pq::PQgetisnull(self.raw, row, col) == 0).then(|| {
                                CStr::from_ptr(pq::PQgetvalue(self.raw, row, col))
                                    .to_string_lossy()
                                    .into_owned()
                            })
                        })
                        .collect()
                })
                .collect())
        }
    }

    fn field(&self, code: u8) -> Option<String> {
        // SAFETY: our result; the field is owned by it and copied at once.
        let f = unsafe { pq::PQresultErrorField(self.raw, c_int::from(code)) };
        // SAFETY: NUL-terminated when not NULL.
        (!f.is_null()).then(|| unsafe { CStr::from_ptr(f) }.to_string_lossy().into_owned())
    }

    fn error(&self) -> RemoteError {
        RemoteError {
            sqlstate: self.field(b'C').unwrap_or_else(|| "XX000".into()),
            message: self.field(b'M').unwrap_or_else(|| "the server reported an error".into()),
            detail: self.field(b'D'),
            hint: self.field(b'H'),
        }
    }
}
