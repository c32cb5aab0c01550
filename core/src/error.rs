//! The one error type of the core. The extension maps each variant to a SQLSTATE.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoreError {
    #[error("not serving: no leadership epoch")]
    NotLeader,
    #[error("timestamp window exhausted: need physical_ms {needed_ms}, committed high-water is {high_water_ms}")]
    WindowExhausted { needed_ms: u64, high_water_ms: u64 },
    #[error("count must be between 1 and {max}, got {got}")]
    InvalidCount { got: i64, max: u64 },
    #[error("physical_ms {0} is outside the 46-bit range")]
    PhysicalOutOfRange(u64),
    #[error("logical {0} is outside the 18-bit range")]
    LogicalOutOfRange(u64),
    #[error("epoch mismatch: allocator is at {current:?}, result is for {got}")]
    EpochMismatch { current: Option<u64>, got: u64 },
    #[error("invalid leadership seed: floor {floor_ms} is above high-water {high_water_ms}")]
    InvalidSeed { floor_ms: u64, high_water_ms: u64 },
    #[error("timestamp {0} is negative")]
    NegativeTimestamp(i64),
    #[error("not a version-7 UUID of the RFC 9562 variant (version {version}, variant bits {variant:02b})")]
    NotUuidV7 { version: u8, variant: u8 },
    #[error("its time ({0} ms) is after the last millisecond a tsoracle timestamp can hold (in the year 3084)")]
    UuidTimeOutOfRange(u64),

    // Sequences.
    #[error("sequence key must be 1 to {max} bytes, got {got}")]
    InvalidSeqKey { got: usize, max: usize },
    #[error("sequence would overflow bigint: base {base} + total {total}")]
    SeqOverflow { base: i64, total: u64 },
    #[error("too many sequence keys: at most {max} distinct keys")]
    TooManySeqKeys { max: u64 },
    #[error("sequence key \"{0}\" is locked by another transaction")]
    SeqKeyBusy(String),

    // Leases.
    #[error("lease holder must be 1 to {max} bytes, got {got}")]
    InvalidHolder { got: usize, max: usize },
    #[error("lease ttl_ms must be between {min} and {max}, got {got}")]
    InvalidTtl { got: i64, min: i64, max: i64 },
    #[error("stale holder epoch {got}: holder already has an active lease at epoch {active}")]
    StaleHolderEpoch { got: i64, active: i64 },
    #[error("lease {0} not found")]
    LeaseNotFound(i64),
    #[error("lease {0} is expired or superseded and cannot be renewed")]
    LeaseNotRenewable(i64),
    #[error("lease id {0} is already in use")]
    DuplicateLeaseId(i64),
}
