//! The BTL test suite over real providers: every test body, in
//! [`in_process`] and [`across_processes`], is generic over the fabric
//! [`Provider`] and takes a function that builds a [`Component`] from a
//! [`BtlConfig`], so the same bodies run on `udp` (always) and on `verbs`
//! (when a device is named), from `providers.rs`.
//!
//! Real fabrics run on wall-clock time and may lose a datagram, so the tests
//! progress until what they wait for has happened, under a generous limit
//! that only bounds a hang: they assert behaviour, never timing.
//!
//! [`provider_suite!`] writes one `#[test]` per body for a provider.

// Each test crate uses part of this module.
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use udbtl_btl::*;
use udbtl_fabric::{Context, Provider};

/// Builds a component of one provider from a configuration.
pub(crate) type Make<'a, P> = &'a dyn Fn(BtlConfig) -> Component<P>;

pub(crate) const PING: Tag = Tag(Tag::PML.0 + 1);
pub(crate) const PONG: Tag = Tag(Tag::PML.0 + 2);
pub(crate) const BULK: Tag = Tag(Tag::PML.0 + 3);

/// Bounds every wait for something that should happen at once on an idle
/// fabric; only a hang or a lost peer reaches it.
const PATIENCE: Duration = Duration::from_secs(60);

/// The seed's unreliable contract, one send credit: the two-process test
/// and the pending-queue tests.
pub(crate) fn unreliable() -> BtlConfig {
    BtlConfig {
        reliable: Some(false),
        rd_num: Some(256),
        sd_num: Some(1),
        job_key: Some(0x5eed),
        ..BtlConfig::default()
    }
}

/// The default, reliable contract.
pub(crate) fn reliable() -> BtlConfig {
    BtlConfig {
        reliable: Some(true),
        job_key: Some(0x5eed),
        ..BtlConfig::default()
    }
}

/// Parameters from `config` alone: the environment is not read, so a
/// developer's `UDBTL_*` settings cannot change what the suite tests.
pub(crate) fn params(config: &BtlConfig) -> Params {
    Params::load_from(config, |_| None).unwrap()
}

/// What a component received, in order: sender's endpoint, tag, payload.
pub(crate) type Inbox = Arc<Mutex<Vec<(Option<EndpointId>, Tag, Vec<u8>)>>>;

pub(crate) fn inbox<P: Provider>(btl: &mut Component<P>, tags: &[Tag]) -> Inbox {
    let inbox: Inbox = Arc::default();
    for tag in tags {
        let sink = inbox.clone();
        btl.modules_mut()[0].register(
            *tag,
            Box::new(move |ev: &RecvEvent<'_>| {
                sink.lock()
                    .unwrap()
                    .push((ev.endpoint, ev.tag, ev.payload.to_vec()))
            }),
        );
    }
    inbox
}

/// Every send completion, in the order reported.
pub(crate) type Completions = Arc<Mutex<Vec<SendEvent>>>;

pub(crate) fn completions<P: Provider>(btl: &mut Component<P>) -> Completions {
    let seen: Completions = Arc::default();
    let sink = seen.clone();
    btl.modules_mut()[0].set_send_callback(Box::new(move |ev: &SendEvent| {
        sink.lock().unwrap().push(ev.clone())
    }));
    seen
}

/// Copies `bytes` into a send fragment (the BTL frees it after its
/// completion) marked with `context`, and sends it. While no fragment is
/// free (back-pressure), progresses until acknowledgements free one.
pub(crate) fn send_with<P: Provider>(
    btl: &mut Component<P>,
    ep: EndpointId,
    tag: Tag,
    bytes: &[u8],
    context: u64,
) -> SendStatus {
    let mut des = None;
    let freed = progress_until(btl, |btl| {
        des = btl.modules_mut()[0].alloc(NO_ORDER, bytes.len(), DesFlags::BTL_OWNERSHIP);
        des.is_some()
    });
    assert!(freed, "no send fragment became free");
    let des = des.unwrap();
    let module = &mut btl.modules_mut()[0];
    module.segment_mut(des).unwrap().copy_from_slice(bytes);
    module.set_context(des, context).unwrap();
    module.send(ep, des, tag).unwrap()
}

pub(crate) fn send<P: Provider>(btl: &mut Component<P>, ep: EndpointId, tag: Tag, bytes: &[u8]) {
    send_with(btl, ep, tag, bytes, 0);
}

/// Progresses `btl` until `done` holds; `false` if [`PATIENCE`] ran out.
pub(crate) fn progress_until<P: Provider>(
    btl: &mut Component<P>,
    mut done: impl FnMut(&mut Component<P>) -> bool,
) -> bool {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if done(btl) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        btl.progress();
    }
}

/// Finalizes `btl` and checks that every fabric resource was released.
pub(crate) fn finalize_clean<P: Provider>(btl: Component<P>) {
    for ctx in btl.finalize().unwrap() {
        assert!(ctx.resources().is_empty(), "leaked {:?}", ctx.resources());
    }
}

/// Two components that know each other through their modex blobs; returns
/// them with the endpoint each has for the other.
pub(crate) fn pair<P: Provider>(
    make: Make<'_, P>,
    config: BtlConfig,
) -> (Component<P>, Component<P>, EndpointId, EndpointId) {
    let mut a = make(config.clone());
    let mut b = make(config);
    let (ma, mb) = (a.modex(), b.modex());
    let ab = a.add_procs(&[Some(&mb)]).unwrap()[0].endpoints[0].unwrap();
    let ba = b.add_procs(&[Some(&ma)]).unwrap()[0].endpoints[0].unwrap();
    (a, b, ab, ba)
}

