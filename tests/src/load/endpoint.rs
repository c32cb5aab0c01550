//! Where a load thread connects: an [`Endpoint`], a name and the current conninfo.

use std::sync::Arc;
use std::time::Duration;

use postgres::{Client, NoTls};

/// Where a load thread connects: a name (recorded as the call's node) and a function giving
/// the current conninfo (so it can follow a node that moved, or later a changing primary).
///
/// A *pooled* endpoint is a connection pooler ([`crate::pooler::PgBouncer`]): PgBouncer
/// refuses the startup parameter `options`, so its connections carry no
/// `statement_timeout` of their own (the pooler's role has one on the server, see
/// [`crate::pooler::create_role`]), and loads call it with unnamed statements only.
#[derive(Clone)]
pub struct Endpoint {
    pub name: String,
    resolve: Arc<dyn Fn() -> String + Send + Sync>,
    pooled: bool,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Endpoint({}: {})", self.name, self.conninfo())
    }
}

impl Endpoint {
    pub fn new(name: &str, resolve: impl Fn() -> String + Send + Sync + 'static) -> Self {
        Endpoint { name: name.to_string(), resolve: Arc::new(resolve), pooled: false }
    }

    pub fn fixed(name: &str, conninfo: &str) -> Self {
        let c = conninfo.to_string();
        Endpoint::new(name, move || c.clone())
    }

    /// A connection pooler at `conninfo` (see the type's documentation).
    pub fn pooled(name: &str, conninfo: &str) -> Self {
        Endpoint { pooled: true, ..Endpoint::fixed(name, conninfo) }
    }

    /// Whether this is a connection pooler: no startup `options`, unnamed statements only.
    pub fn is_pooled(&self) -> bool {
        self.pooled
    }

    pub fn conninfo(&self) -> String {
        (self.resolve)()
    }

    /// One connection attempt, with the load's statement timeout (a pooled endpoint's comes
    /// from its role on the server).
    pub fn connect(&self, statement_timeout_ms: u64) -> Result<Client, postgres::Error> {
        let mut cfg: postgres::Config = self.conninfo().parse()?;
        if cfg.get_connect_timeout().is_none() {
            cfg.connect_timeout(Duration::from_secs(5));
        }
        if cfg.get_options().is_none() && !self.pooled {
            cfg.options(&format!("-c statement_timeout={statement_timeout_ms}"));
        }
        cfg.application_name("tsoracle-load");
        cfg.connect(NoTls)
    }
}
