//! The extension's SQL surface, as the tests use it.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use postgres::error::SqlState;
use postgres::Client;

use crate::error::{pg_error_string, HarnessError};

/// Timestamps are `physical_ms << 18 | logical`.
pub const LOGICAL_BITS: u32 = 18;
pub const LOGICAL_MASK: i64 = (1 << LOGICAL_BITS) - 1;
/// Largest `tso_next_batch` count.
pub const MAX_BATCH: i32 = 1 << LOGICAL_BITS;
/// How long [`wait_serving`] polls.
pub const WAIT_SERVING_TIMEOUT: Duration = Duration::from_secs(30);

pub fn physical(ts: i64) -> i64 {
    ts >> LOGICAL_BITS
}

pub fn logical(ts: i64) -> i64 {
    ts & LOGICAL_MASK
}

pub fn compose(physical_ms: i64, logical: i64) -> i64 {
    (physical_ms << LOGICAL_BITS) | (logical & LOGICAL_MASK)
}

/// Wall clock, milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970").as_millis() as i64
}

/// One row of `tso_status()`. Everything but `role` and `state` may be NULL.
#[derive(Clone, Debug, PartialEq)]
pub struct TsoStatus {
    pub role: String,
    pub state: String,
    pub detail: Option<String>,
    pub epoch: Option<i64>,
    pub timeline: Option<i64>,
    pub high_water_ms: Option<i64>,
    pub floor_ms: Option<i64>,
    pub last_issued: Option<i64>,
    pub window_left_ms: Option<i64>,
    pub timestamps_issued: Option<i64>,
    pub window_extensions: Option<i64>,
    pub fences: Option<i64>,
    pub last_fence_ms: Option<f64>,
    pub worker_pid: Option<i32>,
    pub worker_commits: Option<i64>,
    pub sync_replication: Option<bool>,
}

/// `SELECT ... FROM tso_status()`, decoded with the column types of the specification
/// (a type mismatch is an error, not silently cast).
pub fn status(client: &mut Client) -> Result<TsoStatus, postgres::Error> {
    let r = client.query_one(
        "SELECT role, state, detail, epoch, timeline, high_water_ms, floor_ms, last_issued, \
                window_left_ms, timestamps_issued, window_extensions, fences, last_fence_ms, \
                worker_pid, worker_commits, sync_replication \
           FROM tso_status()",
        &[],
    )?;
    Ok(TsoStatus {
        role: r.try_get(0)?,
        state: r.try_get(1)?,
        detail: r.try_get(2)?,
        epoch: r.try_get(3)?,
        timeline: r.try_get(4)?,
        high_water_ms: r.try_get(5)?,
        floor_ms: r.try_get(6)?,
        last_issued: r.try_get(7)?,
        window_left_ms: r.try_get(8)?,
        timestamps_issued: r.try_get(9)?,
        window_extensions: r.try_get(10)?,
        fences: r.try_get(11)?,
        last_fence_ms: r.try_get(12)?,
        worker_pid: r.try_get(13)?,
        worker_commits: r.try_get(14)?,
        sync_replication: r.try_get(15)?,
    })
}

/// Errors that go away by waiting: not serving yet (57P03), shutdown / crash (class 57),
/// connection problems (class 08), and client-side I/O errors.
pub fn is_retryable(e: &postgres::Error) -> bool {
    match e.code() {
        None => true,
        Some(code) => {
            let c = code.code();
            *code == SqlState::CANNOT_CONNECT_NOW || c.starts_with("57") || c.starts_with("08")
        }
    }
}

