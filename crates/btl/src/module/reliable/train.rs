//! Trains: a fragment prepared from the caller's memory that is longer than
//! one datagram (ob1's fragments, up to `frag_size`) leaves as consecutive
//! datagrams of the reliable stream, each sequenced, acknowledged and
//! retransmitted on its own; the receiver puts them back together
//! (`messages.rs`) and delivers the fragment whole, as it does a message cut
//! by `send_message`. The datagrams are of equal size, so the udp provider
//! sends them as one GSO train.
//!
//! Nothing is copied on the way down. The fragment the caller holds is the
//! head, the first datagram; each car after it is a user fragment of its
//! own, whose registered part holds only its headers and which gathers its
//! share of the caller's bytes through the head's registration.
//!
//! The cars are taken when the fragment is prepared, so a send never fails
//! for want of them: a host that cannot prepare one retries later, as ob1
//! does. The head's send completes once every datagram of the train is
//! acknowledged, or has failed (then with the first failure), so the
//! caller's bytes stay put while any car may still be resent.

use udbtl_fabric::Context;
use udbtl_reliability::{Instant, PeerId};
use udbtl_wire::{btl, rel};

use super::super::{Engine, Flush};
use crate::error::{BtlError, SendFailure};
use crate::frag::{DesFlags, Descriptor, FragState, Train};
use crate::{EndpointId, SendStatus};

impl<C: Context> Engine<C> {
    /// Datagrams beyond its own that a user fragment with `reserve` bytes
    /// of the caller's header and `data` caller bytes needs, at the eager
    /// limit in force.
    pub(in crate::module) fn cars_needed(&self, reserve: usize, data: usize) -> usize {
        let eager = self.limits.eager_limit.max(1);
        data.saturating_sub(eager.saturating_sub(reserve))
            .div_ceil(eager)
    }

    /// Takes the cars a user fragment being prepared, `head`, needs beyond
    /// its own datagram for `reserve` header bytes and `data` caller bytes,
    /// and makes it the head of their train. Returns `false`, with none
    /// taken, when the user free list cannot supply them all. A head that
    /// is not sent after all gives them back with
    /// [`uncouple_cars`](Self::uncouple_cars).
    pub(in crate::module) fn couple_cars(
        &mut self,
        head: Descriptor,
        reserve: usize,
        data: usize,
    ) -> bool {
        let needed = self.cars_needed(reserve, data);
        if needed == 0 || !self.path.is_reliable() {
            return true;
        }
        let Some(first) = self.take_cars(head, needed, None) else {
            return false;
        };
        if let Some(frag) = self.frags.get_mut(head) {
            frag.train = Some(Train::Head {
                next: Some(first),
                unfinished: 0,
                failure: None,
            });
        }
        true
    }

    /// Takes `count` cars for `head`, linked in front of `tail`; returns the
    /// first, or `None`, with none taken, if the free list ran out.
    fn take_cars(
        &mut self,
        head: Descriptor,
        count: usize,
        tail: Option<Descriptor>,
    ) -> Option<Descriptor> {
        let mut next = tail;
        for _ in 0..count {
            let Some(car) = self.frags.user.get(&mut self.ctx, self.pd) else {
                self.put_cars(next, tail);
                return None;
            };
            if let Some(frag) = self.frags.user.frag_mut(car) {
                frag.train = Some(Train::Car {
                    head,
                    range: 0..0,
                    next,
                });
            }
            next = Some(car);
        }
        next
    }

    /// Puts the cars from `first` up to (not including) `until` back on the
    /// free list.
    fn put_cars(&mut self, mut first: Option<Descriptor>, until: Option<Descriptor>) {
        while let Some(car) = first.filter(|&car| Some(car) != until) {
            first = match self.frags.get(car).and_then(|f| f.train.as_ref()) {
                Some(Train::Car { next, .. }) => *next,
                _ => None,
            };
            self.frags.user.put(car);
        }
    }

