//! The background worker, the only process that writes the durable tables.
//!
//! It starts when recovery ends (server start, crash restart, promotion of a standby), runs
//! the fence before anything is served, then keeps the timestamp window ahead of the clock
//! and answers the callers' requests in group commits. Every write is committed (flushed,
//! and on synchronous standbys) before anything is served from it.
//!
//! One concern per file: `main` (registration, start, exit), `settings` (the session it
//! forces and checks), `extension` (waiting for `CREATE EXTENSION` at the right version),
//! `state` (the worker's own memory and the phase it publishes), `serve` (the serving loop
//! and window extensions), `high_water` (the one monotonic path to the durable high-water),
//! `fence`, `requests` (the group commit), `checks` (who may do what), `sequences` and
//! `leases` (their parts of a group commit), `resolved` (publishing `R`); on a member of a
//! fleet, `member/` (the proxy to the oracle, and all of a member's own: what each call
//! becomes there, its leases, its identity, its memory of the oracle, its own past) instead of
//! the fence and the window.
//!
//! May use: `shmem` and `pg`. Never the caller's side or the SQL surface: it serves them
//! through shared memory only.

mod checks;
mod extension;
mod fence;
mod fleet;
mod high_water;
mod leases;
mod main;
mod member;
mod requests;
mod resolved;
mod sequences;
mod serve;
mod settings;
mod state;

pub use main::register;
