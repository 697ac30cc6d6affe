//! The client against scripted servers that replay the exact hydra 4.0.2 and
//! Slurm (pmi2 plugin, PMI-1 wire) transcripts recorded on the probe machine
//! (machine-notes.md §5), byte for byte.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixStream;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use udbtl_pmi::{Maxes, Mode, PmiClient, PmiError, WireError};

const TIMEOUT: Duration = Duration::from_secs(10);

/// One request line the client must send, and the reply lines to answer.
type Step = (&'static str, &'static [&'static str]);

/// Plays `steps` on the server side of a stream: asserts each request line,
/// writes the replies, and at the end asserts that the client sent nothing
/// more before closing.
fn play<S: Read + Write>(mut reader: BufReader<S>, steps: &[Step]) {
    play_steps(&mut reader, steps);
    let mut rest = String::new();
    reader.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "", "unexpected requests after the script");
}

/// Plays `steps` on the server side of a stream, and no more.
fn play_steps<S: Read + Write>(reader: &mut BufReader<S>, steps: &[Step]) {
    for (i, (request, replies)) in steps.iter().enumerate() {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert_eq!(line, format!("{request}\n"), "step {i}");
        for reply in *replies {
            reader
                .get_mut()
                .write_all(format!("{reply}\n").as_bytes())
                .unwrap();
        }
    }
}

/// A client on one end of a socketpair whose other end plays `steps`.
fn scripted(steps: &[Step], rank: u32, size: u32) -> (PmiClient, JoinHandle<()>) {
    let steps = steps.to_vec();
    let (ours, theirs) = UnixStream::pair().unwrap();
    ours.set_read_timeout(Some(TIMEOUT)).unwrap();
    theirs.set_read_timeout(Some(TIMEOUT)).unwrap();
    let server = thread::spawn(move || play(BufReader::new(theirs), &steps));
    let reader = BufReader::new(ours.try_clone().unwrap());
    (PmiClient::new(reader, ours, rank, size).unwrap(), server)
}

const HYDRA_KVS: &str = "kvs_12593_0_296824150_vm";

const HYDRA_INIT: &[Step] = &[
    (
        "cmd=init pmi_version=1 pmi_subversion=1",
        &["cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0"],
    ),
    (
        "cmd=get_maxes",
        &["cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024"],
    ),
    ("cmd=get_appnum", &["cmd=appnum appnum=0"]),
    (
        "cmd=get_my_kvsname",
        &["cmd=my_kvsname kvsname=kvs_12593_0_296824150_vm"],
    ),
    ("cmd=get_universe_size", &["cmd=universe_size size=-1"]),
];

const HYDRA_SESSION: &[Step] = &[
    HYDRA_INIT[0],
    HYDRA_INIT[1],
    HYDRA_INIT[2],
    HYDRA_INIT[3],
    HYDRA_INIT[4],
    (
        "cmd=put kvsname=kvs_12593_0_296824150_vm key=addr-0 value=udp://127.0.0.1:50000",
        &["cmd=put_result rc=0 msg=success"],
    ),
    ("cmd=barrier_in", &["cmd=barrier_out"]),
    (
        "cmd=get kvsname=kvs_12593_0_296824150_vm key=addr-1",
        &["cmd=get_result rc=0 msg=success value=udp://127.0.0.1:50001"],
    ),
    (
        "cmd=get kvsname=kvs_12593_0_296824150_vm key=nonexistent",
        &["cmd=get_result rc=-1 msg=key_nonexistent_not_found value=unknown"],
    ),
    (
        "cmd=get kvsname=kvs_12593_0_296824150_vm key=PMI_process_mapping",
        &["cmd=get_result rc=0 msg=success value=(vector,(0,1,1))"],
    ),
    ("cmd=finalize", &["cmd=finalize_ack"]),
];

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

const SLURM_SESSION: &[Step] = &[
    (
        "cmd=init pmi_version=1 pmi_subversion=1",
        &["cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=1"],
    ),
    (
        "cmd=get_maxes",
        &["cmd=maxes rc=0 kvsname_max=256 keylen_max=64 vallen_max=1024"],
    ),
    ("cmd=get_appnum", &["cmd=appnum rc=0 appnum=-1"]),
    ("cmd=get_my_kvsname", &["cmd=my_kvsname rc=0 kvsname=2.0"]),
    ("cmd=get_universe_size", &["cmd=universe_size rc=0 size=2"]),
    (
        "cmd=put kvsname=2.0 key=addr-1 value=udp://127.0.0.1:50001",
        &["cmd=put_result rc=0"],
    ),
    ("cmd=barrier_in", &["cmd=barrier_out rc=0"]),
    (
        "cmd=get kvsname=2.0 key=addr-0",
        &["cmd=get_result rc=0 value=udp://127.0.0.1:50000"],
    ),
    (
        "cmd=get kvsname=2.0 key=nonexistent",
        &["cmd=get_result rc=1"],
    ),
    (
        "cmd=get kvsname=2.0 key=PMI_process_mapping",
        &["cmd=get_result rc=0 value=(vector,(0,1,2))"],
    ),
    ("cmd=finalize", &["cmd=finalize_ack rc=0"]),
];

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

/// HYDRA_INIT followed by `extra`.
fn after_init(extra: &[Step]) -> Vec<Step> {
    let mut steps = HYDRA_INIT.to_vec();
    steps.extend_from_slice(extra);
    steps
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

// The nonblocking barrier: `barrier_start`, then `barrier_poll` until true.

/// A client built by `from_socket` on one end of a socketpair, and the other
/// end, for a test to play the server by hand.
fn pollable(rank: u32, size: u32) -> (PmiClient, BufReader<UnixStream>) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    ours.set_read_timeout(Some(TIMEOUT)).unwrap();
    theirs.set_read_timeout(Some(TIMEOUT)).unwrap();
    let pmi = PmiClient::from_socket(ours, rank, size).unwrap();
    assert_eq!(pmi.mode(), Mode::Stream);
    (pmi, BufReader::new(theirs))
}

/// `pollable`, with `steps` played by a thread whose join gives the
/// server's end back.
fn pollable_scripted(
    steps: &[Step],
    rank: u32,
    size: u32,
) -> (PmiClient, JoinHandle<BufReader<UnixStream>>) {
    let steps = steps.to_vec();
    let (pmi, mut theirs) = pollable(rank, size);
    let server = thread::spawn(move || {
        play_steps(&mut theirs, &steps);
        theirs
    });
    (pmi, server)
}

/// The next request line the client sent.
fn request(theirs: &mut BufReader<UnixStream>) -> String {
    let mut line = String::new();
    theirs.read_line(&mut line).unwrap();
    line
}

/// Polls the barrier until it is over, for at most TIMEOUT.
fn poll_to_end(pmi: &mut PmiClient) -> Result<(), PmiError> {
    let start = std::time::Instant::now();
    while !pmi.barrier_poll()? {
        assert!(start.elapsed() < TIMEOUT, "barrier_poll never ended");
        thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// Every request but `abort` is refused while the barrier is in flight, and
/// nothing is sent for them.
fn assert_refused_in_flight(pmi: &mut PmiClient) {
    let in_flight = |r: Result<(), PmiError>, cmd: &str| match r {
        Err(PmiError::BarrierInFlight { cmd: c }) => assert_eq!(c, cmd),
        other => panic!("{cmd}: {other:?}"),
    };
    in_flight(pmi.get("k").map(drop), "get");
    in_flight(pmi.get_long("k").map(drop), "get");
    in_flight(pmi.put("k", "v"), "put");
    in_flight(pmi.put_long("k", "v"), "put");
    in_flight(pmi.barrier(), "barrier_in");
    in_flight(pmi.barrier_start(), "barrier_in");
    in_flight(pmi.finalize(), "finalize");
    assert!(matches!(
        pmi.init(),
        Err(PmiError::State { cmd: "init", .. })
    ));
}

/// Runs `session` (a hydra or Slurm transcript) with the nonblocking
/// barrier: its `barrier_in` step is played by hand, the reply held back
/// until the client has polled without it and sent in two pieces. `put` is
/// the session's put, `gets` its gets with their expected answers.
fn nonblocking_session(
    session: &[Step],
    rank: u32,
    size: u32,
    put: (&str, &str),
    gets: &[(&str, Option<&str>)],
) {
    let at = session
        .iter()
        .position(|(request, _)| *request == "cmd=barrier_in")
        .unwrap();
    let (before, after) = (&session[..at], &session[at + 1..]);
    let reply = session[at].1[0];

    let (mut pmi, server) = pollable_scripted(before, rank, size);
    pmi.init().unwrap();
    pmi.put(put.0, put.1).unwrap();
    let mut theirs = server.join().unwrap();

    pmi.barrier_start().unwrap();
    assert_eq!(request(&mut theirs), "cmd=barrier_in\n");
    for _ in 0..3 {
        assert!(!pmi.barrier_poll().unwrap());
    }
    assert_refused_in_flight(&mut pmi);
    // Half a line: still not over, and the call does not wait for the rest.
    let (head, tail) = reply.split_at(reply.len() / 2);
    theirs.get_mut().write_all(head.as_bytes()).unwrap();
    assert!(!pmi.barrier_poll().unwrap());
    assert!(!pmi.barrier_poll().unwrap());
    theirs
        .get_mut()
        .write_all(format!("{tail}\n").as_bytes())
        .unwrap();
    assert!(pmi.barrier_poll().unwrap());
    assert!(matches!(
        pmi.barrier_poll(),
        Err(PmiError::NoBarrierInFlight)
    ));

    let after = after.to_vec();
    let server = thread::spawn(move || play(theirs, &after));
    for (key, expected) in gets {
        assert_eq!(pmi.get(key).unwrap().as_deref(), *expected, "{key}");
    }
    pmi.finalize().unwrap();
    drop(pmi);
    server.join().unwrap();
}

#[test]
fn hydra_transcript_nonblocking_barrier() {
    nonblocking_session(
        HYDRA_SESSION,
        0,
        2,
        ("addr-0", "udp://127.0.0.1:50000"),
        &[
            ("addr-1", Some("udp://127.0.0.1:50001")),
            ("nonexistent", None),
            ("PMI_process_mapping", Some("(vector,(0,1,1))")),
        ],
    );
}

#[test]
fn slurm_transcript_nonblocking_barrier() {
    nonblocking_session(
        SLURM_SESSION,
        1,
        2,
        ("addr-1", "udp://127.0.0.1:50001"),
        &[
            ("addr-0", Some("udp://127.0.0.1:50000")),
            ("nonexistent", None),
            ("PMI_process_mapping", Some("(vector,(0,1,2))")),
        ],
    );
}

/// The blocking `barrier` of a `from_socket` client replays the transcript
/// as before.
#[test]
fn from_socket_blocking_barrier() {
    let (mut pmi, theirs) = pollable(0, 2);
    let server = thread::spawn(move || play(theirs, HYDRA_SESSION));
    pmi.init().unwrap();
    assert_eq!(pmi.kvsname(), Some(HYDRA_KVS));
    pmi.put("addr-0", "udp://127.0.0.1:50000").unwrap();
    pmi.barrier().unwrap();
    assert_eq!(
        pmi.get("addr-1").unwrap().as_deref(),
        Some("udp://127.0.0.1:50001")
    );
    assert_eq!(pmi.get("nonexistent").unwrap(), None);
    assert!(pmi.get("PMI_process_mapping").unwrap().is_some());
    pmi.finalize().unwrap();
    drop(pmi);
    server.join().unwrap();
}

/// A `barrier_out` that arrived with an earlier reply sits in the client's
/// buffer, where the socket cannot show it: the first poll finds it.
#[test]
fn barrier_out_already_buffered() {
    let put = "cmd=put kvsname=kvs_12593_0_296824150_vm key=k value=v";
    // One write carries both lines, so one read buffers both.
    let (mut pmi, server) = pollable_scripted(
        &after_init(&[(put, &["cmd=put_result rc=0 msg=success\ncmd=barrier_out"])]),
        0,
        2,
    );
    pmi.init().unwrap();
    pmi.put("k", "v").unwrap();
    let mut theirs = server.join().unwrap();
    pmi.barrier_start().unwrap();
    assert!(pmi.barrier_poll().unwrap(), "the buffered reply was missed");
    assert_eq!(request(&mut theirs), "cmd=barrier_in\n");

    // The same with only the start of the line buffered: kept, not waited
    // for, and completed by the next pieces. The server's end is played by
    // hand after init, so that the put reply can end without its `\n`.
    let (mut pmi, server) = pollable_scripted(HYDRA_INIT, 0, 2);
    pmi.init().unwrap();
    let mut theirs = server.join().unwrap();
    theirs
        .get_mut()
        .write_all(b"cmd=put_result rc=0 msg=success\ncmd=barrier_o")
        .unwrap();
    pmi.put("k", "v").unwrap();
    assert_eq!(request(&mut theirs), format!("{put}\n"));
    pmi.barrier_start().unwrap();
    assert!(!pmi.barrier_poll().unwrap());
    theirs.get_mut().write_all(b"ut rc").unwrap();
    assert!(!pmi.barrier_poll().unwrap());
    theirs.get_mut().write_all(b"=0\n").unwrap();
    assert!(pmi.barrier_poll().unwrap());
    assert_eq!(request(&mut theirs), "cmd=barrier_in\n");
    // Back to blocking requests, in step.
    theirs
        .get_mut()
        .write_all(b"cmd=get_result rc=0 msg=success value=v\n")
        .unwrap();
    assert_eq!(pmi.get("k").unwrap().as_deref(), Some("v"));
    assert_eq!(
        request(&mut theirs),
        "cmd=get kvsname=kvs_12593_0_296824150_vm key=k\n"
    );
}

#[test]
fn nonblocking_barrier_reply_errors() {
    type Check = fn(&PmiError) -> bool;
    let cases: &[(&str, Check)] = &[
        (
            "cmd=barrier_out rc=-1 msg=no",
            |e| matches!(e, PmiError::Failed { cmd: "barrier_in", rc: -1, msg } if msg == "no"),
        ),
        ("cmd=put_result rc=0", |e| {
            matches!(
                e,
                PmiError::UnexpectedReply {
                    cmd: "barrier_in",
                    expected: "barrier_out",
                    ..
                }
            )
        }),
        ("cmd=barrier_out rc", |e| {
            matches!(
                e,
                PmiError::Malformed {
                    cmd: "barrier_in",
                    ..
                }
            )
        }),
    ];
    for (reply, check) in cases {
        let (mut pmi, server) = pollable_scripted(HYDRA_INIT, 0, 2);
        pmi.init().unwrap();
        let mut theirs = server.join().unwrap();
        pmi.barrier_start().unwrap();
        assert_eq!(request(&mut theirs), "cmd=barrier_in\n");
        theirs
            .get_mut()
            .write_all(format!("{reply}\n").as_bytes())
            .unwrap();
        let err = poll_to_end(&mut pmi).unwrap_err();
        assert!(check(&err), "{reply}: {err:?}");
        // The error ended the barrier.
        assert!(matches!(
            pmi.barrier_poll(),
            Err(PmiError::NoBarrierInFlight)
        ));
    }
}

/// The server goes away while the client polls: an error, never a hang or
/// a panic, whether it closes between lines, inside one, or without reading
/// the request (a reset).
#[test]
fn closed_connection_during_barrier_poll() {
    for (partial, read_request) in [("", true), ("cmd=barrier_o", true), ("", false)] {
        let (mut pmi, server) = pollable_scripted(HYDRA_INIT, 0, 2);
        pmi.init().unwrap();
        let mut theirs = server.join().unwrap();
        pmi.barrier_start().unwrap();
        if read_request {
            assert_eq!(request(&mut theirs), "cmd=barrier_in\n");
        }
        assert!(!pmi.barrier_poll().unwrap());
        theirs.get_mut().write_all(partial.as_bytes()).unwrap();
        drop(theirs);
        let err = poll_to_end(&mut pmi).unwrap_err();
        match (partial, read_request) {
            ("", true) => assert!(
                matches!(err, PmiError::Eof { cmd: "barrier_in" }),
                "{err:?}"
            ),
            ("", false) => assert!(
                matches!(
                    err,
                    PmiError::Eof { cmd: "barrier_in" }
                        | PmiError::Io {
                            cmd: "barrier_in",
                            ..
                        }
                ),
                "{err:?}"
            ),
            _ => assert!(
                matches!(
                    err,
                    PmiError::Malformed {
                        cmd: "barrier_in",
                        source: WireError::Truncated,
                    }
                ),
                "{err:?}"
            ),
        }
        assert!(matches!(
            pmi.barrier_poll(),
            Err(PmiError::NoBarrierInFlight)
        ));
        // Later requests fail too, without hanging.
        assert!(pmi.get("k").is_err());
    }
}

/// A server sending an endless line cannot make the client buffer without
/// bound: the partial line is capped at MAX_LINE.
#[test]
fn endless_line_during_barrier_poll() {
    let (mut pmi, server) = pollable_scripted(HYDRA_INIT, 0, 2);
    pmi.init().unwrap();
    let mut theirs = server.join().unwrap();
    pmi.barrier_start().unwrap();
    assert_eq!(request(&mut theirs), "cmd=barrier_in\n");
    let writer = thread::spawn(move || {
        // Fails once the client has given up and closed its end.
        let _ = theirs
            .get_mut()
            .write_all(&vec![b'x'; udbtl_pmi::wire::MAX_LINE + 4096]);
        theirs
    });
    let err = poll_to_end(&mut pmi).unwrap_err();
    assert!(
        matches!(
            err,
            PmiError::Malformed {
                cmd: "barrier_in",
                source: WireError::LineTooLong { .. },
            }
        ),
        "{err:?}"
    );
    drop(pmi);
    writer.join().unwrap();
}

#[test]
fn nonblocking_barrier_misuse() {
    // Before init, and polling without a start: refused, nothing sent.
    let (mut pmi, server) = pollable_scripted(HYDRA_INIT, 0, 2);
    assert!(matches!(
        pmi.barrier_start(),
        Err(PmiError::State {
            cmd: "barrier_in",
            ..
        })
    ));
    assert!(matches!(
        pmi.barrier_poll(),
        Err(PmiError::NoBarrierInFlight)
    ));
    pmi.init().unwrap();
    assert!(matches!(
        pmi.barrier_poll(),
        Err(PmiError::NoBarrierInFlight)
    ));
    let mut theirs = server.join().unwrap();
    // Abort is still allowed with a barrier in flight.
    pmi.barrier_start().unwrap();
    assert_eq!(request(&mut theirs), "cmd=barrier_in\n");
    assert_refused_in_flight(&mut pmi);
    pmi.abort(2, "bye").unwrap();
    assert_eq!(request(&mut theirs), "cmd=abort exitcode=2 message=bye\n");
    drop(pmi);
    assert_eq!(request(&mut theirs), "", "refused requests were not sent");

    // A client of `new` cannot poll: refused before sending anything; its
    // blocking barrier still works.
    let (mut pmi, server) = scripted(
        &after_init(&[("cmd=barrier_in", &["cmd=barrier_out"])]),
        0,
        2,
    );
    pmi.init().unwrap();
    assert!(matches!(pmi.barrier_start(), Err(PmiError::NotPollable)));
    assert!(matches!(
        pmi.barrier_poll(),
        Err(PmiError::NoBarrierInFlight)
    ));
    pmi.barrier().unwrap();
    drop(pmi);
    server.join().unwrap();

    // Singleton: over at the first poll, same rules in between.
    let mut pmi = PmiClient::singleton();
    assert!(matches!(pmi.barrier_start(), Err(PmiError::State { .. })));
    pmi.init().unwrap();
    pmi.put("k", "v").unwrap();
    pmi.barrier_start().unwrap();
    assert_refused_in_flight(&mut pmi);
    assert!(pmi.barrier_poll().unwrap());
    assert!(matches!(
        pmi.barrier_poll(),
        Err(PmiError::NoBarrierInFlight)
    ));
    assert_eq!(pmi.get("k").unwrap().as_deref(), Some("v"));
    pmi.finalize().unwrap();
}
