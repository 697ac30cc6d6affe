//! Initialisation, port selection, parameters and limits.

use super::*;

#[test]
fn one_module_per_active_port_up_to_max_btls() {
    let net = SimNetwork::new(1);
    let provider = net.provider();
    let a = provider.add_device(SimDeviceSpec::new("mlx0", 2)).unwrap();
    provider.add_device(SimDeviceSpec::new("mlx1", 2)).unwrap();
    net.set_port_state(a[1], PortState::Down).unwrap();
    let btl = Component::init(provider.clone(), params(small())).unwrap();
    let ports: Vec<(String, u8)> = btl
        .modules()
        .iter()
        .map(|m| (m.device().to_owned(), m.port().port_num))
        .collect();
    assert_eq!(
        ports,
        [("mlx0".into(), 1), ("mlx1".into(), 1), ("mlx1".into(), 2)]
    );
    finalize_clean(btl);

    let capped = Component::init(
        provider.clone(),
        params(BtlConfig {
            max_btls: Some(2),
            ..small()
        }),
    )
    .unwrap();
    assert_eq!(capped.modules().len(), 2);
    finalize_clean(capped);
}

#[test]
fn include_and_exclude_select_ports() {
    let net = SimNetwork::new(1);
    let provider = net.provider();
    provider.add_device(SimDeviceSpec::new("mlx0", 2)).unwrap();
    provider.add_device(SimDeviceSpec::new("mlx1", 1)).unwrap();
    let only = |include: &str| BtlConfig {
        if_include: Some(PortSelector::parse_list(include).unwrap()),
        ..small()
    };
    let btl = Component::init(provider.clone(), params(only("mlx0:2"))).unwrap();
    assert_eq!(btl.modules().len(), 1);
    assert_eq!(
        (btl.modules()[0].device(), btl.modules()[0].port().port_num),
        ("mlx0", 2)
    );
    finalize_clean(btl);

    let exclude = BtlConfig {
        if_exclude: Some(PortSelector::parse_list("mlx0").unwrap()),
        ..small()
    };
    let btl = Component::init(provider.clone(), params(exclude)).unwrap();
    assert_eq!(
        btl.modules().iter().map(Module::device).collect::<Vec<_>>(),
        ["mlx1"]
    );
    finalize_clean(btl);

    let both = BtlConfig {
        if_include: Some(PortSelector::parse_list("mlx0").unwrap()),
        if_exclude: Some(PortSelector::parse_list("mlx1").unwrap()),
        ..small()
    };
    let err = Params::load_from(&both, |_| None).unwrap_err().to_string();
    assert!(
        err.contains("if_include") && err.contains("if_exclude"),
        "{err}"
    );

    let none = Component::init(provider, params(only("nosuch")));
    assert!(matches!(none, Err(BtlError::NoPorts { .. })));
}

#[test]
fn parameters_come_from_defaults_config_and_environment() {
    let p = params(BtlConfig::default());
    assert_eq!(
        (
            p.max_btls,
            p.sd_num,
            p.rd_num,
            p.ib_qkey,
            p.exclusivity,
            p.bandwidth
        ),
        (4, 128, 6000, 0, 1024, 800)
    );
    assert_eq!(p.mpool, "rdma");
    assert_eq!(p.source("sd_num"), Some(Source::Default));
    let env = |name: &str| (name == "UDBTL_SD_NUM").then(|| "64".to_string());
    let p = Params::load_from(
        &BtlConfig {
            sd_num: Some(32),
            rd_num: Some(100),
            ..BtlConfig::default()
        },
        env,
    )
    .unwrap();
    assert_eq!(
        (p.sd_num, p.source("sd_num")),
        (64, Some(Source::Environment))
    );
    assert_eq!((p.rd_num, p.source("rd_num")), (100, Some(Source::Config)));
    let bad = Params::load_from(&BtlConfig::default(), |n| {
        (n == "UDBTL_RD_NUM").then(|| "lots".into())
    })
    .unwrap_err();
    assert!(bad.to_string().contains("rd_num"), "{bad}");
}

#[test]
fn a_failed_module_init_unwinds_everything_it_built() {
    let net = SimNetwork::new(17);
    let provider = host(&net, "a", |s| s);
    // The partition key table has one entry: moving the first queue pair to
    // INIT fails after the PD, CQ and that queue pair exist.
    let bad = params(BtlConfig {
        ib_pkey_index: Some(5),
        ..small()
    });
    let ctx = udbtl_fabric::Provider::open(&provider, "a").unwrap();
    let (ctx, err) = Module::new(ctx, 1, &bad).unwrap_err();
    assert!(err.to_string().contains("INIT"), "{err}");
    assert!(ctx.resources().is_empty(), "leaked {:?}", ctx.resources());
    // The component skips the port, and says why when nothing is left.
    let err = Component::init(provider, bad).unwrap_err().to_string();
    assert!(
        err.contains("no active port") && err.contains("INIT"),
        "{err}"
    );
}

#[test]
fn limits_follow_the_port_mtu_unless_set() {
    let net = SimNetwork::new(1);
    let btl = Component::init(
        host(&net, "big", |s| s.with_max_msg_size(9000)),
        params(small()),
    )
    .unwrap();
    let limits = btl.modules()[0].limits();
    assert_eq!(limits.eager_limit, 9000 - 8);
    assert_eq!(limits.max_send_size, 9000 - 8);
    assert_eq!(limits.rndv_eager_limit, 9000 - 8);
    assert_eq!(limits.inline_max, 200);
    finalize_clean(btl);

    let seed = BtlConfig {
        max_send_size: Some(2048),
        min_send_size: Some(1024),
        ..small()
    };
    let btl = Component::init(
        host(&net, "ib", |s| s.with_max_msg_size(4096)),
        params(seed),
    )
    .unwrap();
    let limits = btl.modules()[0].limits();
    assert_eq!(
        (
            limits.eager_limit,
            limits.max_send_size,
            limits.rndv_eager_limit
        ),
        (2040, 2040, 1024)
    );
    finalize_clean(btl);
}
