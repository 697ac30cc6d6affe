//! The PMI-1 "simple" text protocol: one [`Message`] per line.
//!
//! A message is `cmd=<name>` followed by space-separated `key=value` tokens
//! and ended by `\n`:
//!
//! ```text
//! cmd=get kvsname=kvs_0 key=addr-1
//! cmd=get_result rc=0 msg=success value=udp://127.0.0.1:50001
//! ```
//!
//! Parsing is tolerant where real servers differ and strict where a mistake
//! would desynchronise the stream:
//!
//! * key order does not matter and extra keys are kept ([`Message::get`] finds
//!   the first token with that key), because hydra and Slurm order their
//!   replies differently;
//! * a value is everything after the first `=` of its token (it may contain
//!   `=`, and may be empty); runs of spaces separate tokens;
//! * a missing `cmd`, a token without `=`, an empty key, a line longer than
//!   [`MAX_LINE`] bytes or one that is not UTF-8 is a [`WireError`], never a
//!   panic;
//! * no escaping is done in either direction: a backslash is an ordinary byte.
//!
//! Emission ([`Message::to_line`]) only writes what parses back to the same
//! message: keys are printable ASCII without space or `=`, values printable
//! ASCII without space. Callers store binary data as hex.
//!
//! The multi-line form used by `spawn` (`mcmd=spawn`, one `key=value` per
//! line, closed by a line `endcmd`) is read by [`read_message`] into a
//! [`Message`] whose [`is_multiline`](Message::is_multiline) is set, so a
//! server can consume it whole and refuse it cleanly.
//!
//! ```
//! use udbtl_pmi::wire::Message;
//!
//! let msg = Message::new("put").with("kvsname", "kvs_0").with("key", "k").with("value", "v=1");
//! let line = msg.to_line()?;
//! assert_eq!(line, "cmd=put kvsname=kvs_0 key=k value=v=1\n");
//! assert_eq!(Message::parse(line.as_bytes())?, msg);
//! # Ok::<(), udbtl_pmi::wire::WireError>(())
//! ```

use std::fmt::{self, Write as _};
use std::io::{self, BufRead, Read as _};

/// Longest line accepted, in bytes, without its `\n`. A multi-line message
/// may not exceed it in total either.
pub const MAX_LINE: usize = 64 * 1024;

/// Most bytes of offending input quoted in an error.
const SNIPPET: usize = 48;

/// A malformed or unrepresentable PMI-1 message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The line does not start with a non-empty `cmd=` (or `mcmd=`) token.
    #[error("PMI line does not start with cmd=<name>: {line:?}")]
    MissingCmd {
        /// The start of the line.
        line: String,
    },
    /// A token has no `=`.
    #[error("PMI token without '=': {token:?}")]
    TokenWithoutEq {
        /// The token (truncated).
        token: String,
    },
    /// A token starts with `=`.
    #[error("PMI token with an empty key: {token:?}")]
    EmptyKey {
        /// The token (truncated).
        token: String,
    },
    /// More than [`MAX_LINE`] bytes arrived without a `\n`.
    #[error("PMI line longer than {max} bytes")]
    LineTooLong {
        /// The limit, [`MAX_LINE`].
        max: usize,
    },
    /// The line is not valid UTF-8.
    #[error("PMI line is not UTF-8 (at byte {valid_up_to})")]
    NotUtf8 {
        /// Length of the valid prefix.
        valid_up_to: usize,
    },
    /// The stream ended in the middle of a line or of a multi-line message.
    #[error("PMI stream ended inside a message")]
    Truncated,
    /// On emit: a command name or key is empty or holds a byte outside
    /// printable ASCII, a space or `=`.
    #[error("cannot emit PMI key {key:?}: keys are non-empty printable ASCII without space or '='")]
    InvalidKey {
        /// The key (truncated).
        key: String,
    },
    /// On emit: a value holds a byte outside printable ASCII, or a space.
    #[error("cannot emit PMI value of {key:?}: values are printable ASCII without space")]
    InvalidValue {
        /// The key the value belongs to.
        key: String,
    },
}

/// Why [`read_message`] returned no message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The underlying stream failed.
    #[error("reading a PMI message: {0}")]
    Io(#[from] io::Error),
    /// The bytes were not a PMI-1 message. After
    /// [`WireError::LineTooLong`] the stream is no longer at a line boundary.
    #[error(transparent)]
    Malformed(#[from] WireError),
}

/// One PMI-1 message: a command name and its `key=value` arguments, in wire
/// order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    cmd: String,
    args: Vec<(String, String)>,
    multiline: bool,
}

