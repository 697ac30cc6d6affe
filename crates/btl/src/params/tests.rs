//! Tests of parameter loading, parsing, bounds, conflicts and port selectors.

use std::collections::HashMap;

use super::*;

fn load_env(pairs: &[(&str, &str)]) -> Result<Params, ParamError> {
    load_with(&BtlConfig::default(), pairs)
}

fn load_with(config: &BtlConfig, pairs: &[(&str, &str)]) -> Result<Params, ParamError> {
    let env: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    Params::load_from(config, |key| env.get(key).cloned())
}

#[test]
fn defaults_are_the_seeds() {
    let p = load_env(&[]).unwrap();
    assert_eq!(p, Params::default());
    assert_eq!(p.max_btls, 4);
    assert_eq!(p.sd_num, 128);
    assert_eq!(p.rd_num, 6000);
    assert_eq!(p.min_send_size, None);
    assert_eq!(p.max_send_size, None);
    assert_eq!(p.ib_pkey_index, 0);
    assert_eq!(p.ib_qkey, 0);
    assert_eq!(p.ib_service_level, 0);
    assert_eq!(p.ib_src_path_bits, 0);
    assert_eq!(p.mpool, "rdma");
    assert!(p.rcache_enabled());
    assert_eq!(p.exclusivity, 1024);
    assert_eq!(p.bandwidth, 800);
    assert_eq!(p.if_include, None);
    assert_eq!(p.if_exclude, None);
    assert_eq!(p.provider, "udp");
    assert_eq!(p.rcache_max_entries, 256);
    assert_eq!(p.rcache_max_bytes, 1 << 30);
    assert_eq!(p.send_frags_max, 8192);
    assert_eq!(p.send_mem, 64 << 20);
    assert_eq!(p.user_frags_max, 8192);
    assert_eq!(p.job_key, 0);
    assert!(!p.udp_ipv6);
    assert_eq!(p.udp_mtu, None);
    assert!(p.describe().iter().all(|i| i.source == Source::Default));
}

#[test]
fn defaults_satisfy_their_own_bounds() {
    // Catches a default outside its bounds, or a kind that does not fit
    // its field's type.
    let p = Params::load_from(&defaults_as_config(), |_| None).unwrap();
    let expected = Params {
        sources: p.sources,
        ..Params::default()
    };
    assert_eq!(p, expected);
    for info in p.describe() {
        let optional = info.default == "unset";
        let want = if optional {
            Source::Default
        } else {
            Source::Config
        };
        assert_eq!(info.source, want, "{}", info.name);
    }
}

#[test]
fn describe_renders_values_that_parse_back() {
    let p = Params::default();
    let infos = p.describe();
    assert_eq!(infos.len(), 42);
    let pairs: Vec<(String, String)> = infos
        .iter()
        .filter(|i| i.value != "unset")
        .map(|i| (i.env_var.clone(), i.value.clone()))
        .collect();
    let env: HashMap<_, _> = pairs.into_iter().collect();
    let reloaded = Params::load_from(&BtlConfig::default(), |k| env.get(k).cloned()).unwrap();
    let expected = Params {
        sources: reloaded.sources,
        ..p.clone()
    };
    assert_eq!(reloaded, expected);
    let qkey = infos.iter().find(|i| i.name == "ib_qkey").unwrap();
    assert_eq!(qkey.value, "0x00000000");
    assert_eq!(qkey.env_var, "UDBTL_IB_QKEY");
    assert!(qkey.from_seed);
    let bytes = infos.iter().find(|i| i.name == "rcache_max_bytes").unwrap();
    assert_eq!(bytes.default, "1G");
    assert!(!bytes.from_seed);
    assert_eq!(
        infos.iter().find(|i| i.name == "max_btls").unwrap().syntax,
        "integer 1..=64"
    );
}

