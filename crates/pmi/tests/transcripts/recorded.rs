//! The recorded hydra and Slurm sessions, typed errors for every way a
//! reply can be wrong, local checks, abort and the port-mode handshake.

use super::*;

#[test]
fn hydra_transcript() {
    let (mut pmi, server) = scripted(HYDRA_SESSION, 0, 2);
    assert_eq!(pmi.kvsname(), None);
    pmi.init().unwrap();
    assert_eq!(pmi.kvsname(), Some(HYDRA_KVS));
    assert_eq!(pmi.maxes(), Some(Maxes::DEFAULT));
    assert_eq!(pmi.appnum(), Some(0));
    assert_eq!(pmi.universe_size(), None, "hydra answers size=-1");
    assert_eq!((pmi.rank(), pmi.size(), pmi.mode()), (0, 2, Mode::Stream));

    pmi.put("addr-0", "udp://127.0.0.1:50000").unwrap();
    pmi.barrier().unwrap();
    assert_eq!(
        pmi.get("addr-1").unwrap().as_deref(),
        Some("udp://127.0.0.1:50001")
    );
    assert_eq!(pmi.get("nonexistent").unwrap(), None);
    assert_eq!(
        pmi.get("PMI_process_mapping").unwrap().as_deref(),
        Some("(vector,(0,1,1))")
    );
    pmi.finalize().unwrap();
    assert!(matches!(
        pmi.get("addr-1"),
        Err(PmiError::State { cmd: "get", .. })
    ));
    drop(pmi);
    server.join().unwrap();
}

#[test]
fn slurm_transcript() {
    let (mut pmi, server) = scripted(SLURM_SESSION, 1, 2);
    pmi.init().unwrap();
    assert_eq!(pmi.kvsname(), Some("2.0"));
    assert_eq!(pmi.appnum(), None, "Slurm answers appnum=-1");
    assert_eq!(pmi.universe_size(), Some(2));
    pmi.put("addr-1", "udp://127.0.0.1:50001").unwrap();
    pmi.barrier().unwrap();
    assert_eq!(
        pmi.get("addr-0").unwrap().as_deref(),
        Some("udp://127.0.0.1:50000")
    );
    assert_eq!(
        pmi.get("nonexistent").unwrap(),
        None,
        "Slurm's rc=1 without value"
    );
    assert_eq!(
        pmi.get("PMI_process_mapping").unwrap().as_deref(),
        Some("(vector,(0,1,2))")
    );
    pmi.finalize().unwrap();
    drop(pmi);
    server.join().unwrap();
}

#[test]
fn refused_put_is_a_typed_error() {
    let put = "cmd=put kvsname=kvs_12593_0_296824150_vm key=k value=v";
    let (mut pmi, server) = scripted(
        &after_init(&[(put, &["cmd=put_result rc=-1 msg=duplicate_key"])]),
        0,
        1,
    );
    pmi.init().unwrap();
    match pmi.put("k", "v") {
        Err(PmiError::Failed {
            cmd: "put",
            rc: -1,
            msg,
        }) => assert_eq!(msg, "duplicate_key"),
        other => panic!("{other:?}"),
    }
    drop(pmi);
    server.join().unwrap();
}

#[test]
fn wrong_reply_command_is_a_typed_error() {
    let (mut pmi, server) = scripted(
        &after_init(&[("cmd=barrier_in", &["cmd=put_result rc=0"])]),
        0,
        1,
    );
    pmi.init().unwrap();
    match pmi.barrier() {
        Err(PmiError::UnexpectedReply {
            cmd: "barrier_in",
            expected: "barrier_out",
            got,
        }) => {
            assert_eq!(got, "cmd=put_result rc=0");
        }
        other => panic!("{other:?}"),
    }
    drop(pmi);
    server.join().unwrap();
}

#[test]
fn malformed_reply_and_bad_fields_are_typed_errors() {
    let (mut pmi, server) = scripted(
        &after_init(&[("cmd=barrier_in", &["cmd=barrier_out rc"])]),
        0,
        1,
    );
    pmi.init().unwrap();
    assert!(matches!(
        pmi.barrier(),
        Err(PmiError::Malformed {
            cmd: "barrier_in",
            ..
        })
    ));
    drop(pmi);
    server.join().unwrap();

    let steps: &[Step] = &[
        HYDRA_INIT[0],
        (
            "cmd=get_maxes",
            &["cmd=maxes kvsname_max=256 keylen_max=big vallen_max=1024"],
        ),
    ];
    let (mut pmi, server) = scripted(steps, 0, 1);
    assert!(matches!(
        pmi.init(),
        Err(PmiError::BadField {
            cmd: "get_maxes",
            field: "keylen_max",
            ..
        })
    ));
    drop(pmi);
    server.join().unwrap();

    let steps: &[Step] = &[
        HYDRA_INIT[0],
        ("cmd=get_maxes", &["cmd=maxes kvsname_max=256"]),
    ];
    let (mut pmi, server) = scripted(steps, 0, 1);
    assert!(matches!(
        pmi.init(),
        Err(PmiError::MissingField {
            cmd: "get_maxes",
            field: "keylen_max"
        })
    ));
    drop(pmi);
    server.join().unwrap();
}

