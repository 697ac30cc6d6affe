//! Bounce buffers: the memory of a send fragment longer than one datagram
//! (`alloc` above the eager limit, up to `eager_max`, on a reliable module).
//! The caller writes the message into it; it leaves as a train of
//! datagrams (`reliable/train.rs`) gathered from the buffer in place,
//! registered through the registration cache, and comes back to the pool
//! when the fragment is freed. Buffers are made as needed, up to a bound,
//! and kept: their addresses stay registered in the cache, so a reused one
//! costs a cache hit, and a steady stream of sends allocates nothing.

/// A bounded pool of equal buffers.
#[derive(Debug)]
pub(super) struct BouncePool {
    /// Bytes of each buffer: the largest message it holds.
    size: usize,
    free: Vec<Box<[u8]>>,
    /// Buffers made (free or lent).
    made: usize,
    max: usize,
}

impl BouncePool {
    /// A pool of at most `max` buffers of `size` bytes; none made yet.
    pub(super) fn new(size: usize, max: usize) -> Self {
        Self {
            size,
            free: Vec::new(),
            made: 0,
            max,
        }
    }

    /// Bytes of each buffer.
    pub(super) const fn size(&self) -> usize {
        self.size
    }

    /// A buffer: a free one, or a new one while fewer than the bound exist.
    pub(super) fn take(&mut self) -> Option<Box<[u8]>> {
        if let Some(buffer) = self.free.pop() {
            return Some(buffer);
        }
        if self.made >= self.max || self.size == 0 {
            return None;
        }
        self.made += 1;
        Some(vec![0; self.size].into_boxed_slice())
    }

    /// Takes a buffer back for the next `take`.
    pub(super) fn give_back(&mut self, buffer: Box<[u8]>) {
        self.free.push(buffer);
    }

    /// Buffers lent out now.
    pub(super) fn in_use(&self) -> usize {
        self.made - self.free.len()
    }

    /// Buffers made so far, and the bound.
    pub(super) const fn made(&self) -> (usize, usize) {
        (self.made, self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_made_up_to_the_bound_and_reused() {
        let mut pool = BouncePool::new(16, 2);
        let a = pool.take().unwrap();
        let b = pool.take().unwrap();
        assert!(pool.take().is_none(), "at the bound");
        assert_eq!((a.len(), pool.in_use()), (16, 2));
        let address = a.as_ptr();
        pool.give_back(a);
        let again = pool.take().unwrap();
        assert_eq!(again.as_ptr(), address, "the same buffer");
        pool.give_back(b);
        assert_eq!(pool.in_use(), 1);
        pool.give_back(again);
    }
}
