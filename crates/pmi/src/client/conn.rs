//! The connection to a PMI server: [`Conn`] writes requests and reads
//! replies (blocking, or without blocking for the barrier's reply), and does
//! the `PMI_PORT` handshake and the `init` exchange; the helpers that check
//! a reply's command, `rc` and fields are here too.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::mem;
use std::os::fd::AsFd;

use tracing::trace;

use super::{Job, Maxes};
use crate::error::PmiError;
use crate::sys;
use crate::wire::{self, Message, ReadError, WireError};

/// A connection to a PMI server.
pub(super) struct Conn {
    io: Io,
    /// The start of a reply line that [`Conn::try_recv`] has taken out of
    /// the reader while its `\n` had not arrived yet. Empty between
    /// requests.
    partial: Vec<u8>,
}

/// How a connection is read and written.
pub(super) enum Io {
    /// A socket: replies are read through the buffer, requests written to
    /// the socket itself (`get_mut`), and readiness can be asked of poll(2),
    /// so a reply can be waited for without blocking.
    Socket(BufReader<Box<dyn Socket>>),
    /// Halves given by the caller ([`PmiClient::new`](super::PmiClient::new)):
    /// blocking reads only.
    Split {
        reader: Box<dyn BufRead + Send>,
        writer: Box<dyn Write + Send>,
    },
}

/// A connected stream socket, read and written through one handle.
pub(super) trait Socket: Read + Write + AsFd + Send {}

impl<T: Read + Write + AsFd + Send> Socket for T {}

impl Conn {
    pub(super) fn new(io: Io) -> Self {
        Self {
            io,
            partial: Vec::new(),
        }
    }

    /// Whether [`try_recv`](Self::try_recv) can be used.
    pub(super) fn is_pollable(&self) -> bool {
        matches!(self.io, Io::Socket(_))
    }

    /// Writes one request and flushes it.
    pub(super) fn send(&mut self, cmd: &'static str, req: &Message) -> Result<(), PmiError> {
        let line = req
            .to_line()
            .map_err(|source| PmiError::Encode { cmd, source })?;
        trace!(request = line.trim_end(), "PMI >");
        let writer: &mut dyn Write = match &mut self.io {
            Io::Socket(reader) => reader.get_mut(),
            Io::Split { writer, .. } => writer,
        };
        writer
            .write_all(line.as_bytes())
            .and_then(|()| writer.flush())
            .map_err(|source| PmiError::Io { cmd, source })
    }

    /// Reads one reply to `cmd`, blocking until it arrives.
    pub(super) fn recv(&mut self, cmd: &'static str) -> Result<Message, PmiError> {
        // Only barrier_poll leaves bytes here, and only while a barrier is in
        // flight, when no blocking request is allowed.
        debug_assert!(
            self.partial.is_empty(),
            "blocking read after a partial line"
        );
        let reader: &mut dyn BufRead = match &mut self.io {
            Io::Socket(reader) => reader,
            Io::Split { reader, .. } => reader,
        };
        decode(cmd, wire::read_message(reader))
    }

