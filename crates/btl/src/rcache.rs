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
mod tests {
    use std::collections::HashMap;
    use std::ops::Range;

    use proptest::prelude::*;
    use udbtl_fabric::sim::{SimContext, SimNetwork};
    use udbtl_fabric::{Context, FabricError, PdHandle, Provider};

    use super::*;

    /// A simulated device that tracks what is registered, so tests can
    /// check the cache against the fabric.
    struct Fabric {
        ctx: SimContext,
        pd: PdHandle,
        live: HashMap<LKey, Range<usize>>,
        registered: usize,
        deregistered: usize,
    }

    impl Fabric {
        fn new() -> Self {
            let net = SimNetwork::new(7);
            let mut ctx = net.add_device("sim0", 1).unwrap().open("sim0").unwrap();
            let pd = ctx.alloc_pd().unwrap();
            Self {
                ctx,
                pd,
                live: HashMap::new(),
                registered: 0,
                deregistered: 0,
            }
        }

        fn mrs(&self) -> usize {
            self.ctx.resources().mrs
        }
    }

    fn reg(fabric: &mut Fabric, region: &[u8]) -> Result<Mr, FabricError> {
        let mr = fabric.ctx.reg_user_mr(fabric.pd, region)?;
        let start = region.as_ptr().addr();
        fabric.live.insert(mr.lkey, start..start + region.len());
        fabric.registered += 1;
        Ok(mr)
    }

    fn dereg(fabric: &mut Fabric, mr: Mr) {
        fabric.ctx.dereg_mr(mr.handle).unwrap();
        assert!(fabric.live.remove(&mr.lkey).is_some());
        fabric.deregistered += 1;
    }

    fn acquire(cache: &mut RegCache, fabric: &mut Fabric, region: &[u8]) -> (RegId, LKey) {
        cache.acquire(fabric, region, reg, dereg).unwrap()
    }

    fn release(cache: &mut RegCache, fabric: &mut Fabric, id: RegId) {
        cache.release(fabric, id, dereg).unwrap();
    }

    #[test]
    fn a_released_registration_is_reused() {
        let mut fabric = Fabric::new();
        let mut cache = RegCache::new(4, 1 << 20, true);
        let buf = vec![0u8; 256];
        let (a, key_a) = acquire(&mut cache, &mut fabric, &buf);
        release(&mut cache, &mut fabric, a);
        let (b, key_b) = acquire(&mut cache, &mut fabric, &buf);
        assert_eq!((a, key_a), (b, key_b));
        let stats = cache.stats();
        assert_eq!((stats.hits, stats.misses, stats.evictions), (1, 1, 0));
        assert_eq!((stats.entries, stats.bytes, stats.in_use), (1, 256, 1));
        assert_eq!(fabric.registered, 1);
    }

    #[test]
    fn a_sub_slice_of_a_registration_is_a_hit() {
        let mut fabric = Fabric::new();
        let mut cache = RegCache::new(4, 1 << 20, true);
        let buf = vec![0u8; 1000];
        let (whole, key) = acquire(&mut cache, &mut fabric, &buf);
        let (part, part_key) = acquire(&mut cache, &mut fabric, &buf[100..900]);
        assert_eq!((whole, key), (part, part_key));
        let (tail, _) = acquire(&mut cache, &mut fabric, &buf[999..]);
        assert_eq!(tail, whole);
        assert_eq!(cache.stats().hits, 2);
        // Reaching outside the registration is a miss.
        let buf2 = vec![0u8; 10];
        let (other, _) = acquire(&mut cache, &mut fabric, &buf2);
        assert_ne!(other, whole);
        assert_eq!(cache.stats().misses, 2);
    }

