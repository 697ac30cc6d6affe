//! Fragments and their free lists.
//!
//! A fragment is the unit the BTL sends: the BTL header plus up to one
//! datagram of payload. Send fragments carry their payload in registered
//! memory the BTL owns; user fragments carry only the header (and the
//! caller's reserved header bytes) there, and gather the payload straight
//! from registered user memory. Fragments are named by [`Descriptor`]s: an
//! index with a generation, never a pointer, so the same handle travels in
//! `wr_id`, in the pending queue and in callbacks, and a stale one is caught.
//!
//! Free lists grow in chunks, each chunk one memory registration, up to a
//! documented bound (`send_frags_max`, `user_frags_max`): the seed's bound of
//! `sd_num << 2` hung alltoall, and its later unbounded lists let a runaway
//! sender pin unbounded memory.

use std::ops::Range;
use std::sync::Arc;

use udbtl_fabric::{Context, LKey, Mr, PdHandle, Sge};

use crate::error::SendFailure;
use crate::rcache::RegId;

/// A fragment that is a whole message by itself.
pub(crate) const WHOLE_MESSAGE: u16 = udbtl_wire::rel::FLAG_FIRST | udbtl_wire::rel::FLAG_LAST;

/// Descriptor flags, as in the BTL interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DesFlags(u8);

impl DesFlags {
    /// No flags.
    pub const NONE: Self = Self(0);
    /// A hint that the fragment should go before others.
    pub const PRIORITY: Self = Self(0x1);
    /// The BTL frees the descriptor itself after the send callback.
    pub const BTL_OWNERSHIP: Self = Self(0x2);
    /// Run the send callback even when the send could complete at once.
    pub const SEND_ALWAYS_CALLBACK: Self = Self(0x4);

    /// `true` if every flag of `other` is set.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
}

impl core::ops::BitOr for DesFlags {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

/// A handle to a send or user fragment: the BTL descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Descriptor(u32);

const USER_BIT: u32 = 1 << 31;
const GEN_SHIFT: u32 = 23;
const INDEX_MASK: u32 = (1 << GEN_SHIFT) - 1;

impl Descriptor {
    pub(crate) fn new(kind: FragKind, index: u32, generation: u8) -> Self {
        let kind_bit = if kind == FragKind::User { USER_BIT } else { 0 };
        Self(kind_bit | (u32::from(generation) << GEN_SHIFT) | (index & INDEX_MASK))
    }

    /// The raw value, as carried in a work request id.
    pub const fn raw(self) -> u32 {
        self.0
    }

    /// The descriptor whose [`raw`](Self::raw) value is `raw`, for callers
    /// that keep handles outside Rust. Harmless when stale or made up: the
    /// handle carries a generation, and the module refuses a descriptor it
    /// did not hand out.
    pub const fn from_raw(raw: u32) -> Self {
        Self(raw)
    }

    pub(crate) fn kind(self) -> FragKind {
        if self.0 & USER_BIT != 0 {
            FragKind::User
        } else {
            FragKind::Send
        }
    }

    pub(crate) fn index(self) -> usize {
        (self.0 & INDEX_MASK) as usize
    }

    fn generation(self) -> u8 {
        ((self.0 & !USER_BIT) >> GEN_SHIFT) as u8
    }
}

/// Which free list a fragment belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FragKind {
    /// Payload packed into BTL-owned registered memory.
    Send,
    /// Payload gathered from registered user memory.
    User,
}

/// Where a fragment is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FragState {
    /// On the free list.
    Free,
    /// Handed to the caller by alloc/prepare_src.
    Allocated,
    /// Waiting on the module's pending list for a send credit.
    Pending,
    /// Posted to the fabric; owned by the BTL until its completion.
    Posted,
}

/// User memory a user fragment sends from, with the registration covering it.
#[derive(Debug)]
pub(crate) struct UserData {
    pub(crate) reg: RegId,
    pub(crate) lkey: LKey,
    pub(crate) data: UserBytes,
    pub(crate) range: Range<usize>,
}

/// Where a user fragment's bytes live.
pub(crate) enum UserBytes {
    /// Reference-counted memory the BTL holds a share of.
    Shared(Arc<[u8]>),
    /// Memory its owner lends until the send completes.
    Lent(Box<dyn LentBytes>),
    /// A bounce buffer of the module's (`alloc` above the eager limit),
    /// which the caller wrote the message into.
    Bounce(Box<[u8]>),
}

impl UserBytes {
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Self::Shared(data) => data,
            Self::Lent(lent) => lent.bytes(),
            Self::Bounce(buffer) => buffer,
        }
    }
}

impl std::fmt::Debug for UserBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            Self::Shared(_) => "shared",
            Self::Lent(_) => "lent",
            Self::Bounce(_) => "bounce",
        };
        write!(f, "{kind} {} bytes", self.bytes().len())
    }
}

