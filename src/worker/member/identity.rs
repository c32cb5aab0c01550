//! A member's identity in its fleet (`tsoracle.member_identity`, docs/fleet.md, "One entry per
//! cluster"): the number it registers under on the oracle — its system identifier until a copy
//! of it, promoted beside its live original, takes one of its own — and the timeline it was
//! last registered on. The oracle lets one live session speak for an identity; the arithmetic
//! of when a refused cluster takes its own is `tsoracle_core::member::MemberIdentity`.

use crate::pg::guc;
use crate::pg::libpq::RemoteError;
use crate::pg::xact::sql_transaction;
use pgrx::prelude::*;
use std::time::Instant;
use tsoracle_core::fleet::RunClaim;
use tsoracle_core::member::MemberIdentity;

/// The oracle's SQLSTATE for a hello whose identity another live session speaks for.
const IN_USE: &str = "55006";

pub(super) struct Identity {
    kept: MemberIdentity,
    /// This run (this postmaster's start, in µs since 1970), and the run the table named
    /// before it began (0: none): kept in `updated_at` (docs/fleet-resolved.md, "One run at a time").
    run: u64,
    prev: u64,
    /// Whether the table names this run already.
    named: bool,
    /// Since when the oracle has refused it as in use, without a hello answered between.
    refused_since: Option<Instant>,
}

/// This cluster's timeline now.
fn timeline() -> u32 {
    // SAFETY: the worker starts only once recovery has ended (BgWorkerStart_RecoveryFinished)
    // and never starts again while the server runs, so the insertion timeline is set and no
    // longer changes.
    unsafe { pg_sys::GetWALInsertionTimeLine() }
}

impl Identity {
    /// What the member's table holds (`None`: shutting down).
    pub(super) fn load() -> Option<Identity> {
        crate::worker::state::read_at_start(|| {
            let mut identity = Self::read()?;
            identity.mark_run()?;
            Ok(identity)
        })
    }

    /// A run that does not prove the one before it ended (a start after a crash, or a copy's
    /// first) is named durably in the member's row before any hello names it, so that every
    /// later run names it as its predecessor and is held like it. A run that proves it (a
    /// clean start, a promotion) is named once the oracle answered its hello
    /// ([`Self::registered`]): till then the row names the last run the oracle knows, and
    /// every start since proved the one before it ended, so the next run proves that one
    /// ended too — clean restarts while the oracle is away hold nothing.
    fn mark_run(&mut self) -> Result<(), String> {
        if self.kept.timeline.is_none() || self.named || self.claim().ended_prev {
            // No row yet: the first registration writes it, with this run.
            return Ok(());
        }
        super::oracle::durable_transaction(
            "cannot keep this run in tsoracle.member_identity",
            || {
                Spi::run(
                    "UPDATE ONLY tsoracle.member_identity SET updated_at = pg_catalog.pg_postmaster_start_time()",
                )
            },
        )?;
        self.named = true;
        Ok(())
    }

    /// What the hello says of this run: the one before it, and whether this cluster proves
    /// that run ended (`MemberIdentity::proves_predecessor_ended`).
    pub(super) fn claim(&self) -> RunClaim {
        RunClaim {
            run: self.run,
            prev: self.prev,
            ended_prev: self.kept.proves_predecessor_ended(crate::pg::clean_start(), timeline()),
        }
    }

    /// What the member's table holds (no row: the system identifier, on no known timeline).
    fn read() -> Result<Identity, String> {
        let kept = sql_transaction("cannot read tsoracle.member_identity", || {
            Spi::connect(|client| {
                let mut kept =
                    MemberIdentity { id: crate::pg::system_identifier(), timeline: None };
                let micros = |t: &str| {
                    format!(
                        "(EXTRACT(epoch FROM {t}) OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8"
                    )
                };
                let run = client
                    .select(
                        &format!("SELECT {}", micros("pg_catalog.pg_postmaster_start_time()")),
                        None,
                        &[],
                    )?
                    .first()
                    .get_one::<i64>()?
                    .unwrap_or(0);
                let mut prev = 0;
                for row in client.select(
                    &format!(
                        "SELECT member_id, timeline, {} FROM ONLY tsoracle.member_identity",
                        micros("updated_at")
                    ),
                    None,
                    &[],
                )? {
                    if let (Some(id), Some(tl)) = (row.get::<i64>(1)?, row.get::<i64>(2)?) {
                        kept = MemberIdentity { id: id as u64, timeline: u32::try_from(tl).ok() };
                        prev = row.get::<i64>(3)?.unwrap_or(0);
                    }
                }
                Ok((kept, run.max(0) as u64, prev.max(0) as u64))
            })
        })?;
        let (kept, run, prev) = kept;
        Ok(Identity { kept, run, prev, named: prev == run, refused_since: None })
    }

