//! Every `UDBTL_*` environment variable udbtl knows: the parameters'
//! (`UDBTL_<NAME>`), and the others the library, its builds and its tests
//! read. A variable that is none of them is most likely a misspelling, which
//! [`unknown_vars`] finds, with the closest real name; [`param_named`] finds
//! a parameter by any of its names, or the closest to a misspelt one.

use udbtl_fabric::faulty;

use super::Params;

/// When a variable that is not a parameter is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VarUse {
    /// By a running program (what `udinfo` lists).
    Runtime,
    /// By a build script.
    Build,
    /// By a test or a benchmark harness.
    Test,
}

/// A `UDBTL_*` variable that is not a parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OtherVar {
    /// The variable.
    pub name: &'static str,
    /// When it is read.
    pub used: VarUse,
    /// What it does and what it accepts.
    pub help: &'static str,
}

/// The `UDBTL_*` variables that are not parameters.
pub const OTHER_VARS: &[OtherVar] = &[
    OtherVar {
        name: "UDBTL_DUMP",
        used: VarUse::Runtime,
        help: "Print each rank's transport state (btl_dump) to stderr at finalize \
               [bool (1/0, true/false, yes/no, on/off)]",
    },
    OtherVar {
        name: "UDBTL_MODEX",
        used: VarUse::Runtime,
        help: "How a rank fetches its peers' addresses: bulk (all at init) or lazy \
               (on first use); unset: bulk up to 256 ranks, lazy above [bulk|lazy]",
    },
    OtherVar {
        name: "UDBTL_PMI_SECRET",
        used: VarUse::Runtime,
        help: "The job's secret, which udrun gives every rank (remote ones on the \
               launcher's stdin, never a command line): PMI_PORT connections prove it, and \
               with UDBTL_AUTH the datagram keys derive from it [64 hex digits; set by the \
               launcher]",
    },
    OtherVar {
        name: faulty::ENV_DROP,
        used: VarUse::Runtime,
        help: "Fault injection, for testing: fraction of datagrams dropped [0.0..=1.0]",
    },
    OtherVar {
        name: faulty::ENV_DUPLICATE,
        used: VarUse::Runtime,
        help: "Fault injection, for testing: fraction of datagrams sent twice [0.0..=1.0]",
    },
    OtherVar {
        name: faulty::ENV_REORDER,
        used: VarUse::Runtime,
        help: "Fault injection, for testing: fraction of datagrams held back behind \
               the next [0.0..=1.0]",
    },
    OtherVar {
        name: faulty::ENV_SEED,
        used: VarUse::Runtime,
        help: "Fault injection, for testing: seed of the fault generator [integer]",
    },
    OtherVar {
        name: "UDBTL_IBVERBS_INCLUDE",
        used: VarUse::Build,
        help: "Where the build finds the rdma-core headers (verbs feature)",
    },
    OtherVar {
        name: "UDBTL_IBVERBS_LIB",
        used: VarUse::Build,
        help: "Where the build finds libibverbs (verbs feature)",
    },
    OtherVar {
        name: "UDBTL_OMPI_MPICC",
        used: VarUse::Build,
        help: "The Open MPI compiler wrapper the openmpi crate's build asks for flags",
    },
    OtherVar {
        name: "UDBTL_ALLOC_TRACE",
        used: VarUse::Test,
        help: "Allocations the no_alloc test traces",
    },
    OtherVar {
        name: "UDBTL_SHARED_TOOLS",
        used: VarUse::Test,
        help: "Folder of twohosts and nsssh for the two-host tests (default scripts/standin)",
    },
];

/// Prefixes of variables the tests set for their own child processes.
pub const TEST_PREFIXES: &[&str] = &["UDBTL_TEST_"];

/// A `UDBTL_*` variable udbtl does not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownVar {
    /// The variable as set.
    pub name: String,
    /// The known variable nearest to it in spelling, if any is near.
    pub closest: Option<String>,
}

impl std::fmt::Display for UnknownVar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} is not a udbtl variable and is ignored", self.name)?;
        match &self.closest {
            Some(closest) => write!(f, "; did you mean {closest}?"),
            None => f.write_str(" (udinfo lists the variables)"),
        }
    }
}

