//! The descriptor API: fragments from the free lists (`alloc`,
//! `prepare_src`), the caller's access to their segments, and their return
//! (`free`), with user fragments holding registrations from the cache.

use std::sync::Arc;

use udbtl_fabric::{Context, LKey, Mr, Sge};
use udbtl_wire::{datagram, rel};

use super::bounce::BouncePool;
use super::integrity::Integrity;
use super::{Engine, deregister};
use crate::convertor::Convertor;
use crate::error::BtlError;
use crate::frag::{
    DesFlags, Descriptor, Frag, FragKind, FragPool, FragState, LentBytes, SegmentCrc, Train,
    UserBytes, UserData,
};
use crate::rcache::RegId;

/// Bytes of registered memory a user fragment has for the BTL header and the
/// caller's reserved header.
pub(super) const USER_FRAG_STRIDE: usize = 128;

/// The two free lists, and the bounce buffers of long `alloc`s.
#[derive(Debug)]
pub(super) struct Frags {
    /// Payload packed into BTL-owned registered memory.
    pub(super) send: FragPool,
    /// Payload gathered from registered user memory.
    pub(super) user: FragPool,
    /// Memory of `alloc`s longer than one datagram (user fragments whose
    /// bytes are the module's).
    pub(super) bounce: BouncePool,
}

impl Frags {
    pub(super) fn pool(&self, des: Descriptor) -> &FragPool {
        match des.kind() {
            FragKind::Send => &self.send,
            FragKind::User => &self.user,
        }
    }

    pub(super) fn pool_mut(&mut self, des: Descriptor) -> &mut FragPool {
        match des.kind() {
            FragKind::Send => &mut self.send,
            FragKind::User => &mut self.user,
        }
    }

    pub(super) fn get(&self, des: Descriptor) -> Option<&Frag> {
        self.pool(des).frag(des)
    }

    pub(super) fn get_mut(&mut self, des: Descriptor) -> Option<&mut Frag> {
        self.pool_mut(des).frag_mut(des)
    }

    /// The live fragment named by `des`, or the error naming the handle.
    pub(super) fn checked_mut(&mut self, des: Descriptor) -> Result<&mut Frag, BtlError> {
        self.get_mut(des).ok_or_else(|| bad(des, "not allocated"))
    }

    /// The registered bytes holding the first `len` bytes of `des` (BTL
    /// header onwards).
    pub(super) fn head(&self, des: Descriptor, len: usize) -> Option<(Mr, Sge)> {
        self.pool(des).sge(des.index(), len)
    }

    /// The caller's bytes `des` sends after its registered head, with the
    /// key of their registration: its own, or a car's share of its train
    /// head's. `None` for a fragment whose payload is all registered.
    pub(super) fn user_bytes(&self, des: Descriptor) -> Option<(LKey, &[u8])> {
        let frag = self.get(des)?;
        if let Some(user) = &frag.user {
            return Some((user.lkey, &user.data.bytes()[user.range.clone()]));
        }
        let Some(Train::Car { head, range, .. }) = &frag.train else {
            return None;
        };
        let user = self.get(*head)?.user.as_ref()?;
        Some((user.lkey, user.data.bytes().get(range.clone())?))
    }

    /// Whether `des` is an `alloc` over a bounce buffer.
    pub(super) fn is_bounce(&self, des: Descriptor) -> bool {
        matches!(
            self.get(des).and_then(|f| f.user.as_ref()),
            Some(UserData {
                data: UserBytes::Bounce(_),
                ..
            })
        )
    }

    /// The message bytes of an `alloc` over a bounce buffer.
    fn bounce_mut(&mut self, des: Descriptor) -> Option<&mut [u8]> {
        match self.get_mut(des)?.user.as_mut()? {
            UserData {
                data: UserBytes::Bounce(buffer),
                range,
                ..
            } => buffer.get_mut(range.clone()),
            _ => None,
        }
    }

    /// Every descriptor the BTL owns (posted, waiting, or unacknowledged).
    pub(super) fn owned_by_btl(&self) -> Vec<Descriptor> {
        [&self.send, &self.user]
            .into_iter()
            .flat_map(|pool| {
                pool.live()
                    .filter(|(_, f)| matches!(f.state, FragState::Posted | FragState::Pending))
                    .filter_map(|(i, _)| pool.descriptor_at(i))
            })
            .collect()
    }

    /// Fragments not on a free list.
    pub(super) fn live(&self) -> usize {
        self.send.live().count() + self.user.live().count()
    }
}

