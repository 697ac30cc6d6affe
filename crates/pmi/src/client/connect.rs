//! Finding the launcher and making a [`PmiClient`]: from the environment
//! ([`PmiClient::from_env`]: `PMI_FD`, `PMI_PORT` with or without the job
//! secret, a PMIx launcher refused, or singleton), from a caller's stream or
//! socket, and the `PMI_PORT` connection with its handshake and retries.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::thread;
use std::time::{Duration, Instant};

use tracing::debug;

use super::conn::{Conn, Io, Socket, check_reply, required_field};
use super::{Link, Mode, PmiClient};
use crate::auth::{self, JobSecret, NONCE_LEN, SECRET_ENV};
use crate::error::PmiError;
use crate::sys;
use crate::wire;

/// How long an authenticated client
/// ([`connect_port_authenticated`](PmiClient::connect_port_authenticated))
/// waits for the server's challenge, and then for the rest of the
/// handshake. A server without a secret waits for the client's `initack`
/// and sends nothing, so against one the client fails after this long
/// with [`PmiError::NoChallenge`]. Below the server's
/// [`DEFAULT_HANDSHAKE_TIMEOUT`](crate::server::DEFAULT_HANDSHAKE_TIMEOUT).
pub const CHALLENGE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long an authenticated client keeps reconnecting when the server
/// closes the connection before sending anything, which is what a server
/// does when [`PortOptions::with_max_handshakes_per_source`] connections
/// from the client's address are already in their handshake and as many
/// more wait (a flood of junk connections from it, say).
/// Attempts are spaced 10 ms apart at first, doubling up to 500 ms.
///
/// [`PortOptions::with_max_handshakes_per_source`]: crate::server::PortOptions::with_max_handshakes_per_source
pub const PORT_RETRY_WINDOW: Duration = Duration::from_secs(30);

impl PmiClient {
    /// Finds the launcher from the process environment; see
    /// [`from_env_with`](Self::from_env_with).
    ///
    /// # Errors
    ///
    /// As [`from_env_with`](Self::from_env_with).
    pub fn from_env() -> Result<Self, PmiError> {
        Self::from_env_with(|var| std::env::var_os(var).map(|v| v.to_string_lossy().into_owned()))
    }

