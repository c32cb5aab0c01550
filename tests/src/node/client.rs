//! Talking to a node: connections (retried, bounded, every statement with a timeout),
//! `psql`, `CREATE EXTENSION tsoracle` and the wait until it serves.

use std::process::Command;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::{Client, NoTls};

use super::os::{run_cmd, scrub_env};
use super::{Node, CONNECT_TIMEOUT, SERVING_TIMEOUT};
use crate::error::{pg_error_string, HarnessError};
use crate::tso::{self, TsoStatus};
use crate::Result;

impl Node {
    // ---------------------------------------------------------------- clients

    fn client_config(&self, user: &str, dbname: &str) -> postgres::Config {
        let mut cfg = postgres::Config::new();
        cfg.host("127.0.0.1")
            .port(self.port())
            .user(user)
            .dbname(dbname)
            .application_name("tsoracle-tests")
            .connect_timeout(Duration::from_secs(5))
            // Bound every statement: a hung call must not hang the test forever.
            .options("-c statement_timeout=60000");
        cfg
    }

    /// One connection attempt as `postgres` to database `postgres`.
    pub fn connect_once(&self) -> std::result::Result<Client, postgres::Error> {
        self.client_config("postgres", "postgres").connect(NoTls)
    }

    /// Connect as `postgres`, retrying until the server accepts connections (bounded).
    pub fn try_connect(&self, timeout: Duration) -> Result<Client> {
        self.try_connect_as("postgres", "postgres", timeout)
    }

    pub fn try_connect_as(&self, user: &str, dbname: &str, timeout: Duration) -> Result<Client> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.client_config(user, dbname).connect(NoTls) {
                Ok(c) => return Ok(c),
                Err(e) => {
                    // Authentication / unknown role or database will not fix themselves.
                    if let Some(code) = e.code() {
                        if *code != SqlState::CANNOT_CONNECT_NOW
                            && *code != SqlState::TOO_MANY_CONNECTIONS
                        {
                            return Err(e.into());
                        }
                    }
                    if Instant::now() > deadline {
                        return Err(HarnessError::Timeout(format!(
                            "node {}: cannot connect on port {}: {}",
                            self.name,
                            self.port(),
                            pg_error_string(&e)
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    /// Connect as `postgres` (retrying, bounded); panics on failure (the log is printed).
    pub fn connect(&self) -> Client {
        self.try_connect(CONNECT_TIMEOUT)
            .unwrap_or_else(|e| panic!("node {}: connect failed: {e}", self.name))
    }

    /// Connect as another role (retrying, bounded); panics on failure.
    pub fn connect_as(&self, user: &str) -> Client {
        self.try_connect_as(user, "postgres", CONNECT_TIMEOUT)
            .unwrap_or_else(|e| panic!("node {}: connect as {user} failed: {e}", self.name))
    }

    /// Run SQL through `psql -X -A -t -v ON_ERROR_STOP=1`; returns its stdout.
    pub fn psql(&self, sql: &str) -> Result<String> {
        let mut cmd = Command::new(self.bin.join("psql"));
        cmd.args([
            "-X",
            "-A",
            "-t",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-p",
        ])
        .arg(self.port().to_string())
        .arg("-c")
        .arg(sql);
        scrub_env(&mut cmd);
        run_cmd(cmd, Duration::from_secs(120))
    }

    // ---------------------------------------------------------------- tsoracle

    /// `CREATE EXTENSION IF NOT EXISTS tsoracle`, then wait until it serves.
    pub fn create_extension(&self) -> Result<TsoStatus> {
        let mut c = self.try_connect(CONNECT_TIMEOUT)?;
        c.batch_execute("CREATE EXTENSION IF NOT EXISTS tsoracle")?;
        drop(c);
        self.wait_serving()
    }

    /// Poll `tso_status()` until `state = 'serving'` (bounded by [`SERVING_TIMEOUT`]),
    /// reconnecting when the server restarts under us; returns the serving status.
    /// Errors at once on errors that retrying cannot fix (e.g. the function does not exist).
    pub fn wait_serving(&self) -> Result<TsoStatus> {
        let deadline = Instant::now() + SERVING_TIMEOUT;
        let mut client: Option<Client> = None;
        let mut last = String::from("no attempt");
        while Instant::now() < deadline {
            if client.is_none() {
                match self.connect_once() {
                    Ok(c) => client = Some(c),
                    Err(e) => {
                        last = format!("connect: {}", pg_error_string(&e));
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                }
            }
            let c = client.as_mut().expect("client");
            match tso::status(c) {
                Ok(st) if st.state == "serving" => return Ok(st),
                Ok(st) => last = format!("state = {:?} ({:?})", st.state, st.detail),
                Err(e) => {
                    last = pg_error_string(&e);
                    if crate::error::session_broken(c, &e) {
                        client = None; // the server went away: reconnect
                    } else if !tso::is_retryable(&e) {
                        return Err(e.into());
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(HarnessError::Timeout(format!(
            "node {}: not serving after {:?}; last: {last}",
            self.name, SERVING_TIMEOUT
        )))
    }
}
