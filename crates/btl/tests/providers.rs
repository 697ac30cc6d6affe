//! The provider-generic BTL suite (`suite/mod.rs`) on every real provider:
//! on `udp` always, and on `verbs` when the build has the `verbs` feature
//! and `UDBTL_TEST_VERBS_DEVICE` names an RDMA device (`dev` or
//! `dev:port`, e.g. `mlx5_0` or `rxe0:1`); otherwise each `verbs` test says
//! it was skipped and passes. On a device:
//!
//! ```text
//! UDBTL_TEST_VERBS_DEVICE=mlx5_0 cargo test -p udbtl-btl --features verbs --test providers
//! ```

#![allow(clippy::unwrap_used)]

mod suite;

/// The suite on UDP sockets (loopback).
mod udp {
    use udbtl_btl::{BtlConfig, Component, udp_config};
    use udbtl_fabric::udp::UdpProvider;

    use crate::suite::{params, provider_suite};

    fn udp() -> Option<impl Fn(BtlConfig) -> Component<UdpProvider>> {
        Some(|config: BtlConfig| {
            let params = params(&config);
            Component::init(UdpProvider::new(udp_config(&params)), params).unwrap()
        })
    }

    provider_suite!(udp());
}

/// The suite on an RDMA device through libibverbs.
#[cfg(feature = "verbs")]
mod verbs {
    use udbtl_btl::params::PortSelector;
    use udbtl_btl::{BtlConfig, Component, verbs_config};
    use udbtl_fabric::ibv::VerbsProvider;

    use crate::suite::{params, provider_suite};

    /// Components on the device (and port) `UDBTL_TEST_VERBS_DEVICE` names,
    /// selected through `if_include` as a job would; `None`, with a skip
    /// line, when it names none.
    fn verbs() -> Option<impl Fn(BtlConfig) -> Component<VerbsProvider>> {
        let device = match std::env::var("UDBTL_TEST_VERBS_DEVICE") {
            Ok(name) if !name.trim().is_empty() => name.trim().to_owned(),
            _ => {
                println!(
                    "skipped: UDBTL_TEST_VERBS_DEVICE not set (no RDMA device); \
                     set it to a device such as mlx5_0 or mlx5_0:1 to run this test on verbs"
                );
                return None;
            }
        };
        let include = PortSelector::parse_list(&device)
            .unwrap_or_else(|err| panic!("UDBTL_TEST_VERBS_DEVICE={device}: {err}"));
        Some(move |config: BtlConfig| {
            let params = params(&BtlConfig {
                if_include: Some(include.clone()),
                ..config
            });
            Component::init(VerbsProvider::new(verbs_config(&params)), params)
                .unwrap_or_else(|err| panic!("verbs component on {device}: {err}"))
        })
    }

    provider_suite!(verbs());
}

/// Without the `verbs` feature the `verbs` variants are not built: say so,
/// and refuse a run that names a device but could not use it.
#[cfg(not(feature = "verbs"))]
#[test]
fn verbs_variants_need_the_verbs_feature() {
    let device = std::env::var("UDBTL_TEST_VERBS_DEVICE").unwrap_or_default();
    assert!(
        device.trim().is_empty(),
        "UDBTL_TEST_VERBS_DEVICE={device} is set but this build lacks the `verbs` feature: \
         run with `--features verbs`"
    );
    println!(
        "skipped: the verbs variants of this suite need `--features verbs` and \
         UDBTL_TEST_VERBS_DEVICE=<device>[:port]"
    );
}