    /// Gives back the cars of a train head the caller frees unsent.
    pub(in crate::module) fn uncouple_cars(&mut self, head: Descriptor) {
        let first = match self.frags.get_mut(head).and_then(|f| f.train.take()) {
            Some(Train::Head { next, .. }) => next,
            _ => None,
        };
        self.put_cars(first, None);
    }

    /// Whether `des` heads a train, and so leaves through
    /// [`send_train`](Self::send_train).
    pub(in crate::module) fn heads_train(&self, des: Descriptor) -> bool {
        matches!(
            self.frags.get(des).and_then(|f| f.train.as_ref()),
            Some(Train::Head { .. })
        )
    }

    /// Sends a train head and its cars, whose BTL header the caller has
    /// written into the head: cuts the caller's bytes into datagrams of the
    /// eager limit, gives each car its share and its headers, and hands them
    /// to the reliability state one after the other, so their sequence
    /// numbers follow each other. With `awaited` (the caller's bytes are
    /// given back only when the acknowledgement comes) the last asks for
    /// one at once.
    pub(in crate::module) fn send_train(
        &mut self,
        now: Instant,
        peer: PeerId,
        head: Descriptor,
        awaited: bool,
        flush: Flush,
    ) -> Result<SendStatus, BtlError> {
        let endpoint = EndpointId(peer.0);
        let unavailable = |reason: String| BtlError::PeerUnavailable {
            endpoint: endpoint.0,
            reason,
        };
        if let Some(reliable) = self.path.reliable() {
            reliable
                .core
                .accepts(peer)
                .map_err(|err| unavailable(err.to_string()))?;
        }
        // The cars' headers say what the head's does (`send`).
        let Some(route) = self.endpoints.route(endpoint) else {
            return Err(BtlError::BadEndpoint {
                endpoint: endpoint.0,
            });
        };
        // The eager limit may have shrunk since the cars were taken (a peer
        // with smaller datagrams joined): take the ones missing.
        let needed = self.frags.get(head).map_or(0, |f| {
            self.cars_needed(f.seg_len, f.user.as_ref().map_or(0, |u| u.range.len()))
        });
        let coupled = self.train_len(head).saturating_sub(1);
        if needed > coupled {
            let first = self.train_next(head);
            let Some(first) = self.take_cars(head, needed - coupled, first) else {
                return Err(BtlError::NoFragment {
                    waited: std::time::Duration::ZERO,
                });
            };
            if let Some(Train::Head { next, .. }) =
                self.frags.get_mut(head).and_then(|f| f.train.as_mut())
            {
                *next = Some(first);
            }
        }
        let cars = self.lay_out_train(head)?;
        let header = btl::Repr {
            tag: self.frags.get(head).map_or(0, |f| f.tag),
            job_key: route.header_job_key,
            reliable: true,
        };
        let mut car = self.train_next(head);
        while let Some(des) = car {
            header.emit(&mut btl::Packet::new_unchecked(self.registered_mut(des)?));
            car = self.train_next(des);
        }
        let Some(reliable) = self.path.reliable_mut() else {
            return Err(unavailable("trains need a reliable module".into()));
        };
        let mut sent = 0;
        let mut des = Some(head);
        while let Some(next) = des {
            sent += 1;
            let queued = if awaited && sent == cars + 1 {
                reliable.core.send_awaited(now, peer, next)
            } else {
                reliable.core.send(now, peer, next)
            };
            // Refused only for a peer `accepts` refused above.
            queued.map_err(|err| unavailable(err.to_string()))?;
            if let Some(frag) = self.frags.get_mut(next) {
                frag.state = FragState::Posted;
            }
            des = match self.frags.get(next).and_then(|f| f.train.as_ref()) {
                Some(Train::Head { next, .. } | Train::Car { next, .. }) => *next,
                None => None,
            };
        }
        if cars > 0 {
            self.stats.trains_sent += 1;
            self.stats.train_cars_sent += cars as u64;
        }
        if flush == Flush::Now {
            self.flush_transmits(now);
        }
        Ok(if self.tx.sends.len() == 0 {
            SendStatus::Posted
        } else {
            SendStatus::Queued
        })
    }

