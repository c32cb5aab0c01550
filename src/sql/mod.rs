//! The SQL surface, the top layer: every function `CREATE EXTENSION` installs, thin —
//! argument checks and error mapping here, the work in the caller's side.
//!
//! - `timestamps`: `tso_next`, `tso_next_batch`, the conversions, `tso_seed`;
//! - `uuid`: `tso_next_uuid`, `tso_uuid`, `tso_from_uuid`;
//! - `sequences`: `tso_seq`, `tso_seq_batch`, `tso_seq_peek`, `tso_seq_drop`;
//! - `leases`: the lease functions and `tso_safe_frontier`;
//! - `resolved`: `tso_resolved`, `tso_wait_resolved`, `tso_resolved_status`;
//! - `status`: `tso_status`, `tso_clock`;
//! - `restore`: `tsoracle.note_restore`, for the triggers of the durable tables;
//! - `fleet`: what an oracle serves its members (`tsoracle.member_hello`,
//!   `tsoracle.member_next`) and `tso_member_status()` on a member;
//! - `fleet_resolved`: the fleet-wide resolved timestamp on the oracle (`tso_fleet_resolved`,
//!   `tso_fleet_status`, `tso_fleet_remove`, `tsoracle.member_report`).
//!
//! May use: `caller`, `shmem` and `pg`. Nothing uses it.

mod fleet;
mod fleet_resolved;
mod leases;
mod resolved;
mod restore;
mod sequences;
mod status;
mod timestamps;
mod uuid;