#[test]
fn environment_overrides_config_overrides_default() {
    let config = BtlConfig {
        sd_num: Some(64),
        rd_num: Some(100),
        ..BtlConfig::default()
    };
    let p = load_with(&config, &[("UDBTL_SD_NUM", "256")]).unwrap();
    assert_eq!(
        (p.sd_num, p.source("sd_num")),
        (256, Some(Source::Environment))
    );
    assert_eq!((p.rd_num, p.source("rd_num")), (100, Some(Source::Config)));
    assert_eq!(
        (p.max_btls, p.source("max_btls")),
        (4, Some(Source::Default))
    );
    assert_eq!(p.source("no_such_parameter"), None);
}

#[test]
fn integers_take_decimal_hex_and_size_suffixes() {
    let p = load_env(&[
        ("UDBTL_IB_QKEY", "0x11223344"),
        ("UDBTL_JOB_KEY", "12345"),
        ("UDBTL_MAX_SEND_SIZE", "4k"),
        ("UDBTL_MIN_SEND_SIZE", " 0x400 "),
        ("UDBTL_RCACHE_MAX_BYTES", "2G"),
        ("UDBTL_UDP_MTU", "9000"),
    ])
    .unwrap();
    assert_eq!(p.ib_qkey, 0x1122_3344);
    assert_eq!(p.job_key, 12345);
    assert_eq!(p.max_send_size, Some(4096));
    assert_eq!(p.min_send_size, Some(1024));
    assert_eq!(p.rcache_max_bytes, 2 << 30);
    assert_eq!(p.udp_mtu, Some(9000));
    assert_eq!(
        load_env(&[("UDBTL_MAX_SEND_SIZE", "1M")])
            .unwrap()
            .max_send_size,
        Some(MIB as usize)
    );
}

#[test]
fn suffixes_are_only_for_sizes() {
    let err = load_env(&[("UDBTL_SD_NUM", "1k")]).unwrap_err();
    assert!(
        matches!(err, ParamError::Invalid { name: "sd_num", .. }),
        "{err}"
    );
}

#[test]
fn bad_integers_name_the_parameter_and_variable() {
    for bad in [
        "abc",
        "-1",
        "+5",
        "0x",
        "12x",
        "1.5",
        "99999999999999999999999",
    ] {
        let err = load_env(&[("UDBTL_SD_NUM", bad)]).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("sd_num") && msg.contains("UDBTL_SD_NUM"),
            "{msg}"
        );
        assert!(matches!(
            err,
            ParamError::Invalid {
                from: Source::Environment,
                ..
            }
        ));
    }
}

#[test]
fn bounds_are_enforced_from_env_and_config() {
    for (var, value) in [
        ("UDBTL_MAX_BTLS", "0"),
        ("UDBTL_MAX_BTLS", "65"),
        ("UDBTL_SD_NUM", "65537"),
        ("UDBTL_IB_SERVICE_LEVEL", "16"),
        ("UDBTL_IB_SRC_PATH_BITS", "128"),
        ("UDBTL_IB_PKEY_INDEX", "65536"),
        ("UDBTL_MAX_SEND_SIZE", "63"),
        ("UDBTL_MAX_SEND_SIZE", "17M"),
        ("UDBTL_RCACHE_MAX_ENTRIES", "0"),
        ("UDBTL_UDP_MTU", "65528"),
        ("UDBTL_IB_QKEY", "0x100000000"),
        ("UDBTL_IB_QKEY", "0x80000000"),
    ] {
        let err = load_env(&[(var, value)]).unwrap_err();
        assert!(err.to_string().contains(var), "{var}={value}: {err}");
    }
    let config = BtlConfig {
        ib_service_level: Some(16),
        ..BtlConfig::default()
    };
    let err = load_with(&config, &[]).unwrap_err();
    assert_eq!(
        err,
        ParamError::Invalid {
            name: "ib_service_level",
            value: "16".to_owned(),
            from: Source::Config,
            reason: "16 is outside 0..=15".to_owned(),
        }
    );
    assert!(
        err.to_string()
            .contains("parameter ib_service_level (from the config)")
    );
}

