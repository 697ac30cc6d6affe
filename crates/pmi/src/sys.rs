//! The operating-system side of the PMI client and server: taking ownership of the
//! descriptor a launcher hands down in `PMI_FD` (the only `unsafe` block of
//! the crate), and asking whether a connection (or a listener) has something
//! to read.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::io::{Errno, FdFlags, fcntl_getfd, fcntl_setfd};

/// Set by the first call to [`take_inherited_socket`], successful or not.
static TAKEN: AtomicBool = AtomicBool::new(false);

/// Takes ownership of the inherited PMI socket `raw` and marks it
/// close-on-exec, so programs this process starts do not inherit it.
///
/// Only the first call in a process does anything: later calls fail with
/// [`io::ErrorKind::AlreadyExists`], because the descriptor number may by
/// then belong to something else. Descriptors 0–2 are refused, and so is a
/// descriptor that is not open or is not a socket (it is then left alone).
///
/// The launcher contract (hydra, Slurm, udrun) is that `PMI_FD` names a
/// connected stream socket given to the PMI client of this process and to
/// nothing else; the result may be a `AF_UNIX` or a TCP socket, and is only
/// used through `read`, `write` and `poll`.
pub(crate) fn take_inherited_socket(raw: RawFd) -> io::Result<UnixStream> {
    if raw <= 2 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a PMI socket (negative, or standard input/output/error)",
        ));
    }
    if TAKEN.swap(true, Ordering::AcqRel) {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "the PMI_FD descriptor was already taken by this process",
        ));
    }
    // SAFETY: `borrow_raw` needs `raw` to stay open while `fd` is used:
    // nothing else in this process knows it as its own (the launcher gave it
    // to the PMI client alone, and `TAKEN` lets this code run once per
    // process), and `fcntl(F_GETFD)` returns EBADF for a closed descriptor
    // before anything else is done with it. `from_raw_fd` needs `raw` to be
    // open and owned by nobody else, so that the `OwnedFd` is its only
    // owner and closes it exactly once: the same argument, with the fstat
    // check ensuring it is a socket and not, say, a file some library opened.
    let owned = unsafe {
        let fd = BorrowedFd::borrow_raw(raw);
        fcntl_getfd(fd)?;
        let stat = rustix::fs::fstat(fd)?;
        if !rustix::fs::FileType::from_raw_mode(stat.st_mode).is_socket() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a socket"));
        }
        OwnedFd::from_raw_fd(raw)
    };
    fcntl_setfd(&owned, FdFlags::CLOEXEC)?;
    Ok(UnixStream::from(owned))
}

/// Whether a `read` of `fd` would return at once, without blocking: data,
/// the end of the stream or a pending error is there. A `poll(2)` with a
/// zero timeout (retried if interrupted by a signal).
///
/// # Errors
///
/// The error of `poll`, or `EBADF` if `fd` is not open (`POLLNVAL`).
pub(crate) fn readable_now(fd: BorrowedFd<'_>) -> io::Result<bool> {
    wait_readable(fd, Some(std::time::Duration::ZERO))
}

/// Waits until a `read` (or, for a listening socket, an `accept`) of `fd`
/// would return at once, for at most `timeout` (`None`: for as long as it
/// takes); returns whether it would. A signal that interrupts the wait
/// restarts it with the whole timeout.
///
/// # Errors
///
/// The error of `poll`, or `EBADF` if `fd` is not open (`POLLNVAL`).
pub(crate) fn wait_readable(
    fd: BorrowedFd<'_>,
    timeout: Option<std::time::Duration>,
) -> io::Result<bool> {
    let mut fds = [PollFd::from_borrowed_fd(fd, PollFlags::IN)];
    let timeout = timeout.map(|t| Timespec {
        tv_sec: i64::try_from(t.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(t.subsec_nanos()),
    });
    loop {
        match rustix::event::poll(&mut fds, timeout.as_ref()) {
            Ok(0) => return Ok(false),
            // IN, HUP or ERR: the next read returns data, 0 or the error.
            Ok(_) if fds[0].revents().contains(PollFlags::NVAL) => {
                return Err(Errno::BADF.into());
            }
            Ok(_) => return Ok(true),
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}