/// Poll `tso_status()` on this client until `state = 'serving'` (bounded by
/// [`WAIT_SERVING_TIMEOUT`]), tolerating 57P03. Fails if the connection breaks; use
/// `Node::wait_serving` to also reconnect across restarts.
pub fn wait_serving(client: &mut Client) -> Result<TsoStatus, HarnessError> {
    let deadline = Instant::now() + WAIT_SERVING_TIMEOUT;
    let mut last = String::new();
    while Instant::now() < deadline {
        match status(client) {
            Ok(st) if st.state == "serving" => return Ok(st),
            Ok(st) => last = format!("state = {:?} ({:?})", st.state, st.detail),
            Err(e) => {
                if client.is_closed() || !is_retryable(&e) {
                    return Err(e.into());
                }
                last = pg_error_string(&e);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(HarnessError::Timeout(format!("not serving after {WAIT_SERVING_TIMEOUT:?}; last: {last}")))
}

pub fn tso_next(client: &mut Client) -> Result<i64, postgres::Error> {
    client.query_one("SELECT tso_next()", &[])?.try_get(0)
}

/// First of `count` consecutive timestamps.
pub fn tso_next_batch(client: &mut Client, count: i32) -> Result<i64, postgres::Error> {
    client.query_one("SELECT tso_next_batch($1)", &[&count])?.try_get(0)
}

/// `SELECT tso_seed($1)` (return value ignored).
pub fn tso_seed(client: &mut Client, physical_ms: i64) -> Result<(), postgres::Error> {
    client.execute("SELECT tso_seed($1::bigint)", &[&physical_ms])?;
    Ok(())
}

/// The durable high-water: `max(physical_ms)` of `tsoracle.high_water` (needs privileges).
pub fn durable_high_water(client: &mut Client) -> Result<Option<i64>, postgres::Error> {
    client.query_one("SELECT max(physical_ms)::bigint FROM tsoracle.high_water", &[])?.try_get(0)
}

/// The durable high-water read now is at or above the physical part of `served`, a timestamp
/// returned before this read (`None`: nothing served yet); `after` says what ran in between.
#[track_caller]
pub fn assert_high_water_covers(client: &mut Client, served: Option<i64>, after: &str) {
    let table = durable_high_water(client)
        .unwrap_or_else(|e| panic!("tsoracle.high_water: {}", crate::pg_error_string(&e)))
        .expect("the high-water row");
    if let Some(v) = served {
        assert!(
            physical(v) <= table,
            "after {after}: table high-water {table} below a served timestamp's {}",
            physical(v)
        );
    }
}

/// `SHOW <name>`.
pub fn show(client: &mut Client, name: &str) -> Result<String, postgres::Error> {
    client.query_one("SELECT current_setting($1)", &[&name])?.try_get(0)
}

/// Assert that `r` failed with SQLSTATE `code`; returns the error for further checks.
/// Panics (with the actual outcome) otherwise.
#[track_caller]
pub fn expect_sqlstate<T: std::fmt::Debug>(
    r: Result<T, postgres::Error>,
    code: &SqlState,
    what: &str,
) -> postgres::Error {
    match r {
        Ok(v) => panic!("{what}: expected SQLSTATE {}, but it succeeded with {v:?}", code.code()),
        Err(e) => {
            match e.code() {
                Some(c) if c == code => {}
                _ => {
                    panic!("{what}: expected SQLSTATE {}, got {}", code.code(), pg_error_string(&e))
                }
            }
            e
        }
    }
}

/// One row of `tso_clock()` (0.3.0): the server's wall clock, the reference clock of the lead
/// cap and its lead, the lead of the last issued timestamp, the steps the worker has seen,
/// and how long issuing may go on without another confirmed commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TsoClock {
    pub wall_ms: i64,
    pub reference_ms: Option<i64>,
    pub reference_lead_ms: Option<i64>,
    pub issued_lead_ms: Option<i64>,
    pub steps_back: i64,
    pub steps_forward: i64,
    pub last_step_ms: Option<i64>,
    pub serve_left_ms: Option<i64>,
}

impl TsoClock {
    pub fn steps(&self) -> i64 {
        self.steps_back + self.steps_forward
    }
}

pub fn clock(client: &mut Client) -> Result<TsoClock, postgres::Error> {
    let r = client.query_one(
        "SELECT wall_ms, reference_ms, reference_lead_ms, issued_lead_ms, steps_back, \
                steps_forward, last_step_ms, serve_left_ms FROM tso_clock()",
        &[],
    )?;
    Ok(TsoClock {
        wall_ms: r.try_get(0)?,
        reference_ms: r.try_get(1)?,
        reference_lead_ms: r.try_get(2)?,
        issued_lead_ms: r.try_get(3)?,
        steps_back: r.try_get(4)?,
        steps_forward: r.try_get(5)?,
        last_step_ms: r.try_get(6)?,
        serve_left_ms: r.try_get(7)?,
    })
}

/// Test builds (feature `clock-fault`, which `make test` builds with): offset the wall clock
/// of every process of the server by `offset_ms` from real time, at one instant (the
/// postmaster applies it as it reloads), and wait until the server's clock shows it.
pub fn set_clock_offset(client: &mut Client, offset_ms: i64) -> Result<(), HarnessError> {
    client
        .batch_execute(&format!("ALTER SYSTEM SET tsoracle.test_clock_offset_ms = {offset_ms}"))?;
    client.batch_execute("SELECT pg_reload_conf()")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let before = now_ms();
        let wall = clock(client)?.wall_ms;
        let after = now_ms();
        if wall >= before + offset_ms - 5 && wall <= after + offset_ms + 5 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(HarnessError::Timeout(format!(
                "the server's clock does not show the offset {offset_ms} ms: {wall} against {before}..{after}"
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The timestamp a tsoracle UUID carries, decoded from its text form here, independently of
/// the extension (docs/reference/uuids.md): `unix_ts_ms` is the physical part, the 18 bits after the
/// version (4 + 8 in bytes 6 and 7, 6 after the variant in byte 8) the logical part. Fails
/// unless it is a version-7 UUID of the RFC 9562 variant.
pub fn uuid_timestamp(text: &str) -> Result<i64, String> {
    let hex: String = text.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return Err(format!("{text:?} is not a UUID"));
    }
    let mut b = [0u8; 16];
    for (i, byte) in b.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
            .map_err(|e| format!("{text:?} is not a UUID: {e}"))?;
    }
    if b[6] >> 4 != 7 || b[8] >> 6 != 0b10 {
        return Err(format!("{text:?} is not a version-7 UUID of the RFC 9562 variant"));
    }
    let physical = b[..6].iter().fold(0i64, |acc, &x| acc << 8 | i64::from(x));
    let logical = (i64::from(b[6] & 0x0F) << 14) | (i64::from(b[7]) << 6) | i64::from(b[8] & 0x3F);
    Ok(compose(physical, logical))
}

/// `SELECT tso_next_uuid()`, as the timestamp it carries.
pub fn tso_next_uuid(client: &mut Client) -> Result<i64, HarnessError> {
    let text: String = client.query_one("SELECT tso_next_uuid()::text", &[])?.try_get(0)?;
    uuid_timestamp(&text).map_err(HarnessError::Other)
}
