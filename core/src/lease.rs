//! Phase 3.
