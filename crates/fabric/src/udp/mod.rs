//! UDP provider (in progress).
