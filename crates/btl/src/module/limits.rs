//! The sizes a module works with: the header layout every datagram
//! shares, the fragment and receive buffer strides, and the [`Limits`] the
//! parameters and the port allow.

use udbtl_fabric::{GRH_LEN, PortAttr};
use udbtl_wire::btl;

use super::descriptors::USER_FRAG_STRIDE;
use crate::params::{Params, Source};

/// Alignment of every fragment in registered memory.
pub(super) const FRAG_ALIGN: usize = 64;
/// Inline data requested for each queue pair (the seed asked for 200).
pub(super) const INLINE_REQUEST: u32 = 200;
/// The longest BTL header: base header, reliability extension and a seal's
/// tag.
pub(super) const HEADER_MAX: usize = udbtl_wire::seal::SEALED_HEADER_LEN;
/// Fewest receive buffers `rd_mem` may lower the pool to.
const MIN_RECV_BUFFERS: usize = 64;
/// Fewest send fragments `send_mem` may lower the free list to.
const MIN_SEND_FRAGS: usize = 256;

/// The most a caller may reserve in front of zero-copy data: a user
/// fragment's registered part holds the longest BTL header (the reliability
/// extension included) and then the reserve.
pub const USER_RESERVE_MAX: usize = USER_FRAG_STRIDE - HEADER_MAX;

/// Sizes a module works with, derived from the parameters and the port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest payload of an `alloc`ed fragment: the `max_send_size`
    /// parameter (or, unset, the port's largest datagram) less the BTL
    /// header.
    pub eager_limit: usize,
    /// Largest payload of one datagram: equal to the eager limit.
    pub max_send_size: usize,
    /// Largest `alloc`: on a reliable module the `eager_max` parameter, or
    /// the eager limit if larger (above the eager limit the fragment is a
    /// bounce buffer that leaves as a train of datagrams); on an unreliable
    /// one, the eager limit. What a host such as ob1 takes as its eager
    /// limit.
    pub alloc_limit: usize,
    /// Largest payload of a fragment prepared from the caller's memory
    /// (`prepare_src`, `prepare_lent`), the reserve included: what a host
    /// such as ob1 takes as the BTL's maximum send size. On a reliable
    /// module the `frag_size` parameter rounded down to whole datagrams (at
    /// least one): such a fragment leaves as a train of full datagrams and
    /// arrives whole. On an unreliable one, the eager limit. `prepare_lent`
    /// also takes up to `alloc_limit`, so that a host's eager message, which
    /// may be that long, can leave from the caller's memory whole.
    pub frag_limit: usize,
    /// Data size of the first fragment of a rendezvous (`min_send_size`).
    pub rndv_eager_limit: usize,
    /// Bytes a send may carry inline.
    pub inline_max: usize,
    /// Exclusivity, for choosing between BTLs.
    pub exclusivity: u32,
    /// Bandwidth in MB/s, for striping weights.
    pub bandwidth: u32,
    /// Receive buffers posted.
    pub recv_buffers: usize,
    /// Bytes of each receive buffer (see [`recv_buffer_len`]).
    pub recv_buffer_len: usize,
    /// Send fragments the free list may grow to: `send_frags_max`, or less
    /// to fit `send_mem` when `send_frags_max` is left at its default.
    pub send_frags_max: usize,
    /// BTL header bytes in front of every payload: 8, 40 with the
    /// reliability extension, 56 with a seal's tag too.
    pub header_len: usize,
}

impl Limits {
    /// The most bytes one remote read ([`Module::read`](super::Module::read))
    /// may ask for: its reply, header included, is whole datagrams, one to
    /// four fragments of `frag_limit` and at most 32 datagrams where a
    /// fragment is fewer (65 128 bytes at MTU 1500, 261 796 on loopback).
    pub const fn read_limit(&self) -> usize {
        super::read::read_limit(self.eager_limit, self.frag_limit)
    }
}

pub(super) fn round_up(value: usize, align: usize) -> usize {
    value.div_ceil(align) * align
}

/// Receive buffer size for the longest datagram (the module's headers and
/// its largest payload): the GRH the fabric writes in front and the
/// datagram, rounded to the fragment alignment. Allocation and posting both use this one value, which fixes
/// the seed's bug of allocating fewer bytes than it posted.
pub fn recv_buffer_len(max_datagram: usize) -> usize {
    round_up(GRH_LEN + max_datagram, FRAG_ALIGN)
}

/// BTL header bytes in front of every payload.
pub(super) fn header_len(params: &Params) -> usize {
    if params.protection().is_some() {
        HEADER_MAX
    } else if params.reliable {
        udbtl_wire::datagram::HEADER_LEN
    } else {
        btl::HEADER_LEN
    }
}