/// Memory a caller lends the BTL to send from without a copy
/// ([`Module::prepare_lent`](crate::Module::prepare_lent)): a C host's
/// user buffer, say, which it keeps until the send completes, as MPI does.
///
/// The contract, which the BTL relies on: [`bytes`](Self::bytes) returns the
/// same bytes, unchanged, from the `prepare_lent` call until the
/// descriptor's send completion is reported (retransmissions read them) or
/// the descriptor is freed.
pub trait LentBytes: Send + Sync + 'static {
    /// The bytes to send.
    fn bytes(&self) -> &[u8];
}

/// Per-fragment bookkeeping.
#[derive(Debug)]
pub(crate) struct Frag {
    generation: u8,
    pub(crate) state: FragState,
    /// Bytes after the BTL header held in registered memory: the caller's
    /// reserve plus, for send fragments, the packed payload.
    pub(crate) seg_len: usize,
    pub(crate) flags: DesFlags,
    pub(crate) order: u8,
    pub(crate) endpoint: u32,
    pub(crate) tag: u8,
    pub(crate) context: u64,
    pub(crate) user: Option<UserData>,
    /// Whether the fragment starts and/or ends a message (reliability
    /// extension flags `FLAG_FIRST`/`FLAG_LAST`), and, on a carrier, that
    /// its segment is a list of coalesced messages (`FLAG_COALESCED`).
    pub(crate) msg_flags: u16,
    /// The next message coalesced into the same datagram: on a carrier, the
    /// first of its riders; on a rider, the one after it. An intrusive list,
    /// so that coalescing never allocates. Riders complete right after
    /// their carrier, in this order.
    pub(crate) rider: Option<Descriptor>,
    /// On a carrier, its last rider (where the next one is linked).
    pub(crate) rider_tail: Option<Descriptor>,
    /// A user fragment longer than one datagram leaves as a train of
    /// datagrams (`module/reliable/train.rs`): the fragment the caller holds
    /// is the first, each car after it is a fragment of its own.
    pub(crate) train: Option<Train>,
    /// The CRC-32 of the segment, taken as it was written while its bytes
    /// were in the cache, so that sealing the datagram reads only its
    /// headers. Valid while the segment is `seg_len` bytes long: a writer
    /// that changes the segment in place clears it.
    pub(crate) segment_crc: Option<SegmentCrc>,
    /// Where its last transmission is on its way out of this host.
    pub(crate) leaving: Leaving,
    /// The BTL's own (a message of the read protocol): its completion is
    /// not the host's to hear.
    pub(crate) internal: bool,
}

/// Where a reliable fragment's last transmission is before it leaves this
/// host. A resend asked for meanwhile (a timeout under load) must not post
/// the fragment's bytes a second time: they are written (and sealed) in
/// place, so both posts would carry the same packet number, which the peer
/// counts as a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Leaving {
    /// Posted, or never sent.
    #[default]
    No,
    /// Waiting for a send credit.
    WaitingForCredit,
    /// In the batch of datagrams being gathered, numbered so
    /// (`TransmitQueue::batch_number`).
    InBatch(u64),
}

/// The CRC-32 of a fragment's segment when it was `len` bytes long
/// ([`udbtl_wire::datagram::payload_checksum`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SegmentCrc {
    pub(crate) len: usize,
    pub(crate) crc: u32,
}

/// A fragment's place in a train of datagrams.
#[derive(Debug)]
pub(crate) enum Train {
    /// The first datagram, the fragment the caller holds: its callback runs
    /// once every datagram of the train is acknowledged (or has failed).
    Head {
        /// The first car behind it.
        next: Option<Descriptor>,
        /// Datagrams of the train, itself included, not yet acknowledged or
        /// failed.
        unfinished: u32,
        /// Why the first datagram that failed did, if one did.
        failure: Option<SendFailure>,
    },
    /// A later datagram: a share of the head's caller bytes.
    Car {
        head: Descriptor,
        /// Its bytes, in the head's [`UserBytes`].
        range: Range<usize>,
        next: Option<Descriptor>,
    },
}

/// A free list of fragments over chunks of registered memory.
#[derive(Debug)]
pub(crate) struct FragPool {
    kind: FragKind,
    /// Bytes of registered memory per fragment.
    stride: usize,
    /// Fragments added per growth step.
    increment: usize,
    /// Growth bound.
    max: usize,
    chunks: Vec<Mr>,
    frags: Vec<Frag>,
    free: Vec<u32>,
    /// Deepest the pool has ever been drawn.
    pub(crate) high_water: usize,
}

impl FragPool {
    pub(crate) fn new(kind: FragKind, stride: usize, increment: usize, max: usize) -> Self {
        Self {
            kind,
            stride,
            increment: increment.max(1),
            max,
            chunks: Vec::new(),
            frags: Vec::new(),
            free: Vec::new(),
            high_water: 0,
        }
    }

    /// Registers chunks of `increment` fragments until at least `count` more
    /// exist, or the bound is reached. Returns whether any was added.
    pub(crate) fn grow<C: Context>(
        &mut self,
        ctx: &mut C,
        pd: PdHandle,
        count: usize,
    ) -> Result<bool, udbtl_fabric::FabricError> {
        let mut added = false;
        let target = self.frags.len() + count;
        while self.frags.len() < target && self.grow_chunk(ctx, pd)? {
            added = true;
        }
        Ok(added)
    }

