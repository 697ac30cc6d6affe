//! The client against our own threaded `Server`: socketpairs (the `PMI_FD`
//! path of udrun) and TCP port mode, with events checked on the channel.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{self, Receiver};
use std::thread;
use std::time::{Duration, Instant};

use udbtl_pmi::{PmiClient, PmiError, Server, ServerError, ServerEvent};

const TIMEOUT: Duration = Duration::from_secs(10);

/// A connected client for `rank`, served by `server` on a socketpair.
fn connect(server: &Server, rank: u32, size: u32) -> (PmiClient, thread::JoinHandle<()>) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    ours.set_read_timeout(Some(TIMEOUT)).unwrap();
    let handle = server.serve(theirs, rank).unwrap();
    let reader = BufReader::new(ours.try_clone().unwrap());
    (PmiClient::new(reader, ours, rank, size).unwrap(), handle)
}

/// A client built by `from_socket` (which can poll the barrier) for `rank`,
/// served by `server` on a socketpair.
fn connect_pollable(server: &Server, rank: u32, size: u32) -> (PmiClient, thread::JoinHandle<()>) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    ours.set_read_timeout(Some(TIMEOUT)).unwrap();
    let handle = server.serve(theirs, rank).unwrap();
    (PmiClient::from_socket(ours, rank, size).unwrap(), handle)
}