    #[test]
    fn the_entry_limit_evicts_the_least_recently_released() {
        let mut fabric = Fabric::new();
        let mut cache = RegCache::new(2, 1 << 20, true);
        let bufs: Vec<Vec<u8>> = (0..3).map(|_| vec![0u8; 64]).collect();
        let held: Vec<(RegId, LKey)> = bufs
            .iter()
            .map(|b| acquire(&mut cache, &mut fabric, b))
            .collect();
        let ids: Vec<RegId> = held.iter().map(|h| h.0).collect();
        // Three in use with a limit of two: limits are soft.
        assert_eq!(cache.stats().entries, 3);
        assert_eq!(fabric.mrs(), 3);
        // Release order 1, 0, 2: entry 1 is the oldest release.
        release(&mut cache, &mut fabric, ids[1]);
        assert_eq!(cache.stats().evictions, 1);
        assert!(!fabric.live.contains_key(&held[1].1));
        release(&mut cache, &mut fabric, ids[0]);
        release(&mut cache, &mut fabric, ids[2]);
        assert_eq!(cache.stats().entries, 2);
        // 0 and 2 are cached; 1 must be registered again, which evicts 0.
        let (_, _) = acquire(&mut cache, &mut fabric, &bufs[2]);
        let (_, _) = acquire(&mut cache, &mut fabric, &bufs[1]);
        let stats = cache.stats();
        assert_eq!((stats.hits, stats.misses, stats.evictions), (1, 4, 2));
        assert_eq!((stats.entries, stats.in_use), (2, 2));
        assert_eq!(fabric.mrs(), 2);
    }

    #[test]
    fn the_byte_limit_evicts_until_the_new_registration_fits() {
        let mut fabric = Fabric::new();
        let mut cache = RegCache::new(100, 1000, true);
        let bufs: Vec<Vec<u8>> = (0..4).map(|_| vec![0u8; 300]).collect();
        for buf in &bufs[..3] {
            let (id, _) = acquire(&mut cache, &mut fabric, buf);
            release(&mut cache, &mut fabric, id);
        }
        assert_eq!((cache.stats().bytes, cache.stats().evictions), (900, 0));
        let (_, _) = acquire(&mut cache, &mut fabric, &bufs[3]);
        assert_eq!((cache.stats().bytes, cache.stats().evictions), (900, 1));
        // The oldest (bufs[0]) went.
        let (_, _) = acquire(&mut cache, &mut fabric, &bufs[1]);
        assert_eq!(cache.stats().hits, 1);
        let big = vec![0u8; 2000];
        let (id, _) = acquire(&mut cache, &mut fabric, &big);
        // bufs[2] was evicted; bufs[1] and bufs[3] are referenced and stay.
        assert_eq!(cache.stats().entries, 3);
        release(&mut cache, &mut fabric, id);
        // Over the byte limit on its own: gone as soon as it is released.
        assert_eq!(cache.stats().bytes, 600);
        assert_eq!(cache.stats().in_use, 2);
    }

    #[test]
    fn referenced_entries_are_never_evicted() {
        let mut fabric = Fabric::new();
        let mut cache = RegCache::new(1, 10, true);
        let bufs: Vec<Vec<u8>> = (0..5).map(|_| vec![0u8; 64]).collect();
        let ids: Vec<(RegId, LKey)> = bufs
            .iter()
            .map(|b| acquire(&mut cache, &mut fabric, b))
            .collect();
        assert_eq!(cache.stats().evictions, 0);
        assert_eq!(fabric.mrs(), 5);
        for &(_, key) in &ids {
            assert!(fabric.live.contains_key(&key));
        }
        for &(id, _) in &ids {
            release(&mut cache, &mut fabric, id);
        }
        assert_eq!(cache.stats().entries, 0);
        assert_eq!(fabric.mrs(), 0);
    }

    #[test]
    fn a_disabled_cache_deregisters_on_release() {
        let mut fabric = Fabric::new();
        let mut cache = RegCache::new(100, 1 << 20, false);
        let buf = vec![0u8; 128];
        let (a, _) = acquire(&mut cache, &mut fabric, &buf);
        let (b, _) = acquire(&mut cache, &mut fabric, &buf);
        assert_ne!(a, b);
        assert_eq!(fabric.mrs(), 2);
        release(&mut cache, &mut fabric, a);
        assert_eq!(fabric.mrs(), 1);
        release(&mut cache, &mut fabric, b);
        assert_eq!(fabric.mrs(), 0);
        let stats = cache.stats();
        assert_eq!(
            (stats.hits, stats.misses, stats.evictions, stats.entries),
            (0, 2, 0, 0)
        );
    }