    /// Cuts the head's caller bytes into datagrams: the head keeps what fits
    /// behind its reserve, each car takes the next eager limit's worth;
    /// cars left over go back. Marks the message bounds, and the cars as the
    /// head's, owned by the BTL. Returns the cars in use.
    fn lay_out_train(&mut self, head: Descriptor) -> Result<usize, BtlError> {
        let eager = self.limits.eager_limit.max(1);
        let frag = self.frags.checked_mut(head)?;
        let (endpoint, tag) = (frag.endpoint, frag.tag);
        let in_head = eager.saturating_sub(frag.seg_len);
        // A reply of the read protocol is one on every datagram.
        let read = frag.msg_flags & rel::FLAG_READ;
        let user = frag
            .user
            .as_mut()
            .ok_or_else(|| super::super::descriptors::bad(head, "heads a train without data"))?;
        let end = user.range.end;
        let mut at = (user.range.start + in_head).min(end);
        user.range.end = at;
        frag.msg_flags = rel::FLAG_FIRST | read;
        let mut cars = 0;
        let mut car = self.train_next(head);
        let mut last = head;
        while let Some(des) = car.filter(|_| at < end) {
            let take = eager.min(end - at);
            let Some(frag) = self.frags.get_mut(des) else {
                break;
            };
            car = match &mut frag.train {
                Some(Train::Car { range, next, .. }) => {
                    *range = at..at + take;
                    *next
                }
                _ => None,
            };
            frag.seg_len = 0;
            frag.endpoint = endpoint;
            frag.tag = tag;
            frag.flags = DesFlags::BTL_OWNERSHIP;
            frag.msg_flags = read;
            at += take;
            cars += 1;
            last = des;
        }
        // Cut the list after the last car in use and give back the rest.
        let spare = car;
        match self.frags.get_mut(last).and_then(|f| f.train.as_mut()) {
            Some(Train::Car { next, .. } | Train::Head { next, .. }) => *next = None,
            None => {}
        }
        self.put_cars(spare, None);
        if let Some(frag) = self.frags.get_mut(last) {
            frag.msg_flags |= rel::FLAG_LAST;
        }
        if let Some(Train::Head { unfinished, .. }) =
            self.frags.get_mut(head).and_then(|f| f.train.as_mut())
        {
            *unfinished = cars as u32 + 1;
        }
        Ok(cars)
    }

    /// The datagram after `des` in its train.
    fn train_next(&self, des: Descriptor) -> Option<Descriptor> {
        match self.frags.get(des)?.train.as_ref()? {
            Train::Head { next, .. } | Train::Car { next, .. } => *next,
        }
    }

    /// Datagrams in the train `head` leads, itself included.
    fn train_len(&self, head: Descriptor) -> usize {
        let mut len = 1;
        let mut des = self.train_next(head);
        while let Some(car) = des {
            len += 1;
            des = self.train_next(car);
        }
        len
    }

    /// The reliable stream is done with the datagram of `des`: acknowledged,
    /// or failed. A fragment of its own completes, with the messages riding
    /// in it; a datagram of a train counts towards its head, which completes
    /// with the train's last, and a car goes back to the free list.
    pub(in crate::module) fn finish_datagram(
        &mut self,
        des: Descriptor,
        status: Result<(), SendFailure>,
    ) {
        let head = match self.frags.get(des).and_then(|f| f.train.as_ref()) {
            None => return self.complete_with_riders(des, status),
            Some(Train::Car { head, .. }) => {
                let head = *head;
                self.frags.user.put(des);
                head
            }
            Some(Train::Head { .. }) => des,
        };
        let Some(frag) = self.frags.get_mut(head) else {
            return;
        };
        let Some(Train::Head {
            unfinished,
            failure,
            ..
        }) = frag.train.as_mut()
        else {
            return;
        };
        *unfinished = unfinished.saturating_sub(1);
        if let Err(err) = status {
            failure.get_or_insert(err);
        }
        if *unfinished > 0 {
            return;
        }
        let status = failure.take().map_or(Ok(()), Err);
        frag.train = None;
        self.complete_send(head, status);
    }
}
