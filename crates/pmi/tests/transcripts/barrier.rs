//! The nonblocking barrier: `barrier_start`, then `barrier_poll` until
//! true, against the same transcripts and against broken servers.

use super::*;

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