/// The error for a descriptor that cannot be used as asked.
pub(super) fn bad(des: Descriptor, problem: &'static str) -> BtlError {
    BtlError::BadDescriptor {
        descriptor: des.raw(),
        problem,
    }
}

impl<C: Context> Engine<C> {
    /// The engine's side of `Module::alloc`, whose documentation is the
    /// contract.
    pub(super) fn alloc(&mut self, order: u8, size: usize, flags: DesFlags) -> Option<Descriptor> {
        if size > self.limits.eager_limit {
            return self.alloc_bounce(order, size, flags);
        }
        let des = self.frags.send.get(&mut self.ctx, self.pd)?;
        let frag = self.frags.send.frag_mut(des)?;
        frag.seg_len = size;
        frag.flags = flags;
        frag.order = order;
        Some(des)
    }

    /// An `alloc` longer than one datagram, up to the alloc limit: a user
    /// fragment over a bounce buffer, registered through the cache, with the
    /// cars of its train taken. `None` when the limit, the bounce pool, the
    /// user free list or a registration says no.
    fn alloc_bounce(&mut self, order: u8, size: usize, flags: DesFlags) -> Option<Descriptor> {
        if size > self.limits.alloc_limit || size > self.frags.bounce.size() {
            return None;
        }
        let buffer = self.frags.bounce.take()?;
        // The whole buffer is registered, so that its next use hits the
        // cache whatever the size; the cars are for this message's size.
        let Some((des, reg, lkey)) = self.user_frag_over(&buffer, 0, size) else {
            self.frags.bounce.give_back(buffer);
            return None;
        };
        let frag = self.frags.user.frag_mut(des)?;
        frag.flags = flags;
        frag.order = order;
        frag.user = Some(UserData {
            reg,
            lkey,
            data: UserBytes::Bounce(buffer),
            range: 0..size,
        });
        Some(des)
    }

    /// A user fragment that sends `len` bytes of `bytes` behind `reserve`
    /// bytes of the caller's header: taken from the free list, with the cars
    /// its train needs, and the registration of `bytes` from the cache.
    /// `None`, with nothing taken, when any of them is refused.
    fn user_frag_over(
        &mut self,
        bytes: &[u8],
        reserve: usize,
        len: usize,
    ) -> Option<(Descriptor, RegId, LKey)> {
        let des = self.frags.user.get(&mut self.ctx, self.pd)?;
        if !self.couple_cars(des, reserve, len) {
            self.frags.user.put(des);
            return None;
        }
        let pd = self.pd;
        match self.rcache.acquire(
            &mut self.ctx,
            bytes,
            |c, r| c.reg_user_mr(pd, r),
            deregister,
        ) {
            Ok((reg, lkey)) => Some((des, reg, lkey)),
            Err(_) => {
                self.uncouple_cars(des);
                self.frags.user.put(des);
                None
            }
        }
    }

    /// The engine's side of `Module::free`, whose documentation is the
    /// contract.
    pub(super) fn free(&mut self, des: Descriptor) -> Result<(), BtlError> {
        let state = self
            .frags
            .get(des)
            .ok_or_else(|| bad(des, "not allocated"))?
            .state;
        if state != FragState::Allocated {
            return Err(bad(des, "still owned by the BTL"));
        }
        self.uncouple_cars(des);
        self.release(des);
        Ok(())
    }

    /// Puts a descriptor back on its free list, whoever owned it.
    pub(super) fn release(&mut self, des: Descriptor) {
        if let Some(user) = self.frags.get_mut(des).and_then(|f| f.user.take()) {
            if let Err(err) = self.rcache.release(&mut self.ctx, user.reg, deregister) {
                tracing::error!(%err, "user fragment held no registration reference");
            }
            if let UserBytes::Bounce(buffer) = user.data {
                self.frags.bounce.give_back(buffer);
            }
        }
        self.frags.pool_mut(des).put(des);
    }

