//! The engine's side of remote reads: sending a request, serving one, and
//! taking a reply's datagrams as the reliable stream delivers them.

use udbtl_fabric::Context;
use udbtl_wire::read::{self, ReplyHeader, Request};
use udbtl_wire::rel;

use super::{ReadTarget, Region, RegionKey, RemoteRange, Reply};
use crate::error::BtlError;
use crate::frag::{DesFlags, Descriptor, WHOLE_MESSAGE};
use crate::module::delivery::Held;
use crate::module::events::Notice;
use crate::module::{Engine, Flush, deregister};
use crate::{EndpointId, NO_ORDER, Tag};

/// The longest reply a module serves, its header included: no reader asks
/// for more ([`Limits::read_limit`](crate::Limits::read_limit) is capped at
/// it, and is a quarter of it or less at the default `frag_size`), so that
/// peers whose datagrams differ in size (which sets each one's read limit)
/// never refuse each other. Its train takes at most 741 user fragments at
/// MTU 1500.
pub(crate) const READ_MAX: usize = 1 << 20;

/// Bytes a read of a module with datagram payloads of `datagram` and
/// fragments of `frag_limit` asks for at most: its reply, header included,
/// is whole datagrams, at least one fragment and at most four, and no
/// more than 32 datagrams unless one fragment is. A read's fixed cost (its
/// request, and the host's own completion work) then counts for little on
/// loopback and with jumbo frames, where 4 fragments are 4 to 28 datagrams,
/// while at MTU 1500, where a fragment is already 46, replies stay one
/// fragment: longer ones measured slower there (1 MiB bandwidth through
/// Open MPI, 3 alternating runs each, 2026-12-05: with fragments of 256 KiB
/// against 64 KiB, +13 % on loopback, +15-30 % at MTU 9000, -12 % at MTU
/// 1500).
pub(crate) const fn read_limit(datagram: usize, frag_limit: usize) -> usize {
    if datagram == 0 {
        return 0;
    }
    let mut reply = 4 * frag_limit;
    if reply > 32 * datagram {
        reply = 32 * datagram;
    }
    if reply < frag_limit {
        reply = frag_limit;
    }
    if reply > READ_MAX {
        reply = READ_MAX;
    }
    (reply / datagram * datagram).saturating_sub(read::REPLY_HEADER_LEN)
}

impl<C: Context> Engine<C> {
    /// The engine's side of `Module::register_region`, whose documentation
    /// is the contract. The region is registered with the fabric once, whole,
    /// through the registration cache, so that each reply from it finds its
    /// registration there; a refusal only leaves each reply to register its
    /// own bytes.
    pub(in crate::module) fn register_region(&mut self, region: Region) -> RegionKey {
        let pd = self.pd;
        let reg = self
            .rcache
            .acquire(
                &mut self.ctx,
                region.bytes(),
                |c, r| c.reg_user_mr(pd, r),
                deregister,
            )
            .ok()
            .map(|(reg, _)| reg);
        self.reads.register(region, reg)
    }

    /// The engine's side of `Module::deregister_region`, whose
    /// documentation is the contract.
    pub(in crate::module) fn deregister_region(&mut self, key: RegionKey) -> bool {
        let Some(reg) = self.reads.deregister(key) else {
            return false;
        };
        if let Some(reg) = reg {
            self.release_registration(reg);
        }
        true
    }

    /// Drops every region still registered (the module is closing): they
    /// are the host's to deregister, but nothing reads them any more.
    pub(in crate::module) fn deregister_regions(&mut self) {
        for reg in self.reads.deregister_all() {
            self.release_registration(reg);
        }
    }

    fn release_registration(&mut self, reg: crate::rcache::RegId) {
        if let Err(err) = self.rcache.release(&mut self.ctx, reg, deregister) {
            tracing::error!(%err, "a region held no registration reference");
        }
    }

    /// The engine's side of `Module::read`, whose documentation is the
    /// contract.
    pub(in crate::module) fn start_read(
        &mut self,
        endpoint: EndpointId,
        target: Box<dyn ReadTarget>,
        len: usize,
        from: RemoteRange,
        context: u64,
    ) -> Result<(), BtlError> {
        if !self.path.is_reliable() {
            return Err(BtlError::BadRead("remote reads need a reliable module"));
        }
        if len > self.limits.read_limit() {
            return Err(BtlError::BadRead(
                "longer than the module's read limit (Limits::read_limit)",
            ));
        }
        if self.endpoints.get(endpoint).is_none() {
            return Err(BtlError::BadEndpoint {
                endpoint: endpoint.0,
            });
        }
        self.reads.start(endpoint, target, (len, from), context);
        self.stats.reads_started += 1;
        self.send_read_requests();
        Ok(())
    }

    /// Sends the requests of the reads waiting their turn, oldest first,
    /// while fewer than `READS_IN_FLIGHT` are out and fragments are free.
    pub(in crate::module) fn send_read_requests(&mut self) {
        let flags = DesFlags::BTL_OWNERSHIP | DesFlags::PRIORITY;
        while let Some((endpoint, request)) = self.reads.next_unsent() {
            let Some(des) = self.alloc(NO_ORDER, read::REQUEST_LEN, flags) else {
                self.reads.request_unsent(request.id);
                return;
            };
            let sent = self.segment_mut(des).map(|segment| request.emit(segment));
            let sent = sent
                .and_then(|()| self.send_internal(endpoint, des, read::TAG_REQUEST, Flush::Now));
            if sent.is_err() {
                // Its peer was lost since (it is being failed) or deleted.
                self.release(des);
                self.forget_reads_of(endpoint);
            }
        }
    }