/// Polls the barrier until it is over, for at most TIMEOUT.
fn poll_to_end(pmi: &mut PmiClient) -> Result<(), PmiError> {
    let start = Instant::now();
    while !pmi.barrier_poll()? {
        assert!(start.elapsed() < TIMEOUT, "barrier_poll never ended");
        thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// A raw socket for `rank`, to send bytes no client would.
fn connect_raw(server: &Server, rank: u32) -> (BufReader<UnixStream>, thread::JoinHandle<()>) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    ours.set_read_timeout(Some(TIMEOUT)).unwrap();
    let handle = server.serve(theirs, rank).unwrap();
    (BufReader::new(ours), handle)
}

/// The next event other than [`ServerEvent::Connected`] (which every
/// port-mode rank sends first).
fn next_event(events: &Receiver<ServerEvent>) -> ServerEvent {
    loop {
        match events.recv_timeout(TIMEOUT).expect("no server event") {
            ServerEvent::Connected { .. } => {}
            event => return event,
        }
    }
}

fn hex(bytes: impl IntoIterator<Item = u8>) -> String {
    bytes.into_iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn eight_ranks_exchange_addresses() {
    const N: u32 = 8;
    let (tx, events) = mpsc::channel();
    let server = Server::new(N, "kvs_udrun_1", tx).unwrap();
    let mut threads = Vec::new();
    for rank in 0..N {
        let (mut pmi, served) = connect(&server, rank, N);
        threads.push(served);
        threads.push(thread::spawn(move || {
            pmi.init().unwrap();
            assert_eq!(pmi.kvsname(), Some("kvs_udrun_1"));
            assert_eq!(pmi.universe_size(), Some(N));
            assert_eq!(pmi.appnum(), Some(0));
            pmi.put(
                &format!("addr-{rank}"),
                &format!("udp://127.0.0.1:{}", 50_000 + rank),
            )
            .unwrap();
            // 2500 bytes as hex: 5000 characters, five chunks at vallen_max 1024.
            let blob = hex((0..2500u32).map(|i| (i * 7 + rank) as u8));
            pmi.put_long(&format!("blob-{rank}"), &blob).unwrap();
            pmi.barrier().unwrap();

            for peer in (0..N).filter(|&p| p != rank) {
                let addr = pmi.get(&format!("addr-{peer}")).unwrap();
                assert_eq!(addr, Some(format!("udp://127.0.0.1:{}", 50_000 + peer)));
            }
            let next = (rank + 1) % N;
            let long = pmi.get_long(&format!("blob-{next}")).unwrap().unwrap();
            assert_eq!(long.len(), 5000);
            assert_eq!(long, hex((0..2500u32).map(|i| (i * 7 + next) as u8)));
            // The chunk layout: "<count>:" header under the key, then key#1..
            let head = pmi.get(&format!("blob-{next}")).unwrap().unwrap();
            assert!(head.starts_with("5:"), "{}", &head[..8]);
            assert!(pmi.get(&format!("blob-{next}#4")).unwrap().is_some());
            assert_eq!(pmi.get(&format!("blob-{next}#5")).unwrap(), None);

            assert_eq!(pmi.get("no-such-key").unwrap(), None);
            assert_eq!(pmi.get_long("no-such-key").unwrap(), None);
            assert_eq!(
                pmi.get("PMI_process_mapping").unwrap().as_deref(),
                Some("(vector,(0,1,8))")
            );
            // A second barrier works too (the epoch moved on).
            pmi.barrier().unwrap();
            pmi.finalize().unwrap();
        }));
    }
    let mut finalized = vec![false; N as usize];
    for _ in 0..N {
        match next_event(&events) {
            ServerEvent::Finalized { rank } => finalized[rank as usize] = true,
            other => panic!("{other:?}"),
        }
    }
    assert!(finalized.iter().all(|&f| f));
    for t in threads {
        t.join().unwrap();
    }
    // Closing after finalize is not a disconnection.
    assert!(events.recv_timeout(Duration::from_millis(100)).is_err());
}

#[test]
fn abort_is_reported() {
    let (tx, events) = mpsc::channel();
    let server = Server::new(2, "kvs_abort", tx).unwrap();
    let (mut pmi, served) = connect(&server, 1, 2);
    pmi.init().unwrap();
    pmi.abort(3, "rank 1 gave up").unwrap();
    match next_event(&events) {
        ServerEvent::Aborted {
            rank: 1,
            code: 3,
            message,
        } => assert_eq!(message, "rank_1_gave_up"),
        other => panic!("{other:?}"),
    }
    drop(pmi);
    served.join().unwrap();
    // After an abort, the closed connection is not reported again.
    assert!(events.recv_timeout(Duration::from_millis(100)).is_err());
}

#[test]
fn disconnect_before_finalize_is_reported() {
    let (tx, events) = mpsc::channel();
    let server = Server::new(2, "kvs_drop", tx).unwrap();
    let (mut pmi, served) = connect(&server, 0, 2);
    pmi.init().unwrap();
    drop(pmi);
    assert!(matches!(
        next_event(&events),
        ServerEvent::Disconnected {
            rank: 0,
            error: None
        }
    ));
    served.join().unwrap();
    // A rank can only be served once.
    let (_ours, theirs) = UnixStream::pair().unwrap();
    assert!(matches!(
        server.serve(theirs, 0),
        Err(ServerError::AlreadyConnected { rank: 0 })
    ));
    let (_ours, theirs) = UnixStream::pair().unwrap();
    assert!(matches!(
        server.serve(theirs, 2),
        Err(ServerError::RankOutOfRange { rank: 2, size: 2 })
    ));
}

#[test]
fn malformed_input_is_answered_and_reported_without_harm() {
    const N: u32 = 4;
    let (tx, events) = mpsc::channel();
    let server = Server::new(N, "kvs_bad", tx).unwrap();

    // Rank 0 is a well-behaved client that waits in a barrier meanwhile.
    let (mut good, good_served) = connect(&server, 0, N);
    good.init().unwrap();
    good.put("ok", "1").unwrap();

    // Rank 1: a line without '=' gets an error reply, then the connection closes.
    let (mut raw, served1) = connect_raw(&server, 1);
    raw.get_mut().write_all(b"garbage\n").unwrap();
    let mut line = String::new();
    raw.read_line(&mut line).unwrap();
    assert_eq!(line, "cmd=error rc=-1 msg=malformed_request\n");
    assert_eq!(raw.read_line(&mut line).unwrap(), 0, "connection closed");
    assert!(matches!(
        next_event(&events),
        ServerEvent::ProtocolError { rank: Some(1), .. }
    ));
    served1.join().unwrap();

    // Rank 2: an endless line without '\n' is cut off at the limit.
    let (mut raw, served2) = connect_raw(&server, 2);
    let chunk = vec![b'x'; 8192];
    let mut rest = Vec::new();
    for _ in 0..9 {
        if raw.get_mut().write_all(&chunk).is_err() {
            break;
        }
    }
    let _ = raw.read_to_end(&mut rest);
    match next_event(&events) {
        ServerEvent::ProtocolError {
            rank: Some(2),
            detail,
        } => {
            assert!(detail.contains("longer than"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
    served2.join().unwrap();

    // Rank 3: non-UTF-8, then (never read) more requests.
    let (mut raw, served3) = connect_raw(&server, 3);
    raw.get_mut()
        .write_all(b"cmd=put key=\xff\xfe value=1\ncmd=get_appnum\n")
        .unwrap();
    let mut rest = String::new();
    raw.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "cmd=error rc=-1 msg=malformed_request\n");
    assert!(matches!(
        next_event(&events),
        ServerEvent::ProtocolError { rank: Some(3), .. }
    ));
    served3.join().unwrap();

    // The good rank is unaffected.
    assert_eq!(good.get("ok").unwrap().as_deref(), Some("1"));
    assert_eq!(good.get("garbage").unwrap(), None);
    good.finalize().unwrap();
    assert!(matches!(
        next_event(&events),
        ServerEvent::Finalized { rank: 0 }
    ));
    drop(good);
    good_served.join().unwrap();
}

#[test]
fn protocol_violations_after_parsing() {
    let (tx, events) = mpsc::channel();
    let server = Server::new(1, "kvs_v", tx).unwrap();
    let (mut raw, served) = connect_raw(&server, 0);
    let w = raw.get_mut();
    w.write_all(
        b"cmd=hello\nmcmd=spawn\nnprocs=1\nexecname=x\nendcmd\ncmd=finalize\ncmd=get_appnum\n",
    )
    .unwrap();
    let mut rest = String::new();
    raw.read_to_string(&mut rest).unwrap();
    assert_eq!(
        rest,
        "cmd=hello_result rc=-1 msg=unknown_command\n\
         cmd=spawn_result rc=-1 msg=spawn_not_supported\n\
         cmd=finalize_ack rc=0\n\
         cmd=get_appnum_result rc=-1 msg=already_finalized\n"
    );
    assert!(matches!(
        next_event(&events),
        ServerEvent::Finalized { rank: 0 }
    ));
    assert!(matches!(
        next_event(&events),
        ServerEvent::ProtocolError { rank: Some(0), .. }
    ));
    served.join().unwrap();
}

#[test]
fn shutdown_releases_a_held_barrier() {
    let (tx, _events) = mpsc::channel();
    let server = Server::new(2, "kvs_sd", tx).unwrap();
    let (mut pmi, served) = connect(&server, 0, 2);
    pmi.init().unwrap();
    let waiter = thread::spawn(move || pmi.barrier());
    thread::sleep(Duration::from_millis(50));
    server.shutdown();
    match waiter.join().unwrap() {
        Err(PmiError::Failed {
            cmd: "barrier_in",
            rc: -1,
            msg,
        }) => assert_eq!(msg, "server_shutdown"),
        other => panic!("{other:?}"),
    }
    served.join().unwrap();
}

#[test]
fn port_mode_against_our_server() {
    const N: u32 = 3;
    let (tx, events) = mpsc::channel();
    let server = Server::new(N, "kvs_port", tx).unwrap();
    let (port, accept) = server.listen_tcp("127.0.0.1:0").unwrap();
    let addr = format!("127.0.0.1:{port}");

    // A stranger with a bad pmiid is refused and reported.
    let mut stranger = TcpStream::connect(&addr).unwrap();
    stranger.set_read_timeout(Some(TIMEOUT)).unwrap();
    stranger.write_all(b"cmd=initack pmiid=7\n").unwrap();
    let mut reply = String::new();
    stranger.read_to_string(&mut reply).unwrap();
    assert_eq!(reply, "cmd=initack rc=-1 msg=pmiid_refused\n");
    assert!(matches!(
        next_event(&events),
        ServerEvent::ProtocolError { rank: None, .. }
    ));

    let clients: Vec<_> = (0..N)
        .map(|id| {
            let addr = addr.clone();
            thread::spawn(move || {
                let env = |var: &str| match var {
                    "PMI_PORT" => Some(addr.clone()),
                    "PMI_ID" => Some(id.to_string()),
                    _ => None,
                };
                let mut pmi = PmiClient::from_env_with(env).unwrap();
                assert_eq!((pmi.rank(), pmi.size()), (id, N));
                pmi.init().unwrap();
                pmi.put(&format!("addr-{id}"), &format!("tcp-{id}"))
                    .unwrap();
                pmi.barrier().unwrap();
                for peer in 0..N {
                    let got = pmi.get(&format!("addr-{peer}")).unwrap();
                    assert_eq!(got, Some(format!("tcp-{peer}")));
                }
                pmi.finalize().unwrap();
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    for _ in 0..N {
        assert!(matches!(next_event(&events), ServerEvent::Finalized { .. }));
    }
    // A second connection for a served rank is refused.
    let err = PmiClient::connect_port(&addr, "0").unwrap_err();
    assert!(
        matches!(err, PmiError::Failed { cmd: "initack", .. }),
        "{err:?}"
    );
    assert!(matches!(
        next_event(&events),
        ServerEvent::ProtocolError { rank: None, .. }
    ));

    server.shutdown();
    accept.join().unwrap();
}

#[test]
fn singleton_works_alone() {
    let mut pmi = PmiClient::from_env_with(|_| None).unwrap();
    assert!(pmi.is_singleton());
    assert_eq!((pmi.rank(), pmi.size()), (0, 1));
    assert!(matches!(pmi.put("k", "v"), Err(PmiError::State { .. })));
    pmi.init().unwrap();
    assert_eq!(pmi.universe_size(), Some(1));
    pmi.put("addr-0", "udp://127.0.0.1:1").unwrap();
    pmi.barrier().unwrap();
    assert_eq!(
        pmi.get("addr-0").unwrap().as_deref(),
        Some("udp://127.0.0.1:1")
    );
    assert_eq!(pmi.get("missing").unwrap(), None);
    assert_eq!(
        pmi.get("PMI_process_mapping").unwrap().as_deref(),
        Some("(vector,(0,1,1))")
    );
    assert!(matches!(
        pmi.put("PMI_x", "v"),
        Err(PmiError::InvalidKey { .. })
    ));
    let long = "ab".repeat(3000);
    pmi.put_long("long", &long).unwrap();
    assert_eq!(pmi.get_long("long").unwrap(), Some(long));
    pmi.put("plain", "no-header").unwrap();
    assert!(matches!(
        pmi.get_long("plain"),
        Err(PmiError::LongValue { .. })
    ));
    pmi.put("broken", "3:abc").unwrap();
    assert!(matches!(
        pmi.get_long("broken"),
        Err(PmiError::LongValue { .. })
    ));
    // 7000 bytes take 7 chunks: key#6 must fit below keylen_max (64).
    let key = "k".repeat(62);
    assert!(matches!(
        pmi.put_long(&key, &"x".repeat(7000)),
        Err(PmiError::InvalidKey { .. })
    ));
    assert_eq!(pmi.get(&key).unwrap(), None, "nothing stored on refusal");
    pmi.put_long(&"k".repeat(60), &"x".repeat(7000)).unwrap();
    pmi.abort(1, "ignored").unwrap();
    pmi.finalize().unwrap();
    assert!(matches!(
        pmi.finalize(),
        Err(PmiError::State {
            cmd: "finalize",
            ..
        })
    ));
}

/// Ranks enter the barrier one after the other, from one thread: nobody's
/// poll ends until the last has entered, then everybody's does. A second
/// barrier mixes blocking and polling ranks.
#[test]
fn nonblocking_barrier_waits_for_the_last_rank() {
    const N: u32 = 4;
    let (tx, events) = mpsc::channel();
    let server = Server::new(N, "kvs_nb", tx).unwrap();
    server.report_barriers();
    let mut served = Vec::new();
    let mut ranks: Vec<PmiClient> = (0..N)
        .map(|rank| {
            let (mut pmi, handle) = connect_pollable(&server, rank, N);
            served.push(handle);
            pmi.init().unwrap();
            pmi.put(&format!("addr-{rank}"), &format!("nb-{rank}"))
                .unwrap();
            pmi
        })
        .collect();

    for entering in 0..N as usize {
        ranks[entering].barrier_start().unwrap();
        if entering + 1 < ranks.len() {
            // Time for a wrong early barrier_out to arrive.
            thread::sleep(Duration::from_millis(30));
            for (rank, pmi) in ranks.iter_mut().enumerate().take(entering + 1) {
                assert!(
                    !pmi.barrier_poll().unwrap(),
                    "rank {rank} released with {} of {N} in",
                    entering + 1
                );
            }
            assert!(events.try_recv().is_err(), "released early");
        }
    }
    assert!(matches!(
        next_event(&events),
        ServerEvent::BarrierReleased { epoch: 1 }
    ));
    for pmi in &mut ranks {
        poll_to_end(pmi).unwrap();
        for peer in 0..N {
            let got = pmi.get(&format!("addr-{peer}")).unwrap();
            assert_eq!(got, Some(format!("nb-{peer}")));
        }
    }

    // Second barrier: ranks 0 and 1 block in their own threads, 2 and 3
    // poll here; the server sees the same wire either way.
    let mut polling = ranks.split_off(2);
    let blocking: Vec<_> = ranks
        .into_iter()
        .map(|mut pmi| {
            thread::spawn(move || {
                pmi.barrier().unwrap();
                pmi
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(30));
    polling[0].barrier_start().unwrap();
    thread::sleep(Duration::from_millis(30));
    assert!(!polling[0].barrier_poll().unwrap());
    polling[1].barrier_start().unwrap();
    for pmi in &mut polling {
        poll_to_end(pmi).unwrap();
    }
    assert!(matches!(
        next_event(&events),
        ServerEvent::BarrierReleased { epoch: 2 }
    ));
    let mut all: Vec<PmiClient> = blocking.into_iter().map(|t| t.join().unwrap()).collect();
    all.append(&mut polling);
    for pmi in &mut all {
        pmi.finalize().unwrap();
    }
    for _ in 0..N {
        assert!(matches!(next_event(&events), ServerEvent::Finalized { .. }));
    }
    drop(all);
    for handle in served {
        handle.join().unwrap();
    }
}

#[test]
fn shutdown_ends_a_polled_barrier() {
    let (tx, _events) = mpsc::channel();
    let server = Server::new(2, "kvs_nb_sd", tx).unwrap();
    let (mut pmi, served) = connect_pollable(&server, 0, 2);
    pmi.init().unwrap();
    pmi.barrier_start().unwrap();
    thread::sleep(Duration::from_millis(30));
    assert!(!pmi.barrier_poll().unwrap());
    server.shutdown();
    match poll_to_end(&mut pmi) {
        Err(PmiError::Failed {
            cmd: "barrier_in",
            rc: -1,
            msg,
        }) => assert_eq!(msg, "server_shutdown"),
        other => panic!("{other:?}"),
    }
    // The server closed the connection after its reply.
    let err = pmi.get("k").unwrap_err();
    assert!(
        matches!(
            err,
            PmiError::Eof { cmd: "get" } | PmiError::Io { cmd: "get", .. }
        ),
        "{err:?}"
    );
    served.join().unwrap();
}

/// Port mode (TCP) clients poll too.
#[test]
fn nonblocking_barrier_in_port_mode() {
    let (tx, events) = mpsc::channel();
    let server = Server::new(2, "kvs_nb_port", tx).unwrap();
    let (port, accept) = server.listen_tcp("127.0.0.1:0").unwrap();
    let addr = format!("127.0.0.1:{port}");
    let mut ranks: Vec<PmiClient> = (0..2)
        .map(|id| {
            let mut pmi = PmiClient::connect_port(&addr, &id.to_string()).unwrap();
            pmi.init().unwrap();
            pmi
        })
        .collect();
    ranks[1].barrier_start().unwrap();
    thread::sleep(Duration::from_millis(30));
    assert!(!ranks[1].barrier_poll().unwrap());
    ranks[0].barrier_start().unwrap();
    for pmi in &mut ranks {
        poll_to_end(pmi).unwrap();
        pmi.finalize().unwrap();
    }
    for _ in 0..2 {
        assert!(matches!(next_event(&events), ServerEvent::Finalized { .. }));
    }
    server.shutdown();
    accept.join().unwrap();
}
