//! Every peer's state, made when the peer first talks: [`Peers`].
//!
//! A job of thousands of processes adds every peer at start-up, but most
//! pairs never exchange a datagram (a stencil talks to 26 neighbours). A
//! peer nothing was sent to or received from keeps only where its streams
//! start; its [`Peer`] state, the room for it in the transmit queue and the
//! list of acknowledgements held back are made when it first sends or is
//! sent to (it *wakes*). A dormant peer behaves as a peer just added: it is
//! active, idle, owes and is owed nothing, and arms no timer.

use std::ops::{Index, IndexMut};

use super::peer::Peer;
use super::types::StreamStart;
use crate::config::Config;
use crate::time::Instant;

/// The peers of one process, by id (dense, from 0).
#[derive(Debug, Default)]
pub(super) struct Peers {
    /// By peer id: where its state is, or where its streams will start.
    index: Vec<Entry>,
    /// The state of every peer that woke, in the order they woke.
    awake: Vec<Peer>,
    /// The id of each of `awake`.
    awake_ids: Vec<u32>,
}

#[derive(Debug, Clone, Copy)]
enum Entry {
    /// Nothing was sent to or received from the peer yet.
    Dormant(StreamStart),
    /// Its state is `awake[i]`.
    Awake(u32),
}

/// Heap bytes a dormant peer keeps.
pub(super) const DORMANT_BYTES: usize = size_of::<Entry>();

/// Heap bytes the peers' table adds when a peer wakes, besides its
/// [`DORMANT_BYTES`].
pub(super) const AWAKE_BYTES: usize = size_of::<Peer>() + size_of::<u32>();

impl Peers {
    /// Adds a dormant peer whose streams start at `start`; returns its id.
    pub(super) fn add(&mut self, start: StreamStart) -> u32 {
        self.index.push(Entry::Dormant(start));
        (self.index.len() - 1) as u32
    }

    /// Makes room for `additional` more peers at once.
    pub(super) fn reserve(&mut self, additional: usize) {
        self.index.reserve(additional);
    }

    /// Number of peers ever added, dormant or awake.
    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    /// Number of peers that woke.
    pub(super) fn awake(&self) -> usize {
        self.awake.len()
    }

    /// Room for this many peers' states without growing.
    pub(super) fn awake_capacity(&self) -> usize {
        self.awake.capacity()
    }

    /// The state of peer `id`, if it woke.
    pub(super) fn get(&self, id: usize) -> Option<&Peer> {
        match self.index.get(id)? {
            Entry::Awake(at) => self.awake.get(*at as usize),
            Entry::Dormant(_) => None,
        }
    }

    /// Runs `f` on the state of peer `id`: its own if it woke, else the
    /// state it would wake with. `None` for an unknown peer.
    pub(super) fn view<T>(
        &self,
        id: usize,
        config: &Config,
        f: impl FnOnce(&Peer) -> T,
    ) -> Option<T> {
        match *self.index.get(id)? {
            Entry::Awake(at) => self.awake.get(at as usize).map(f),
            // On the stack, and only until the peer first talks.
            Entry::Dormant(start) => Some(f(&Peer::new(config, Instant::ZERO, start))),
        }
    }

    /// Wakes peer `id` if it is dormant, its failure clock starting at
    /// `now`. Returns whether it woke now (the caller then makes room for
    /// what an awake peer can queue); `None` for an unknown peer.
    pub(super) fn wake(&mut self, id: usize, config: &Config, now: Instant) -> Option<bool> {
        match *self.index.get(id)? {
            Entry::Awake(_) => Some(false),
            Entry::Dormant(start) => {
                let at = self.awake.len() as u32;
                self.awake.push(Peer::new(config, now, start));
                self.awake_ids.push(id as u32);
                self.index[id] = Entry::Awake(at);
                Some(true)
            }
        }
    }

    /// The id of the `i`th peer to wake.
    pub(super) fn awake_id(&self, i: usize) -> u32 {
        self.awake_ids[i]
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

    fn index(&self, id: usize) -> &Peer {
        match self.index[id] {
            Entry::Awake(at) => &self.awake[at as usize],
            Entry::Dormant(_) => panic!("peer {id} is dormant"),
        }
    }
}

impl IndexMut<usize> for Peers {
    fn index_mut(&mut self, id: usize) -> &mut Peer {
        match self.index[id] {
            Entry::Awake(at) => &mut self.awake[at as usize],
            Entry::Dormant(_) => panic!("peer {id} is dormant"),
        }
    }
}
