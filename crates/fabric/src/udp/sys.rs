//! The UDP provider's system calls: every `unsafe` block of the provider is
//! here, each with the invariant it relies on.
//!
//! The functions are safe to call: they take Rust slices and derive every
//! pointer they pass to the kernel from those slices, after bounds checks, so
//! the kernel can only write where the borrow checker lets this module write.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::io::{self, IoSlice};
use std::mem::{self, MaybeUninit};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, BorrowedFd};

use socket2::SockAddr;
use udbtl_wire::ud;

use crate::types::GRH_LEN;

/// Most datagrams moved by one `recvmmsg`/`sendmmsg`.
pub(crate) const MAX_BATCH: usize = 32;
/// Most iovecs one `sendmmsg` call may reference in total.
pub(crate) const MAX_SEND_IOV: usize = MAX_BATCH * 9;

/// What the kernel reported about one received datagram.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecvMeta {
    /// The first bytes of the datagram: its UD encapsulation header.
    pub(crate) header: [u8; ud::HEADER_LEN],
    /// Bytes received (header included); less than the datagram when it was
    /// truncated.
    pub(crate) len: usize,
    /// The datagram did not fit its buffer.
    pub(crate) truncated: bool,
    /// The sender's socket address.
    pub(crate) source: Option<SocketAddr>,
}

impl RecvMeta {
    pub(crate) const EMPTY: Self =
        Self { header: [0; ud::HEADER_LEN], len: 0, truncated: false, source: None };
}

fn is_interrupted(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::Interrupted
}

/// Receives up to `targets.len()` datagrams without blocking. Datagram `i`
/// goes to `meta[i].header` (its first [`ud::HEADER_LEN`] bytes) and to
/// `region[offset + GRH_LEN .. offset + len]` for `targets[i] = (offset, len)`
/// (the rest), leaving the GRH bytes of the buffer untouched.
///
/// Returns how many datagrams arrived; 0 when the socket is empty. Targets
/// that lie outside `region` or cannot hold a GRH end the batch early.
pub(crate) fn recv_batch(
    fd: BorrowedFd<'_>,
    region: &mut [u8],
    targets: &[(usize, usize)],
    meta: &mut [RecvMeta],
) -> io::Result<usize> {
    let count = targets
        .iter()
        .take(MAX_BATCH.min(meta.len()))
        .take_while(|(offset, len)| {
            *len >= GRH_LEN && offset.checked_add(*len).is_some_and(|end| end <= region.len())
        })
        .count();
    if count == 0 {
        return Ok(0);
    }
    // One base pointer for the whole region: every iovec below is derived
    // from it, so no Rust reference to the region is created or used while
    // the kernel holds these pointers.
    let base = region.as_mut_ptr();
    let mut iovecs = [[libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; 2]; MAX_BATCH];
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
    let mut names: [libc::sockaddr_storage; MAX_BATCH] = unsafe { mem::zeroed() };
    // SAFETY: mmsghdr is plain old data; all-zero is a valid (empty) value.
    let mut msgs: [libc::mmsghdr; MAX_BATCH] = unsafe { mem::zeroed() };
    for i in 0..count {
        let (offset, len) = targets[i];
        iovecs[i][0] = libc::iovec {
            iov_base: meta[i].header.as_mut_ptr().cast(),
            iov_len: ud::HEADER_LEN,
        };
        iovecs[i][1] = libc::iovec {
            iov_base: base.wrapping_add(offset + GRH_LEN).cast(),
            iov_len: len - GRH_LEN,
        };
        let hdr = &mut msgs[i].msg_hdr;
        hdr.msg_name = (&raw mut names[i]).cast();
        hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        hdr.msg_iov = iovecs[i].as_mut_ptr();
        hdr.msg_iovlen = 2;
    }
    let received = loop {
        // SAFETY: `msgs[..count]` point at `iovecs`, `names` and `meta`
        // headers, all alive on this frame or borrowed mutably for the whole
        // call; the payload iovecs were bounds-checked against `region`, which
        // is borrowed mutably for the call. MSG_DONTWAIT keeps it nonblocking.
        let rc = unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                msgs.as_mut_ptr(),
                count as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if rc >= 0 {
            break rc as usize;
        }
        let err = io::Error::last_os_error();
        match err.kind() {
            io::ErrorKind::WouldBlock => return Ok(0),
            _ if is_interrupted(&err) => continue,
            // An ICMP error queued by an earlier send surfaces here on some
            // kernels; it concerns no datagram of this batch.
            io::ErrorKind::ConnectionRefused => continue,
            _ => return Err(err),
        }
    };
    for i in 0..received {
        meta[i].len = msgs[i].msg_len as usize;
        meta[i].truncated = msgs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
        meta[i].source = socket_addr(&names[i], msgs[i].msg_hdr.msg_namelen);
    }
    Ok(received)
}

