//! The caller's side: what a backend does inside a call, before and after it touches shared
//! memory.
//!
//! - `window`: take timestamps from the shared window, or wait (bounded) for the worker;
//! - `requests`: hand a call that changes durable state to the worker and wait for its answer;
//! - `member`: on a member of a fleet, timestamps from the oracle through the worker;
//! - `fleet`: on the oracle of a fleet, a member's registration and reports;
//! - `holding`: hold the resolved timestamp below what this backend's transaction took;
//! - `resolved`: read `R` (from shared memory on a primary, the replayed table on a standby);
//! - `seq_in_place`: advance an existing counter in the calling backend;
//! - `guard`: the drop guard (`object_access_hook`);
//! - `logged`: the extension's tables stay logged (`ProcessUtility_hook`);
//! - `restore`: rows restored underneath the worker.
//!
//! May use: `shmem` and `pg`. Used by: `sql`. Never used by the worker, which has a side of
//! its own.

pub mod fleet;
pub mod guard;
pub mod holding;
pub mod logged;
pub mod member;
pub mod requests;
pub mod resolved;
pub mod restore;
pub mod seq_in_place;
pub mod window;
