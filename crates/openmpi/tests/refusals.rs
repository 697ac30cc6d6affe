//! What the component refuses, and how it says so: a bad parameter value
//! fails the job at `MPI_Init` with Open MPI's own message about
//! unreachable peers, after udbtl's reason naming the variable and the value
//! as the user wrote it.

mod common;

use common::Run;

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn a_bad_parameter_value_is_named_and_the_job_fails() {
    require_openmpi!();
    let _turn = common::serial();
    let exe = common::program("hello");
    let out = Run::udbtl(2)
        .mca("btl_udbtl_sd_num", "many")
        .output(&exe, &[]);
    let all = text(&out);
    assert!(!out.status.success(), "the job must fail:\n{all}");
    assert!(
        all.contains("invalid value \"many\" for MCA parameter btl_udbtl_sd_num"),
        "udbtl must name the variable:\n{all}"
    );
    // Open MPI's own account follows (its wording varies with how its help
    // messages get through): the job stops in MPI_Init. Sometimes Open MPI
    // 4.1's launcher fails to unpack the aggregated help messages and logs
    // that in place of them (ORTE_ERROR_LOG ... show_help.c): its account
    // is then lost, by Open MPI, after udbtl's reason got through.
    assert!(
        all.contains("MPI_Init") || all.contains("MPI_INIT") || all.contains("show_help.c"),
        "{all}"
    );
}
