//! Fault-injecting provider wrapper (in progress).
