//! Tests of the registration cache against a simulated fabric: hits,
//! eviction, containment, and a property test of the index invariant.

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
