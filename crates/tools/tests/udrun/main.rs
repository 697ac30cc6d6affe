//! `udrun` as a user runs it: the real binary, real rank processes and the
//! real PMI-1 exchange. The ranks are bash scripts that speak PMI-1 over
//! their `PMI_FD` (or, on a "remote" host, over TCP to `PMI_PORT`), made by
//! [`pmi_rank`](harness::pmi_rank). Every run is bounded by
//! [`LIMIT`](harness::LIMIT); a run that takes longer is killed and fails
//! its test.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cli;
mod harness;
mod lifecycle;
mod remote;
mod security;

// At the crate root, so that its name is `proof_helper`, which
// `proof_command` gives the test binary as its `--exact` filter.
/// Not a test: the helper of [`proof_command`](harness::proof_command) (it
/// does nothing unless `UDRUN_TEST_NONCE` is set).
#[test]
fn proof_helper() {
    let Ok(nonce_hex) = std::env::var("UDRUN_TEST_NONCE") else {
        return;
    };
    let mut nonce = [0u8; udbtl_pmi::auth::NONCE_LEN];
    for (i, byte) in nonce.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&nonce_hex[2 * i..2 * i + 2], 16).unwrap();
    }
    let secret =
        udbtl_pmi::JobSecret::from_hex(&std::env::var(udbtl_pmi::SECRET_ENV).unwrap()).unwrap();
    let proof = secret.proof(&nonce, &std::env::var("PMI_ID").unwrap());
    let hex: String = proof.iter().map(|b| format!("{b:02x}")).collect();
    println!("PROOF {hex}");
}