    /// Reads one reply to `cmd` if all of its line has arrived, without
    /// blocking: `Ok(None)` if not yet.
    ///
    /// The bytes already in the reader's buffer are used first, so a reply
    /// that came in with an earlier one is not missed; only an empty buffer
    /// makes it poll the socket, and it reads only when poll(2) says a read
    /// returns at once (one `read` per refill, as `BufReader::fill_buf` does
    /// on an empty buffer). The start of a line whose `\n` has not arrived
    /// is moved to `partial`, so the buffer is always empty before a poll.
    pub(super) fn try_recv(&mut self, cmd: &'static str) -> Result<Option<Message>, PmiError> {
        let Io::Socket(reader) = &mut self.io else {
            return Err(PmiError::NotPollable);
        };
        loop {
            let buffered = reader.buffer();
            if let Some(end) = buffered.iter().position(|&b| b == b'\n') {
                self.partial.extend_from_slice(&buffered[..=end]);
                reader.consume(end + 1);
                let line = mem::take(&mut self.partial);
                return decode(cmd, wire::read_message(&mut line.as_slice())).map(Some);
            }
            let taken = buffered.len();
            self.partial.extend_from_slice(buffered);
            reader.consume(taken);
            if self.partial.len() > wire::MAX_LINE {
                return Err(PmiError::Malformed {
                    cmd,
                    source: WireError::LineTooLong {
                        max: wire::MAX_LINE,
                    },
                });
            }
            let fd = reader.get_ref().as_fd();
            if !sys::readable_now(fd).map_err(|source| PmiError::Io { cmd, source })? {
                return Ok(None);
            }
            match reader.fill_buf() {
                Ok([]) if self.partial.is_empty() => return Err(PmiError::Eof { cmd }),
                Ok([]) => {
                    return Err(PmiError::Malformed {
                        cmd,
                        source: WireError::Truncated,
                    });
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => return Err(PmiError::Io { cmd, source }),
            }
        }
    }

    /// Drops the start of a reply line that [`try_recv`](Self::try_recv)
    /// kept, once the barrier it was waiting for is over (by its reply or an
    /// error).
    pub(super) fn discard_partial(&mut self) {
        self.partial.clear();
    }

    /// Sends `req` and reads its reply, which must be `expected`.
    pub(super) fn call(
        &mut self,
        cmd: &'static str,
        req: &Message,
        expected: &'static str,
    ) -> Result<Message, PmiError> {
        self.send(cmd, req)?;
        self.expect(cmd, expected)
    }

    fn expect(&mut self, cmd: &'static str, expected: &'static str) -> Result<Message, PmiError> {
        let reply = self.recv(cmd)?;
        check_reply(cmd, expected, reply)
    }

    /// The `PMI_PORT` handshake, with the proof of authenticated mode;
    /// returns `(rank, size)`.
    pub(super) fn initack(
        &mut self,
        pmiid: &str,
        proof: Option<&str>,
    ) -> Result<(u32, u32), PmiError> {
        const CMD: &str = "initack";
        let mut req = Message::new(CMD).with("pmiid", pmiid);
        if let Some(proof) = proof {
            req = req.with("proof", proof);
        }
        self.send(CMD, &req)?;
        let reply = self.recv(CMD)?;
        if reply.cmd() == "challenge" && proof.is_none() {
            return Err(PmiError::SecretRequired);
        }
        let reply = check_reply(CMD, CMD, reply)?;
        check_rc(CMD, &reply)?;
        let (mut rank, mut size, mut debug) = (None, None, None);
        while rank.is_none() || size.is_none() || debug.is_none() {
            let set = self.expect(CMD, "set")?;
            for (key, value) in set.args() {
                match key.as_str() {
                    "rank" => rank = Some(parse_field::<u32>(CMD, "rank", value)?),
                    "size" => size = Some(parse_field::<u32>(CMD, "size", value)?),
                    "debug" => debug = Some(parse_field::<i64>(CMD, "debug", value)?),
                    _ => trace!(key, value, "ignoring PMI set"),
                }
            }
        }
        match (rank, size) {
            (Some(rank), Some(size)) => Ok((rank, size)),
            _ => Err(PmiError::MissingField {
                cmd: CMD,
                field: "rank",
            }),
        }
    }

    pub(super) fn init(&mut self) -> Result<Job, PmiError> {
        let req = Message::new("init")
            .with("pmi_version", "1")
            .with("pmi_subversion", "1");
        let reply = self.call("init", &req, "response_to_init")?;
        check_rc("init", &reply)?;
        if let Some(v) = reply.get("pmi_version").filter(|&v| v != "1") {
            return Err(PmiError::BadField {
                cmd: "init",
                field: "pmi_version",
                value: wire::snippet(v),
            });
        }

        let reply = self.call("get_maxes", &Message::new("get_maxes"), "maxes")?;
        check_rc("get_maxes", &reply)?;
        let limit = |field| {
            let v = required_field("get_maxes", &reply, field)?;
            match parse_field::<usize>("get_maxes", field, v)? {
                n if n >= 2 => Ok(n),
                _ => Err(PmiError::BadField {
                    cmd: "get_maxes",
                    field,
                    value: wire::snippet(v),
                }),
            }
        };
        let maxes = Maxes {
            kvsname: limit("kvsname_max")?,
            key: limit("keylen_max")?,
            value: limit("vallen_max")?,
        };

        let reply = self.call("get_appnum", &Message::new("get_appnum"), "appnum")?;
        check_rc("get_appnum", &reply)?;
        let appnum = optional_count("get_appnum", "appnum", &reply)?;

        let reply = self.call(
            "get_my_kvsname",
            &Message::new("get_my_kvsname"),
            "my_kvsname",
        )?;
        check_rc("get_my_kvsname", &reply)?;
        let kvsname = required_field("get_my_kvsname", &reply, "kvsname")?.to_owned();
        if !wire::is_valid_value(&kvsname) || kvsname.is_empty() {
            return Err(PmiError::BadField {
                cmd: "get_my_kvsname",
                field: "kvsname",
                value: wire::snippet(&kvsname),
            });
        }

        let reply = self.call(
            "get_universe_size",
            &Message::new("get_universe_size"),
            "universe_size",
        )?;
        check_rc("get_universe_size", &reply)?;
        let universe_size = optional_count("get_universe_size", "size", &reply)?;

        Ok(Job {
            kvsname,
            maxes,
            appnum,
            universe_size,
        })
    }
}

/// The outcome of [`wire::read_message`] for a reply to `cmd`.
fn decode(
    cmd: &'static str,
    read: Result<Option<Message>, ReadError>,
) -> Result<Message, PmiError> {
    match read {
        Ok(Some(reply)) => {
            trace!(reply = %reply, "PMI <");
            Ok(reply)
        }
        Ok(None) => Err(PmiError::Eof { cmd }),
        Err(ReadError::Io(source)) if source.kind() == io::ErrorKind::UnexpectedEof => {
            Err(PmiError::Eof { cmd })
        }
        Err(ReadError::Io(source)) => Err(PmiError::Io { cmd, source }),
        Err(ReadError::Malformed(source)) => Err(PmiError::Malformed { cmd, source }),
    }
}

/// `reply`, if it is an `expected` message.
pub(super) fn check_reply(
    cmd: &'static str,
    expected: &'static str,
    reply: Message,
) -> Result<Message, PmiError> {
    if reply.cmd() != expected {
        return Err(PmiError::UnexpectedReply {
            cmd,
            expected,
            got: wire::snippet(&reply.to_string()),
        });
    }
    Ok(reply)
}

/// The reply's `rc`; 0 when absent (hydra's `barrier_out` has none).
pub(super) fn rc_of(cmd: &'static str, reply: &Message) -> Result<i64, PmiError> {
    reply
        .get("rc")
        .map_or(Ok(0), |rc| parse_field(cmd, "rc", rc))
}

pub(super) fn check_rc(cmd: &'static str, reply: &Message) -> Result<(), PmiError> {
    match rc_of(cmd, reply)? {
        0 => Ok(()),
        rc => Err(PmiError::Failed {
            cmd,
            rc,
            msg: reply.get("msg").map(wire::snippet).unwrap_or_default(),
        }),
    }
}

pub(super) fn required_field<'m>(
    cmd: &'static str,
    reply: &'m Message,
    field: &'static str,
) -> Result<&'m str, PmiError> {
    reply
        .get(field)
        .ok_or(PmiError::MissingField { cmd, field })
}

fn parse_field<T: std::str::FromStr>(
    cmd: &'static str,
    field: &'static str,
    value: &str,
) -> Result<T, PmiError> {
    value.parse().map_err(|_| PmiError::BadField {
        cmd,
        field,
        value: wire::snippet(value),
    })
}

/// A count the launcher may not know: negative means unknown.
fn optional_count(
    cmd: &'static str,
    field: &'static str,
    reply: &Message,
) -> Result<Option<u32>, PmiError> {
    let value = required_field(cmd, reply, field)?;
    let n: i64 = parse_field(cmd, field, value)?;
    if n < 0 {
        return Ok(None);
    }
    u32::try_from(n).map(Some).map_err(|_| PmiError::BadField {
        cmd,
        field,
        value: wire::snippet(value),
    })
}