/// Every variable udbtl knows: the parameters' and [`OTHER_VARS`].
pub fn known_vars() -> Vec<String> {
    Params::default()
        .describe()
        .into_iter()
        .map(|info| info.env_var)
        .chain(OTHER_VARS.iter().map(|var| var.name.to_owned()))
        .chain(super::alias::RENAMED.iter().map(|r| r.old.to_owned()))
        .collect()
}

/// The `UDBTL_*` names among `names` that udbtl does not read (test
/// variables aside), each with the nearest known name when one is within a
/// third of its length in edits (at least 2).
pub fn unknown_vars<I, S>(names: I) -> Vec<UnknownVar>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let known = known_vars();
    let mut unknown: Vec<UnknownVar> = names
        .into_iter()
        .filter_map(|name| {
            let name = name.as_ref();
            let upper = name.to_ascii_uppercase();
            if !upper.starts_with("UDBTL_")
                || TEST_PREFIXES.iter().any(|p| upper.starts_with(p))
                || known.iter().any(|k| *k == name)
            {
                return None;
            }
            let closest = nearest(&upper, known.iter().map(String::as_str)).map(str::to_owned);
            Some(UnknownVar {
                name: name.to_owned(),
                closest,
            })
        })
        .collect();
    unknown.sort_by(|a, b| a.name.cmp(&b.name));
    unknown
}

/// The `UDBTL_*` variables of this process's environment that udbtl does
/// not read (see [`unknown_vars`]).
pub fn unknown_env_vars() -> Vec<UnknownVar> {
    unknown_vars(std::env::vars_os().filter_map(|(name, _)| name.to_str().map(str::to_owned)))
}

/// A name given for a parameter that names none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownParam {
    /// The name as given.
    pub name: String,
    /// The parameter nearest to it in spelling, written the way it was
    /// given (`btl_udbtl_sd_num` for `btl_udbtl_sd_nmu`), if one is near.
    pub closest: Option<String>,
}

impl std::fmt::Display for UnknownParam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no parameter is named {:?}", self.name)?;
        match &self.closest {
            Some(closest) => write!(f, "; did you mean {closest}?"),
            None => f.write_str(" (udinfo lists the parameters)"),
        }
    }
}

impl std::error::Error for UnknownParam {}

/// The prefixes a parameter's name is met with, longest first, lower case:
/// Open MPI's environment form of the component's MCA variable, the MCA
/// variable (`btl_udbtl_<name>`), the seed's (`btl_ofud_<name>`) and the
/// environment variable (`UDBTL_<NAME>`).
const NAME_PREFIXES: [&str; 4] = ["ompi_mca_btl_udbtl_", "btl_udbtl_", "btl_ofud_", "udbtl_"];

/// The parameter `text` names, in any spelling a user meets: the bare name
/// (`sd_num`), its environment variable (`UDBTL_SD_NUM`), the Open MPI
/// component's MCA variable (`btl_udbtl_sd_num`, or
/// `OMPI_MCA_btl_udbtl_sd_num`), the seed's (`btl_ofud_sd_num`), or the
/// old variable of a renamed parameter (`UDBTL_UDP_IF`). Case and
/// surrounding whitespace do not matter.
///
/// # Errors
/// [`UnknownParam`] when it names no parameter, with the nearest one (by
/// the rule of [`unknown_vars`], on the name without its prefix) written
/// with the prefix given.
pub fn param_named(text: &str) -> Result<&'static str, UnknownParam> {
    let text = text.trim();
    let names: Vec<&'static str> = Params::default()
        .describe()
        .into_iter()
        .map(|info| info.name)
        .collect();
    if let Some(renamed) = super::alias::RENAMED
        .iter()
        .find(|r| r.old.eq_ignore_ascii_case(text))
    {
        return Ok(renamed.now);
    }
    let lower = text.to_ascii_lowercase();
    // Prefixes are ASCII, so the bare name starts at the same byte in
    // `text` as in `lower`.
    let prefix_len = NAME_PREFIXES
        .iter()
        .find(|prefix| lower.starts_with(*prefix))
        .map_or(0, |prefix| prefix.len());
    let bare = &lower[prefix_len..];
    if let Some(name) = names.iter().find(|name| **name == bare) {
        return Ok(name);
    }
    let closest = nearest(bare, names.iter().copied()).map(|name| {
        let (prefix, given) = text.split_at(prefix_len);
        let upper = given.bytes().any(|b| b.is_ascii_uppercase())
            && !given.bytes().any(|b| b.is_ascii_lowercase());
        let name = if upper {
            name.to_ascii_uppercase()
        } else {
            name.to_owned()
        };
        format!("{prefix}{name}")
    });
    Err(UnknownParam {
        name: text.to_owned(),
        closest,
    })
}