fn socket_addr(storage: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    match i32::from(storage.ss_family) {
        libc::AF_INET if len >= size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family is AF_INET and the kernel wrote a whole
            // sockaddr_in; sockaddr_storage is larger and suitably aligned.
            let sin = unsafe { &*(&raw const *storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 if len >= size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for AF_INET6 and sockaddr_in6.
            let sin6 = unsafe { &*(&raw const *storage).cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::new(IpAddr::V6(ip), u16::from_be(sin6.sin6_port)))
        }
        _ => None,
    }
}

/// One datagram (or, with `segment_size`, a GSO train of equally sized
/// datagrams) to send.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OutMsg<'a> {
    pub(crate) dest: SocketAddr,
    pub(crate) iov: &'a [IoSlice<'a>],
    pub(crate) segment_size: Option<u16>,
}

/// Space for one `UDP_SEGMENT` control message.
#[repr(C, align(8))]
struct CmsgBuf([u8; 32]);

/// Sends `msgs` with `sendmmsg`, retrying on EINTR. Returns how many were
/// accepted from the front; an error means the first message was refused
/// and none were sent.
pub(crate) fn send_batch(fd: BorrowedFd<'_>, msgs: &[OutMsg<'_>]) -> io::Result<usize> {
    let count = msgs.len().min(MAX_BATCH);
    if count == 0 {
        return Ok(0);
    }
    let names: [SockAddr; MAX_BATCH] = std::array::from_fn(|i| {
        SockAddr::from(msgs.get(i).map_or(SocketAddr::from(([0, 0, 0, 0], 0)), |m| m.dest))
    });
    let mut cmsgs: [CmsgBuf; MAX_BATCH] = std::array::from_fn(|_| CmsgBuf([0; 32]));
    // SAFETY: mmsghdr is plain old data; all-zero is a valid (empty) value.
    let mut hdrs: [libc::mmsghdr; MAX_BATCH] = unsafe { mem::zeroed() };
    for (i, msg) in msgs.iter().take(count).enumerate() {
        let hdr = &mut hdrs[i].msg_hdr;
        hdr.msg_name = names[i].as_ptr().cast_mut().cast();
        hdr.msg_namelen = names[i].len();
        // IoSlice is guaranteed ABI-compatible with iovec on Unix; the kernel
        // only reads through it.
        hdr.msg_iov = msg.iov.as_ptr().cast_mut().cast();
        hdr.msg_iovlen = msg.iov.len() as _;
        if let Some(segment) = msg.segment_size {
            write_segment_cmsg(hdr, &mut cmsgs[i], segment);
        }
    }
    loop {
        // SAFETY: every pointer in `hdrs[..count]` refers to `names`, `cmsgs`
        // (alive on this frame) or to the caller's slices, borrowed for the
        // call; the kernel only reads them.
        let rc = unsafe { libc::sendmmsg(fd.as_raw_fd(), hdrs.as_mut_ptr(), count as _, 0) };
        if rc >= 0 {
            return Ok(rc as usize);
        }
        let err = io::Error::last_os_error();
        if !is_interrupted(&err) {
            return Err(err);
        }
    }
}

