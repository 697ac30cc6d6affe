//! The registration cache: the seed's `rdma` memory pool.
//!
//! Registering memory is a system call on real hardware, so user fragments
//! that send from the same buffer again (a benchmark loop, a halo exchange)
//! should find it still registered. The cache keeps registrations of user
//! memory after their last user releases them, up to a limit of entries and
//! of bytes, and evicts the least recently released ones beyond it.
//!
//! # Reference counts and soft limits
//!
//! [`acquire`](RegCache::acquire) takes a reference and
//! [`release`](RegCache::release) drops it. An entry with references is never
//! deregistered, whatever the limits say: the limits are soft, and while
//! every entry is in use the cache may hold more than they allow. Only
//! unreferenced entries are evicted, oldest release first.
//!
//! With `enabled = false` (mpool `none`) nothing is kept: every acquire
//! registers, and the release that drops the last reference deregisters.
//!
//! # Lookup
//!
//! Entries are indexed by start address. An acquire hits if one indexed entry
//! covers the whole requested range, so a sub-slice of a registered buffer is
//! a hit. The index keeps one invariant: **no indexed entry contains
//! another**. Between two such ranges, the one that starts later also ends
//! later, so among the entries starting at or before an address, the last one
//! reaches furthest; checking that single entry (found in O(log n)) decides a
//! hit exactly, with no scan of predecessors. On a miss the new registration
//! cannot be contained in an indexed entry (that would have been a hit), and
//! the entries it contains are taken out of the index: deregistered at once if
//! unreferenced, or when their last reference goes if not.
//!
//! # Why caching by address is safe here
//!
//! With verbs a registration pins pages; if the program frees the buffer and
//! the allocator hands the same addresses out again, a stale cache entry
//! names the wrong physical memory, which is why verbs caches hook `free` and
//! `munmap`. In this fabric model a registration records only an address
//! range, and the bytes themselves are passed again (as a slice that the
//! borrow checker keeps alive) each time a send is posted. A stale entry can
//! therefore only let a send of live memory pass the key check; it can never
//! make the transport read freed memory. No memory hooks are needed.
//!
//! # Fabric access
//!
//! The cache knows no fabric type. Each call takes the caller's context `ctx`
//! and closures that register and deregister through it. The context is
//! threaded through rather than captured because `acquire` needs both
//! closures at once, and two closures cannot both borrow one context mutably.
//! One cache serves one protection domain.

use std::collections::BTreeMap;

use udbtl_fabric::{Handle, LKey, Mr, Table};

/// A reference to a cached registration, returned by
/// [`RegCache::acquire`] and given back to [`RegCache::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RegId(Handle);

/// Counters and occupancy of a [`RegCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegCacheStats {
    /// Acquires served by a cached registration.
    pub hits: u64,
    /// Acquires that registered memory.
    pub misses: u64,
    /// Registrations the cache dropped on its own while enabled: to respect
    /// its limits, or because a larger registration replaced them.
    pub evictions: u64,
    /// Live registrations, referenced or not.
    pub entries: usize,
    /// Bytes those registrations cover.
    pub bytes: usize,
    /// Live registrations with at least one reference.
    pub in_use: usize,
}

/// A registration cache misuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegCacheError {
    /// The id holds no reference: it was released as often as it was
    /// acquired, or the cache was drained.
    #[error("registration {id:?} is not held")]
    NotHeld {
        /// The id given.
        id: RegId,
    },
}

#[derive(Debug)]
struct Entry {
    start: usize,
    end: usize,
    mr: Mr,
    refs: usize,
    /// In the address index. Entries that are not (every entry of a disabled
    /// cache, and entries replaced by a larger registration) are deregistered
    /// when their last reference goes.
    indexed: bool,
    /// Key in the LRU list while unreferenced.
    released_at: u64,
}

/// A reference-counted, LRU cache of user memory registrations.
#[derive(Debug)]
pub struct RegCache {
    max_entries: usize,
    max_bytes: usize,
    enabled: bool,
    entries: Table<Entry>,
    /// Start address → indexed entry; no indexed entry contains another.
    by_start: BTreeMap<usize, Handle>,
    /// Release time → unreferenced indexed entry, oldest first.
    lru: BTreeMap<u64, Handle>,
    clock: u64,
    bytes: usize,
    in_use: usize,
    hits: u64,
    misses: u64,
    evictions: u64,
}

