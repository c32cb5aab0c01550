//! `tso-link`: the test harness's TCP forwarder ([`tsoracle_tests::link`]) as a program, for
//! `make bench` (scripts/bench/bench.py puts it between a member and its oracle).
//!
//! Usage: `tso-link LISTEN_PORT TARGET_PORT ONE_WAY_MS`
//!
//! Listens on `127.0.0.1:LISTEN_PORT` (0: a free port) and forwards every connection to
//! `127.0.0.1:TARGET_PORT`, delaying each direction by `ONE_WAY_MS` milliseconds (a fraction
//! is allowed: `0.5`), so a round trip costs twice that. It prints the port it listens on, one
//! line, once it is listening. Each line read from standard input afterwards is a new one-way
//! delay in milliseconds, for the bytes read from then on (it answers `ok MS` on standard
//! output, or `error: ...` on standard error). It runs until it is killed; the end of its
//! input changes nothing.

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::Duration;

use tsoracle_tests::link::Link;

const USAGE: &str = "usage: tso-link LISTEN_PORT TARGET_PORT ONE_WAY_MS";

/// A one-way delay in milliseconds, 0 to one minute.
fn delay(arg: &str) -> Result<Duration, String> {
    let ms: f64 =
        arg.trim().parse().map_err(|_| format!("not a number of milliseconds: {arg:?}"))?;
    if !(0.0..=60_000.0).contains(&ms) {
        return Err(format!("a one-way delay of {ms} ms is outside 0 to 60000"));
    }
    Ok(Duration::from_secs_f64(ms / 1000.0))
}

fn port(arg: &str) -> Result<u16, String> {
    arg.parse().map_err(|_| format!("not a port: {arg:?}"))
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [listen, target, one_way] = args.as_slice() else {
        return Err(USAGE.to_string());
    };
    let (listen, target, one_way) = (port(listen)?, port(target)?, delay(one_way)?);
    if target == 0 {
        return Err("the target port must not be 0".to_string());
    }
    let link = Link::start_on(listen, target, one_way)
        .map_err(|e| format!("cannot listen on 127.0.0.1:{listen}: {e}"))?;
    let mut out = std::io::stdout();
    writeln!(out, "{}", link.port()).and_then(|()| out.flush()).map_err(|e| e.to_string())?;
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        match delay(&line) {
            Ok(d) => {
                link.set_one_way(d);
                let _ = writeln!(out, "ok {}", line.trim()).and_then(|()| out.flush());
            }
            Err(e) => eprintln!("tso-link: error: {e}"),
        }
    }
    // The input ended: forward until killed.
    loop {
        std::thread::park();
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tso-link: {e}");
            ExitCode::from(2)
        }
    }
}
