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

mod recv;

/// Most datagrams moved by one `recvmmsg`/`sendmmsg`.
pub(crate) const MAX_BATCH: usize = 32;

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
    /// With UDP GRO: the size of each datagram of a coalesced train (the
    /// last may be shorter); 0 when the kernel delivered one datagram.
    pub(crate) stride: usize,
}

impl RecvMeta {
    pub(crate) const EMPTY: Self = Self {
        header: [0; ud::HEADER_LEN],
        len: 0,
        truncated: false,
        source: None,
        stride: 0,
    };
}

/// Where a datagram starts in a receive buffer: its UD header fills the
/// last bytes of the GRH area, so that its payload starts after the GRH.
pub(crate) const SKIP: usize = GRH_LEN - ud::HEADER_LEN;

/// Most buffers one [`recv_scattered`] spreads a train over (a train holds
/// at most 64 datagrams).
pub(crate) const MAX_SCATTER: usize = 64;

pub(crate) use recv::{recv_batch, recv_into, recv_scattered};

pub(super) fn is_interrupted(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::Interrupted
}

/// One datagram (or, with `segment_size`, a GSO train of equally sized
/// datagrams) to send.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OutMsg<'a> {
    pub(crate) dest: SocketAddr,
    pub(crate) iov: &'a [IoSlice<'a>],
    pub(crate) segment_size: Option<u16>,
}

/// Space for one control message: `UDP_SEGMENT` out, `UDP_GRO` in.
#[repr(C, align(8))]
struct CmsgBuf([u8; 32]);

/// Sends `msgs` with `sendmmsg`, retrying on EINTR. Returns how many were
/// accepted from the front; an error means the first message was refused
/// and none were sent. At most `N` messages are looked at: callers pick `N`
/// to fit their batch, so a single send prepares a single header.
pub(crate) fn send_batch<const N: usize>(
    fd: BorrowedFd<'_>,
    msgs: &[OutMsg<'_>],
) -> io::Result<usize> {
    let count = msgs.len().min(N);
    if count == 0 {
        return Ok(0);
    }
    let mut names = [const { MaybeUninit::<SockAddr>::uninit() }; N];
    let mut cmsgs = [const { MaybeUninit::<CmsgBuf>::uninit() }; N];
    let mut hdrs = [const { MaybeUninit::<libc::mmsghdr>::uninit() }; N];
    for (i, msg) in msgs.iter().take(count).enumerate() {
        let name = names[i].write(SockAddr::from(msg.dest));
        // SAFETY: mmsghdr is plain old data; all-zero is a valid value.
        let hdr = &mut hdrs[i].write(unsafe { mem::zeroed() }).msg_hdr;
        hdr.msg_name = name.as_ptr().cast_mut().cast();
        hdr.msg_namelen = name.len();
        // IoSlice is guaranteed ABI-compatible with iovec on Unix; the kernel
        // only reads through it.
        hdr.msg_iov = msg.iov.as_ptr().cast_mut().cast();
        hdr.msg_iovlen = msg.iov.len() as _;
        if let Some(segment) = msg.segment_size {
            write_segment_cmsg(hdr, cmsgs[i].write(CmsgBuf([0; 32])), segment);
        }
    }
    loop {
        // SAFETY: `hdrs[..count]` are initialised; their pointers refer to
        // `names` and `cmsgs` (alive on this frame) or to the caller's slices,
        // borrowed for the call. The kernel only reads them. One message goes
        // out with sendmsg, which costs less than a batch of one.
        let rc = unsafe {
            if count == 1 {
                let sent = libc::sendmsg(
                    fd.as_raw_fd(),
                    &raw const hdrs[0].assume_init_ref().msg_hdr,
                    0,
                );
                if sent >= 0 { 1 } else { -1 }
            } else {
                libc::sendmmsg(fd.as_raw_fd(), hdrs.as_mut_ptr().cast(), count as _, 0)
            }
        };
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
    let option = if receive {
        libc::SO_RCVBUFFORCE
    } else {
        libc::SO_SNDBUFFORCE
    };
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    set_int_option(fd, libc::SOL_SOCKET, option, value)
}

/// `SO_MEMINFO` where Linux uses the generic socket option numbers; mips
/// and sparc number their own, and are not asked.
const SO_MEMINFO: Option<libc::c_int> = if cfg!(any(
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc",
    target_arch = "sparc64"
)) {
    None
} else {
    Some(55)
};

/// Datagrams the kernel dropped at this socket since it opened, mostly for
/// want of room in its receive buffer (`SK_MEMINFO_DROPS` of
/// `SO_MEMINFO`). `None` where the kernel does not say.
pub(crate) fn socket_drops(fd: BorrowedFd<'_>) -> Option<u64> {
    let option = SO_MEMINFO?;
    let drops = usize::try_from(libc::SK_MEMINFO_DROPS).ok()?;
    let mut info = [0u32; 16];
    let mut len = size_of_val(&info) as libc::socklen_t;
    // SAFETY: `info` is a live array of `len` bytes, and the kernel writes
    // at most `len` bytes into it, updating `len`.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            info.as_mut_ptr().cast(),
            &raw mut len,
        )
    };
    (rc == 0 && (len as usize) > drops * size_of::<u32>()).then(|| u64::from(info[drops]))
}

/// Turns UDP GRO on: the kernel may then deliver a train of datagrams from
/// one sender as one read, with a `UDP_GRO` control message giving their
/// size. Fails on kernels without it.
pub(crate) fn enable_gro(fd: BorrowedFd<'_>) -> io::Result<()> {
    set_int_option(fd, libc::SOL_UDP, libc::UDP_GRO, 1)
}

fn set_int_option(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `value` is a live c_int and its exact size is passed.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
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

/// A network interface and its addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Interface {
    pub(crate) name: String,
    pub(crate) up: bool,
    pub(crate) loopback: bool,
    /// Addresses with their prefix lengths.
    pub(crate) addrs: Vec<(IpAddr, u8)>,
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
        let name = unsafe { CStr::from_ptr(entry.ifa_name) }
            .to_string_lossy()
            .into_owned();
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
            let prefix = ip_of(entry.ifa_netmask).map_or(0, |mask| match mask {
                IpAddr::V4(m) => u32::from(m).count_ones() as u8,
                IpAddr::V6(m) => u128::from(m).count_ones() as u8,
            });
            out[index].addrs.push((addr, prefix));
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
            Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                sin.sin_addr.s_addr,
            ))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family is AF_INET6, so this is a sockaddr_in6.
            let sin6 = unsafe { &*addr.cast::<libc::sockaddr_in6>() };
            Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
        }
        _ => None,
    }
}
