//! Messages that arrived on a tag without a callback, kept for
//! [`World::recv`](super::World::recv).

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::Tag;

/// A message as [`World::recv`](super::World::recv) returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The sender's rank. `None` only for a datagram from a process this
    /// rank is not connected to, which only an unreliable transport
    /// (`UDBTL_RELIABLE=0`) delivers.
    pub from: Option<u32>,
    /// The tag it was sent with.
    pub tag: Tag,
    /// Its bytes, whole.
    pub data: Vec<u8>,
}

/// One queue of messages per tag, in arrival order (which is each sender's
/// send order). Filled by the transport's callbacks, inside progress;
/// emptied by the program.
#[derive(Debug)]
pub(super) struct Inbox {
    queues: Mutex<Vec<VecDeque<Message>>>,
}

impl Default for Inbox {
    fn default() -> Self {
        Self {
            queues: Mutex::new(vec![VecDeque::new(); Tag::COUNT]),
        }
    }
}

impl Inbox {
    fn lock(&self) -> MutexGuard<'_, Vec<VecDeque<Message>>> {
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps a copy of a message that arrived on `tag`.
    pub(super) fn push(&self, tag: Tag, from: Option<u32>, data: &[u8]) {
        self.lock()[usize::from(tag.get())].push_back(Message {
            from,
            tag,
            data: data.to_vec(),
        });
    }

    /// The oldest message kept for `tag`.
    pub(super) fn pop(&self, tag: Tag) -> Option<Message> {
        self.lock()[usize::from(tag.get())].pop_front()
    }

    /// Every message kept for `tag`, oldest first; the queue is left empty.
    pub(super) fn take(&self, tag: Tag) -> VecDeque<Message> {
        std::mem::take(&mut self.lock()[usize::from(tag.get())])
    }

    /// The tags with messages nobody received, and how many each.
    pub(super) fn unread(&self) -> Vec<(Tag, usize)> {
        Tag::all()
            .zip(self.lock().iter())
            .filter(|(_, queue)| !queue.is_empty())
            .map(|(tag, queue)| (tag, queue.len()))
            .collect()
    }
}