impl Message {
    /// A single-line message `cmd=<cmd>` without arguments.
    pub fn new(cmd: impl Into<String>) -> Self {
        Self {
            cmd: cmd.into(),
            args: Vec::new(),
            multiline: false,
        }
    }

    /// Appends `key=value` (builder form of [`push`](Self::push)).
    #[must_use]
    pub fn with(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.push(key, value);
        self
    }

    /// Appends `key=value`. Validity is checked by [`to_line`](Self::to_line).
    pub fn push(&mut self, key: impl Into<String>, value: impl Into<String>) {
        self.args.push((key.into(), value.into()));
    }

    /// The command name (the value of `cmd=` or `mcmd=`).
    pub fn cmd(&self) -> &str {
        &self.cmd
    }

    /// The value of the first argument named `key`, if any.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.args
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The arguments in wire order (duplicates kept).
    pub fn args(&self) -> &[(String, String)] {
        &self.args
    }

    /// Whether the message uses the multi-line `mcmd=` form.
    pub fn is_multiline(&self) -> bool {
        self.multiline
    }

    /// Switches to the multi-line `mcmd=` form (spawn), for emission.
    #[must_use]
    pub fn into_multiline(mut self) -> Self {
        self.multiline = true;
        self
    }

    /// Parses one single-line message. A trailing `\n` (or `\r\n`) is
    /// optional; an embedded `\n` is part of a token. Lines starting with
    /// `mcmd=` are reported as [`WireError::MissingCmd`]: the multi-line form
    /// needs [`read_message`].
    ///
    /// # Errors
    ///
    /// [`WireError::MissingCmd`], [`WireError::TokenWithoutEq`],
    /// [`WireError::EmptyKey`], [`WireError::LineTooLong`] or
    /// [`WireError::NotUtf8`]; never panics, whatever the bytes.
    pub fn parse(line: &[u8]) -> Result<Self, WireError> {
        let line = strip_eol(line);
        if line.len() > MAX_LINE {
            return Err(WireError::LineTooLong { max: MAX_LINE });
        }
        let line = utf8(line)?;
        let mut tokens = line.split(' ').filter(|t| !t.is_empty());
        let cmd = match tokens.next().map(split_token).transpose()? {
            Some(("cmd", name)) if !name.is_empty() => name.to_owned(),
            _ => {
                return Err(WireError::MissingCmd {
                    line: snippet(line),
                });
            }
        };
        let args = tokens
            .map(|t| split_token(t).map(|(k, v)| (k.to_owned(), v.to_owned())))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            cmd,
            args,
            multiline: false,
        })
    }

    /// The message on the wire, `\n` included: `cmd=<name> k=v ...\n`, or for
    /// a multi-line message `mcmd=<name>\n`, one `k=v\n` per argument, and
    /// `endcmd\n`.
    ///
    /// # Errors
    ///
    /// [`WireError::InvalidKey`] if the command name or a key is empty or
    /// holds a byte outside `!`..=`~` or `=`; [`WireError::InvalidValue`] if
    /// a value holds a byte outside `!`..=`~`. Such a message would not parse
    /// back to itself.
    pub fn to_line(&self) -> Result<String, WireError> {
        check_key(&self.cmd)?;
        let mut len = self.cmd.len() + 6;
        for (k, v) in &self.args {
            check_key(k)?;
            if !v.bytes().all(is_value_byte) {
                return Err(WireError::InvalidValue { key: snippet(k) });
            }
            len += k.len() + v.len() + 2;
        }
        let mut line = String::with_capacity(len + 8);
        if self.multiline {
            line.push_str("mcmd=");
            line.push_str(&self.cmd);
            line.push('\n');
            for (k, v) in &self.args {
                line.push_str(k);
                line.push('=');
                line.push_str(v);
                line.push('\n');
            }
            line.push_str("endcmd\n");
        } else {
            line.push_str("cmd=");
            line.push_str(&self.cmd);
            for (k, v) in &self.args {
                line.push(' ');
                line.push_str(k);
                line.push('=');
                line.push_str(v);
            }
            line.push('\n');
        }
        Ok(line)
    }
}

