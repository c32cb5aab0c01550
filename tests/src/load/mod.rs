//! Client load: N threads, each with its own connection, calling an operation in a loop and
//! recording every call in a [`History`](crate::History).
//!
//! A thread runs until its stop flag is set or its duration has passed (hard cap
//! [`MAX_LOAD_DURATION`]). Errors are expected while servers restart: an errored call is
//! recorded as an error (never as a value), the connection is dropped if it is broken, and the
//! thread reconnects with a short backoff. Failed connection attempts are not calls (nothing
//! was asked of the oracle) and are only counted. Every connection has a
//! `statement_timeout`, so a hung call ends too.
//!
//! Every load of the harness counts in [`LoadStats`] and runs its threads as [`Workers`].
//!
//! # Files
//!
//! * `mod.rs`: [`MAX_LOAD_DURATION`], [`LoadStats`];
//! * `endpoint.rs`: [`Endpoint`], where a load thread connects;
//! * `workers.rs`: [`Workers`], the threads of a load;
//! * `ops.rs`: [`ops`], ready-made operations for [`Load`];
//! * `timestamps.rs`: [`Load`], any operation in a loop, recorded in a `History`;
//! * `seq.rs`: [`SeqLoad`], `tso_seq`/`tso_seq_batch` recorded in a `DenseHistory`
//!   (re-exported by [`crate::seqlease`]);
//! * `mixed.rs`: [`MixedLoad`], timestamps and sequence blocks on the primary a
//!   [`PrimaryPointer`] names, following it across failovers (re-exported by
//!   [`crate::cluster`]).

mod endpoint;
mod mixed;
pub mod ops;
mod seq;
mod timestamps;
mod workers;

use std::time::Duration;

pub use endpoint::Endpoint;
pub use mixed::{MixedLoad, MixedLoadOptions, PrimaryPointer};
pub use seq::{SeqLoad, SeqLoadOptions, SeqLoadStats};
pub use timestamps::{Got, Load, LoadOptions, Op};
pub use workers::Workers;

/// No load runs longer than this, whatever it was asked.
pub const MAX_LOAD_DURATION: Duration = Duration::from_secs(600);

/// Totals over all threads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadStats {
    pub ok_calls: u64,
    pub err_calls: u64,
    /// Successful (re)connections, the first ones included.
    pub connects: u64,
    pub connect_failures: u64,
    /// A few distinct error messages seen (for diagnostics).
    pub sample_errors: Vec<String>,
}

impl LoadStats {
    /// Keep `e` among the sample errors (ten distinct ones at most).
    pub(crate) fn note(&mut self, e: String) {
        if self.sample_errors.len() < 10 && !self.sample_errors.contains(&e) {
            self.sample_errors.push(e);
        }
    }

    pub(crate) fn merge(&mut self, o: LoadStats) {
        self.ok_calls += o.ok_calls;
        self.err_calls += o.err_calls;
        self.connects += o.connects;
        self.connect_failures += o.connect_failures;
        for e in o.sample_errors {
            self.note(e);
        }
    }
}
