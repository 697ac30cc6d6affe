//! The provider-generic BTL suite (`suite/`) on every real provider:
//! on `udp` always (plain, authenticated and encrypted), and on `verbs` when the build has the `verbs` feature
//! and `UDBTL_TEST_VERBS_DEVICE` names an RDMA device (`dev` or
//! `dev:port`, e.g. `mlx5_0` or `rxe0:1`) when the tests are built;
//! otherwise each `verbs` test is ignored, `SKIPPED: needs an RDMA device
//! ...`. On a device:
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

/// The suite's reliable tests on UDP sockets with sealed datagrams (the
/// unreliable contract does not seal): zero-copy sends, whose payload goes
/// on in the caller's memory, are authenticated from a copy and encrypted
/// out of place.
mod udp_sealed {
    use udbtl_btl::{BtlConfig, Component, udp_config};
    use udbtl_fabric::udp::UdpProvider;

    use crate::suite;

    fn sealed(auth: &'static str) -> impl Fn(BtlConfig) -> Component<UdpProvider> {
        move |config: BtlConfig| {
            let params = suite::params(&BtlConfig {
                auth: Some(auth.into()),
                ..config
            });
            Component::init(UdpProvider::new(udp_config(&params)), params).unwrap()
        }
    }

    #[test]
    fn tagged_sends_arrive_once_in_order() {
        for auth in ["on", "encrypt"] {
            suite::tagged_sends_arrive_once_in_order(&sealed(auth));
        }
    }

    #[test]
    fn zero_copy_sends_through_the_registration_cache() {
        for auth in ["on", "encrypt"] {
            suite::zero_copy_sends_through_the_registration_cache(&sealed(auth));
        }
    }

    #[test]
    fn remote_reads_copy_a_peers_region() {
        for auth in ["on", "encrypt"] {
            suite::remote_reads_copy_a_peers_region(&sealed(auth));
        }
    }
}

/// The suite on an RDMA device through libibverbs.
#[cfg(feature = "verbs")]
mod verbs {
    use udbtl_btl::params::PortSelector;
    use udbtl_btl::{BtlConfig, Component, verbs_config};
    use udbtl_fabric::ibv::VerbsProvider;

    use crate::suite::{params, provider_suite};

    /// Components on the device (and port) `UDBTL_TEST_VERBS_DEVICE` names,
    /// selected through `if_include` as a job would; `None`, the test said
    /// skipped and recorded (see udbtl-prereq), when it names none at run
    /// time though it did at build time.
    fn verbs() -> Option<impl Fn(BtlConfig) -> Component<VerbsProvider>> {
        let device = match std::env::var("UDBTL_TEST_VERBS_DEVICE") {
            Ok(name) if !name.trim().is_empty() => name.trim().to_owned(),
            _ => {
                udbtl_prereq::skipped!(
                    "UDBTL_TEST_VERBS_DEVICE is not set (no RDMA device); set it to a device \
                     such as mlx5_0 or mlx5_0:1 to run this test on verbs"
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

    provider_suite!(
        verbs(),
        #[cfg_attr(
            udbtl_missing = "verbs_device",
            ignore = "SKIPPED: needs an RDMA device (build and run with \
                      UDBTL_TEST_VERBS_DEVICE=<device>[:port])"
        )]
    );
}

/// Without the `verbs` feature the `verbs` variants cannot be built: they
/// are listed, ignored, so that the summary counts them.
#[cfg(not(feature = "verbs"))]
mod verbs {
    use crate::suite::provider_suite;

    provider_suite!(
        @absent
        "SKIPPED: needs an RDMA device (UDBTL_TEST_VERBS_DEVICE=<device>[:port]) and --features verbs"
    );
}

/// Without the `verbs` feature, a run that names a device could not use
/// it: refuse it rather than leave the device untested unnoticed.
#[cfg(not(feature = "verbs"))]
#[test]
fn verbs_variants_need_the_verbs_feature() {
    let device = std::env::var("UDBTL_TEST_VERBS_DEVICE").unwrap_or_default();
    assert!(
        device.trim().is_empty(),
        "UDBTL_TEST_VERBS_DEVICE={device} is set but this build lacks the `verbs` feature: \
         run with `--features verbs`"
    );
}
