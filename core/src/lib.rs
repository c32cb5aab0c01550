//! The pure logic of tsoracle: timestamp packing, the window allocator, dense-sequence
//! group planning, the lease table, and the lock-free window the hot path takes from. No PostgreSQL here, so all of it is unit- and
//! property-testable in microseconds; the extension crate does the I/O around it.

pub mod allocator;
pub mod clock;
pub mod error;
pub mod fence;
pub mod fleet;
pub mod ha;
pub mod lease;
pub mod locks;
pub mod member;
pub mod queue;
pub mod redact;
pub mod reservation;
pub mod resolved;
pub mod row_page;
pub mod seq;
pub mod text;
pub mod timestamp;
pub mod uuid;
pub mod version;
pub mod window;

pub use error::CoreError;
