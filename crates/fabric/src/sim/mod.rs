//! Deterministic simulated fabric (in progress).
