//! The `PMI_FD` path: the launcher's end of a socketpair served by our
//! `Server`, the client's end handed over by descriptor number as a child
//! would inherit it. One test per binary: the descriptor can be taken once
//! per process.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::fd::IntoRawFd;
use std::os::unix::net::UnixStream;
use std::sync::mpsc;

use udbtl_pmi::{Mode, PmiClient, PmiError, Server, ServerEvent};

#[test]
fn client_takes_pmi_fd_once() {
    let (tx, events) = mpsc::channel();
    let server = Server::new(2, "kvs_fd", tx).unwrap();
    let (launcher_end, child_end) = UnixStream::pair().unwrap();
    let served = server.serve(launcher_end, 1).unwrap();
    let fd = child_end.into_raw_fd();

    let env = move |var: &str| match var {
        "PMI_FD" => Some(fd.to_string()),
        "PMI_RANK" => Some("1".to_owned()),
        "PMI_SIZE" => Some("2".to_owned()),
        _ => None,
    };
    let mut pmi = PmiClient::from_env_with(env).unwrap();
    assert_eq!((pmi.rank(), pmi.size(), pmi.mode()), (1, 2, Mode::Fd));

    // Made close-on-exec (O_CLOEXEC is octal 02000000 in fdinfo's flags).
    let fdinfo = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap();
    let flags = fdinfo
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .unwrap()
        .trim();
    assert_ne!(
        u32::from_str_radix(flags, 8).unwrap() & 0o2_000_000,
        0,
        "flags {flags}"
    );

    // A second take is refused, even of the same number.
    match PmiClient::from_env_with(env) {
        Err(PmiError::InheritedFd { fd: f, source }) => {
            assert_eq!(f, fd);
            assert_eq!(source.kind(), std::io::ErrorKind::AlreadyExists);
        }
        other => panic!("{other:?}"),
    }

    pmi.init().unwrap();
    pmi.put("addr-1", "fd").unwrap();
    assert_eq!(pmi.get("addr-1").unwrap().as_deref(), Some("fd"));
    pmi.finalize().unwrap();
    assert!(matches!(
        events.recv().unwrap(),
        ServerEvent::Finalized { rank: 1 }
    ));
    drop(pmi);
    served.join().unwrap();
    // Dropping the client closed the descriptor.
    assert!(!std::path::Path::new(&format!("/proc/self/fdinfo/{fd}")).exists());
}
