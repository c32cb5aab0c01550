//! A blocking connection through libpq (the `pq-sys` bindings), as the extension's member link
//! uses it (src/pg/libpq.rs). libpq is the client `psql` is: a connection string means here
//! what it means there — every `sslmode` with `sslrootcert`, `sslcert`, `sslkey` and
//! `sslcrl`, `passfile` and `~/.pgpass`, `service` and the service files, several hosts with
//! `target_session_attrs`, `PG*` environment variables. No TLS code of our own.
//!
//! The relay's SQL is a few statements with text parameters and text results.

use pq_sys as pq;
use std::ffi::{c_char, c_int, CStr, CString};
use std::ptr::NonNull;

/// What went wrong, in libpq's words (several lines joined into one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PqError {
    #[error("{0}")]
    Conninfo(String),
    #[error("{0}")]
    Connect(String),
    #[error("{0}")]
    Query(String),
}

/// libpq's messages end with a newline and may hold several lines (one per host tried): one
/// line, for a log line of its own.
fn one_line(text: &str) -> String {
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    if lines.is_empty() {
        "unknown libpq error".into()
    } else {
        lines.join("; ")
    }
}

fn c_string(s: &str, what: &str) -> Result<CString, PqError> {
    CString::new(s).map_err(|_| PqError::Conninfo(format!("{what} contains a NUL byte")))
}

/// Check a connection string the way libpq reads it (keywords and quoting; a URI too).
pub fn check_conninfo(conninfo: &str) -> Result<(), PqError> {
    let c = c_string(conninfo, "the connection string")?;
    let mut err: *mut c_char = std::ptr::null_mut();
    // SAFETY: a NUL-terminated string alive for the call; libpq returns an array it allocated
    // (or NULL, with an error message it allocated or NULL for out of memory), both freed
    // below with its own functions.
    let options = unsafe { pq::PQconninfoParse(c.as_ptr(), &mut err) };
    if options.is_null() {
        let why = if err.is_null() {
            "out of memory".to_string()
        } else {
            // SAFETY: a NUL-terminated message allocated by libpq, copied before it is freed.
            let text = one_line(&unsafe { CStr::from_ptr(err) }.to_string_lossy());
            // SAFETY: allocated by libpq for us, freed once.
            unsafe { pq::PQfreemem(err.cast()) };
            text
        };
        return Err(PqError::Conninfo(why));
    }
    // SAFETY: the array PQconninfoParse returned, freed once.
    unsafe { pq::PQconninfoFree(options) };
    Ok(())
}

/// One connection, closed when dropped.
pub struct Client {
    raw: NonNull<pq::PGconn>,
}

impl Drop for Client {
    fn drop(&mut self) {
        // SAFETY: our connection, closed once (nothing uses it after drop).
        unsafe { pq::PQfinish(self.raw.as_ptr()) };
    }
}

/// Rows as text, `None` for NULL.
pub type Rows = Vec<Vec<Option<String>>>;

impl Client {
    /// Connect (blocking) to `conninfo` (a keyword/value string or a URI), as
    /// `application_name` unless the string names its own, in the UTF8 client encoding.
    pub fn connect(conninfo: &str, application_name: &str) -> Result<Client, PqError> {
        let dbname = c_string(conninfo, "the connection string")?;
        let app = c_string(application_name, "the application name")?;
        // Processed in order, later ones winning: the fallback name first, then the expanded
        // connection string (dbname), then the encoding the relay reads every text in.
        let keywords = [
            c"fallback_application_name".as_ptr(),
            c"dbname".as_ptr(),
            c"client_encoding".as_ptr(),
            std::ptr::null(),
        ];
        let values = [app.as_ptr(), dbname.as_ptr(), c"UTF8".as_ptr(), std::ptr::null()];
        // SAFETY: two NULL-terminated arrays of NUL-terminated strings, alive for the call
        // (libpq copies what it keeps); expand_dbname = 1 reads dbname as a connection string.
        let raw = unsafe { pq::PQconnectdbParams(keywords.as_ptr(), values.as_ptr(), 1) };
        let raw = NonNull::new(raw).ok_or_else(|| PqError::Connect("out of memory".into()))?;
        let client = Client { raw };
        // SAFETY: our connection.
        if unsafe { pq::PQstatus(raw.as_ptr()) } != pq::ConnStatusType::CONNECTION_OK {
            return Err(PqError::Connect(client.error()));
        }
        Ok(client)
    }

    /// libpq's last error message for this connection, on one line.
    fn error(&self) -> String {
        // SAFETY: our connection; the message is owned by it (never NULL for a connection
        // object, checked anyway) and copied at once.
        let msg = unsafe { pq::PQerrorMessage(self.raw.as_ptr()) };
        if msg.is_null() {
            return "unknown libpq error".into();
        }
        // SAFETY: NUL-terminated, owned by the connection, copied here.
        one_line(&unsafe { CStr::from_ptr(msg) }.to_string_lossy())
    }