#[test]
fn eof_and_failed_init_are_typed_errors() {
    // The server reads init and closes the connection without replying.
    let (ours, theirs) = UnixStream::pair().unwrap();
    ours.set_read_timeout(Some(TIMEOUT)).unwrap();
    let server = thread::spawn(move || {
        let mut line = String::new();
        BufReader::new(theirs).read_line(&mut line).unwrap();
        assert_eq!(line, "cmd=init pmi_version=1 pmi_subversion=1\n");
    });
    let reader = BufReader::new(ours.try_clone().unwrap());
    let mut pmi = PmiClient::new(reader, ours, 0, 1).unwrap();
    let err = pmi.init().unwrap_err();
    assert!(matches!(err, PmiError::Eof { cmd: "init" }), "{err:?}");
    server.join().unwrap();

    let steps: &[Step] = &[(
        "cmd=init pmi_version=1 pmi_subversion=1",
        &["cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=-1 msg=go_away"],
    )];
    let (mut pmi, server) = scripted(steps, 0, 1);
    assert!(matches!(
        pmi.init(),
        Err(PmiError::Failed {
            cmd: "init",
            rc: -1,
            ..
        })
    ));
    assert!(matches!(
        pmi.put("k", "v"),
        Err(PmiError::State { cmd: "put", .. })
    ));
    drop(pmi);
    server.join().unwrap();
}

#[test]
fn local_checks_send_nothing() {
    let (mut pmi, server) = scripted(HYDRA_INIT, 0, 1);
    assert!(matches!(
        pmi.barrier(),
        Err(PmiError::State {
            cmd: "barrier_in",
            ..
        })
    ));
    pmi.init().unwrap();
    assert!(matches!(
        pmi.init(),
        Err(PmiError::State { cmd: "init", .. })
    ));
    let long_key = "k".repeat(64);
    for (key, value) in [
        ("PMI_mine", "v"),
        ("a key", "v"),
        ("k=1", "v"),
        ("", "v"),
        (long_key.as_str(), "v"),
    ] {
        assert!(
            matches!(pmi.put(key, value), Err(PmiError::InvalidKey { .. })),
            "{key:?}"
        );
    }
    let long_value = "v".repeat(1024);
    for value in ["a b", "tab\there", "caf\u{e9}", long_value.as_str()] {
        assert!(
            matches!(pmi.put("k", value), Err(PmiError::InvalidValue { .. })),
            "{value:?}"
        );
    }
    // The longest legal key and value pass the local checks (63 and 1023).
    assert_eq!(pmi.maxes().map(|m| (m.key, m.value)), Some((64, 1024)));
    drop(pmi);
    server.join().unwrap();
}

#[test]
fn abort_does_not_wait() {
    // Allowed before init; spaces and non-printable bytes become `_`.
    let steps: &[Step] = &[("cmd=abort exitcode=3 message=rank_1:_out_of_memory__", &[])];
    let (mut pmi, server) = scripted(steps, 1, 2);
    pmi.abort(3, "rank 1: out of memory\t\u{e9}").unwrap();
    drop(pmi);
    server.join().unwrap();
}

/// The PMI_PORT handshake, with `set` lines in a different order than
/// hydra's and an extra `set` key.
#[test]
fn port_mode_handshake() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        stream.set_read_timeout(Some(TIMEOUT)).unwrap();
        let steps: &[Step] = &[
            (
                "cmd=initack pmiid=1",
                &[
                    "cmd=initack",
                    "cmd=set rank=1",
                    "cmd=set appnum=0",
                    "cmd=set debug=0",
                    "cmd=set size=2",
                ],
            ),
            HYDRA_INIT[0],
            HYDRA_INIT[1],
            HYDRA_INIT[2],
            HYDRA_INIT[3],
            HYDRA_INIT[4],
            ("cmd=barrier_in", &["cmd=barrier_out"]),
            ("cmd=finalize", &["cmd=finalize_ack"]),
        ];
        play(BufReader::new(stream), steps);
    });
    let env = move |var: &str| match var {
        "PMI_PORT" => Some(format!("localhost:{port}")),
        "PMI_ID" => Some("1".to_owned()),
        "PMIX_RANK" => Some("0".to_owned()), // PMI_PORT wins
        _ => None,
    };
    let mut pmi = PmiClient::from_env_with(env).unwrap();
    assert_eq!((pmi.rank(), pmi.size(), pmi.mode()), (1, 2, Mode::Port));
    pmi.init().unwrap();
    pmi.barrier().unwrap();
    pmi.finalize().unwrap();
    drop(pmi);
    server.join().unwrap();
}

#[test]
fn port_mode_refused_handshake() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let steps: &[Step] = &[(
            "cmd=initack pmiid=9",
            &["cmd=initack rc=-1 msg=pmiid_refused"],
        )];
        play(BufReader::new(stream), steps);
    });
    let err = PmiClient::connect_port(&addr.to_string(), "9").unwrap_err();
    assert!(
        matches!(
            err,
            PmiError::Failed {
                cmd: "initack",
                rc: -1,
                ..
            }
        ),
        "{err:?}"
    );
    server.join().unwrap();

    // Nobody listening.
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let err = PmiClient::connect_port(&closed.to_string(), "0").unwrap_err();
    assert!(matches!(err, PmiError::Connect { .. }), "{err:?}");
}