#[test]
fn an_empty_environment_value_is_an_error() {
    for var in ["UDBTL_SD_NUM", "UDBTL_IF_INCLUDE", "UDBTL_UDP_IPV6"] {
        let err = load_env(&[(var, "  ")]).unwrap_err();
        assert!(err.to_string().contains("empty value"), "{err}");
    }
}

#[test]
fn the_environment_may_fix_a_bad_config_value() {
    let config = BtlConfig {
        sd_num: Some(0),
        ..BtlConfig::default()
    };
    assert_eq!(
        load_with(&config, &[("UDBTL_SD_NUM", "8")]).unwrap().sd_num,
        8
    );
}

#[test]
fn booleans() {
    for (text, want) in [
        ("1", true),
        ("yes", true),
        ("ON", true),
        ("True", true),
        ("0", false),
        ("off", false),
        ("No", false),
    ] {
        assert_eq!(
            load_env(&[("UDBTL_UDP_IPV6", text)]).unwrap().udp_ipv6,
            want,
            "{text}"
        );
    }
    assert!(load_env(&[("UDBTL_UDP_IPV6", "2")]).is_err());
}

#[test]
fn mpool_and_provider_are_choices() {
    let p = load_env(&[("UDBTL_MPOOL", "GRDMA"), ("UDBTL_PROVIDER", "sim")]).unwrap();
    assert_eq!((p.mpool.as_str(), p.provider.as_str()), ("grdma", "sim"));
    assert!(p.rcache_enabled());
    let config = BtlConfig {
        mpool: Some("none".into()),
        ..BtlConfig::default()
    };
    assert!(!load_with(&config, &[]).unwrap().rcache_enabled());
    let err = load_env(&[("UDBTL_MPOOL", "bogus")]).unwrap_err();
    assert!(
        err.to_string()
            .contains("expected one of rdma, grdma, none"),
        "{err}"
    );
    assert_eq!(
        load_env(&[("UDBTL_PROVIDER", "verbs")]).unwrap().provider,
        "verbs"
    );
    assert!(load_env(&[("UDBTL_PROVIDER", "rdma")]).is_err());
}

#[test]
fn port_selectors_parse_and_match() {
    let list = PortSelector::parse_list("mlx4_0, mlx4_1:2").unwrap();
    assert_eq!(
        list,
        [
            PortSelector {
                device: "mlx4_0".into(),
                port: None
            },
            PortSelector {
                device: "mlx4_1".into(),
                port: Some(2)
            },
        ]
    );
    assert!(list[0].matches("mlx4_0", 1) && list[0].matches("mlx4_0", 2));
    assert!(list[1].matches("mlx4_1", 2) && !list[1].matches("mlx4_1", 1));
    assert!(!list[0].matches("mlx4_00", 1));
    assert_eq!(list[1].to_string(), "mlx4_1:2");
    for bad in [
        "", ":1", "dev:", "dev:0", "dev:x", "dev:+1", "dev:256", "dev:1:2", "a,,b", "a,",
    ] {
        assert!(PortSelector::parse_list(bad).is_err(), "{bad:?}");
    }
    assert!(matches!(
        "dev:0".parse::<PortSelector>(),
        Err(SelectorError::BadPort { .. })
    ));
    assert!(matches!(
        ":1".parse::<PortSelector>(),
        Err(SelectorError::EmptyDevice { .. })
    ));
}

