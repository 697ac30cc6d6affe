//! What the benches share: a component on UDP loopback that counts what it
//! receives.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use udbtl_btl::{BtlConfig, Component, Params, RecvEvent, Tag, udp_config};
use udbtl_fabric::udp::{UdpConfig, UdpProvider};

/// A component on UDP loopback with the parameters `env` sets (as
/// `UDBTL_*` variables would), counting the messages it received on
/// [`Tag::PML`].
pub(crate) fn component(
    env: impl Fn(&str) -> Option<String>,
) -> (Component<UdpProvider>, Arc<AtomicU64>) {
    component_on(env, |_| {})
}

/// [`component`], with the `udp` provider's configuration changed by
/// `adjust` after the parameters made it.
pub(crate) fn component_on(
    env: impl Fn(&str) -> Option<String>,
    adjust: impl FnOnce(&mut UdpConfig),
) -> (Component<UdpProvider>, Arc<AtomicU64>) {
    let params = Params::load_from(&BtlConfig::default(), env).expect("params");
    let mut config = udp_config(&params);
    adjust(&mut config);
    let mut btl = Component::init(UdpProvider::new(config), params).expect("init");
    let arrived = Arc::new(AtomicU64::new(0));
    let counter = arrived.clone();
    btl.modules_mut()[0].register(
        Tag::PML,
        Box::new(move |ev: &RecvEvent<'_>| {
            black_box(ev.payload);
            counter.fetch_add(1, Ordering::Relaxed);
        }),
    );
    (btl, arrived)
}
