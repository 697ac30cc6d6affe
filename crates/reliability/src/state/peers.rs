//! Every peer's state, made when the peer first talks: [`Peers`].
//!
//! A job of thousands of processes adds every peer at start-up, but most
//! pairs never exchange a datagram (a stencil talks to 26 neighbours). A
//! peer nothing was sent to or received from keeps only where its streams
//! start; its [`Peer`] state, the room for it in the transmit queue and the
//! list of acknowledgements held back are made when it first sends or is
//! sent to (it *wakes*). A dormant peer behaves as a peer just added: it is
//! active, idle, owes and is owed nothing, and arms no timer.
//!
//! A lookup is two vector reads, inlined: the state machine is generic, so
//! it is compiled in the caller's crate, which could not inline these
//! otherwise, and it looks a peer up several times a datagram.

use std::ops::{Index, IndexMut};

use super::peer::{NIL, Peer};
use super::types::StreamStart;
use crate::config::Config;
use crate::time::Instant;

/// The peers of one process, by id (dense, from 0).
#[derive(Debug, Default)]
pub(super) struct Peers {
    /// By peer id: where in `awake` its state is, or [`NIL`] while dormant.
    index: Vec<u32>,
    /// By peer id: where its streams start (read when it wakes).
    starts: Vec<StreamStart>,
    /// The state of every peer that woke, in the order they woke.
    awake: Vec<Peer>,
}

/// Heap bytes a dormant peer keeps.
pub(super) const DORMANT_BYTES: usize = size_of::<u32>() + size_of::<StreamStart>();

/// Heap bytes the peers' table adds when a peer wakes, besides its
/// [`DORMANT_BYTES`].
pub(super) const AWAKE_BYTES: usize = size_of::<Peer>();

impl Peers {
    /// Adds a dormant peer whose streams start at `start`; returns its id.
    pub(super) fn add(&mut self, start: StreamStart) -> u32 {
        self.index.push(NIL);
        self.starts.push(start);
        (self.index.len() - 1) as u32
    }

    /// Makes room for `additional` more peers at once.
    pub(super) fn reserve(&mut self, additional: usize) {
        self.index.reserve(additional);
        self.starts.reserve(additional);
    }

    /// Number of peers ever added, dormant or awake.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    /// Number of peers that woke.
    #[inline]
    pub(super) fn awake(&self) -> usize {
        self.awake.len()
    }

    /// Room for this many peers' states without growing.
    pub(super) fn awake_capacity(&self) -> usize {
        self.awake.capacity()
    }

    /// The state of peer `id`, if it woke.
    #[inline]
    pub(super) fn get(&self, id: usize) -> Option<&Peer> {
        self.awake.get(*self.index.get(id)? as usize)
    }

    /// Runs `f` on the state of peer `id`: its own if it woke, else the
    /// state it would wake with. `None` for an unknown peer.
    #[inline]
    pub(super) fn view<T>(
        &self,
        id: usize,
        config: &Config,
        f: impl FnOnce(&Peer) -> T,
    ) -> Option<T> {
        match self.get(id) {
            Some(peer) => Some(f(peer)),
            // On the stack, and only until the peer first talks.
            None => {
                let start = *self.starts.get(id)?;
                Some(f(&Peer::new(config, Instant::ZERO, start)))
            }
        }
    }

    /// Wakes peer `id` if it is dormant, its failure clock starting at
    /// `now`. Returns whether it woke now (the caller then makes room for
    /// what an awake peer can queue); `None` for an unknown peer.
    #[inline]
    pub(super) fn wake(&mut self, id: usize, config: &Config, now: Instant) -> Option<bool> {
        if *self.index.get(id)? != NIL {
            return Some(false);
        }
        self.index[id] = self.awake.len() as u32;
        self.awake.push(Peer::new(config, now, self.starts[id]));
        Some(true)
    }

    /// The states of the peers that woke.
    pub(super) fn iter_awake_mut(&mut self) -> impl Iterator<Item = &mut Peer> {
        self.awake.iter_mut()
    }
}

/// The state of a peer that woke. Only peers that woke have datagrams,
/// timers or acknowledgements in the state, so only they are looked up
/// this way.
///
/// # Panics
/// The peer is unknown or dormant: a broken invariant, as an index out of
/// bounds.
impl Index<usize> for Peers {
    type Output = Peer;

    #[inline]
    fn index(&self, id: usize) -> &Peer {
        &self.awake[self.index[id] as usize]
    }
}

impl IndexMut<usize> for Peers {
    #[inline]
    fn index_mut(&mut self, id: usize) -> &mut Peer {
        &mut self.awake[self.index[id] as usize]
    }
}