#[test]
fn subnets_are_selectors_without_a_port() {
    let list = PortSelector::parse_list("10.77.0.0/24, fd00::/64, eth0").unwrap();
    assert!(list[0].is_subnet() && list[1].is_subnet() && !list[2].is_subnet());
    assert_eq!(list[1].port, None);
    assert_eq!(list[1].to_string(), "fd00::/64");
    // The provider judges subnets: by device name, an include list with
    // one lets every device through, and an exclude list's subnet skips none.
    let include = Params {
        if_include: Some(list.clone()),
        ..Params::default()
    };
    assert!(include.port_allowed("vB", 1));
    let exclude = Params {
        if_exclude: Some(list[..2].to_vec()),
        ..Params::default()
    };
    assert!(exclude.port_allowed("vB", 1));
    let config = crate::udp_config_in(&exclude, crate::JobLayout::SpansHosts);
    assert_eq!(config.exclude, ["10.77.0.0/24", "fd00::/64"]);
    assert_eq!(config.scope, udbtl_fabric::udp::InterfaceScope::Network);
}

#[test]
fn port_lists_load_from_env_and_config() {
    let p = load_env(&[("UDBTL_IF_INCLUDE", "lo,eth0:1")]).unwrap();
    assert_eq!(p.if_include.as_ref().map(Vec::len), Some(2));
    let info = p
        .describe()
        .into_iter()
        .find(|i| i.name == "if_include")
        .unwrap();
    assert_eq!(info.value, "lo,eth0:1");
    let err = load_env(&[("UDBTL_IF_EXCLUDE", "eth0:0")]).unwrap_err();
    assert!(err.to_string().contains("UDBTL_IF_EXCLUDE"), "{err}");
    let config = BtlConfig {
        if_exclude: Some(Vec::new()),
        ..BtlConfig::default()
    };
    assert!(load_with(&config, &[]).is_err());
}

#[test]
fn port_allowed_follows_include_or_exclude() {
    assert!(Params::default().port_allowed("mlx4_0", 1));
    let include = load_env(&[("UDBTL_IF_INCLUDE", "mlx4_0:2,mlx4_1")]).unwrap();
    assert!(!include.port_allowed("mlx4_0", 1));
    assert!(include.port_allowed("mlx4_0", 2));
    assert!(include.port_allowed("mlx4_1", 1));
    let exclude = load_env(&[("UDBTL_IF_EXCLUDE", "mlx4_0:2")]).unwrap();
    assert!(exclude.port_allowed("mlx4_0", 1));
    assert!(!exclude.port_allowed("mlx4_0", 2));
}

#[test]
fn include_and_exclude_conflict() {
    let config = BtlConfig {
        if_include: Some(vec!["lo".parse().unwrap()]),
        ..BtlConfig::default()
    };
    let err = load_with(&config, &[("UDBTL_IF_EXCLUDE", "eth0")]).unwrap_err();
    assert_eq!(
        err,
        ParamError::Conflict {
            first: "if_include",
            first_from: Source::Config,
            second: "if_exclude",
            second_from: Source::Environment,
            reason: "set either the ports to include or those to exclude, not both",
        }
    );
    let msg = err.to_string();
    assert!(
        msg.contains("if_include") && msg.contains("UDBTL_IF_EXCLUDE"),
        "{msg}"
    );
}

#[test]
fn min_send_size_may_not_exceed_max_send_size() {
    let err =
        load_env(&[("UDBTL_MIN_SEND_SIZE", "4k"), ("UDBTL_MAX_SEND_SIZE", "2k")]).unwrap_err();
    assert!(
        matches!(
            err,
            ParamError::Conflict {
                first: "min_send_size",
                ..
            }
        ),
        "{err}"
    );
    assert!(load_env(&[("UDBTL_MIN_SEND_SIZE", "2k"), ("UDBTL_MAX_SEND_SIZE", "2k")]).is_ok());
}

