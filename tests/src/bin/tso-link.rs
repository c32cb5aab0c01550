//! `tso-link`: the test harness's TCP forwarder ([`tsoracle_tests::link`]) as a program, for
//! `make bench` (scripts/bench/bench.py puts it between a member and its oracle).
//!
//! Usage: `tso-link LISTEN_PORT TARGET_PORT ONE_WAY_MS`
//!
//! Listens on `127.0.0.1:LISTEN_PORT` (0: a free port) and forwards every connection to
//! `127.0.0.1:TARGET_PORT`, delaying each direction by `ONE_WAY_MS` milliseconds (a fraction
//! is allowed: `0.5`), so a round trip costs twice that. Once it listens it prints the port,
//! one line. Each line of its standard input afterwards is a new one-way delay in
//! milliseconds, for the bytes read from then on; it answers each on standard output, `ok MS`
//! or `error: WHY` ([`Link::follow`]). It runs until it is killed; the end of its input
//! changes nothing.

use std::io::Write;
use std::process::ExitCode;

use tsoracle_tests::link::{parse_one_way_ms, Link};

const USAGE: &str = "usage: tso-link LISTEN_PORT TARGET_PORT ONE_WAY_MS";

fn port(arg: &str) -> Result<u16, String> {
    arg.parse().map_err(|_| format!("not a port: {arg:?}"))
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [listen, target, one_way] = args.as_slice() else {
        return Err(USAGE.to_string());
    };
    let (listen, target, one_way) = (port(listen)?, port(target)?, parse_one_way_ms(one_way)?);
    if target == 0 {
        return Err("the target port must not be 0".to_string());
    }
    let link = Link::start_on(listen, target, one_way)
        .map_err(|e| format!("cannot listen on 127.0.0.1:{listen}: {e}"))?;
    let mut out = std::io::stdout();
    writeln!(out, "{}", link.port()).and_then(|()| out.flush()).map_err(|e| e.to_string())?;
    if let Err(e) = link.follow(std::io::stdin().lock(), std::io::stdout()) {
        eprintln!("tso-link: its input or output failed ({e}): the delay stays as it is");
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