    #[test]
    fn a_larger_registration_replaces_those_it_contains() {
        let mut fabric = Fabric::new();
        let mut cache = RegCache::new(100, 1 << 20, true);
        let buf = vec![0u8; 1000];
        let (left, _) = acquire(&mut cache, &mut fabric, &buf[..100]);
        release(&mut cache, &mut fabric, left);
        let (middle, middle_key) = acquire(&mut cache, &mut fabric, &buf[200..300]);
        let (whole, whole_key) = acquire(&mut cache, &mut fabric, &buf);
        // The unreferenced one went at once; the referenced one waits.
        assert_eq!(cache.stats().evictions, 1);
        assert!(fabric.live.contains_key(&middle_key));
        assert_eq!(
            acquire(&mut cache, &mut fabric, &buf[250..260]).1,
            whole_key
        );
        release(&mut cache, &mut fabric, middle);
        assert!(!fabric.live.contains_key(&middle_key));
        assert_eq!(cache.stats().entries, 1);
        release(&mut cache, &mut fabric, whole);
        release(&mut cache, &mut fabric, whole);
        assert_eq!(cache.stats().entries, 1);
        assert_eq!(cache.stats().in_use, 0);
    }

    #[test]
    fn retain_adds_a_reference_to_a_held_registration() {
        let mut fabric = Fabric::new();
        let mut cache = RegCache::new(0, 0, true);
        let buf = vec![0u8; 16];
        let (id, key) = acquire(&mut cache, &mut fabric, &buf);
        assert_eq!(cache.retain(id), Ok(key));
        release(&mut cache, &mut fabric, id);
        assert!(fabric.live.contains_key(&key));
        release(&mut cache, &mut fabric, id);
        // With no room in the cache, the last release deregisters.
        assert!(!fabric.live.contains_key(&key));
        assert_eq!(cache.retain(id), Err(RegCacheError::NotHeld { id }));
    }

    #[test]
    fn releasing_too_often_is_an_error() {
        let mut fabric = Fabric::new();
        let mut cache = RegCache::new(4, 1 << 20, true);
        let buf = vec![0u8; 16];
        let (id, _) = acquire(&mut cache, &mut fabric, &buf);
        release(&mut cache, &mut fabric, id);
        assert_eq!(
            cache.release(&mut fabric, id, dereg),
            Err(RegCacheError::NotHeld { id })
        );
        assert_eq!(cache.stats().entries, 1);
    }

    #[test]
    fn a_failed_registration_changes_nothing() {
        let mut fabric = Fabric::new();
        let mut cache = RegCache::new(4, 1 << 20, true);
        // The fabric refuses an empty region.
        assert!(cache.acquire(&mut fabric, &[], reg, dereg).is_err());
        assert_eq!(
            cache.stats(),
            RegCacheStats {
                misses: 1,
                ..RegCacheStats::default()
            }
        );
    }

    #[test]
    fn drain_deregisters_everything_and_counts_leaks() {
        let mut fabric = Fabric::new();
        let mut cache = RegCache::new(4, 1 << 20, true);
        let bufs: Vec<Vec<u8>> = (0..3).map(|_| vec![0u8; 32]).collect();
        let ids: Vec<RegId> = bufs
            .iter()
            .map(|b| acquire(&mut cache, &mut fabric, b).0)
            .collect();
        release(&mut cache, &mut fabric, ids[0]);
        assert_eq!(cache.drain(&mut fabric, dereg), 2);
        assert_eq!(fabric.mrs(), 0);
        assert_eq!(cache.stats().entries, 0);
        assert_eq!(cache.stats().bytes, 0);
        assert!(cache.release(&mut fabric, ids[1], dereg).is_err());
    }