/// Receive buffers to post: `rd_num`, unless it was left at its default and
/// that many buffers of `stride` bytes exceed `rd_mem`. The seed's 6000
/// assumed 2 KB datagrams; on UDP loopback a buffer holds 64 KiB.
pub(super) fn recv_pool_size(params: &Params, stride: usize) -> usize {
    let asked = params.rd_num as usize;
    if params.source("rd_num") == Some(Source::Default) {
        asked.min((params.rd_mem / stride).max(MIN_RECV_BUFFERS))
    } else {
        asked
    }
}

/// Send fragments the free list may grow to: `send_frags_max`, unless it
/// was left at its default and that many fragments of `stride` bytes exceed
/// `send_mem`. Each fragment holds an eager message, 64 KiB on UDP loopback.
pub(super) fn send_frags_bound(params: &Params, stride: usize) -> usize {
    let asked = params.send_frags_max;
    if params.source("send_frags_max") == Some(Source::Default) {
        asked.min((params.send_mem / stride.max(1)).max(MIN_SEND_FRAGS))
    } else {
        asked
    }
}

/// Where a parameter is unset, the port's largest datagram decides: the
/// seed's 2048 bytes assumed a 2 KB InfiniBand MTU.
pub(super) fn limits_for(port: &PortAttr, params: &Params) -> Limits {
    let max_send_size = match params.max_send_size {
        Some(asked) if asked > port.max_msg_size => {
            tracing::warn!(
                asked,
                port_max = port.max_msg_size,
                "max_send_size exceeds the port's largest datagram; using the port's"
            );
            port.max_msg_size
        }
        Some(asked) => asked,
        None => port.max_msg_size,
    };
    let eager_limit = max_send_size.saturating_sub(header_len(params));
    let (alloc_limit, frag_limit) = if params.reliable {
        // Whole datagrams: a runt at the end of every fragment would cost a
        // datagram more each, and on loopback, where `frag_size` is just
        // over one 64 KiB datagram, double them and make the receiver
        // reassemble what would otherwise arrive whole.
        let datagram = eager_limit.max(1);
        (
            params.eager_max.max(eager_limit),
            params.frag_size.max(eager_limit) / datagram * datagram,
        )
    } else {
        (eager_limit, eager_limit)
    };
    Limits {
        eager_limit,
        max_send_size: eager_limit,
        alloc_limit,
        frag_limit,
        rndv_eager_limit: params.min_send_size.unwrap_or(eager_limit).min(eager_limit),
        inline_max: 0,
        exclusivity: params.exclusivity,
        bandwidth: params.bandwidth,
        recv_buffers: 0,
        recv_buffer_len: 0,
        send_frags_max: 0,
        header_len: header_len(params),
    }
}

/// The longest datagram a module whose port takes `own` (its largest
/// datagram, and its largest that leaves as one packet) may send a peer
/// whose port takes `peer`: the peer's largest where both ports cut long
/// datagrams into pieces and this port's pieces fit the peer's packets;
/// else the smaller packet size of the two, a datagram that leaves whole
/// and crosses both links. A port that does not cut has packets as large
/// as its datagrams, so between two such ports this is the smaller
/// datagram.
pub(super) fn usable_size(
    (own_size, own_packet): (usize, usize),
    (size, packet): (usize, usize),
) -> usize {
    let both_cut = own_packet < own_size && packet < size;
    if both_cut && own_packet <= packet {
        size
    } else {
        packet.min(own_packet)
    }
}

#[cfg(test)]
mod tests {
    use super::usable_size;

    /// MTU 1500 with pieces: 64 360-byte datagrams of 1 416-byte packets.
    const CUT_1500: (usize, usize) = (64_360, 1_416);
    /// MTU 9000, whose datagrams leave whole.
    const WHOLE_9000: (usize, usize) = (8_916, 8_916);

    #[test]
    fn two_ports_that_cut_send_long_datagrams() {
        assert_eq!(usable_size(CUT_1500, CUT_1500), 64_360);
    }

    #[test]
    fn a_port_that_cuts_and_one_that_does_not_send_single_packets() {
        assert_eq!(usable_size(CUT_1500, WHOLE_9000), 1_416);
        assert_eq!(usable_size(WHOLE_9000, CUT_1500), 1_416);
    }

    #[test]
    fn pieces_too_long_for_the_peers_packets_are_not_sent() {
        let cut_4000 = (59_000, 3_940);
        assert_eq!(usable_size(CUT_1500, cut_4000), 59_000);
        assert_eq!(usable_size(cut_4000, CUT_1500), 1_416);
    }

    #[test]
    fn ports_that_do_not_cut_take_the_smaller_datagram() {
        assert_eq!(usable_size(WHOLE_9000, (65_491, 65_491)), 8_916);
        assert_eq!(usable_size((1_416, 1_416), WHOLE_9000), 1_416);
    }
}
