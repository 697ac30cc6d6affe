//! What a rank reads at start: its job's layout, key and secret, and how
//! it logs.

use udbtl_btl::JobLayout;
use udbtl_pmi::{JobSecret, PmiClient, ProcessMapping, SECRET_ENV};
use udbtl_wire::datagram::AuthKey;

use super::InitError;

/// The PMI key under which `rank` publishes its addresses.
pub(super) fn address_key(rank: u32) -> String {
    format!("udbtl-addr-{rank}")
}

/// A job key from a launcher's job name: a stable hash, since every rank
/// must derive the same key.
pub(super) fn job_key_from(name: &str) -> u32 {
    let hash = udbtl_wire::hash::fnv1a(name.as_bytes());
    // Zero means "no key"; any other value is a key.
    ((hash >> 32) as u32 ^ hash as u32).max(1)
}

/// The context under which the datagram secret derives from the job secret:
/// no other use of the job secret may share it.
const DATAGRAM_SECRET_CONTEXT: &str = "udbtl 2026-12 authenticated datagrams v1";

/// The job's datagram secret, derived from the job secret its launcher
/// handed it (`UDBTL_PMI_SECRET`: udrun gives it to every rank, local or
/// remote, never on a command line), or `None` under a launcher that gives
/// none: then each module publishes a random key through PMI instead.
pub(super) fn datagram_secret() -> Result<Option<AuthKey>, InitError> {
    let Some(hex) = std::env::var_os(SECRET_ENV) else {
        return Ok(None);
    };
    let secret = JobSecret::from_hex(&hex.to_string_lossy()).map_err(InitError::BadJobSecret)?;
    Ok(Some(AuthKey(secret.derive_key(DATAGRAM_SECRET_CONTEXT))))
}

/// Sends log records to stderr: `RUST_LOG` when set (an invalid one is
/// reported and replaced), `warn` otherwise, so that the library's warnings
/// reach the user. A program that installed its own subscriber keeps it.
/// [`init`](crate::init) calls it; tools that do not call `init` may too.
pub fn log_to_stderr() {
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::filter::LevelFilter;
    let filter = EnvFilter::builder()
        .with_default_directive(LevelFilter::WARN.into())
        .from_env();
    let (filter, rejected) = match filter {
        Ok(filter) => (filter, None),
        Err(err) => (EnvFilter::new("warn"), Some(err)),
    };
    let installed = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .without_time()
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init()
        .is_ok();
    if let (true, Some(err)) = (installed, rejected) {
        tracing::warn!("ignoring RUST_LOG: {err}");
    }
}

/// Whether `UDBTL_DUMP` asks for the transport's state at finalize, read
/// as the boolean parameters are.
pub(super) fn dump_requested() -> Result<bool, InitError> {
    match std::env::var_os("UDBTL_DUMP") {
        None => Ok(false),
        Some(value) => {
            let value = value.to_string_lossy().into_owned();
            udbtl_btl::params::parse_bool(&value)
                .map_err(|reason| InitError::BadDump { value, reason })
        }
    }
}

/// Where the job runs, from the launcher's `PMI_process_mapping`: on one
/// node, or across several. A launcher that gives no mapping (or one this
/// cannot read) leaves the job taken to span hosts when it has more than
/// one rank: every interface but loopback works on one host too, where
/// loopback alone would not work across hosts.
pub(super) fn job_layout(pmi: &mut PmiClient) -> Result<JobLayout, InitError> {
    if pmi.size() == 1 {
        return Ok(JobLayout::OneHost);
    }
    let text = pmi.get("PMI_process_mapping")?;
    let mapping = text.as_deref().and_then(ProcessMapping::parse);
    Ok(match mapping {
        Some(mapping) if mapping.node_count() == 1 => JobLayout::OneHost,
        Some(_) => JobLayout::SpansHosts,
        None => {
            tracing::debug!(
                ?text,
                "no PMI_process_mapping to read; taking the job to span hosts"
            );
            JobLayout::SpansHosts
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_keys_from_names_differ_and_are_never_zero() {
        assert_ne!(job_key_from("kvs_1"), job_key_from("kvs_2"));
        assert_ne!(job_key_from(""), 0);
    }
}