    impl RegCache {
        /// The index invariant: no indexed entry contains another, every
        /// indexed entry is keyed by its start, and the LRU list holds
        /// exactly the unreferenced indexed entries.
        fn check_index(&self) {
            let indexed: Vec<&Entry> = self
                .by_start
                .values()
                .map(|&h| self.entries.get(h).unwrap())
                .collect();
            for (key, &h) in &self.by_start {
                let entry = self.entries.get(h).unwrap();
                assert!(entry.indexed && entry.start == *key);
            }
            for pair in indexed.windows(2) {
                assert!(
                    pair[0].start < pair[1].start && pair[0].end < pair[1].end,
                    "containment in the index"
                );
            }
            let idle = self
                .entries
                .iter()
                .filter(|(_, e)| e.indexed && e.refs == 0)
                .count();
            assert_eq!(
                self.entries.iter().filter(|(_, e)| e.indexed).count(),
                self.by_start.len()
            );
            assert_eq!(self.lru.len(), idle);
            for &h in self.lru.values() {
                assert_eq!(self.entries.get(h).unwrap().refs, 0);
            }
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Acquire { offset: usize, len: usize },
        Release(usize),
        Retain(usize),
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        prop::collection::vec(
            prop_oneof![
                (0usize..200, 1usize..120).prop_map(|(offset, len)| Op::Acquire { offset, len }),
                any::<usize>().prop_map(Op::Release),
                any::<usize>().prop_map(Op::Retain),
            ],
            1..80,
        )
    }

    proptest! {
        /// Against the fabric: every key handed out covers its region and is
        /// live, memory in use is never deregistered, the counts agree with
        /// the fabric, and once nothing is in use the limits hold.
        #[test]
        fn the_cache_agrees_with_the_fabric(
            ops in ops(),
            max_entries in 0usize..6,
            max_bytes in 0usize..400,
            enabled in any::<bool>(),
        ) {
            let mut fabric = Fabric::new();
            let mut cache = RegCache::new(max_entries, max_bytes, enabled);
            let buf = vec![0u8; 320];
            let base = buf.as_ptr().addr();
            let mut held: Vec<(RegId, LKey, Range<usize>)> = Vec::new();
            for op in ops {
                match op {
                    Op::Acquire { offset, len } => {
                        let region = &buf[offset..offset + len];
                        let (start, end) = (base + offset, base + offset + len);
                        let coverable = cache.entries.iter().any(|(_, e)| e.indexed && e.start <= start && end <= e.end);
                        let hits = cache.stats().hits;
                        let (id, key) = acquire(&mut cache, &mut fabric, region);
                        prop_assert_eq!(cache.stats().hits == hits + 1, coverable, "hit iff an indexed entry covers");
                        let covered = fabric.live.get(&key).cloned();
                        let covers = covered
                            .is_some_and(|r| r.start <= base + offset && base + offset + len <= r.end);
                        prop_assert!(covers, "key {:?} does not cover the region", key);
                        held.push((id, key, offset..offset + len));
                    }
                    Op::Release(pick) if !held.is_empty() => {
                        let (id, _, _) = held.swap_remove(pick % held.len());
                        release(&mut cache, &mut fabric, id);
                    }
                    Op::Retain(pick) if !held.is_empty() => {
                        let (id, key, range) = held[pick % held.len()].clone();
                        prop_assert_eq!(cache.retain(id), Ok(key));
                        held.push((id, key, range));
                    }
                    Op::Release(_) | Op::Retain(_) => {}
                }
                for (_, key, _) in &held {
                    prop_assert!(fabric.live.contains_key(key), "in-use registration was deregistered");
                }
                cache.check_index();
                let stats = cache.stats();
                prop_assert_eq!(stats.entries, fabric.mrs());
                prop_assert_eq!(stats.bytes, fabric.live.values().map(ExactSizeIterator::len).sum::<usize>());
                let distinct: std::collections::HashSet<RegId> = held.iter().map(|h| h.0).collect();
                prop_assert_eq!(stats.in_use, distinct.len());
                if stats.in_use == 0 {
                    prop_assert!(stats.entries <= max_entries && stats.bytes <= max_bytes);
                }
                if !enabled {
                    prop_assert_eq!(stats.entries, distinct.len());
                }
                prop_assert_eq!(stats.misses, fabric.registered as u64);
            }
            let leaked = cache.drain(&mut fabric, dereg);
            let distinct: std::collections::HashSet<RegId> = held.iter().map(|h| h.0).collect();
            prop_assert_eq!(leaked, distinct.len());
            prop_assert_eq!(fabric.mrs(), 0);
            prop_assert_eq!(fabric.registered, fabric.deregistered);
        }
    }
}