    /// Run `sql` with text parameters `$1`, `$2`, ... (its own implicit transaction); its
    /// rows as text.
    pub fn query(&mut self, sql: &str, params: &[&str]) -> Result<Rows, PqError> {
        let bad = |what: &str| PqError::Query(format!("{what} contains a NUL byte"));
        let sql = CString::new(sql).map_err(|_| bad("the statement"))?;
        let owned: Vec<CString> = params
            .iter()
            .map(|p| CString::new(*p))
            .collect::<Result<_, _>>()
            .map_err(|_| bad("a parameter"))?;
        let ptrs: Vec<*const c_char> = owned.iter().map(|p| p.as_ptr()).collect();
        let n = c_int::try_from(ptrs.len())
            .map_err(|_| PqError::Query("too many parameters".into()))?;
        // SAFETY: our connection; `ptrs` holds `n` NUL-terminated strings alive for the call;
        // NULL types, lengths and formats mean parameters in text whose types the server
        // infers, and result format 0 means text.
        let raw = unsafe {
            pq::PQexecParams(
                self.raw.as_ptr(),
                sql.as_ptr(),
                n,
                std::ptr::null(),
                ptrs.as_ptr(),
                std::ptr::null(),
                std::ptr::null(),
                0,
            )
        };
        let Some(raw) = NonNull::new(raw) else {
            return Err(PqError::Query(self.error()));
        };
        let result = PgResult { raw };
        result.rows().ok_or_else(|| PqError::Query(result.error()))
    }
}

/// One result, freed when dropped.
struct PgResult {
    raw: NonNull<pq::PGresult>,
}

impl Drop for PgResult {
    fn drop(&mut self) {
        // SAFETY: our result, freed once.
        unsafe { pq::PQclear(self.raw.as_ptr()) };
    }
}

impl PgResult {
    /// The rows, or None if the statement failed.
    fn rows(&self) -> Option<Rows> {
        let raw = self.raw.as_ptr();
        // SAFETY: our result.
        match unsafe { pq::PQresultStatus(raw) } {
            pq::ExecStatusType::PGRES_TUPLES_OK | pq::ExecStatusType::PGRES_COMMAND_OK => {}
            _ => return None,
        }
        // SAFETY: our result; every index is within PQntuples × PQnfields, and PQgetvalue's
        // text (NUL-terminated, owned by the result) is copied before the result is freed.
        unsafe {
            let (n, m) = (pq::PQntuples(raw), pq::PQnfields(raw));
            Some(
                (0..n)
                    .map(|row| {
                        (0..m)
                            .map(|col| {
                                (pq::PQgetisnull(raw, row, col) == 0).then(|| {
                                    CStr::from_ptr(pq::PQgetvalue(raw, row, col))
                                        .to_string_lossy()
                                        .into_owned()
                                })
                            })
                            .collect()
                    })
                    .collect(),
            )
        }
    }

    /// The server's message (with its SQLSTATE), or libpq's.
    fn error(&self) -> String {
        let field = |code: u8| {
            // SAFETY: our result; the field is owned by it and copied at once.
            let f = unsafe { pq::PQresultErrorField(self.raw.as_ptr(), c_int::from(code)) };
            // SAFETY: NUL-terminated when not NULL.
            (!f.is_null()).then(|| unsafe { CStr::from_ptr(f) }.to_string_lossy().into_owned())
        };
        match (field(b'M'), field(b'C')) {
            (Some(message), Some(code)) => one_line(&format!("{message} (SQLSTATE {code})")),
            (Some(message), None) => one_line(&message),
            _ => {
                // SAFETY: our result; the message is owned by it (empty if none) and copied.
                let msg = unsafe { pq::PQresultErrorMessage(self.raw.as_ptr()) };
                if msg.is_null() {
                    "the statement failed".into()
                } else {
                    // SAFETY: NUL-terminated, owned by the result.
                    one_line(&unsafe { CStr::from_ptr(msg) }.to_string_lossy())
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_strings_are_read_as_libpq_reads_them() {
        assert!(check_conninfo("host=a,b port=1,2 target_session_attrs=read-write").is_ok());
        assert!(check_conninfo("postgresql://u@h:5/db?sslmode=verify-full").is_ok());
        assert!(check_conninfo("service=relay sslmode=require").is_ok());
        let e = check_conninfo("host=a nonsense=1").unwrap_err();
        assert!(e.to_string().contains("nonsense"), "{e}");
        assert!(check_conninfo("host").is_err(), "no = after a keyword");
        assert!(check_conninfo("host='a").is_err(), "an unterminated quote");
        assert!(check_conninfo("a\0b").is_err());
    }

    #[test]
    fn a_refused_connection_says_why_on_one_line() {
        // Port 1 on loopback: nothing listens there (connection refused at once).
        let e = Client::connect("host=127.0.0.1 port=1 connect_timeout=2", "t").err();
        let e = e.expect("nothing listens on port 1").to_string();
        assert!(!e.contains('\n') && e.contains("127.0.0.1"), "{e}");
    }

    #[test]
    fn one_line_joins_libpq_lines() {
        assert_eq!(one_line("a\n  b\n\n"), "a; b");
        assert_eq!(one_line("\n"), "unknown libpq error");
    }
}
