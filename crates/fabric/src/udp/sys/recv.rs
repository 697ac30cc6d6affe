//! Receiving: `recvfrom`, `recvmsg` and `recvmmsg` into posted buffers,
//! scatter lists and scratch space.
#![allow(unsafe_code)]

use std::io::{self, IoSliceMut};
use std::mem::{self, MaybeUninit};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, BorrowedFd};

use udbtl_wire::ud;

use super::{CmsgBuf, MAX_BATCH, MAX_SCATTER, RecvMeta, SKIP, is_interrupted};
use crate::types::GRH_LEN;

/// `region[offset..offset + len]` exists.
fn within(region: &[u8], offset: usize, len: usize) -> bool {
    offset
        .checked_add(len)
        .is_some_and(|end| end <= region.len())
}

/// Receives up to `targets.len()` datagrams without blocking.
///
/// For `targets[i] = (offset, len)`, datagram `i` lands whole at
/// `region[offset + GRH_LEN - ud::HEADER_LEN .. offset + len]`: its UD
/// header fills the last bytes of the buffer's GRH area and its payload
/// starts at `offset + GRH_LEN`, as verbs would place it, with one iovec per
/// datagram. The header is also copied into `meta[i].header`.
///
/// With `gro` (a socket with UDP GRO on), `meta[i].stride` says whether a
/// coalesced train arrived; [`recv_scattered`] is the way to receive one
/// whole, this is for reading trains to discard them.
///
/// Returns how many datagrams (or trains) arrived; 0 when the socket is
/// empty. Targets that lie outside `region` or cannot hold a GRH end the
/// batch early.
pub(crate) fn recv_batch(
    fd: BorrowedFd<'_>,
    region: &mut [u8],
    targets: &[(usize, usize)],
    meta: &mut [RecvMeta],
    gro: bool,
) -> io::Result<usize> {
    let count = targets
        .iter()
        .take(MAX_BATCH.min(meta.len()))
        .take_while(|(offset, len)| *len >= GRH_LEN && within(region, *offset, *len))
        .count();
    if count == 0 {
        return Ok(0);
    }
    // One base pointer for the whole region: every iovec below is derived
    // from it, so no Rust reference to the region is created or used while
    // the kernel holds these pointers. Only the first `count` entries of the
    // arrays are initialised: a poll that finds nothing costs no memset.
    let base = region.as_mut_ptr();
    let mut iovecs = [const { MaybeUninit::<libc::iovec>::uninit() }; MAX_BATCH];
    let mut names = [const { MaybeUninit::<libc::sockaddr_in6>::uninit() }; MAX_BATCH];
    let mut controls = [const { MaybeUninit::<CmsgBuf>::uninit() }; MAX_BATCH];
    let mut msgs = [const { MaybeUninit::<libc::mmsghdr>::uninit() }; MAX_BATCH];
    for i in 0..count {
        let (offset, len) = targets[i];
        let iov = iovecs[i].write(libc::iovec {
            iov_base: base.wrapping_add(offset + SKIP).cast(),
            iov_len: len - SKIP,
        });
        // SAFETY: sockaddr_in6 and mmsghdr are plain old data, for which
        // all-zero is a valid value.
        let name = names[i].write(unsafe { mem::zeroed() });
        // SAFETY: as above.
        let msg = msgs[i].write(unsafe { mem::zeroed() });
        msg.msg_hdr.msg_name = (name as *mut libc::sockaddr_in6).cast();
        msg.msg_hdr.msg_namelen = size_of::<libc::sockaddr_in6>() as libc::socklen_t;
        msg.msg_hdr.msg_iov = iov;
        msg.msg_hdr.msg_iovlen = 1;
        if gro {
            let control = controls[i].write(CmsgBuf([0; 32]));
            msg.msg_hdr.msg_control = control.0.as_mut_ptr().cast();
            msg.msg_hdr.msg_controllen = control.0.len() as _;
        }
    }
    let received = loop {
        // SAFETY: `msgs[..count]` are initialised and point at `iovecs` and
        // `names`, alive on this frame; the iovecs were bounds-checked against
        // `region`, which is borrowed mutably for the call. MSG_DONTWAIT keeps
        // the call nonblocking. A batch of one uses recvfrom, the cheapest
        // receive the kernel offers; MSG_TRUNC makes it report the datagram's
        // real length so truncation is seen.
        let rc = unsafe {
            if count == 1 && gro {
                let rc = libc::recvmsg(
                    fd.as_raw_fd(),
                    &raw mut msgs[0].assume_init_mut().msg_hdr,
                    libc::MSG_DONTWAIT,
                );
                if rc >= 0 {
                    msgs[0].assume_init_mut().msg_len = rc as libc::c_uint;
                    1
                } else {
                    -1
                }
            } else if count == 1 {
                let msg = msgs[0].assume_init_mut();
                let iov = iovecs[0].assume_init_ref();
                let rc = libc::recvfrom(
                    fd.as_raw_fd(),
                    iov.iov_base,
                    iov.iov_len,
                    libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                    msg.msg_hdr.msg_name.cast(),
                    &raw mut msg.msg_hdr.msg_namelen,
                );
                if rc >= 0 {
                    let full = rc as usize;
                    msg.msg_len = full.min(iov.iov_len) as libc::c_uint;
                    if full > iov.iov_len {
                        msg.msg_hdr.msg_flags = libc::MSG_TRUNC;
                    }
                    1
                } else {
                    -1
                }
            } else {
                libc::recvmmsg(
                    fd.as_raw_fd(),
                    msgs.as_mut_ptr().cast(),
                    count as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            }
        };
        if rc >= 0 {
            break (rc as usize).min(count);
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
        // SAFETY: entries below `count` were initialised above and the
        // kernel only updated fields in place.
        let (msg, name) = unsafe { (msgs[i].assume_init_ref(), names[i].assume_init_ref()) };
        let (offset, _) = targets[i];
        let start = offset + SKIP;
        meta[i].len = msg.msg_len as usize;
        meta[i].truncated = msg.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
        meta[i].source = socket_addr(name, msg.msg_hdr.msg_namelen);
        meta[i].stride = if gro {
            gro_segment_size(&msg.msg_hdr)
        } else {
            0
        };
        meta[i].header = [0; ud::HEADER_LEN];
        let header_len = meta[i].len.min(ud::HEADER_LEN);
        meta[i].header[..header_len].copy_from_slice(&region[start..start + header_len]);
    }
    Ok(received)
}

/// Receives one datagram, or one UDP GRO train, without blocking, spread
/// over the buffers `targets` and then `spill`: the received bytes fill
/// `slot` bytes of each target in turn, from where [`recv_batch`] places a
/// datagram (`offset + SKIP`), and what does not fit them continues in
/// `spill`. A train of `slot`-byte datagrams thus lands one datagram per
/// buffer, in place; the caller moves those of a shorter stride. `meta`
/// gets the length, truncation, source, GRO segment size and the first
/// datagram's UD header.
///
/// Returns how many targets the bytes were spread over (those before the
/// spill space), or `None` when the socket is empty. At most
/// [`MAX_SCATTER`] targets are used; a target outside `region` or shorter
/// than `SKIP + slot` ends the list early.
pub(crate) fn recv_scattered(
    fd: BorrowedFd<'_>,
    region: &mut [u8],
    targets: &[(usize, usize)],
    slot: usize,
    spill: &mut [u8],
    meta: &mut RecvMeta,
) -> io::Result<Option<usize>> {
    let count = targets
        .iter()
        .take(MAX_SCATTER)
        .take_while(|(offset, len)| *len >= SKIP + slot && within(region, *offset, *len))
        .count();
    // As in `recv_batch`, every pointer derives from one base per slice.
    let base = region.as_mut_ptr();
    let mut iovecs = [const { MaybeUninit::<libc::iovec>::uninit() }; MAX_SCATTER + 1];
    for (iov, (offset, _)) in iovecs.iter_mut().zip(&targets[..count]) {
        iov.write(libc::iovec {
            iov_base: base.wrapping_add(offset + SKIP).cast(),
            iov_len: slot,
        });
    }
    iovecs[count].write(libc::iovec {
        iov_base: spill.as_mut_ptr().cast(),
        iov_len: spill.len(),
    });
    // SAFETY: the first `count + 1` iovecs are initialised and point into
    // `region` (bounds-checked above) and `spill`, both borrowed mutably
    // for the call.
    if !unsafe { recvmsg_into(fd, iovecs.as_mut_ptr().cast(), count + 1, meta) }? {
        return Ok(None);
    }
    let received = meta.len;
    meta.header = [0; ud::HEADER_LEN];
    let have = received.min(ud::HEADER_LEN);
    let first = match targets[..count].first() {
        Some((offset, _)) => &region[offset + SKIP..][..have],
        None => &spill[..have],
    };
    meta.header[..have].copy_from_slice(first);
    Ok(Some(count))
}

/// Receives one datagram, or one UDP GRO train, without blocking, into
/// `iov` in order: the bytes fill each slice in turn, and what does not fit
/// them all is lost (`meta.truncated`). `meta` gets the length,
/// truncation, source and GRO segment size; its `header` is left as it
/// was. Returns `false` when the socket is empty.
pub(crate) fn recv_into(
    fd: BorrowedFd<'_>,
    iov: &mut [IoSliceMut<'_>],
    meta: &mut RecvMeta,
) -> io::Result<bool> {
    // SAFETY: IoSliceMut is guaranteed ABI-compatible with iovec on Unix,
    // and each points at a slice borrowed mutably for the call.
    unsafe { recvmsg_into(fd, iov.as_mut_ptr().cast(), iov.len(), meta) }
}

/// One nonblocking `recvmsg` into the `count` iovecs at `iov`, retrying on
/// EINTR and skipping queued ICMP errors; fills `meta` but its `header`.
/// Returns `false` when the socket is empty.
///
/// # Safety
///
/// The `count` iovecs at `iov` must be initialised and point at memory the
/// kernel may write for the length of the call.
unsafe fn recvmsg_into(
    fd: BorrowedFd<'_>,
    iov: *mut libc::iovec,
    count: usize,
    meta: &mut RecvMeta,
) -> io::Result<bool> {
    // SAFETY: sockaddr_in6 and msghdr are plain old data, for which all-zero
    // is a valid value.
    let mut name: libc::sockaddr_in6 = unsafe { mem::zeroed() };
    let mut control = CmsgBuf([0; 32]);
    // SAFETY: as above.
    let mut hdr: libc::msghdr = unsafe { mem::zeroed() };
    hdr.msg_name = (&raw mut name).cast();
    hdr.msg_namelen = size_of::<libc::sockaddr_in6>() as libc::socklen_t;
    hdr.msg_iov = iov;
    hdr.msg_iovlen = count as _;
    hdr.msg_control = control.0.as_mut_ptr().cast();
    hdr.msg_controllen = control.0.len() as _;
    let received = loop {
        // SAFETY: `hdr` points at the caller's iovecs (see the contract)
        // and at `name` and `control` on this frame. MSG_DONTWAIT keeps the
        // call nonblocking.
        let rc = unsafe { libc::recvmsg(fd.as_raw_fd(), &raw mut hdr, libc::MSG_DONTWAIT) };
        if rc >= 0 {
            break rc as usize;
        }
        let err = io::Error::last_os_error();
        match err.kind() {
            io::ErrorKind::WouldBlock => return Ok(false),
            _ if is_interrupted(&err) => continue,
            // An ICMP error queued by an earlier send; see `recv_batch`.
            io::ErrorKind::ConnectionRefused => continue,
            _ => return Err(err),
        }
    };
    meta.len = received;
    meta.truncated = hdr.msg_flags & libc::MSG_TRUNC != 0;
    meta.source = socket_addr(&name, hdr.msg_namelen);
    meta.stride = gro_segment_size(&hdr);
    Ok(true)
}

/// The segment size of a coalesced train, from the `UDP_GRO` control
/// message the kernel attached to `hdr`; 0 when there is none.
fn gro_segment_size(hdr: &libc::msghdr) -> usize {
    if hdr.msg_control.is_null() || hdr.msg_controllen == 0 {
        return 0;
    }
    // SAFETY: the kernel wrote `msg_controllen` bytes of well-formed control
    // messages into the buffer `msg_control` points at, which lives on the
    // caller's frame; CMSG_FIRSTHDR/CMSG_NXTHDR stay inside that length and
    // the data (an int) is read unaligned.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(hdr);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_UDP && (*cmsg).cmsg_type == libc::UDP_GRO {
                let size = libc::CMSG_DATA(cmsg).cast::<libc::c_int>().read_unaligned();
                return usize::try_from(size).unwrap_or(0);
            }
            cmsg = libc::CMSG_NXTHDR(hdr, cmsg);
        }
    }
    0
}

fn socket_addr(storage: &libc::sockaddr_in6, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    match i32::from(storage.sin6_family) {
        libc::AF_INET if len >= size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family is AF_INET and the kernel wrote a whole
            // sockaddr_in; sockaddr_in6 is larger and at least as aligned.
            let sin = unsafe { &*(&raw const *storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 if len >= size_of::<libc::sockaddr_in6>() => {
            let sin6 = storage;
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::new(
                IpAddr::V6(ip),
                u16::from_be(sin6.sin6_port),
            ))
        }
        _ => None,
    }
}
