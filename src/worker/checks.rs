//! Who may do what, for the roles of one group commit: owners of keys and leases,
//! superusers, and names the worker's database can store.

use crate::shmem::{Reply, ReplyCode, Request};
use pgrx::prelude::*;
use std::collections::HashMap;
use tsoracle_core::queue::Ticket;

/// Who may do what, for the roles of one group: asked of the catalogs once per role.
pub(super) struct Checks {
    superusers: HashMap<u32, bool>,
    ascii_only: bool,
}

impl Checks {
    pub(super) fn new(requests: &[(Ticket, Request)], ascii_only: bool) -> Checks {
        let mut superusers = HashMap::new();
        for (_, r) in requests {
            superusers
                .entry(r.role)
                // SAFETY: a catalog lookup by OID inside the group's transaction; an unknown
                // OID (a role dropped since) is simply not a superuser.
                .or_insert_with(|| unsafe { pg_sys::superuser_arg(pg_sys::Oid::from(r.role)) });
        }
        Checks { superusers, ascii_only }
    }

    fn is_superuser(&self, role: u32) -> bool {
        self.superusers.get(&role).copied().unwrap_or(false)
    }

    /// May `role` use what `owner` owns? Owner 0 (a key from before owners existed) is
    /// shared by every role that may call the function; otherwise the owner, its members
    /// (as for PostgreSQL's own objects), and superusers.
    pub(super) fn may_use(&self, role: u32, owner: u32) -> bool {
        owner == 0
            || role == owner
            || self.is_superuser(role)
            // SAFETY: a catalog lookup inside the group's transaction.
            || unsafe { pg_sys::has_privs_of_role(pg_sys::Oid::from(role), pg_sys::Oid::from(owner)) }
    }

    /// May `role` manage (renew, release, drop) what `owner` owns? The owner itself or a
    /// superuser (owner 0: shared, as above).
    pub(super) fn may_manage(&self, role: u32, owner: u32) -> bool {
        owner == 0 || role == owner || self.is_superuser(role)
    }

    /// A name the worker's database can store and give back.
    pub(super) fn storable(&self, name: &str) -> bool {
        !self.ascii_only || name.is_ascii()
    }
}

/// 42501, carrying the owner so the caller can name it.
pub(super) fn denied(owner: u32) -> Reply {
    Reply { value: i64::from(owner), ..Reply::err(ReplyCode::PermissionDenied) }
}