    /// Every chunk holds exactly `increment` fragments, so a fragment's
    /// memory is found by division, not by a search.
    fn grow_chunk<C: Context>(
        &mut self,
        ctx: &mut C,
        pd: PdHandle,
    ) -> Result<bool, udbtl_fabric::FabricError> {
        let count = self.increment;
        if self.frags.len() + count > self.max {
            return Ok(false);
        }
        let mr = ctx.reg_mr(pd, count * self.stride)?;
        self.chunks.push(mr);
        let first = self.frags.len();
        for index in (first..first + count).rev() {
            self.free.push(index as u32);
        }
        self.frags.extend((0..count).map(|_| Frag {
            generation: 0,
            state: FragState::Free,
            seg_len: 0,
            flags: DesFlags::NONE,
            order: 0,
            endpoint: 0,
            tag: 0,
            context: 0,
            user: None,
            msg_flags: WHOLE_MESSAGE,
            rider: None,
            rider_tail: None,
            train: None,
            segment_crc: None,
            leaving: Leaving::No,
            internal: false,
        }));
        Ok(true)
    }

    /// Takes a fragment off the free list, growing by one chunk if it is
    /// empty. `None` when the pool is at its bound (the caller retries later,
    /// as the PML did).
    pub(crate) fn get<C: Context>(&mut self, ctx: &mut C, pd: PdHandle) -> Option<Descriptor> {
        if self.free.is_empty() {
            match self.grow_chunk(ctx, pd) {
                Ok(true) => {}
                Ok(false) => return None,
                Err(err) => {
                    tracing::warn!(%err, "could not grow a fragment free list");
                    return None;
                }
            }
        }
        let index = self.free.pop()?;
        let frag = self.frags.get_mut(index as usize)?;
        frag.state = FragState::Allocated;
        frag.seg_len = 0;
        frag.flags = DesFlags::NONE;
        frag.order = crate::NO_ORDER;
        frag.context = 0;
        frag.user = None;
        frag.msg_flags = WHOLE_MESSAGE;
        frag.rider = None;
        frag.rider_tail = None;
        frag.train = None;
        frag.segment_crc = None;
        frag.leaving = Leaving::No;
        frag.internal = false;
        let des = Descriptor::new(self.kind, index, frag.generation);
        self.high_water = self.high_water.max(self.in_use());
        Some(des)
    }

    /// Returns a fragment to the free list; bumps its generation so old
    /// handles stop resolving.
    pub(crate) fn put(&mut self, des: Descriptor) {
        if let Some(frag) = self.frags.get_mut(des.index()) {
            frag.state = FragState::Free;
            frag.generation = frag.generation.wrapping_add(1);
            frag.user = None;
            frag.train = None;
            self.free.push(des.index() as u32);
        }
    }

    /// The live fragment named by `des`.
    pub(crate) fn frag(&self, des: Descriptor) -> Option<&Frag> {
        self.frags
            .get(des.index())
            .filter(|f| f.generation == des.generation() && f.state != FragState::Free)
    }

    /// The live fragment named by `des`, mutably.
    pub(crate) fn frag_mut(&mut self, des: Descriptor) -> Option<&mut Frag> {
        self.frags
            .get_mut(des.index())
            .filter(|f| f.generation == des.generation() && f.state != FragState::Free)
    }

    /// The registered bytes of fragment `index`: chunk and range inside it.
    pub(crate) fn sge(&self, index: usize, len: usize) -> Option<(Mr, Sge)> {
        let mr = *self.chunks.get(index / self.increment)?;
        let offset = (index % self.increment) * self.stride;
        Some((
            mr,
            Sge {
                lkey: mr.lkey,
                offset,
                len: len.min(self.stride),
            },
        ))
    }

    pub(crate) fn len(&self) -> usize {
        self.frags.len()
    }

    pub(crate) fn in_use(&self) -> usize {
        self.frags.len() - self.free.len()
    }

    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// The descriptor of the live fragment at `index`.
    pub(crate) fn descriptor_at(&self, index: usize) -> Option<Descriptor> {
        let frag = self
            .frags
            .get(index)
            .filter(|f| f.state != FragState::Free)?;
        Some(Descriptor::new(self.kind, index as u32, frag.generation))
    }

    /// Fragments not on the free list, for leak checks and dumps.
    pub(crate) fn live(&self) -> impl Iterator<Item = (usize, &Frag)> {
        self.frags
            .iter()
            .enumerate()
            .filter(|(_, f)| f.state != FragState::Free)
    }

    /// Deregisters every chunk.
    pub(crate) fn release<C: Context>(
        &mut self,
        ctx: &mut C,
    ) -> Result<(), udbtl_fabric::FabricError> {
        for mr in self.chunks.drain(..) {
            ctx.dereg_mr(mr.handle)?;
        }
        self.frags.clear();
        self.free.clear();
        Ok(())
    }
}