    /// Sends a descriptor of the read protocol: BTL-owned, a whole message
    /// (or a train) marked [`rel::FLAG_READ`], never coalesced, and
    /// completed without telling the host.
    fn send_internal(
        &mut self,
        endpoint: EndpointId,
        des: Descriptor,
        tag: u8,
        flush: Flush,
    ) -> Result<(), BtlError> {
        let frag = self.frags.checked_mut(des)?;
        frag.internal = true;
        frag.flags = DesFlags::BTL_OWNERSHIP;
        frag.msg_flags = WHOLE_MESSAGE | rel::FLAG_READ;
        self.send_as(endpoint, des, Tag(tag), flush).map(|_| ())
    }

    /// A delivered, in-order datagram of the read protocol from `endpoint`:
    /// a request is queued to be served, a reply's bytes go to their read.
    /// Its buffer goes straight back to the pool.
    pub(in crate::module) fn on_read_datagram(
        &mut self,
        held: Held,
        endpoint: EndpointId,
        tag: Tag,
        (header_len, flags): (usize, u16),
    ) {
        let bounds = (
            flags & rel::FLAG_FIRST != 0,
            flags & rel::FLAG_LAST != 0,
            flags & rel::FLAG_ABORT != 0,
        );
        let payload = self
            .recv
            .datagram(&self.ctx, held)
            .and_then(|d| d.get(header_len..));
        match (tag.0, payload) {
            (read::TAG_REQUEST, Some(payload)) if bounds == (true, true, false) => {
                match Request::parse(payload) {
                    Ok(request) => {
                        if !self.reads.queue_request(endpoint, request) {
                            self.stats.read_requests_dropped += 1;
                        }
                    }
                    Err(_) => self.stats.recv_malformed += 1,
                }
            }
            (read::TAG_REPLY, Some(payload)) => {
                if self.reads.on_reply(endpoint, bounds, payload).is_err() {
                    self.stats.recv_orphan_pieces += 1;
                }
                self.report_finished_reads();
            }
            _ => self.stats.recv_malformed += 1,
        }
        self.recv.repost(held.slot);
    }

    /// Serves the requests waiting, oldest first, until one finds no free
    /// fragment (it waits for the next call). Their replies leave in one
    /// flush.
    pub(in crate::module) fn serve_reads(&mut self) {
        let limit = READ_MAX - read::REPLY_HEADER_LEN;
        let mut served = false;
        while let Some((endpoint, request)) = self.reads.next_request() {
            let des = match self.reads.serve(&request, limit) {
                Reply::Bytes(header, bytes) => {
                    let len = bytes.bytes().len();
                    let lent = (bytes, NO_ORDER, read::REPLY_HEADER_LEN, DesFlags::NONE);
                    match self.prepare_lent_up_to(lent, READ_MAX) {
                        Ok(des) => Some((des, header, true)),
                        // Fragments enough were free: the registration was
                        // refused, which waiting would not change.
                        Err(_)
                            if self.user_frags_free()
                                > self.cars_needed(read::REPLY_HEADER_LEN, len) =>
                        {
                            let refusal = ReplyHeader {
                                status: read::STATUS_UNAVAILABLE,
                                ..header
                            };
                            self.alloc(NO_ORDER, read::REPLY_HEADER_LEN, DesFlags::NONE)
                                .map(|des| (des, refusal, false))
                        }
                        Err(_) => None,
                    }
                }
                Reply::Refusal(header) => self
                    .alloc(NO_ORDER, read::REPLY_HEADER_LEN, DesFlags::NONE)
                    .map(|des| (des, header, false)),
            };
            let Some((des, header, with_bytes)) = des else {
                self.reads.requeue_request(endpoint, request);
                break;
            };
            if self.send_reply(endpoint, des, header).is_err() {
                // The peer is gone or unknown: its reads end with it.
                self.release_unsent(des);
                continue;
            }
            served = true;
            if with_bytes {
                self.stats.reads_served += 1;
            } else {
                self.stats.reads_refused += 1;
            }
        }
        if served {
            let now = self.clock();
            self.flush_transmits(now);
        }
    }

    /// User fragments the free list can still give.
    fn user_frags_free(&self) -> usize {
        self.frags
            .user
            .max()
            .saturating_sub(self.frags.user.in_use())
    }

    /// Writes a reply's header and sends it.
    fn send_reply(
        &mut self,
        endpoint: EndpointId,
        des: Descriptor,
        header: ReplyHeader,
    ) -> Result<(), BtlError> {
        header.emit(self.segment_mut(des)?);
        self.send_internal(endpoint, des, read::TAG_REPLY, Flush::Later)
    }

    /// Gives back a descriptor that was never sent, and its train's cars.
    fn release_unsent(&mut self, des: Descriptor) {
        self.uncouple_cars(des);
        self.release(des);
    }

    /// Fails the reads from `endpoint` and drops its requests: it was lost
    /// or deleted.
    pub(in crate::module) fn forget_reads_of(&mut self, endpoint: EndpointId) {
        self.reads.forget_peer(endpoint);
        self.report_finished_reads();
    }

    /// Queues the reads that are over for the host.
    fn report_finished_reads(&mut self) {
        while let Some(event) = self.reads.pop_finished() {
            self.notices.push_back(Notice::ReadDone(event));
        }
    }
}