    /// The engine's side of `Module::prepare_src`, whose documentation is the
    /// contract.
    pub(super) fn prepare_src(
        &mut self,
        registration: Option<RegId>,
        convertor: &mut Convertor<'_>,
        order: u8,
        reserve: usize,
        size: &mut usize,
        flags: DesFlags,
    ) -> Option<Descriptor> {
        let max_data = self.limits.frag_limit.checked_sub(reserve)?;
        let want = (*size).min(convertor.remaining());
        let zero_copy = convertor.is_contiguous()
            && reserve <= super::USER_RESERVE_MAX
            && (registration.is_some() || want > self.limits.eager_limit.saturating_sub(reserve));
        if zero_copy {
            if let Some(des) =
                self.prepare_user(registration, convertor, reserve, want.min(max_data), size)
            {
                let frag = self.frags.user.frag_mut(des)?;
                frag.flags = flags;
                frag.order = order;
                return Some(des);
            }
        }
        let take = want.min(self.limits.eager_limit.checked_sub(reserve)?);
        let des = self.frags.send.get(&mut self.ctx, self.pd)?;
        let packed = {
            let (mr, sge) = self
                .frags
                .send
                .sge(des.index(), self.header_len + reserve + take)?;
            let bytes = self.ctx.mr_bytes_mut(mr.handle).ok()?;
            let start = sge.offset + self.header_len + reserve;
            convertor.pack(&mut bytes[start..start + take])
        };
        let frag = self.frags.send.frag_mut(des)?;
        frag.seg_len = reserve + packed;
        frag.flags = flags;
        frag.order = order;
        *size = packed;
        Some(des)
    }

    fn prepare_user(
        &mut self,
        registration: Option<RegId>,
        convertor: &mut Convertor<'_>,
        reserve: usize,
        take: usize,
        size: &mut usize,
    ) -> Option<Descriptor> {
        let (data, range) = convertor.zero_copy(take)?;
        let Some(des) = self.frags.user.get(&mut self.ctx, self.pd) else {
            convertor.rewind(range.len());
            return None;
        };
        if !self.couple_cars(des, reserve, range.len()) {
            self.frags.user.put(des);
            convertor.rewind(range.len());
            return None;
        }
        let pd = self.pd;
        let reg = match registration {
            Some(reg) => self.rcache.retain(reg).ok().map(|lkey| (reg, lkey)),
            // Register the whole shared buffer, not just this piece: the
            // caller cuts a large message into datagram-sized pieces, and
            // every later piece then hits the cache.
            None => self
                .rcache
                .acquire(
                    &mut self.ctx,
                    &data,
                    |c, r| c.reg_user_mr(pd, r),
                    deregister,
                )
                .ok(),
        };
        let Some((reg, lkey)) = reg else {
            self.uncouple_cars(des);
            self.frags.user.put(des);
            convertor.rewind(range.len());
            return None;
        };
        *size = range.len();
        let frag = self.frags.user.frag_mut(des)?;
        frag.seg_len = reserve;
        frag.user = Some(UserData {
            reg,
            lkey,
            data: UserBytes::Shared(data),
            range,
        });
        Some(des)
    }

    /// The engine's side of `Module::prepare_lent`, whose documentation is the
    /// contract.
    pub(super) fn prepare_lent(
        &mut self,
        lent: Box<dyn LentBytes>,
        order: u8,
        reserve: usize,
        flags: DesFlags,
    ) -> Result<Descriptor, Box<dyn LentBytes>> {
        // An eager message may be as long as an `alloc`: ob1 hands a
        // contiguous one to `prepare_src` and sends what comes back as the
        // whole message.
        let max = self.limits.frag_limit.max(self.limits.alloc_limit);
        self.prepare_lent_up_to((lent, order, reserve, flags), max)
    }

    /// [`prepare_lent`](Self::prepare_lent) of up to `max` bytes, reserve
    /// included, rather than a fragment's: the module's own replies to
    /// remote reads.
    pub(super) fn prepare_lent_up_to(
        &mut self,
        (lent, order, reserve, flags): (Box<dyn LentBytes>, u8, usize, DesFlags),
        max: usize,
    ) -> Result<Descriptor, Box<dyn LentBytes>> {
        let len = lent.bytes().len();
        let fits = reserve <= super::USER_RESERVE_MAX
            && reserve.checked_add(len).is_some_and(|total| total <= max);
        if !fits {
            return Err(lent);
        }
        let Some((des, reg, lkey)) = self.user_frag_over(lent.bytes(), reserve, len) else {
            return Err(lent);
        };
        let Some(frag) = self.frags.user.frag_mut(des) else {
            return Err(lent);
        };
        frag.seg_len = reserve;
        frag.flags = flags;
        frag.order = order;
        frag.user = Some(UserData {
            reg,
            lkey,
            data: UserBytes::Lent(lent),
            range: 0..len,
        });
        Ok(des)
    }

    /// The engine's side of `Module::mpool_register`, whose documentation is the
    /// contract.
    pub(super) fn mpool_register(&mut self, data: &Arc<[u8]>) -> Result<RegId, BtlError> {
        let pd = self.pd;
        self.rcache
            .acquire(&mut self.ctx, data, |c, r| c.reg_user_mr(pd, r), deregister)
            .map(|(reg, _)| reg)
            .map_err(|source| BtlError::Fabric {
                step: "register user memory",
                device: self.device.clone(),
                port: self.port.port_num,
                source,
            })
    }