impl RegCache {
    /// A cache keeping up to `max_entries` registrations covering up to
    /// `max_bytes`, beyond those in use. `enabled = false` is mpool `none`:
    /// nothing is kept once released.
    pub fn new(max_entries: usize, max_bytes: usize, enabled: bool) -> Self {
        Self {
            max_entries,
            max_bytes,
            enabled,
            entries: Table::default(),
            by_start: BTreeMap::new(),
            lru: BTreeMap::new(),
            clock: 0,
            bytes: 0,
            in_use: 0,
            hits: 0,
            misses: 0,
            evictions: 0,
        }
    }

    /// Returns a registration covering `region` and takes a reference to it.
    /// A live entry covering the whole region is a hit; otherwise the region
    /// itself is registered with `register`, after evicting unreferenced
    /// entries (through `deregister`) to make room for it.
    ///
    /// # Errors
    /// What `register` returned; the cache is unchanged but for evictions.
    pub fn acquire<X: ?Sized, E>(
        &mut self,
        ctx: &mut X,
        region: &[u8],
        register: impl FnOnce(&mut X, &[u8]) -> Result<Mr, E>,
        mut deregister: impl FnMut(&mut X, Mr),
    ) -> Result<(RegId, LKey), E> {
        let start = region.as_ptr().addr();
        let end = start.saturating_add(region.len());
        if let Some(handle) = self.covering(start, end) {
            if let Some(entry) = self.entries.get_mut(handle) {
                if entry.refs == 0 {
                    self.lru.remove(&entry.released_at);
                    self.in_use += 1;
                }
                entry.refs += 1;
                self.hits += 1;
                return Ok((RegId(handle), entry.mr.lkey));
            }
        }
        self.misses += 1;
        if self.enabled {
            self.evict(ctx, &mut deregister, 1, region.len());
        }
        let mr = register(ctx, region)?;
        if self.enabled {
            self.supersede(ctx, &mut deregister, start, end);
        }
        let handle = self.entries.insert(Entry {
            start,
            end,
            mr,
            refs: 1,
            indexed: self.enabled,
            released_at: 0,
        });
        if self.enabled {
            self.by_start.insert(start, handle);
        }
        self.bytes += end - start;
        self.in_use += 1;
        Ok((RegId(handle), mr.lkey))
    }

    /// Takes one more reference to a registration already held, e.g. one
    /// the caller passed in, so that each holder releases its own.
    ///
    /// # Errors
    /// [`RegCacheError::NotHeld`] if `id` holds no reference; nothing changes.
    pub fn retain(&mut self, id: RegId) -> Result<LKey, RegCacheError> {
        let entry = self
            .entries
            .get_mut(id.0)
            .filter(|entry| entry.refs > 0)
            .ok_or(RegCacheError::NotHeld { id })?;
        entry.refs += 1;
        Ok(entry.mr.lkey)
    }

    /// Drops a reference taken by [`acquire`](Self::acquire) or
    /// [`retain`](Self::retain). When the last one goes the entry joins the
    /// LRU list, and unreferenced entries are evicted while the cache is over
    /// its limits; in a disabled cache the entry is deregistered at once.
    ///
    /// # Errors
    /// [`RegCacheError::NotHeld`] if `id` holds no reference; nothing changes.
    pub fn release<X: ?Sized>(
        &mut self,
        ctx: &mut X,
        id: RegId,
        mut deregister: impl FnMut(&mut X, Mr),
    ) -> Result<(), RegCacheError> {
        let entry = self
            .entries
            .get_mut(id.0)
            .filter(|entry| entry.refs > 0)
            .ok_or(RegCacheError::NotHeld { id })?;
        entry.refs -= 1;
        if entry.refs > 0 {
            return Ok(());
        }
        self.in_use -= 1;
        if !entry.indexed {
            if let Some(entry) = self.remove(id.0) {
                deregister(ctx, entry.mr);
                if self.enabled {
                    self.evictions += 1;
                }
            }
            return Ok(());
        }
        self.clock += 1;
        entry.released_at = self.clock;
        self.lru.insert(self.clock, id.0);
        self.evict(ctx, &mut deregister, 0, 0);
        Ok(())
    }