impl fmt::Display for Message {
    /// The wire form without the final `\n`, not validated (for logs).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prefix = if self.multiline { "mcmd=" } else { "cmd=" };
        f.write_str(prefix)?;
        f.write_str(&self.cmd)?;
        for (k, v) in &self.args {
            f.write_char(' ')?;
            f.write_str(k)?;
            f.write_char('=')?;
            f.write_str(v)?;
        }
        Ok(())
    }
}

/// Reads the next message from `reader`: one line, or for `mcmd=` every line
/// up to and including `endcmd`.
///
/// Returns `Ok(None)` on a clean end of stream (no byte of a new message was
/// read). Never reads more than [`MAX_LINE`] + 1 bytes per line, so a peer
/// cannot make it allocate without bound.
///
/// # Errors
///
/// [`ReadError::Io`] from the reader; [`ReadError::Malformed`] with
/// [`WireError::Truncated`] if the stream ends inside a message, or any error
/// of [`Message::parse`]. After [`WireError::LineTooLong`] the reader is in
/// the middle of a line: close the connection.
pub fn read_message<R: BufRead + ?Sized>(reader: &mut R) -> Result<Option<Message>, ReadError> {
    let mut line = Vec::new();
    if !read_line(reader, &mut line)? {
        return Ok(None);
    }
    let Some(name) = strip_eol(&line).strip_prefix(b"mcmd=") else {
        return Ok(Some(Message::parse(&line)?));
    };
    let name = utf8(name)?;
    if name.is_empty() || name.contains(' ') {
        return Err(WireError::MissingCmd {
            line: snippet(name),
        }
        .into());
    }
    let mut msg = Message::new(name).into_multiline();
    let mut total = line.len();
    loop {
        line.clear();
        if !read_line(reader, &mut line)? {
            return Err(WireError::Truncated.into());
        }
        total += line.len();
        if total > MAX_LINE {
            return Err(WireError::LineTooLong { max: MAX_LINE }.into());
        }
        let text = utf8(strip_eol(&line))?;
        if text == "endcmd" {
            return Ok(Some(msg));
        }
        let (k, v) = split_token(text)?;
        msg.push(k, v);
    }
}

/// Appends one line (with its `\n`) to `buf`. `Ok(false)` on end of stream
/// before any byte.
fn read_line<R: BufRead + ?Sized>(reader: &mut R, buf: &mut Vec<u8>) -> Result<bool, ReadError> {
    let limit = MAX_LINE as u64 + 1;
    let n = reader.take(limit).read_until(b'\n', buf)?;
    if n == 0 {
        return Ok(false);
    }
    if buf.last() != Some(&b'\n') {
        return Err(if n as u64 >= limit {
            WireError::LineTooLong { max: MAX_LINE }
        } else {
            WireError::Truncated
        }
        .into());
    }
    Ok(true)
}

fn strip_eol(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn utf8(bytes: &[u8]) -> Result<&str, WireError> {
    std::str::from_utf8(bytes).map_err(|e| WireError::NotUtf8 {
        valid_up_to: e.valid_up_to(),
    })
}

/// Splits `key=value` at its first `=`.
fn split_token(token: &str) -> Result<(&str, &str), WireError> {
    match token.split_once('=') {
        None => Err(WireError::TokenWithoutEq {
            token: snippet(token),
        }),
        Some(("", _)) => Err(WireError::EmptyKey {
            token: snippet(token),
        }),
        Some(kv) => Ok(kv),
    }
}

/// Whether `b` may appear in an emitted value: printable ASCII, no space.
pub(crate) fn is_value_byte(b: u8) -> bool {
    b.is_ascii_graphic()
}

/// Whether `s` may be emitted as a key or command name.
pub(crate) fn is_valid_key(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| is_value_byte(b) && b != b'=')
}

/// Whether `s` may be emitted as a value.
pub(crate) fn is_valid_value(s: &str) -> bool {
    s.bytes().all(is_value_byte)
}

fn check_key(key: &str) -> Result<(), WireError> {
    if is_valid_key(key) {
        Ok(())
    } else {
        Err(WireError::InvalidKey { key: snippet(key) })
    }
}

/// The first [`SNIPPET`] characters of `s`, for error messages.
pub(crate) fn snippet(s: &str) -> String {
    match s.char_indices().nth(SNIPPET) {
        Some((end, _)) => format!("{}...", &s[..end]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests;
