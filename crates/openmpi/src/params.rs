//! udbtl's parameters as Open MPI's MCA variables (`btl_udbtl_<name>`),
//! typed and levelled as Open MPI's own BTLs register theirs, and the values
//! Open MPI was given turned back into udbtl's settings.

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::OnceLock;

use udbtl_btl::params::{ValueType, env_var};
use udbtl_btl::{BtlConfig, Params};

/// How a variable is typed in Open MPI: `component.c` maps each to an
/// `MCA_BASE_VAR_TYPE_*` (and a choice to an enumerator).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub enum McaType {
    /// `MCA_BASE_VAR_TYPE_STRING`.
    Text = 0,
    /// `MCA_BASE_VAR_TYPE_UNSIGNED_INT`.
    Unsigned = 1,
    /// `MCA_BASE_VAR_TYPE_SIZE_T`.
    Size = 2,
    /// `MCA_BASE_VAR_TYPE_BOOL`.
    Bool = 3,
    /// `MCA_BASE_VAR_TYPE_INT` with an enumerator of [`ParamEntry::choices`].
    Choice = 4,
}

/// One parameter as Open MPI registers it: `btl_udbtl_<name>`.
#[derive(Debug)]
pub struct ParamEntry {
    /// The name after `btl_udbtl_`.
    pub name: CString,
    /// The default as text; `None` when unset.
    pub default: Option<CString>,
    /// What it does and what it accepts.
    pub help: CString,
    /// How Open MPI types it.
    pub mca_type: McaType,
    /// The names a choice accepts, in order (empty for other types).
    pub choices: Vec<CString>,
    /// `ompi_info`'s level: 1 for what a user must set to run at all (the
    /// interfaces, as Open MPI's tcp BTL), 4 for common tuning, 5 for the
    /// rest of the seed's, 6 for udbtl's own.
    pub level: u8,
    /// Whether the seed (`btl_ofud`) had it.
    pub from_seed: bool,
}

/// Common tuning: shown at `ompi_info --level 4`.
const TUNING: &[&str] = &[
    "max_send_size",
    "min_send_size",
    "peer_timeout",
    "reliable",
    "auth",
    "checksum",
    "rel_window",
    "progress_thread",
    "udp_mtu",
    "udp_sockbuf",
];

fn level(name: &str, from_seed: bool) -> u8 {
    if name == "if_include" || name == "if_exclude" {
        1
    } else if TUNING.contains(&name) {
        4
    } else if from_seed {
        5
    } else {
        6
    }
}

/// Every BTL parameter, in table order, for Open MPI to register.
pub fn param_table() -> &'static [ParamEntry] {
    static TABLE: OnceLock<Vec<ParamEntry>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let defaults = match Params::load_from(&BtlConfig::default(), |_| None) {
            Ok(params) => params,
            Err(err) => {
                tracing::error!(%err, "the parameter defaults do not load");
                return Vec::new();
            }
        };
        defaults
            .describe()
            .into_iter()
            .filter_map(|info| {
                let (mca_type, choices) = match info.value_type {
                    ValueType::Integer => (McaType::Unsigned, Vec::new()),
                    ValueType::Size => (McaType::Size, Vec::new()),
                    ValueType::Boolean => (McaType::Bool, Vec::new()),
                    ValueType::Choice(names) => (
                        McaType::Choice,
                        names.iter().filter_map(|n| CString::new(*n).ok()).collect(),
                    ),
                    _ => (McaType::Text, Vec::new()),
                };
                Some(ParamEntry {
                    name: CString::new(info.name).ok()?,
                    default: (info.default != "unset")
                        .then(|| CString::new(info.default.clone()).ok())
                        .flatten(),
                    help: CString::new(format!(
                        "{} [{}; environment {}]",
                        info.help, info.syntax, info.env_var
                    ))
                    .ok()?,
                    mca_type,
                    choices,
                    level: level(info.name, info.from_seed),
                    from_seed: info.from_seed,
                })
            })
            .collect()
    })
}

/// The settings Open MPI was given (`explicit[i]` for parameter `i` of
/// [`param_table`], as text), keyed by the environment variable each stands
/// for, so that udbtl checks them as it checks its environment.
pub fn explicit_settings(explicit: &[Option<String>]) -> HashMap<String, String> {
    param_table()
        .iter()
        .zip(explicit)
        .filter_map(|(entry, value)| {
            let value = value.as_ref()?;
            Some((env_var(&entry.name.to_string_lossy()), value.clone()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str) -> &'static ParamEntry {
        param_table()
            .iter()
            .find(|p| p.name.to_bytes() == name.as_bytes())
            .unwrap_or_else(|| panic!("{name} missing"))
    }

    #[test]
    fn every_parameter_is_offered_typed_with_its_default_and_help() {
        let sd_num = entry("sd_num");
        assert_eq!(sd_num.default.as_deref(), Some(c"128"));
        assert_eq!(sd_num.mca_type, McaType::Unsigned);
        assert!(sd_num.from_seed);
        assert_eq!(entry("reliable").mca_type, McaType::Bool);
        assert_eq!(entry("rd_mem").mca_type, McaType::Size);
        let provider = entry("provider");
        assert_eq!(provider.mca_type, McaType::Choice);
        assert!(provider.choices.iter().any(|c| c.as_c_str() == c"udp"));
        assert_eq!(entry("if_include").mca_type, McaType::Text);
        assert_eq!(entry("if_include").default, None, "unset has no default");
        assert!(
            entry("peer_timeout")
                .help
                .to_string_lossy()
                .contains("UDBTL_PEER_TIMEOUT")
        );
    }

    #[test]
    fn the_interfaces_are_at_level_one_as_tcp_has_them() {
        assert_eq!(entry("if_include").level, 1);
        assert_eq!(entry("if_exclude").level, 1);
        assert_eq!(entry("peer_timeout").level, 4);
        assert_eq!(entry("ib_qkey").level, 5);
        assert_eq!(entry("coalesce").level, 6);
    }

    #[test]
    fn explicit_values_become_the_variables_they_stand_for() {
        let mut explicit = vec![None; param_table().len()];
        let sd_num = param_table()
            .iter()
            .position(|p| p.name.as_c_str() == c"sd_num")
            .expect("sd_num");
        explicit[sd_num] = Some("64".to_owned());
        let set = explicit_settings(&explicit);
        assert_eq!(set.get("UDBTL_SD_NUM").map(String::as_str), Some("64"));
        assert_eq!(set.len(), 1);
    }
}
