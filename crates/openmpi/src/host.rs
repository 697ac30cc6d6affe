//! What the C side does with one module that [`Module`] has no single
//! method for: descriptors with the address of their bytes, whether the
//! module is the loopback one, and its counters and messages.
//!
//! Every function takes `&Module`: modules lock themselves, and the
//! component calls them from any thread (`MPI_THREAD_MULTIPLE`).

use std::fmt::Write as _;

use udbtl_btl::{DesFlags, Descriptor, HostEvent, LentBytes, Module};
use udbtl_fabric::{AnyContext, Context as _};
use udbtl_wire::modex;

/// A module of the component's transport.
type Mod = Module<AnyContext>;

/// Hands `event` back to the module once C's callback for it ran
/// ([`Module::finish`]); `claimed` is `false` for a received message no
/// receive callback took ([`Module::finish_unclaimed`]).
pub fn finish(module: &Mod, event: HostEvent, claimed: bool) {
    if claimed {
        module.finish(event);
    } else {
        module.finish_unclaimed(event);
    }
}

/// A send fragment of `size` bytes ([`Module::alloc`], the caller owning
/// it) and where its bytes are; `None` when none is free or `size` is too
/// large.
pub fn alloc(module: &Mod, order: u8, size: usize) -> Option<(Descriptor, *mut u8)> {
    let des = module.alloc(order, size, DesFlags::NONE)?;
    match module.segment_ptr(des) {
        Ok((data, _)) => Some((des, data)),
        Err(_) => {
            let _ = module.free(des);
            None
        }
    }
}

/// A descriptor that sends `lent` without a copy after `reserve` header
/// bytes ([`Module::prepare_lent`], the caller owning it), and where the
/// header goes; `None` when it cannot (the caller copies instead).
pub fn prepare_lent(
    module: &Mod,
    lent: Box<dyn LentBytes>,
    order: u8,
    reserve: usize,
) -> Option<(Descriptor, *mut u8)> {
    let des = module
        .prepare_lent(lent, order, reserve, DesFlags::NONE)
        .ok()?;
    match module.segment_ptr(des) {
        Ok((header, _)) => Some((des, header)),
        Err(_) => {
            let _ = module.free(des);
            None
        }
    }
}

/// Whether the module's published address is a loopback address (IPv4 or
/// IPv6); `false` for an address of another kind (InfiniBand).
pub fn is_loopback(module: &Mod) -> bool {
    match module.address().location {
        modex::Location::Ipv4(ip) => std::net::Ipv4Addr::from(ip).is_loopback(),
        modex::Location::Ipv6(ip) => std::net::Ipv6Addr::from(ip).is_loopback(),
        _ => false,
    }
}

/// The module's device and published address, for messages.
pub fn describe_address(module: &Mod) -> String {
    format!("{} {}", module.device(), module.address())
}

/// The module's `key=value` counters for the `udbtl-stats:` line: device,
/// messages, the limits ob1 was given (before a smaller
/// `btl_udbtl_eager_limit`) and one datagram's payload, the datagrams the
/// kernel refused to send or dropped at a full socket buffer and those
/// missing a piece (what makes a lossless path lose), and with reliability
/// its datagram, retransmission, acknowledgement, integrity, coalescing,
/// train and get counters.
pub fn stats_line(module: &Mod) -> String {
    let s = module.stats();
    let limits = module.limits();
    let fabric = module.with_context(|ctx| ctx.stats());
    let mut line = format!(
        "device={} sent={} received={} send_errors={} no_callback={} eager_limit={} \
         rndv_eager_limit={} max_send_size={} datagram={} tx_refused={} socket_full={} \
         missing_piece={}",
        module.device(),
        s.messages_sent,
        s.recvs_delivered,
        s.send_errors,
        s.recv_no_callback,
        limits.alloc_limit,
        limits.rndv_eager_limit.min(limits.eager_limit),
        limits.frag_limit,
        limits.eager_limit,
        fabric.tx_kernel_drops,
        fabric.rx_kernel_drops,
        fabric.rx_incomplete,
    );
    if let Some(r) = module.reliability_stats() {
        let _ = write!(
            line,
            " datagrams={} retransmitted={} fast_retransmits={} timeouts={} tail_probes={} \
             spurious={} duplicates={} acks_sent={} keepalives={} lost_peers={} integrity={} \
             bad_checksum={} unauthenticated={} replayed={} unacceptable={} coalesced={} \
             trains={} gets={} gets_served={}",
            r.sent,
            r.retransmitted,
            r.fast_retransmits,
            r.timeouts,
            r.tail_probes,
            r.spurious_retransmits,
            r.duplicates,
            r.acks_sent,
            r.keepalives,
            r.peers_lost,
            module.integrity(),
            s.recv_bad_checksum,
            s.recv_unauthenticated,
            s.recv_replayed,
            r.unacceptable_acks + r.unacceptable_resets,
            s.messages_coalesced,
            s.trains_sent,
            s.reads_started,
            s.reads_served
        );
    }
    line
}

/// The counters Open MPI tools read (MPI_T performance variables
/// `btl_udbtl_<name>`), summed over the modules: name and description.
pub const COUNTERS: [(&str, &str); 16] = [
    (
        "sent",
        "Sends posted to the fabric (datagrams, retransmissions not counted)",
    ),
    ("received", "Messages delivered to Open MPI"),
    ("send_errors", "Sends that failed (their peer was lost)"),
    ("retransmitted", "Datagrams sent again"),
    (
        "fast_retransmits",
        "Datagrams sent again because later ones were acknowledged",
    ),
    ("timeouts", "Retransmission timeouts"),
    ("duplicates", "Datagrams received twice and dropped"),
    ("lost_peers", "Peers declared lost"),
    (
        "dropped_bad_checksum",
        "Datagrams dropped: the checksum did not match",
    ),
    (
        "dropped_unauthenticated",
        "Datagrams dropped: no valid authentication tag",
    ),
    (
        "dropped_malformed",
        "Datagrams dropped: headers that did not parse",
    ),
    (
        "dropped_other_job",
        "Datagrams dropped: from a job this process does not know",
    ),
    (
        "dropped_unknown_peer",
        "Datagrams dropped: from a process not added yet",
    ),
    (
        "dropped_socket_full",
        "Datagrams the kernel dropped at a full socket buffer",
    ),
    (
        "dropped_unacceptable",
        "Datagrams dropped: a reset or an acknowledgement the peer could not have sent",
    ),
    (
        "dropped_replayed",
        "Sealed datagrams dropped: their packet number was taken before (a replay)",
    ),
];

/// Adds the module's counters to `totals`, indexed as [`COUNTERS`].
pub fn add_counters(module: &Mod, totals: &mut [u64; COUNTERS.len()]) {
    let s = module.stats();
    let r = module.reliability_stats().unwrap_or_default();
    let socket_full = module.with_context(|ctx| ctx.stats().rx_kernel_drops);
    let values = [
        s.messages_sent,
        s.recvs_delivered,
        s.send_errors,
        r.retransmitted,
        r.fast_retransmits,
        r.timeouts,
        r.duplicates,
        r.peers_lost,
        s.recv_bad_checksum,
        s.recv_unauthenticated,
        s.recv_malformed,
        s.recv_bad_job_key,
        s.recv_unknown_peer,
        socket_full,
        r.unacceptable_acks + r.unacceptable_resets,
        s.recv_replayed,
    ];
    for (total, value) in totals.iter_mut().zip(values) {
        *total += value;
    }
}