    /// Deregisters every entry, as at finalize, and returns how many still
    /// had references: registrations the caller leaked, which it should
    /// report. Their ids are no longer valid.
    pub fn drain<X: ?Sized>(
        &mut self,
        ctx: &mut X,
        mut deregister: impl FnMut(&mut X, Mr),
    ) -> usize {
        let handles: Vec<Handle> = self.entries.iter().map(|(handle, _)| handle).collect();
        let mut referenced = 0;
        for handle in handles {
            if let Some(entry) = self.entries.remove(handle) {
                referenced += usize::from(entry.refs > 0);
                deregister(ctx, entry.mr);
            }
        }
        self.by_start.clear();
        self.lru.clear();
        self.bytes = 0;
        self.in_use = 0;
        referenced
    }

    /// Counters and occupancy.
    pub fn stats(&self) -> RegCacheStats {
        RegCacheStats {
            hits: self.hits,
            misses: self.misses,
            evictions: self.evictions,
            entries: self.entries.len(),
            bytes: self.bytes,
            in_use: self.in_use,
        }
    }

    /// The indexed entry covering `start..end`, if any. By the index
    /// invariant, the last entry starting at or before `start` is the one
    /// reaching furthest, so it is the only candidate.
    fn covering(&self, start: usize, end: usize) -> Option<Handle> {
        let (_, &handle) = self.by_start.range(..=start).next_back()?;
        self.entries
            .get(handle)
            .filter(|entry| entry.end >= end)
            .map(|_| handle)
    }

    /// Evicts unreferenced entries, oldest release first, until `extra_entries`
    /// more entries covering `extra_bytes` more bytes fit within the limits,
    /// or nothing unreferenced is left.
    fn evict<X: ?Sized>(
        &mut self,
        ctx: &mut X,
        deregister: &mut impl FnMut(&mut X, Mr),
        extra_entries: usize,
        extra_bytes: usize,
    ) {
        while self.entries.len().saturating_add(extra_entries) > self.max_entries
            || self.bytes.saturating_add(extra_bytes) > self.max_bytes
        {
            let Some((_, handle)) = self.lru.pop_first() else {
                break;
            };
            if let Some(entry) = self.remove(handle) {
                deregister(ctx, entry.mr);
                self.evictions += 1;
            }
        }
    }

    /// Takes the indexed entries contained in `start..end` out of the index,
    /// before a registration of that range goes in. Contained entries start
    /// at or after `start` and, by the index invariant, form one run in
    /// address order that ends at the first entry reaching past `end`.
    fn supersede<X: ?Sized>(
        &mut self,
        ctx: &mut X,
        deregister: &mut impl FnMut(&mut X, Mr),
        start: usize,
        end: usize,
    ) {
        while let Some((&key, &handle)) = self.by_start.range(start..).next() {
            let Some(entry) = self.entries.get_mut(handle) else {
                self.by_start.remove(&key);
                continue;
            };
            if entry.end > end {
                break;
            }
            self.by_start.remove(&key);
            entry.indexed = false;
            if entry.refs == 0 {
                self.lru.remove(&entry.released_at);
                if let Some(entry) = self.remove(handle) {
                    deregister(ctx, entry.mr);
                    self.evictions += 1;
                }
            }
        }
    }

    /// Forgets an entry: the table, the index and the byte count (not the
    /// LRU list, which callers handle).
    fn remove(&mut self, handle: Handle) -> Option<Entry> {
        let entry = self.entries.remove(handle)?;
        if entry.indexed && self.by_start.get(&entry.start) == Some(&handle) {
            self.by_start.remove(&entry.start);
        }
        self.bytes -= entry.end - entry.start;
        Some(entry)
    }
}

#[cfg(test)]
mod tests;