#[test]
fn auth_needs_reliable() {
    let err = load_env(&[("UDBTL_AUTH", "1"), ("UDBTL_RELIABLE", "0")]).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(
            err,
            ParamError::Conflict {
                first: "auth",
                second: "reliable",
                ..
            }
        ),
        "{msg}"
    );
    assert!(
        msg.contains("UDBTL_AUTH") && msg.contains("UDBTL_RELIABLE"),
        "{msg}"
    );
    let protection = |value| load_env(&[("UDBTL_AUTH", value)]).unwrap().protection();
    for on in ["1", "on", "yes", "TRUE"] {
        assert_eq!(protection(on), Some(Protection::Authenticate), "{on}");
    }
    assert_eq!(protection(" Encrypt "), Some(Protection::Encrypt));
    for off in ["0", "off", "no", "false"] {
        assert_eq!(protection(off), None, "{off}");
    }
    assert!(load_env(&[("UDBTL_AUTH", "sign")]).is_err());
    assert_eq!(Params::default().protection(), None);
}

#[test]
fn text_is_trimmed() {
    let p = load_env(&[("UDBTL_PROVIDER", " udp ")]).unwrap();
    assert_eq!(p.provider, "udp");
}

#[test]
fn the_old_interface_variable_sets_if_include() {
    let p = load_env(&[("UDBTL_UDP_IF", "eth0,10.77.0.0/24")]).unwrap();
    let include: Vec<String> = p
        .if_include
        .iter()
        .flatten()
        .map(ToString::to_string)
        .collect();
    assert_eq!(include, ["eth0", "10.77.0.0/24"]);
    assert_eq!(p.source("if_include"), Some(Source::Environment));
    let err = load_env(&[("UDBTL_UDP_IF", "eth0"), ("UDBTL_IF_INCLUDE", "eth1")]).unwrap_err();
    assert!(matches!(err, ParamError::Renamed { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("UDBTL_UDP_IF and UDBTL_IF_INCLUDE are both set"),
        "{err}"
    );
    assert!(
        env::unknown_vars(["UDBTL_UDP_IF"]).is_empty(),
        "the old name is not unknown"
    );
}

/// `udp_mtu` must leave room for the UD header, the BTL header with its
/// reliability extension and a 256-byte payload: below that, sends of a
/// greeting failed "over the eager limit of 24".
#[test]
fn udp_mtu_has_a_lower_bound_that_leaves_a_useful_payload() {
    assert_eq!(
        MIN_UDP_MTU,
        udbtl_wire::ud::HEADER_LEN + udbtl_wire::datagram::HEADER_LEN + MIN_EAGER_PAYLOAD
    );
    assert_eq!(MIN_UDP_MTU, 312);
    for low in ["64", "300", "311"] {
        let err = load_env(&[("UDBTL_UDP_MTU", low)]).unwrap_err().to_string();
        assert!(err.contains("UDBTL_UDP_MTU"), "{err}");
        assert!(err.contains("outside 312..="), "{err}");
    }
    assert_eq!(
        load_env(&[("UDBTL_UDP_MTU", "312")]).unwrap().udp_mtu,
        Some(312)
    );
}

#[test]
fn udp_sockbuf_defaults_to_4_mib_and_takes_sizes() {
    assert_eq!(Params::default().udp_sockbuf, 4 << 20);
    assert_eq!(
        load_env(&[("UDBTL_UDP_SOCKBUF", "16m")])
            .unwrap()
            .udp_sockbuf,
        16 << 20
    );
    assert!(load_env(&[("UDBTL_UDP_SOCKBUF", "4k")]).is_err());
}

/// `parse_bool` is what the BOOL parameters and `UDBTL_DUMP` accept.
#[test]
fn booleans_parse_as_the_bool_parameters_do() {
    for yes in ["1", "true", "YES", " on "] {
        assert_eq!(parse_bool(yes), Ok(true), "{yes:?}");
    }
    for no in ["0", "false", "No", "off"] {
        assert_eq!(parse_bool(no), Ok(false), "{no:?}");
    }
    for bad in ["", " ", "2", "y"] {
        assert!(parse_bool(bad).is_err(), "{bad:?}");
    }
}