/// A component progressed by a thread of its own, as a peer process would
/// be, recording what arrives on some tags until stopped.
pub(crate) struct Peer<P: Provider> {
    thread: JoinHandle<Component<P>>,
    stop: Arc<AtomicBool>,
    pub(crate) inbox: Inbox,
}

impl<P: Provider> Peer<P>
where
    Component<P>: Send + 'static,
{
    pub(crate) fn spawn(mut btl: Component<P>, tags: &[Tag]) -> Self {
        let inbox = inbox(&mut btl, tags);
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                btl.progress();
            }
            btl
        });
        Self {
            thread,
            stop,
            inbox,
        }
    }

    /// Messages received so far.
    pub(crate) fn received(&self) -> usize {
        self.inbox.lock().unwrap().len()
    }

    /// Stops the thread and returns the component.
    pub(crate) fn join(self) -> Component<P> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("peer thread")
    }
}

/// Message `index`, `len` bytes: every byte depends on both, so a
/// misplaced, truncated or mixed-up message cannot pass for another.
pub(crate) fn payload(index: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i * 31 + index * 7 + i / 251) as u8)
        .collect()
}

// ----- the tests ---------------------------------------------------------

mod across_processes;
mod in_process;
mod reads;

// The bodies, where `provider_suite!` finds them; a test crate that writes
// no suite uses none.
#[allow(unused_imports)]
pub(crate) use across_processes::{two_processes, two_processes_child};
#[allow(unused_imports)]
pub(crate) use in_process::{
    del_procs_fails_pending_sends, finalize_reports_leaked_descriptors, modex_and_add_procs,
    tagged_sends_arrive_once_in_order, zero_copy_sends_through_the_registration_cache,
};
#[allow(unused_imports)]
pub(crate) use reads::{reads_of_a_deleted_peer_fail, remote_reads_copy_a_peers_region};

/// Writes the suite's `#[test]`s for one provider into the calling module.
///
/// * `provider_suite!(make $(, #[attr])*)`: `make` is an expression giving
///   `Option<impl Fn(BtlConfig) -> Component<P>>`; `None` skips every test
///   at run time (it has said why, see udbtl-prereq's `skipped!`). Each
///   attribute goes on every test, e.g. a `cfg_attr(..., ignore = ...)`
///   for a provider that needs a device.
/// * `provider_suite!(@absent "SKIPPED: <reason>")`: the same tests,
///   ignored with that reason, for a provider this build lacks, so that the
///   summary counts them.
// Not every test crate that uses this module writes a suite.
#[allow(unused_macros)]
macro_rules! provider_suite {
    (@absent $reason:literal) => {
        $crate::suite::provider_suite!(@absent $reason, modex_and_add_procs
            tagged_sends_arrive_once_in_order zero_copy_sends_through_the_registration_cache
            del_procs_fails_pending_sends finalize_reports_leaked_descriptors two_processes
            remote_reads_copy_a_peers_region reads_of_a_deleted_peer_fail);
    };
    (@absent $reason:literal, $($test:ident)*) => {
        $(#[test] #[ignore = $reason] fn $test() {})*
    };
    ($make:expr $(, #[$attr:meta])* $(,)?) => {
        #[test]
        $(#[$attr])*
        fn modex_and_add_procs() {
            if let Some(make) = $make {
                $crate::suite::modex_and_add_procs(&make);
            }
        }

        #[test]
        $(#[$attr])*
        fn tagged_sends_arrive_once_in_order() {
            if let Some(make) = $make {
                $crate::suite::tagged_sends_arrive_once_in_order(&make);
            }
        }

        #[test]
        $(#[$attr])*
        fn zero_copy_sends_through_the_registration_cache() {
            if let Some(make) = $make {
                $crate::suite::zero_copy_sends_through_the_registration_cache(&make);
            }
        }

        #[test]
        $(#[$attr])*
        fn remote_reads_copy_a_peers_region() {
            if let Some(make) = $make {
                $crate::suite::remote_reads_copy_a_peers_region(&make);
            }
        }

        #[test]
        $(#[$attr])*
        fn reads_of_a_deleted_peer_fail() {
            if let Some(make) = $make {
                $crate::suite::reads_of_a_deleted_peer_fail(&make);
            }
        }

        #[test]
        $(#[$attr])*
        fn del_procs_fails_pending_sends() {
            if let Some(make) = $make {
                $crate::suite::del_procs_fails_pending_sends(&make);
            }
        }

        #[test]
        $(#[$attr])*
        fn finalize_reports_leaked_descriptors() {
            if let Some(make) = $make {
                $crate::suite::finalize_reports_leaked_descriptors(&make);
            }
        }

        #[test]
        $(#[$attr])*
        fn two_processes() {
            if let Some(make) = $make {
                // The child's test name, without the crate's own.
                let path = module_path!();
                let module = path.split_once("::").map_or(path, |(_, rest)| rest);
                $crate::suite::two_processes(&make, &format!("{module}::two_processes_child"));
            }
        }

        #[test]
        #[ignore = "child process of two_processes"]
        fn two_processes_child() {
            if let Some(make) = $make {
                $crate::suite::two_processes_child(&make);
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use provider_suite;
