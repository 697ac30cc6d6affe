//! A program's messages: sends, receive callbacks and blocking receives.

use std::sync::Arc;
use std::time::{Duration, Instant};

use udbtl_btl::{
    BtlError, DesFlags, EndpointId, NO_ORDER, RecvEvent, Tag as BtlTag, TransportModule,
};

use super::failures::Route;
use super::inbox::Message;
use super::{RecvError, SendError, Tag, World};

impl World {
    /// Sends `message`, of any length, to `rank` with `tag`. The receiver
    /// gets it whole, once, in the order this rank sent to it: from
    /// [`recv`](Self::recv), or from its [`on_receive`](Self::on_receive)
    /// callback for `tag`. A rank can send to itself.
    ///
    /// It returns once the transport has taken the message (its bytes are
    /// copied), not once it arrived; [`finalize`](Self::finalize) waits
    /// for every message to be acknowledged. Without reliability
    /// (`UDBTL_RELIABLE=0`) a message is one datagram, as
    /// [`send_bytes`](Self::send_bytes) sends it.
    ///
    /// # Errors
    /// A rank outside the job or one that cannot be reached
    /// ([`SendError::Connect`]), a peer declared lost, no send fragment
    /// freed within `peer_timeout`, or, without reliability, a message over
    /// one datagram.
    pub fn send(&mut self, rank: u32, tag: Tag, message: &[u8]) -> Result<(), SendError> {
        if !self.reliable {
            return self.send_bytes(rank, tag, message);
        }
        self.send_on_route(rank, message.len(), |module, endpoint| {
            module.send_message(endpoint, tag.on_the_wire(), message)
        })
    }

    /// [`send`](Self::send) without a copy: the transport sends from
    /// `message` itself and keeps a share of it until every datagram is
    /// acknowledged (the buffer is immutable meanwhile, which the `Arc`
    /// guarantees). Cheapest for long messages, and for one message sent
    /// many times; a message of one datagram or less is copied all the
    /// same. The receiver cannot tell the difference.
    ///
    /// # Errors
    /// As [`send`](Self::send).
    pub fn send_shared(
        &mut self,
        rank: u32,
        tag: Tag,
        message: &Arc<[u8]>,
    ) -> Result<(), SendError> {
        if !self.reliable {
            return self.send_bytes(rank, tag, message);
        }
        self.send_on_route(rank, message.len(), |module, endpoint| {
            module.send_message_shared(endpoint, tag.on_the_wire(), message)
        })
    }

    /// Has `send` send a message of `len` bytes on the module and endpoint
    /// that reach `rank`, and words its refusal.
    fn send_on_route(
        &mut self,
        rank: u32,
        len: usize,
        send: impl FnOnce(&mut TransportModule, EndpointId) -> Result<(), BtlError>,
    ) -> Result<(), SendError> {
        let Route { module, endpoint } = self.route(rank)?;
        send(&mut self.btl.modules_mut()[module], endpoint).map_err(|err| {
            self.lost_or(SendError::Refused {
                rank,
                len,
                reason: err.to_string(),
            })
        })
    }

    /// Sends `bytes`, which must fit one datagram (the eager limit, about
    /// the MTU's payload), to `rank` with `tag`: the cheapest send, with
    /// the same delivery as [`send`](Self::send). Waits, progressing, while
    /// no send fragment is free.
    ///
    /// # Errors
    /// As [`send`](Self::send); a message over one datagram is
    /// [`SendError::TooLong`].
    pub fn send_bytes(&mut self, rank: u32, tag: Tag, bytes: &[u8]) -> Result<(), SendError> {
        self.send_datagram(rank, tag.on_the_wire(), bytes)
    }

    /// [`send_bytes`](Self::send_bytes) on any tag of the transport, for
    /// udbtl's own messages.
    pub(super) fn send_datagram(
        &mut self,
        rank: u32,
        tag: BtlTag,
        bytes: &[u8],
    ) -> Result<(), SendError> {
        let Route { module, endpoint } = self.route(rank)?;
        let c = &mut self.btl;
        let limit = c.modules()[module].limits().eager_limit;
        if bytes.len() > limit {
            return Err(SendError::TooLong {
                rank,
                len: bytes.len(),
                limit,
            });
        }
        // Fragments held by a peer that stopped acknowledging come back when
        // it is declared lost (within peer_timeout and one retransmission
        // timeout, at most a third of it): wait that long, so that the
        // caller hears of the loss, not of a shortage.
        let peer_timeout = Duration::from_millis(u64::from(c.params().peer_timeout));
        let deadline = Instant::now() + peer_timeout + peer_timeout / 3 + Duration::from_secs(1);
        let refused = |reason: String| SendError::Refused {
            rank,
            len: bytes.len(),
            reason,
        };
        let des = loop {
            if let Some(des) =
                c.modules_mut()[module].alloc(NO_ORDER, bytes.len(), DesFlags::BTL_OWNERSHIP)
            {
                break des;
            }
            if Instant::now() > deadline {
                return Err(self.lost_or(refused("no send fragment became free".into())));
            }
            c.progress();
        };
        let module = &mut c.modules_mut()[module];
        let sent = module
            .segment_mut(des)
            .map(|mut segment| segment.copy_from_slice(bytes))
            .and_then(|()| module.send(endpoint, des, tag));
        let Err(err) = sent else {
            return Ok(());
        };
        // The descriptor is the caller's again: give it back.
        if let Err(free) = module.free(des) {
            tracing::error!(%free, "could not free a refused descriptor");
        }
        Err(self.lost_or(refused(err.to_string())))
    }