/// The entry of `known` nearest to `name` in edits, if it is within a
/// third of `name`'s length (at least 2): nearer ones are likely
/// misspellings, farther ones a different name.
fn nearest<'a>(name: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    known
        .into_iter()
        .map(|k| (edit_distance(name, k), k))
        .min()
        .filter(|(distance, _)| *distance <= (name.len() / 3).max(2))
        .map(|(_, k)| k)
}

/// The Levenshtein distance between `a` and `b`, in bytes.
fn edit_distance(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.bytes().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_insertions_deletions_and_substitutions() {
        assert_eq!(edit_distance("", ""), 0);
        assert_eq!(edit_distance("abc", "abc"), 0);
        assert_eq!(edit_distance("abc", "abd"), 1);
        assert_eq!(edit_distance("abc", "ab"), 1);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn misspellings_name_the_closest_variable() {
        let unknown = unknown_vars([
            "UDBTL_SD_NUMS",
            "UDBTL_RELIABEL",
            "UDBTL_FAULT_DORP",
            "UDBTL_DUMPP",
            "UDBTL_ZZZZZZZZZZZZZZZZZZ",
        ]);
        let pairs: Vec<(&str, Option<&str>)> = unknown
            .iter()
            .map(|u| (u.name.as_str(), u.closest.as_deref()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("UDBTL_DUMPP", Some("UDBTL_DUMP")),
                ("UDBTL_FAULT_DORP", Some("UDBTL_FAULT_DROP")),
                ("UDBTL_RELIABEL", Some("UDBTL_RELIABLE")),
                ("UDBTL_SD_NUMS", Some("UDBTL_SD_NUM")),
                ("UDBTL_ZZZZZZZZZZZZZZZZZZ", None),
            ]
        );
        assert!(unknown[0].to_string().contains("did you mean UDBTL_DUMP?"));
    }

    #[test]
    fn a_parameter_is_found_by_any_of_its_names() {
        for text in [
            "sd_num",
            "SD_NUM",
            " sd_num ",
            "UDBTL_SD_NUM",
            "udbtl_sd_num",
            "btl_udbtl_sd_num",
            "OMPI_MCA_btl_udbtl_sd_num",
            "btl_ofud_sd_num",
        ] {
            assert_eq!(param_named(text), Ok("sd_num"), "{text}");
        }
        assert_eq!(param_named("UDBTL_UDP_IF"), Ok("if_include"));
    }

    #[test]
    fn a_misspelt_parameter_names_the_closest_in_the_spelling_given() {
        let closest = |text: &str| param_named(text).unwrap_err().closest;
        assert_eq!(closest("sd_nmu").as_deref(), Some("sd_num"));
        assert_eq!(closest("UDBTL_SD_NMU").as_deref(), Some("UDBTL_SD_NUM"));
        assert_eq!(
            closest("btl_udbtl_sd_nmu").as_deref(),
            Some("btl_udbtl_sd_num")
        );
        assert_eq!(closest("zzzzzzzzzzzz"), None);
        let err = param_named("sd_nmu").unwrap_err();
        assert_eq!(
            err.to_string(),
            "no parameter is named \"sd_nmu\"; did you mean sd_num?"
        );
    }

    #[test]
    fn known_test_and_foreign_variables_are_not_reported() {
        let names = [
            "UDBTL_SD_NUM",
            "UDBTL_JOB_KEY",
            "UDBTL_DUMP",
            "UDBTL_MODEX",
            "UDBTL_PMI_SECRET",
            "UDBTL_FAULT_SEED",
            "UDBTL_TEST_PEER_MODEX",
            "UDBTL_OMPI_MPICC",
            "UDRUN_JOB_KEY",
            "PATH",
        ];
        assert_eq!(unknown_vars(names), []);
    }
}