    /// Finds the launcher from the variables `lookup` returns:
    ///
    /// 1. `PMI_FD` set: take ownership of that inherited socket (at most once
    ///    per process; it is made close-on-exec) with rank `PMI_RANK` and
    ///    size `PMI_SIZE` (both required);
    /// 2. else `PMI_PORT=host:port` and `PMI_ID` set:
    ///    [`connect_port_authenticated`](Self::connect_port_authenticated)
    ///    if [`SECRET_ENV`] (`UDBTL_PMI_SECRET`) holds the job secret (64 hex
    ///    digits), else [`connect_port`](Self::connect_port);
    /// 3. else `PMIX_RANK`, `PMIX_VERSION` or `PRTE_LAUNCHED` set: a PMIx
    ///    launcher, which is refused;
    /// 4. else [`singleton`](Self::singleton).
    ///
    /// No request is sent except the `initack` handshake of `PMI_PORT`: call
    /// [`init`](Self::init) next.
    ///
    /// # Errors
    ///
    /// [`PmiError::Env`] for a missing or invalid variable (an invalid
    /// secret is not quoted),
    /// [`PmiError::InheritedFd`] if `PMI_FD` is not an open socket (or was
    /// already taken), [`PmiError::PmixLauncher`], and the errors of
    /// [`connect_port`](Self::connect_port) or
    /// [`connect_port_authenticated`](Self::connect_port_authenticated).
    pub fn from_env_with(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, PmiError> {
        if let Some(fd) = lookup("PMI_FD") {
            let fd = parse_env::<i32>("PMI_FD", &fd)?;
            let rank = required_env(&lookup, "PMI_RANK")?;
            let size = required_env(&lookup, "PMI_SIZE")?;
            check_rank("PMI_RANK", rank, size)?;
            let stream = sys::take_inherited_socket(fd)
                .map_err(|source| PmiError::InheritedFd { fd, source })?;
            debug!(fd, rank, size, "PMI client on PMI_FD");
            let mut client = Self::from_socket(stream, rank, size)?;
            client.mode = Mode::Fd;
            return Ok(client);
        }
        if let Some(port) = lookup("PMI_PORT") {
            let Some(id) = lookup("PMI_ID") else {
                return Err(PmiError::Env {
                    var: "PMI_ID",
                    reason: "not set (PMI_PORT is)".into(),
                });
            };
            return match lookup(SECRET_ENV) {
                Some(hex) => {
                    let secret = JobSecret::from_hex(&hex).map_err(|e| PmiError::Env {
                        var: SECRET_ENV,
                        reason: e.to_string(),
                    })?;
                    Self::connect_port_authenticated(&port, &id, &secret)
                }
                None => Self::connect_port(&port, &id),
            };
        }
        for var in ["PMIX_RANK", "PMIX_VERSION", "PRTE_LAUNCHED"] {
            if lookup(var).is_some() {
                return Err(PmiError::PmixLauncher { var });
            }
        }
        debug!("no PMI launcher found: singleton");
        Ok(Self::singleton())
    }

    /// A client over an established connection: replies are read from
    /// `reader`, requests written to `writer` (flushed after each one).
    ///
    /// Such a client cannot wait for a reply without blocking, so its
    /// [`barrier_start`](Self::barrier_start) fails with
    /// [`PmiError::NotPollable`]: use [`from_socket`](Self::from_socket) for
    /// the nonblocking barrier.
    ///
    /// # Errors
    ///
    /// [`PmiError::Env`] (naming `PMI_RANK`) if `rank >= size`.
    pub fn new(
        reader: impl BufRead + Send + 'static,
        writer: impl Write + Send + 'static,
        rank: u32,
        size: u32,
    ) -> Result<Self, PmiError> {
        check_rank("PMI_RANK", rank, size)?;
        let io = Io::Split {
            reader: Box::new(reader),
            writer: Box::new(writer),
        };
        Ok(Self::with_link(
            Link::Remote(Conn::new(io)),
            Mode::Stream,
            rank,
            size,
        ))
    }

    /// A client over a connected, blocking stream socket (such as a
    /// `UnixStream` or a `TcpStream`), which it both reads (buffered) and
    /// writes. Unlike [`new`](Self::new), the client can ask the socket
    /// whether a reply has arrived, so it supports the nonblocking
    /// [`barrier_start`](Self::barrier_start) /
    /// [`barrier_poll`](Self::barrier_poll). The clients of
    /// [`from_env`](Self::from_env) are built this way.
    ///
    /// # Errors
    ///
    /// [`PmiError::Env`] (naming `PMI_RANK`) if `rank >= size`.
    pub fn from_socket(
        socket: impl Read + Write + AsFd + Send + 'static,
        rank: u32,
        size: u32,
    ) -> Result<Self, PmiError> {
        check_rank("PMI_RANK", rank, size)?;
        let socket: Box<dyn Socket> = Box::new(socket);
        let io = Io::Socket(BufReader::new(socket));
        Ok(Self::with_link(
            Link::Remote(Conn::new(io)),
            Mode::Stream,
            rank,
            size,
        ))
    }

    /// A client with no server: rank 0 of 1, whose `put`/`get` use an
    /// in-memory key-value space and whose `barrier` returns at once.
    pub fn singleton() -> Self {
        Self::with_link(Link::Singleton(HashMap::new()), Mode::Singleton, 0, 1)
    }

    /// Connects to a PMI server in port mode (`PMI_PORT=host:port`,
    /// `PMI_ID=pmiid`) and does the handshake: sends `cmd=initack
    /// pmiid=<pmiid>`, expects `cmd=initack`, then `cmd=set` lines giving
    /// `size`, `rank` and `debug` in any order (other `set` keys are
    /// ignored).
    ///
    /// # Errors
    ///
    /// [`PmiError::Env`] if `addr` is not `host:port`, [`PmiError::Connect`],
    /// and the errors of any request (with `cmd` `"initack"`).
    pub fn connect_port(addr: &str, pmiid: &str) -> Result<Self, PmiError> {
        let (host, port) = split_host_port(addr)?;
        let connect_err = |source| PmiError::Connect {
            addr: addr.to_owned(),
            source,
        };
        let stream = TcpStream::connect((host, port)).map_err(connect_err)?;
        stream.set_nodelay(true).map_err(connect_err)?;
        let socket: Box<dyn Socket> = Box::new(stream);
        let mut conn = Conn::new(Io::Socket(BufReader::new(socket)));
        let (rank, size) = conn.initack(pmiid, None)?;
        check_rank("PMI_ID", rank, size)?;
        debug!(addr, pmiid, rank, size, "PMI client on PMI_PORT");
        Ok(Self::with_link(Link::Remote(conn), Mode::Port, rank, size))
    }

    /// Connects to a PMI server that requires the job secret (see the
    /// [server docs](crate::server#authenticated-port-mode)): reads the
    /// server's `cmd=challenge nonce=<hex>`, sends `cmd=initack
    /// pmiid=<pmiid> proof=<hex>` with [`JobSecret::proof`], then reads the
    /// replies as [`connect_port`](Self::connect_port) does.
    ///
    /// The whole handshake must be done within [`CHALLENGE_TIMEOUT`]. If the
    /// server closes the connection before sending anything (it does so
    /// while its handshake slots are full), the client connects again, for
    /// up to [`PORT_RETRY_WINDOW`].
    ///
    /// # Errors
    ///
    /// As [`connect_port`](Self::connect_port), and
    /// [`PmiError::NoChallenge`] if no challenge came in time (the server
    /// does not require a secret), [`PmiError::ClosedBeforeChallenge`] if
    /// the server kept closing the connection, or [`PmiError::Failed`]
    /// (`cmd` `"initack"`, `msg=authentication_failed`) if the server
    /// refused the proof (the secret is not this job's).
    pub fn connect_port_authenticated(
        addr: &str,
        pmiid: &str,
        secret: &JobSecret,
    ) -> Result<Self, PmiError> {
        const CMD: &str = "initack";
        let (host, port) = split_host_port(addr)?;
        let connect_err = |source| PmiError::Connect {
            addr: addr.to_owned(),
            source,
        };
        let start = Instant::now();
        let mut pause = Duration::from_millis(10);
        let mut attempts = 0u32;
        let (mut conn, stream, challenge) = loop {
            attempts += 1;
            let stream = TcpStream::connect((host, port)).map_err(connect_err)?;
            stream
                .set_nodelay(true)
                .and_then(|()| stream.set_read_timeout(Some(CHALLENGE_TIMEOUT)))
                .and_then(|()| stream.set_write_timeout(Some(CHALLENGE_TIMEOUT)))
                .map_err(connect_err)?;
            // Shares the socket, to lift the timeouts after the handshake.
            let handle = stream.try_clone().map_err(connect_err)?;
            let socket: Box<dyn Socket> = Box::new(stream);
            let mut conn = Conn::new(Io::Socket(BufReader::new(socket)));
            match conn.recv(CMD) {
                Ok(challenge) => break (conn, handle, challenge),
                Err(PmiError::Io { source, .. })
                    if matches!(
                        source.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(PmiError::NoChallenge {
                        addr: addr.to_owned(),
                        waited: CHALLENGE_TIMEOUT,
                    });
                }
                Err(e) if closed_early(&e) => {
                    if start.elapsed() + pause > PORT_RETRY_WINDOW {
                        return Err(PmiError::ClosedBeforeChallenge {
                            addr: addr.to_owned(),
                            attempts,
                            window: PORT_RETRY_WINDOW,
                        });
                    }
                    debug!(
                        addr,
                        attempts, "PMI server closed before its challenge; retrying"
                    );
                    thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                Err(e) => return Err(e),
            }
        };
        let challenge = check_reply(CMD, "challenge", challenge)?;
        let nonce_hex = required_field(CMD, &challenge, "nonce")?;
        let nonce = auth::decode_hex::<NONCE_LEN>(nonce_hex).ok_or_else(|| PmiError::BadField {
            cmd: CMD,
            field: "nonce",
            value: wire::snippet(nonce_hex),
        })?;
        let proof = auth::encode_hex(&secret.proof(&nonce, pmiid));
        let (rank, size) = conn.initack(pmiid, Some(&proof))?;
        check_rank("PMI_ID", rank, size)?;
        stream
            .set_read_timeout(None)
            .and_then(|()| stream.set_write_timeout(None))
            .map_err(|source| PmiError::Io { cmd: CMD, source })?;
        debug!(
            addr,
            pmiid, rank, size, attempts, "PMI client on PMI_PORT, authenticated"
        );
        Ok(Self::with_link(Link::Remote(conn), Mode::Port, rank, size))
    }
}

/// Whether `e` says the server closed the connection without a word (an
/// end of stream or a reset before the first line).
fn closed_early(e: &PmiError) -> bool {
    match e {
        PmiError::Eof { .. } => true,
        PmiError::Io { source, .. } => matches!(
            source.kind(),
            io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::UnexpectedEof
        ),
        _ => false,
    }
}

fn parse_env<T: std::str::FromStr>(var: &'static str, value: &str) -> Result<T, PmiError> {
    value.trim().parse().map_err(|_| PmiError::Env {
        var,
        reason: format!("{value:?} is not a number"),
    })
}

fn required_env(
    lookup: &impl Fn(&str) -> Option<String>,
    var: &'static str,
) -> Result<u32, PmiError> {
    let value = lookup(var).ok_or_else(|| PmiError::Env {
        var,
        reason: "not set (PMI_FD is)".into(),
    })?;
    parse_env(var, &value)
}

fn check_rank(var: &'static str, rank: u32, size: u32) -> Result<(), PmiError> {
    if rank < size {
        Ok(())
    } else {
        Err(PmiError::Env {
            var,
            reason: format!("rank {rank} is not below size {size}"),
        })
    }
}

/// Splits `host:port` (the host may be a bracketed IPv6 address).
fn split_host_port(addr: &str) -> Result<(&str, u16), PmiError> {
    let bad = || PmiError::Env {
        var: "PMI_PORT",
        reason: format!("{addr:?} is not host:port"),
    };
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let port = port.parse().map_err(|_| bad())?;
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port() {
        assert_eq!(split_host_port("vm:42771").unwrap(), ("vm", 42771));
        assert_eq!(split_host_port("[::1]:7").unwrap(), ("::1", 7));
        assert!(split_host_port("vm").is_err());
        assert!(split_host_port(":1").is_err());
        assert!(split_host_port("vm:99999").is_err());
    }

    #[test]
    fn env_selection() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let s = PmiClient::from_env_with(env(&[])).unwrap();
        assert!(s.is_singleton());
        assert_eq!((s.rank(), s.size()), (0, 1));

        for var in ["PMIX_RANK", "PMIX_VERSION", "PRTE_LAUNCHED"] {
            let lookup = move |k: &str| (k == var).then(|| "1".to_owned());
            assert!(matches!(
                PmiClient::from_env_with(lookup),
                Err(PmiError::PmixLauncher { var: v }) if v == var
            ));
        }
        assert!(matches!(
            PmiClient::from_env_with(env(&[("PMI_FD", "7"), ("PMI_SIZE", "2")])),
            Err(PmiError::Env {
                var: "PMI_RANK",
                ..
            })
        ));
        assert!(matches!(
            PmiClient::from_env_with(env(&[
                ("PMI_FD", "x"),
                ("PMI_RANK", "0"),
                ("PMI_SIZE", "2")
            ])),
            Err(PmiError::Env { var: "PMI_FD", .. })
        ));
        assert!(matches!(
            PmiClient::from_env_with(env(&[
                ("PMI_FD", "7"),
                ("PMI_RANK", "2"),
                ("PMI_SIZE", "2")
            ])),
            Err(PmiError::Env {
                var: "PMI_RANK",
                ..
            })
        ));
        assert!(matches!(
            PmiClient::from_env_with(env(&[("PMI_PORT", "vm:1")])),
            Err(PmiError::Env { var: "PMI_ID", .. })
        ));
        // PMI_FD wins over the PMIx markers.
        assert!(matches!(
            PmiClient::from_env_with(env(&[
                ("PMI_FD", "1"),
                ("PMI_RANK", "0"),
                ("PMI_SIZE", "1"),
                ("PMIX_RANK", "0")
            ])),
            Err(PmiError::InheritedFd { fd: 1, .. })
        ));
    }
}
