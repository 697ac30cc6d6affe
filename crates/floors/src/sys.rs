//! The few socket calls that neither `std`, `socket2` nor `quinn-udp`
//! offer: forced buffer sizes, the path MTU of a connected socket, the
//! don't-fragment rule, `UDP_GRO` on and off, and `sendmmsg`/`recvmmsg`
//! batches on a connected or bound socket. Every `unsafe` block of the
//! crate is here.
#![allow(unsafe_code)]

use std::io;
use std::mem;
use std::os::fd::{AsRawFd, RawFd};

/// Most datagrams one `sendmmsg`/`recvmmsg` call moves.
pub const MAX_BATCH: usize = 64;

/// Calls `setsockopt` with an `int` value.
fn set_int(fd: RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: `value` lives across the call and the length passed is its size;
    // the kernel only reads it. A bad `fd` is reported as EBADF, not UB.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&raw const value).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Calls `getsockopt` for an `int` value.
fn get_int(fd: RawFd, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `len` are valid for writes and `len` holds the
    // size of `value`, so the kernel writes at most that many bytes.
    let rc = unsafe { libc::getsockopt(fd, level, name, (&raw mut value).cast(), &raw mut len) };
    if rc == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets the receive (`recv`) or send buffer to `bytes`, past
/// `net.core.rmem_max`/`wmem_max` (`SO_RCVBUFFORCE`, needs CAP_NET_ADMIN).
pub fn force_buffer(sock: &impl AsRawFd, recv: bool, bytes: usize) -> io::Result<()> {
    let name = if recv {
        libc::SO_RCVBUFFORCE
    } else {
        libc::SO_SNDBUFFORCE
    };
    let bytes = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    set_int(sock.as_raw_fd(), libc::SOL_SOCKET, name, bytes)
}

/// Forbids fragmentation (`IP_PMTUDISC_DO`): a datagram larger than the
/// path MTU fails with `EMSGSIZE` instead of leaving in pieces.
pub fn set_dont_fragment(sock: &impl AsRawFd, ipv6: bool) -> io::Result<()> {
    if ipv6 {
        set_int(
            sock.as_raw_fd(),
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
        )
    } else {
        set_int(
            sock.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )
    }
}

/// The path MTU the kernel knows for a connected socket (`IP_MTU`).
pub fn path_mtu(sock: &impl AsRawFd, ipv6: bool) -> io::Result<u32> {
    let mtu = if ipv6 {
        get_int(sock.as_raw_fd(), libc::IPPROTO_IPV6, libc::IPV6_MTU)?
    } else {
        get_int(sock.as_raw_fd(), libc::IPPROTO_IP, libc::IP_MTU)?
    };
    u32::try_from(mtu).map_err(|_| io::Error::other("negative path MTU"))
}

/// Turns `UDP_GRO` on or off; an error means the kernel refuses it.
pub fn set_udp_gro(sock: &impl AsRawFd, on: bool) -> io::Result<()> {
    set_int(
        sock.as_raw_fd(),
        libc::SOL_UDP,
        libc::UDP_GRO,
        libc::c_int::from(on),
    )
}

/// Sends `datagrams` on a connected socket with `sendmmsg`, at most
/// [`MAX_BATCH`] of them; returns how many left (a prefix). `WouldBlock`
/// when the send buffer is full.
pub fn send_mmsg(sock: &impl AsRawFd, datagrams: &[&[u8]]) -> io::Result<usize> {
    let n = datagrams.len().min(MAX_BATCH);
    // SAFETY: iovec and mmsghdr are plain C structs for which all-zero bytes
    // are valid values (null pointers, zero lengths).
    let mut iovs: [libc::iovec; MAX_BATCH] = unsafe { mem::zeroed() };
    // SAFETY: as above.
    let mut hdrs: [libc::mmsghdr; MAX_BATCH] = unsafe { mem::zeroed() };
    for i in 0..n {
        iovs[i].iov_base = datagrams[i].as_ptr().cast_mut().cast();
        iovs[i].iov_len = datagrams[i].len();
        hdrs[i].msg_hdr.msg_iov = &raw mut iovs[i];
        hdrs[i].msg_hdr.msg_iovlen = 1;
    }
    // SAFETY: the first `n` headers point at `n` iovecs, each naming a live
    // slice of `datagrams` that the kernel only reads (the cast to a mutable
    // pointer is what the C type asks for). No name is given: the socket is
    // connected. All of it outlives the call.
    let rc = unsafe {
        libc::sendmmsg(
            sock.as_raw_fd(),
            hdrs.as_mut_ptr(),
            n as libc::c_uint,
            libc::MSG_DONTWAIT,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as usize)
    }
}

/// Receives up to `bufs.len()` (at most [`MAX_BATCH`]) datagrams with
/// `recvmmsg` without waiting; writes their lengths to `lens` and returns
/// their count. `WouldBlock` when none is queued.
pub fn recv_mmsg(
    sock: &impl AsRawFd,
    bufs: &mut [Vec<u8>],
    lens: &mut [usize],
) -> io::Result<usize> {
    let n = bufs.len().min(lens.len()).min(MAX_BATCH);
    // SAFETY: all-zero iovec and mmsghdr are valid values.
    let mut iovs: [libc::iovec; MAX_BATCH] = unsafe { mem::zeroed() };
    // SAFETY: as above.
    let mut hdrs: [libc::mmsghdr; MAX_BATCH] = unsafe { mem::zeroed() };
    for i in 0..n {
        iovs[i].iov_base = bufs[i].as_mut_ptr().cast();
        iovs[i].iov_len = bufs[i].len();
        hdrs[i].msg_hdr.msg_iov = &raw mut iovs[i];
        hdrs[i].msg_hdr.msg_iovlen = 1;
    }
    // SAFETY: the first `n` headers point at iovecs over `n` distinct,
    // initialised, exclusively borrowed buffers of the lengths given, so the
    // kernel writes only inside them; no name or control buffer is asked for;
    // a null timeout is allowed.
    let rc = unsafe {
        libc::recvmmsg(
            sock.as_raw_fd(),
            hdrs.as_mut_ptr(),
            n as libc::c_uint,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let got = rc as usize;
    for i in 0..got {
        lens[i] = hdrs[i].msg_len as usize;
    }
    Ok(got)
}