    /// The engine's side of `Module::mpool_deregister`, whose documentation is the
    /// contract.
    pub(super) fn mpool_deregister(&mut self, reg: RegId) -> Result<(), BtlError> {
        self.rcache
            .release(&mut self.ctx, reg, deregister)
            .map_err(|_| BtlError::BadDescriptor {
                descriptor: u32::MAX,
                problem: "a registration without references",
            })
    }

    /// The engine's side of `Module::segment_mut`, whose documentation is the
    /// contract.
    pub(super) fn segment_mut(&mut self, des: Descriptor) -> Result<&mut [u8], BtlError> {
        if self.frags.is_bounce(des) {
            return self
                .frags
                .bounce_mut(des)
                .ok_or_else(|| bad(des, "without memory"));
        }
        let header_len = self.header_len;
        Ok(&mut self.registered_mut(des)?[header_len..])
    }

    /// The registered bytes of a descriptor: the BTL header (and for a
    /// reliable module its extension), then the segment.
    pub(super) fn registered_mut(&mut self, des: Descriptor) -> Result<&mut [u8], BtlError> {
        let seg_len = self
            .frags
            .get(des)
            .ok_or_else(|| bad(des, "not allocated"))?
            .seg_len;
        let (mr, sge) = self
            .frags
            .head(des, self.header_len + seg_len)
            .ok_or_else(|| bad(des, "without memory"))?;
        let bytes = self
            .ctx
            .mr_bytes_mut(mr.handle)
            .map_err(|_| bad(des, "without memory"))?;
        Ok(&mut bytes[sge.offset..sge.offset + sge.len])
    }

    /// The engine's side of `Module::set_context`, whose documentation is the
    /// contract.
    pub(super) fn set_context(&mut self, des: Descriptor, context: u64) -> Result<(), BtlError> {
        self.frags.checked_mut(des)?.context = context;
        Ok(())
    }

    /// The engine's side of `Module::set_flags`, whose documentation is the
    /// contract.
    pub(super) fn set_flags(&mut self, des: Descriptor, flags: DesFlags) -> Result<(), BtlError> {
        let frag = self.frags.checked_mut(des)?;
        if frag.state != FragState::Allocated {
            return Err(bad(des, "still owned by the BTL"));
        }
        frag.flags = flags;
        Ok(())
    }

    /// The engine's side of `Module::set_segment_len`, whose documentation is the
    /// contract.
    pub(super) fn set_segment_len(&mut self, des: Descriptor, len: usize) -> Result<(), BtlError> {
        let limit = self.limits.eager_limit;
        let frag = self.frags.checked_mut(des)?;
        // A bounce buffer's segment is the message in it.
        if let Some(UserData {
            data: UserBytes::Bounce(buffer),
            range,
            ..
        }) = frag.user.as_mut()
        {
            if len > buffer.len() {
                return Err(bad(des, "too small for that length"));
            }
            *range = 0..len;
            return Ok(());
        }
        // A user fragment's registered part is the caller's header only.
        let limit = if frag.user.is_some() {
            super::USER_RESERVE_MAX
        } else {
            limit
        };
        if len > limit {
            return Err(bad(des, "too small for that length"));
        }
        frag.seg_len = len;
        Ok(())
    }

    /// Notes the CRC-32 of a send fragment's segment, `written` into it just
    /// now, when this module checksums its datagrams: the bytes are in the
    /// cache now, and sealing the datagram then reads only its headers.
    pub(super) fn note_segment_crc(
        &mut self,
        des: Descriptor,
        written: &[u8],
    ) -> Result<(), BtlError> {
        let checksums = self
            .path
            .reliable()
            .is_some_and(|r| matches!(r.integrity, Integrity::Checksum));
        let frag = self.frags.checked_mut(des)?;
        frag.segment_crc = checksums.then(|| SegmentCrc {
            len: written.len(),
            crc: datagram::payload_checksum(&[written]),
        });
        Ok(())
    }

    /// The engine's side of `Module::set_message_bounds`, whose documentation is the
    /// contract.
    pub(super) fn set_message_bounds(
        &mut self,
        des: Descriptor,
        first: bool,
        last: bool,
    ) -> Result<(), BtlError> {
        self.frags.checked_mut(des)?.msg_flags =
            if first { rel::FLAG_FIRST } else { 0 } | if last { rel::FLAG_LAST } else { 0 };
        Ok(())
    }
}
