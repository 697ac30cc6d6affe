use core::fmt;

/// A header could not be parsed: it was truncated, carried an unknown version
/// or magic number, or held a field value the format does not allow.
///
/// The error is deliberately a unit: the receiving layer counts and drops the
/// datagram, and it is the one that knows which peer and queue were involved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Error;

/// `Result` with this crate's [`Error`].
pub type Result<T> = core::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("malformed or truncated header")
    }
}

impl std::error::Error for Error {}