    /// A send refused because its peer was declared lost: the account of
    /// the loss says more than the refusal.
    fn lost_or(&self, refusal: SendError) -> SendError {
        self.check().err().map_or(refusal, SendError::Lost)
    }

    /// Hands every message on `tag` to `callback`, with the sender's rank
    /// (see [`Message::from`]), instead of keeping them for
    /// [`recv`](Self::recv). Messages already kept for `tag` go to the
    /// callback before this returns; later ones inside
    /// [`progress`](Self::progress) (and the calls that progress: sends,
    /// receives, barriers, finalize), in each sender's order, exactly once.
    ///
    /// The callback gets the bytes in the transport's buffer, without a
    /// copy: the fastest way to receive. It runs on the thread that
    /// progresses and must not block. A later call for the same tag
    /// replaces it.
    pub fn on_receive(
        &mut self,
        tag: Tag,
        callback: impl FnMut(Option<u32>, &[u8]) + Send + Clone + 'static,
    ) {
        self.claimed |= 1u128 << tag.get();
        let mut first = callback.clone();
        self.listen(tag.on_the_wire(), callback);
        for message in self.inbox.take(tag) {
            first(message.from, &message.data);
        }
    }

    /// Installs `callback` for transport tag `tag` on every module.
    pub(super) fn listen(
        &mut self,
        tag: BtlTag,
        callback: impl FnMut(Option<u32>, &[u8]) + Send + Clone + 'static,
    ) {
        for module in self.btl.modules_mut() {
            let mut callback = callback.clone();
            module.register(
                tag,
                Box::new(move |ev: &RecvEvent<'_>| {
                    let rank = ev.endpoint_context.and_then(|r| u32::try_from(r).ok());
                    callback(rank, ev.payload);
                }),
            );
        }
    }

    /// Keeps the messages of every tag without a callback for
    /// [`recv`](Self::recv), from the start: a message sent before its
    /// receiver asked for it is never dropped.
    pub(super) fn keep_unclaimed(&mut self) {
        for tag in Tag::all() {
            let inbox = self.inbox.clone();
            self.listen(tag.on_the_wire(), move |from, bytes| {
                inbox.push(tag, from, bytes);
            });
        }
    }

    /// Waits, progressing, for the next message on `tag` and returns it:
    /// the oldest not yet received, from any rank. Messages from one sender
    /// come in the order it sent them.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut world = udbtl::init()?;
    /// const TOKEN: udbtl::Tag = udbtl::Tag::new(1);
    /// world.send(world.rank(), TOKEN, b"to myself")?;
    /// let message = world.recv(TOKEN)?;
    /// assert_eq!((message.from, &message.data[..]), (Some(world.rank()), &b"to myself"[..]));
    /// world.finalize()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A tag with a callback, which takes its messages; or messages lost
    /// (a peer was declared lost), since the one awaited may then never
    /// come. A rank that is alive but never sends keeps it waiting, as an
    /// MPI receive would.
    pub fn recv(&mut self, tag: Tag) -> Result<Message, RecvError> {
        loop {
            if let Some(message) = self.try_recv(tag)? {
                return Ok(message);
            }
            if self.progress() == 0 {
                std::thread::yield_now();
            }
        }
    }

    /// The oldest message kept for `tag`, if one has arrived, without
    /// waiting and without progressing: call [`progress`](Self::progress)
    /// between calls.
    ///
    /// # Errors
    /// As [`recv`](Self::recv), once nothing is kept.
    pub fn try_recv(&mut self, tag: Tag) -> Result<Option<Message>, RecvError> {
        if self.claimed & (1u128 << tag.get()) != 0 {
            return Err(RecvError::HasCallback { tag });
        }
        if let Some(message) = self.inbox.pop(tag) {
            return Ok(Some(message));
        }
        self.check()?;
        Ok(None)
    }

    /// Warns of messages that arrived and were never received: a program
    /// that sent to a tag its peer never reads.
    pub(super) fn warn_unread(&self) {
        for (tag, count) in self.inbox.unread() {
            tracing::warn!(
                rank = self.rank,
                "{count} messages on {tag} arrived and were never received"
            );
        }
    }
}
