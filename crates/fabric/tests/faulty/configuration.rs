//! The fault configuration parser.

use super::*;

fn lookup(vars: &[(&'static str, &'static str)]) -> Result<FaultConfig, FaultConfigError> {
    let vars: HashMap<&str, &str> = vars.iter().copied().collect();
    FaultConfig::from_lookup(|name| vars.get(name).map(|v| (*v).to_owned()))
}

#[test]
fn the_configuration_parses_fractions_and_a_seed() {
    let config = lookup(&[]).unwrap();
    assert_eq!(config, FaultConfig::default());
    assert!(!config.is_active());

    let config = lookup(&[
        (ENV_DROP, "0.05"),
        (ENV_DUPLICATE, " 0.1 "),
        (ENV_REORDER, ""),
        (ENV_SEED, "1234"),
    ])
    .unwrap();
    assert_eq!(
        config,
        FaultConfig {
            drop: 0.05,
            duplicate: 0.1,
            reorder: 0.0,
            seed: 1234
        }
    );
    assert!(config.is_active());
    assert_eq!(lookup(&[(ENV_DROP, "1")]).unwrap().drop, 1.0);
}

#[test]
fn bad_configuration_values_are_errors_that_name_the_variable() {
    let cases: [(&[(&str, &str)], &str); 8] = [
        (&[(ENV_DROP, "abc")], ENV_DROP),
        (&[(ENV_DUPLICATE, "1.5")], ENV_DUPLICATE),
        (&[(ENV_REORDER, "-0.1")], ENV_REORDER),
        (&[(ENV_DROP, "NaN")], ENV_DROP),
        (&[(ENV_DROP, "5")], ENV_DROP),
        (&[(ENV_REORDER, "5%")], ENV_REORDER),
        (&[(ENV_SEED, "-1")], ENV_SEED),
        (&[(ENV_SEED, "0x10")], ENV_SEED),
    ];
    for (vars, name) in cases {
        let err = lookup(vars).expect_err("must be refused");
        assert!(err.to_string().contains(name), "{err} should name {name}");
    }
    assert!(matches!(
        lookup(&[(ENV_DROP, "abc")]),
        Err(FaultConfigError::NotANumber { var: ENV_DROP, .. })
    ));
    assert!(matches!(
        lookup(&[(ENV_DUPLICATE, "1.5")]),
        Err(FaultConfigError::OutOfRange {
            var: ENV_DUPLICATE,
            ..
        })
    ));
    let err = lookup(&[(ENV_DROP, "0.6"), (ENV_DUPLICATE, "0.6")]).unwrap_err();
    assert!(
        matches!(err, FaultConfigError::RatesExceedOne { .. }),
        "{err}"
    );

    let net = SimNetwork::new(0);
    let bad = FaultConfig {
        drop: 2.0,
        ..FaultConfig::default()
    };
    assert!(FaultyProvider::new(net.provider(), bad).is_err());
}