    /// The identity the hello names.
    pub(super) fn id(&self) -> i64 {
        self.kept.id as i64
    }

    /// Keep `id` on `timeline` durably, committed before this returns.
    fn write(&mut self, id: u64, timeline: u32) -> Result<(), String> {
        super::oracle::durable_transaction(
            "cannot keep this member's identity in tsoracle.member_identity",
            || {
                Spi::run_with_args(
                    "INSERT INTO tsoracle.member_identity AS m (id, member_id, timeline, updated_at) \
                 VALUES (true, $1, $2, pg_catalog.pg_postmaster_start_time()) ON CONFLICT (id) DO UPDATE SET member_id = \
                 EXCLUDED.member_id, timeline = EXCLUDED.timeline, \
                 updated_at = pg_catalog.pg_postmaster_start_time()",
                    &[(id as i64).into(), i64::from(timeline).into()],
                )
            },
        )?;
        self.kept = MemberIdentity { id, timeline: Some(timeline) };
        self.named = true;
        Ok(())
    }

    /// The oracle answered the hello (its entry names this run durably by then): the identity
    /// is this cluster's on this timeline (a promoted standby whose old primary is gone keeps
    /// the entry), and the row names this run, kept before it is served.
    pub(super) fn registered(&mut self) -> Result<(), String> {
        self.refused_since = None;
        let now = timeline();
        if self.kept.timeline == Some(now) && self.named {
            return Ok(());
        }
        self.write(self.kept.id, now)
    }

    /// The oracle refused the hello: why, as the member reports it. When it refused the identity as in use, for long enough,
    /// on a cluster promoted since it was registered: take an identity of its own, durably,
    /// before the next hello names it. What the member reports either way.
    pub(super) fn refused(&mut self, e: &RemoteError) -> String {
        let why = match e.sqlstate.as_str() {
            // Not admitted, or under another role: the oracle's own words, its HINT naming
            // what to ask the oracle's DBA for (`refused.rs` hands them to the callers).
            _ if refused_admission(e) => {
                format!("the oracle refused this member: {} ({})", e.message, e.sqlstate)
            }
            "42883" | "3F000" => format!(
                "the oracle has no tsoracle {} (tsoracle.member_hello is missing): install it there, in its tsoracle.database",
                crate::pg::EXTENSION_VERSION
            ),
            "42501" => format!(
                "the oracle refuses this member's role: grant it tsoracle_member there ({})",
                e.message
            ),
            _ => format!("the oracle refused this member: {} ({})", e.message, e.sqlstate),
        };
        if e.sqlstate != IN_USE {
            self.refused_since = None;
            return why;
        }
        let since = *self.refused_since.get_or_insert_with(Instant::now);
        // Twice the oracle's silence window (the same setting on both, by default): a
        // standby promoted after its primary died waits for the oracle to see that session go.
        let wait_ms = guc::extension_timeout_ms().max(0) as u64 * 2;
        let now = timeline();
        if !self.kept.takes_its_own(now, since.elapsed().as_millis() as u64, wait_ms) {
            return why;
        }
        let mut random = [0u8; 8];
        // SAFETY: the buffer is 8 writable bytes, the length passed.
        if !unsafe { pg_sys::pg_strong_random(random.as_mut_ptr().cast(), random.len()) } {
            return format!("{why}; cannot take an identity of its own: no random bytes");
        }
        let old = self.kept.id;
        let id = self.kept.fresh(crate::pg::system_identifier(), u64::from_ne_bytes(random));
        if let Err(e) = self.write(id, now) {
            return format!("{why}; cannot take an identity of its own: {e}");
        }
        self.refused_since = None;
        pgrx::log!(
            "tsoracle member: identity {} is in use on the oracle by another live cluster, and this one was promoted since it registered (timeline {now}): it is a copy, and registers as member {} from now on",
            old as i64,
            id as i64
        );
        format!(
            "{why}; this cluster, a copy promoted beside it, takes identity {} of its own",
            id as i64
        )
    }
}

/// A hello refused `42501` with a HINT: the cluster is not admitted, or not for this role
/// (PostgreSQL's own `42501`, a role without `tsoracle_member`, has none).
pub(super) fn refused_admission(e: &RemoteError) -> bool {
    e.sqlstate == "42501" && e.hint.is_some()
}
