//! `PMI_FD` naming something other than a socket is refused and left open.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use udbtl_pmi::{PmiClient, PmiError};

#[test]
fn pmi_fd_must_be_a_socket() {
    let file = File::open("/proc/self/stat").unwrap();
    let fd = file.as_raw_fd();
    let env = move |var: &str| match var {
        "PMI_FD" => Some(fd.to_string()),
        "PMI_RANK" => Some("0".to_owned()),
        "PMI_SIZE" => Some("1".to_owned()),
        _ => None,
    };
    match PmiClient::from_env_with(env) {
        Err(PmiError::InheritedFd { fd: f, source }) => {
            assert_eq!(f, fd);
            assert_eq!(source.kind(), std::io::ErrorKind::InvalidInput, "{source}");
        }
        other => panic!("{other:?}"),
    }
    // Still open and still ours: `file` closes it.
    assert!(Path::new(&format!("/proc/self/fdinfo/{fd}")).exists());
    drop(file);

    // Standard streams are never taken (and this does not count as the take).
    let stdin = std::io::stdin().as_raw_fd();
    let env = move |var: &str| match var {
        "PMI_FD" => Some(stdin.to_string()),
        "PMI_RANK" => Some("0".to_owned()),
        "PMI_SIZE" => Some("1".to_owned()),
        _ => None,
    };
    assert!(matches!(
        PmiClient::from_env_with(env),
        Err(PmiError::InheritedFd { fd: 0, .. })
    ));
}
