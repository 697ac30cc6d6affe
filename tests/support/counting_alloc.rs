//! A byte-counting global allocator for tests that measure memory: it
//! tracks the live heap bytes of the calling thread while it runs a closure
//! ([`live_bytes_of`]): allocations minus frees, capacity included (an
//! over-grown vector counts). Including this file installs it as the test
//! binary's global allocator.

#![allow(unsafe_code, dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicI64, Ordering};

/// `System`, counting the live bytes of armed threads.
struct Counting;

/// Live bytes allocated by armed threads (negative if they freed more
/// than they allocated while armed).
static LIVE: AtomicI64 = AtomicI64::new(0);

thread_local! {
    /// Whether this thread's allocations are counted. Const-initialized:
    /// reading it allocates nothing.
    static ARMED: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with this thread's allocations counted; returns what it
/// returned and the heap bytes it left allocated (negative if it freed
/// more than it allocated). Not reentrant, and one thread at a time.
pub(crate) fn live_bytes_of<T>(f: impl FnOnce() -> T) -> (T, i64) {
    LIVE.store(0, Ordering::Relaxed);
    ARMED.with(|a| a.set(true));
    let out = f();
    ARMED.with(|a| a.set(false));
    (out, LIVE.load(Ordering::Relaxed))
}

/// `bytes` as a signed count.
pub(crate) fn size(bytes: usize) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

fn count(bytes: i64) {
    if ARMED.try_with(Cell::get).unwrap_or(false) {
        LIVE.fetch_add(bytes, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees hold; counting touches only an atomic
// and a const-initialized thread-local, and never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(size(layout.size()));
        // SAFETY: the caller's contract for `alloc` is `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(size(layout.size()));
        // SAFETY: the caller's contract for `alloc_zeroed` is `System`'s.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(size(new_size) - size(layout.size()));
        // SAFETY: `ptr` came from `System` with `layout`; the rest is the
        // caller's contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-size(layout.size()));
        // SAFETY: `ptr` came from `System` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;
