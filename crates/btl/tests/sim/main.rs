//! The BTL's contract on the deterministic `sim` fabric: initialisation and
//! port selection, addressing, every fragment operation, the pending queue,
//! zero-copy sends through the registration cache, progress and teardown.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use udbtl_btl::params::{PortSelector, Source};
use udbtl_btl::*;
use udbtl_fabric::sim::{SimContext, SimDeviceSpec, SimNetwork, SimProvider};
use udbtl_fabric::{Context, PortState};

type Btl = Component<SimProvider>;

fn params(config: BtlConfig) -> Params {
    Params::load_from(&config, |_| None).unwrap()
}

/// The seed's contract: unreliable, small pools. The reliable path has its
/// own tests (`reliable.rs`).
fn small() -> BtlConfig {
    BtlConfig {
        rd_num: Some(64),
        sd_num: Some(16),
        reliable: Some(false),
        ..BtlConfig::default()
    }
}

/// One host with one single-port device.
fn host(
    net: &SimNetwork,
    name: &str,
    spec: impl FnOnce(SimDeviceSpec) -> SimDeviceSpec,
) -> SimProvider {
    let provider = net.provider();
    provider
        .add_device(spec(SimDeviceSpec::new(name, 1)))
        .unwrap();
    provider
}

/// Two components that know each other; returns them with the endpoint each
/// has for the other.
fn pair(net: &SimNetwork, config: BtlConfig) -> (Btl, Btl, EndpointId, EndpointId) {
    let mut a = Component::init(host(net, "simA", |s| s), params(config.clone())).unwrap();
    let mut b = Component::init(host(net, "simB", |s| s), params(config)).unwrap();
    let (ma, mb) = (a.modex(), b.modex());
    let ab = a.add_procs(&[Some(&mb)]).unwrap()[0].endpoints[0].unwrap();
    let ba = b.add_procs(&[Some(&ma)]).unwrap()[0].endpoints[0].unwrap();
    (a, b, ab, ba)
}

/// Receives on `tag` into a shared list.
type Received = Arc<Mutex<Vec<(Option<EndpointId>, Vec<u8>)>>>;

fn collect(btl: &mut Btl, tag: Tag) -> Received {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    btl.modules_mut()[0].register(
        tag,
        Box::new(move |ev: &RecvEvent<'_>| {
            sink.lock()
                .unwrap()
                .push((ev.endpoint, ev.payload.to_vec()))
        }),
    );
    seen
}

fn sends(btl: &mut Btl) -> Arc<Mutex<Vec<SendEvent>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    btl.modules_mut()[0].set_send_callback(Box::new(move |ev: &SendEvent| {
        sink.lock().unwrap().push(ev.clone())
    }));
    seen
}

fn send_bytes(
    btl: &mut Btl,
    ep: EndpointId,
    tag: Tag,
    bytes: &[u8],
    flags: DesFlags,
) -> Result<SendStatus, BtlError> {
    let module = &mut btl.modules_mut()[0];
    let des = module
        .alloc(NO_ORDER, bytes.len(), flags)
        .expect("a free send fragment");
    module.segment_mut(des).unwrap().copy_from_slice(bytes);
    module.send(ep, des, tag)
}

fn drive(a: &mut Btl, b: &mut Btl, rounds: usize) {
    for _ in 0..rounds {
        a.progress();
        b.progress();
    }
}

fn finalize_clean(btl: Btl) {
    for ctx in btl.finalize().unwrap() {
        assert!(ctx.resources().is_empty(), "leaked {:?}", ctx.resources());
    }
}

mod fragments;
mod peers;
mod setup;