fn write_segment_cmsg(hdr: &mut libc::msghdr, buf: &mut CmsgBuf, segment: u16) {
    let space = cmsg_space(size_of::<u16>());
    if space > buf.0.len() {
        return;
    }
    hdr.msg_control = buf.0.as_mut_ptr().cast();
    hdr.msg_controllen = space as _;
    // SAFETY: msg_control points at `buf`, which is 8-aligned and at least
    // CMSG_SPACE(2) bytes, so CMSG_FIRSTHDR returns a valid, aligned header
    // inside it and CMSG_DATA has room for the u16 written unaligned.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(hdr);
        if cmsg.is_null() {
            return;
        }
        (*cmsg).cmsg_level = libc::SOL_UDP;
        (*cmsg).cmsg_type = libc::UDP_SEGMENT;
        (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as _;
        libc::CMSG_DATA(cmsg).cast::<u16>().write_unaligned(segment);
    }
}

fn cmsg_space(len: usize) -> usize {
    // SAFETY: CMSG_SPACE is a pure size computation.
    unsafe { libc::CMSG_SPACE(len as u32) as usize }
}

/// Sets `SO_SNDBUFFORCE`/`SO_RCVBUFFORCE`, which exceed `wmem_max`/`rmem_max`
/// when the process has CAP_NET_ADMIN.
pub(crate) fn force_buffer(fd: BorrowedFd<'_>, receive: bool, bytes: usize) -> io::Result<()> {
    let option = if receive { libc::SO_RCVBUFFORCE } else { libc::SO_SNDBUFFORCE };
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: `value` is a live c_int and its exact size is passed.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            (&raw const value).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// A network interface and its addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Interface {
    pub(crate) name: String,
    pub(crate) up: bool,
    pub(crate) loopback: bool,
    pub(crate) addrs: Vec<IpAddr>,
}

/// Lists the host's interfaces with `getifaddrs`.
pub(crate) fn interfaces() -> io::Result<Vec<Interface>> {
    let mut head = MaybeUninit::<*mut libc::ifaddrs>::uninit();
    // SAFETY: getifaddrs writes a list head into `head` on success.
    if unsafe { libc::getifaddrs(head.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: getifaddrs returned 0, so `head` is initialised.
    let head = unsafe { head.assume_init() };
    let mut out: Vec<Interface> = Vec::new();
    let mut cursor = head;
    while !cursor.is_null() {
        // SAFETY: `cursor` is a node of the list getifaddrs built, which stays
        // valid until freeifaddrs below.
        let entry = unsafe { &*cursor };
        cursor = entry.ifa_next;
        if entry.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(entry.ifa_name) }.to_string_lossy().into_owned();
        let flags = entry.ifa_flags;
        let addr = ip_of(entry.ifa_addr);
        let index = match out.iter().position(|i| i.name == name) {
            Some(index) => index,
            None => {
                out.push(Interface {
                    name,
                    up: flags & libc::IFF_UP as u32 != 0,
                    loopback: flags & libc::IFF_LOOPBACK as u32 != 0,
                    addrs: Vec::new(),
                });
                out.len() - 1
            }
        };
        if let Some(addr) = addr {
            out[index].addrs.push(addr);
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed exactly once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

fn ip_of(addr: *const libc::sockaddr) -> Option<IpAddr> {
    if addr.is_null() {
        return None;
    }
    // SAFETY: a non-null ifa_addr points at a sockaddr whose family field is
    // valid; the family says which larger struct it really is.
    let family = i32::from(unsafe { (*addr).sa_family });
    match family {
        libc::AF_INET => {
            // SAFETY: the family is AF_INET, so this is a sockaddr_in.
            let sin = unsafe { &*addr.cast::<libc::sockaddr_in>() };
            Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family is AF_INET6, so this is a sockaddr_in6.
            let sin6 = unsafe { &*addr.cast::<libc::sockaddr_in6>() };
            Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
        }
        _ => None,
    }
}
