//! Authenticated port mode over real TCP on loopback: intruders, replays,
//! wrong proofs, second claims, handshake bounds and the per-rank KVS quota.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use udbtl_pmi::auth::SECRET_ENV;
use udbtl_pmi::{
    JobSecret, KvsLimits, PmiClient, PmiError, PortOptions, Server, ServerEvent, ServerStats,
};

const TIMEOUT: Duration = Duration::from_secs(10);

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

/// The next event, which must be a refusal of a connection that is no rank;
/// returns its detail.
fn refusal(events: &Receiver<ServerEvent>) -> String {
    match next_event(events) {
        ServerEvent::ProtocolError { rank: None, detail } => detail,
        other => panic!("expected a refused connection, got {other:?}"),
    }
}

/// A job of `size` on loopback requiring `secret`: the server, its events
/// and `host:port`.
fn job(size: u32, options: PortOptions) -> (Server, Receiver<ServerEvent>, String) {
    let (tx, events) = mpsc::channel();
    let server = Server::new(size, "kvs_auth", tx).unwrap();
    let (port, _accept) = server.listen_tcp_with("127.0.0.1:0", options).unwrap();
    (server, events, format!("127.0.0.1:{port}"))
}

/// The client of rank `id`, found from the environment as a launched rank
/// would: `PMI_PORT`, `PMI_ID` and, if given, the secret.
fn from_env(addr: &str, id: u32, secret: Option<&JobSecret>) -> Result<PmiClient, PmiError> {
    let (addr, secret) = (addr.to_owned(), secret.map(JobSecret::to_hex));
    PmiClient::from_env_with(move |var| match var {
        "PMI_PORT" => Some(addr.clone()),
        "PMI_ID" => Some(id.to_string()),
        v if v == SECRET_ENV => secret.clone(),
        _ => None,
    })
}

/// init, put, barrier, get every peer, finalize.
fn session(mut pmi: PmiClient, size: u32) {
    let id = pmi.rank();
    pmi.init().unwrap();
    pmi.put(&format!("addr-{id}"), &format!("tcp-{id}"))
        .unwrap();
    pmi.barrier().unwrap();
    for peer in 0..size {
        let got = pmi.get(&format!("addr-{peer}")).unwrap();
        assert_eq!(got, Some(format!("tcp-{peer}")));
    }
    pmi.finalize().unwrap();
}

/// Runs the ranks `ids` of a job of `size` in threads, each with `secret`.
fn run_ranks(addr: &str, size: u32, ids: &[u32], secret: &JobSecret) {
    let ranks: Vec<_> = ids
        .iter()
        .map(|&id| {
            let (addr, secret) = (addr.to_owned(), secret.clone());
            thread::spawn(move || session(from_env(&addr, id, Some(&secret)).unwrap(), size))
        })
        .collect();
    for r in ranks {
        r.join().unwrap();
    }
}

fn raw(addr: &str) -> BufReader<TcpStream> {
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    BufReader::new(stream)
}

fn line(conn: &mut BufReader<TcpStream>) -> String {
    let mut line = String::new();
    conn.read_line(&mut line).unwrap();
    line
}

/// Reads what is left until the server closes the connection.
fn rest(conn: &mut BufReader<TcpStream>) -> String {
    let mut rest = String::new();
    let _ = conn.read_to_string(&mut rest);
    rest
}

fn stats_when(server: &Server, done: impl Fn(&ServerStats) -> bool) -> ServerStats {
    let start = Instant::now();
    loop {
        let stats = server.stats();
        if done(&stats) {
            return stats;
        }
        assert!(start.elapsed() < TIMEOUT, "stats never settled: {stats:?}");
        thread::sleep(Duration::from_millis(5));
    }
}

fn finalized(events: &Receiver<ServerEvent>, n: u32) {
    for _ in 0..n {
        match next_event(events) {
            ServerEvent::Finalized { .. } => {}
            other => panic!("expected Finalized, got {other:?}"),
        }
    }
}

#[test]
fn intruder_without_secret_is_refused_and_the_rank_still_joins() {
    let secret = JobSecret::generate().unwrap();
    let (server, events, addr) = job(2, PortOptions::new().with_secret(secret.clone()));

    // First intruder: reads the challenge, then claims rank 0 without proof.
    let mut intruder = raw(&addr);
    let challenge = line(&mut intruder);
    assert!(challenge.starts_with("cmd=challenge nonce="), "{challenge}");
    assert_eq!(
        challenge.trim_end().len(),
        "cmd=challenge nonce=".len() + 64
    );
    intruder
        .get_mut()
        .write_all(b"cmd=initack pmiid=0\n")
        .unwrap();
    assert_eq!(
        rest(&mut intruder),
        "cmd=initack rc=-1 msg=authentication_failed\n"
    );
    let detail = refusal(&events);
    let me = intruder.get_ref().local_addr().unwrap().to_string();
    assert!(
        detail.contains(&me) && detail.contains("no proof"),
        "{detail}"
    );

    // Second intruder: a plain PMI_PORT client, as before the secret.
    let err = PmiClient::connect_port(&addr, "0").unwrap_err();
    assert!(matches!(err, PmiError::SecretRequired), "{err:?}");
    assert!(refusal(&events).contains("no proof"));

    // The real ranks claim their ids and complete the session.
    run_ranks(&addr, 2, &[0, 1], &secret);
    finalized(&events, 2);
    let stats = server.stats();
    assert_eq!(
        (
            stats.handshake_failures,
            stats.handshakes_completed,
            stats.claims_refused
        ),
        (2, 2, 0),
        "{stats:?}"
    );
    server.shutdown();
}

/// Forwards one connection to `upstream`, recording what the client sent.
fn recording_proxy(upstream: String) -> (String, Arc<Mutex<Vec<u8>>>, thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let sent = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&sent);
    let proxy = thread::spawn(move || {
        let (mut client, _) = listener.accept().unwrap();
        let mut server = TcpStream::connect(upstream).unwrap();
        let (mut client_r, mut server_w) =
            (client.try_clone().unwrap(), server.try_clone().unwrap());
        let up = thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                match client_r.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        record.lock().unwrap().extend_from_slice(&buf[..n]);
                        server_w.write_all(&buf[..n]).unwrap();
                    }
                }
            }
            let _ = server_w.shutdown(std::net::Shutdown::Write);
        });
        let _ = std::io::copy(&mut server, &mut client);
        let _ = client.shutdown(std::net::Shutdown::Write);
        up.join().unwrap();
    });
    (addr, sent, proxy)
}

#[test]
fn replayed_handshake_is_refused() {
    let secret = JobSecret::generate().unwrap();
    let (server, events, addr) = job(2, PortOptions::new().with_secret(secret.clone()));

    // Rank 1 joins through a proxy that records every byte it sends.
    let (proxy_addr, sent, proxy) = recording_proxy(addr.clone());
    let genuine = {
        let secret = secret.clone();
        thread::spawn(move || session(from_env(&proxy_addr, 1, Some(&secret)).unwrap(), 2))
    };
    run_ranks(&addr, 2, &[0], &secret);
    genuine.join().unwrap();
    proxy.join().unwrap();
    finalized(&events, 2);
    let captured = sent.lock().unwrap().clone();
    let captured = String::from_utf8(captured).unwrap();
    let first = captured.lines().next().unwrap();
    assert!(
        first.starts_with("cmd=initack pmiid=1 proof="),
        "{captured}"
    );

    // An eavesdropper replays those exact bytes on a new connection, after
    // the challenge (or without waiting for it): the proof is refused as a
    // proof (authentication_failed), not as a second claim.
    for wait_for_challenge in [true, false] {
        let mut replay = raw(&addr);
        if wait_for_challenge {
            assert!(line(&mut replay).starts_with("cmd=challenge "));
        }
        replay.get_mut().write_all(captured.as_bytes()).unwrap();
        let answer = rest(&mut replay);
        assert!(
            answer.ends_with("cmd=initack rc=-1 msg=authentication_failed\n"),
            "{answer}"
        );
        assert!(refusal(&events).contains("wrong proof"));
    }
    let stats = server.stats();
    assert_eq!(
        (stats.handshake_failures, stats.claims_refused),
        (2, 0),
        "{stats:?}"
    );
    server.shutdown();
}

#[test]
fn wrong_proof_and_second_claim_are_refused() {
    let secret = JobSecret::generate().unwrap();
    let (server, events, addr) = job(2, PortOptions::new().with_secret(secret.clone()));

    // Another job's secret: refused.
    let other = JobSecret::generate().unwrap();
    let err = PmiClient::connect_port_authenticated(&addr, "0", &other).unwrap_err();
    assert!(
        matches!(&err, PmiError::Failed { cmd: "initack", msg, .. } if msg == "authentication_failed"),
        "{err:?}"
    );
    assert!(refusal(&events).contains("wrong proof"));

    // Rank 0 connects and stays connected.
    let mut zero = PmiClient::connect_port_authenticated(&addr, "0", &secret).unwrap();
    zero.init().unwrap();
    // A second claim of rank 0, with a valid proof: refused.
    let err = PmiClient::connect_port_authenticated(&addr, "0", &secret).unwrap_err();
    assert!(
        matches!(&err, PmiError::Failed { cmd: "initack", msg, .. } if msg == "pmiid_refused"),
        "{err:?}"
    );
    let detail = refusal(&events);
    assert!(detail.contains("second claim of rank 0"), "{detail}");
    // And without one.
    let mut claim = raw(&addr);
    line(&mut claim);
    claim.get_mut().write_all(b"cmd=initack pmiid=0\n").unwrap();
    assert_eq!(
        rest(&mut claim),
        "cmd=initack rc=-1 msg=authentication_failed\n"
    );
    refusal(&events);
    let stats = server.stats();
    assert_eq!(
        (
            stats.handshake_failures,
            stats.claims_refused,
            stats.handshakes_completed
        ),
        (2, 1, 1),
        "{stats:?}"
    );

    // The real rank 0 is unharmed; rank 1 joins.
    let one = {
        let (addr, secret) = (addr.clone(), secret.clone());
        thread::spawn(move || session(from_env(&addr, 1, Some(&secret)).unwrap(), 2))
    };
    zero.put("addr-0", "tcp-0").unwrap();
    zero.barrier().unwrap();
    assert_eq!(zero.get("addr-1").unwrap().as_deref(), Some("tcp-1"));
    zero.finalize().unwrap();
    one.join().unwrap();
    finalized(&events, 2);
    server.shutdown();
}

#[test]
fn secret_mismatch_between_client_and_server_fails_clearly() {
    // A client holding a secret, a server without one: no challenge comes.
    let (server, _events, addr) = job(1, PortOptions::new());
    let secret = JobSecret::generate().unwrap();
    let start = Instant::now();
    let err = from_env(&addr, 0, Some(&secret)).unwrap_err();
    assert!(matches!(err, PmiError::NoChallenge { .. }), "{err:?}");
    assert!(start.elapsed() < TIMEOUT);
    assert!(err.to_string().contains("sent no challenge"), "{err}");
    server.shutdown();

    // A malformed secret in the environment is not quoted.
    let err = PmiClient::from_env_with(|var| match var {
        "PMI_PORT" => Some("127.0.0.1:1".into()),
        "PMI_ID" => Some("0".into()),
        v if v == SECRET_ENV => Some("abcdef0123".into()),
        _ => None,
    })
    .unwrap_err();
    assert!(
        matches!(err, PmiError::Env { var, .. } if var == SECRET_ENV),
        "{err:?}"
    );
    assert!(!err.to_string().contains("abcdef0123"), "{err}");
}

#[test]
fn handshake_bounds_time_and_line_length() {
    let secret = JobSecret::generate().unwrap();
    let options = PortOptions::new()
        .with_secret(secret.clone())
        .with_handshake_timeout(Duration::from_millis(400));
    let (server, events, addr) = job(1, options);

    // Silent after connecting: closed at the deadline.
    let start = Instant::now();
    let mut silent = raw(&addr);
    line(&mut silent);
    assert_eq!(rest(&mut silent), "");
    // Closed by the 400 ms deadline (the refusal says so), not left open:
    // a bound far above any machine's delay, not a speed test.
    assert!(start.elapsed() < Duration::from_secs(30));
    assert!(refusal(&events).contains("not done within"));

    // Dribbling a byte every 100 ms: cut off at the deadline all the same.
    let mut dribble = raw(&addr);
    line(&mut dribble);
    let start = Instant::now();
    for b in b"cmd=initack pmiid=0 proof=0000000000000000" {
        if dribble.get_mut().write_all(&[*b]).is_err() {
            break;
        }
        thread::sleep(Duration::from_millis(100));
        if start.elapsed() > Duration::from_secs(3) {
            panic!("the server kept a dribbling connection open");
        }
    }
    assert!(refusal(&events).contains("not done within"));

    // A line over wire::MAX_LINE: closed with a clear error, not buffered.
    let mut long = raw(&addr);
    line(&mut long);
    let _ = long
        .get_mut()
        .write_all(&vec![b'x'; udbtl_pmi::wire::MAX_LINE + 100]);
    let detail = refusal(&events);
    assert!(detail.contains("longer than 65536 bytes"), "{detail}");

    let stats = server.stats();
    assert_eq!(stats.handshake_failures, 3, "{stats:?}");
    // The rank still joins.
    run_ranks(&addr, 1, &[0], &secret);
    finalized(&events, 1);
    server.shutdown();
}

#[test]
fn kvs_quota_closes_the_rank() {
    let secret = JobSecret::generate().unwrap();
    let (server, events, addr) = job(1, PortOptions::new().with_secret(secret.clone()));
    server.set_kvs_limits(KvsLimits {
        bytes: 1 << 20,
        keys: 16,
    });
    let mut pmi = from_env(&addr, 0, Some(&secret)).unwrap();
    pmi.init().unwrap();
    for i in 0..16 {
        pmi.put(&format!("k{i}"), "v").unwrap();
    }
    let err = pmi.put("k16", "v").unwrap_err();
    assert!(
        matches!(&err, PmiError::Failed { cmd: "put", msg, .. } if msg == "kvs_quota_exceeded"),
        "{err:?}"
    );
    match next_event(&events) {
        ServerEvent::ProtocolError {
            rank: Some(0),
            detail,
        } => assert!(
            detail.contains("quota of 1048576 bytes and 16 keys"),
            "{detail}"
        ),
        other => panic!("{other:?}"),
    }
    // The connection is closed.
    assert!(pmi.get("k0").is_err());
    stats_when(&server, |s| s.protocol_errors == 1);

    // The bytes cap, at its default of 1 MiB: entries of 5 + 1023 bytes,
    // 1020 fit (1 048 560 bytes), the next does not.
    let (server, events, addr) = job(1, PortOptions::new().with_secret(secret.clone()));
    let mut pmi = from_env(&addr, 0, Some(&secret)).unwrap();
    pmi.init().unwrap();
    let value = "v".repeat(1023);
    for i in 0..1020 {
        pmi.put(&format!("k{i:04}"), &value).unwrap();
    }
    let err = pmi.put("k1020", &value).unwrap_err();
    assert!(
        matches!(&err, PmiError::Failed { cmd: "put", .. }),
        "{err:?}"
    );
    assert!(matches!(
        next_event(&events),
        ServerEvent::ProtocolError { rank: Some(0), .. }
    ));
    server.shutdown();
}

#[test]
fn a_completed_handshake_is_announced_before_anything_else_of_its_rank() {
    let secret = JobSecret::generate().unwrap();
    let (server, events, addr) = job(2, PortOptions::new().with_secret(secret.clone()));
    // A refused connection announces nothing but its refusal.
    assert!(from_env(&addr, 1, None).is_err());
    match events.recv_timeout(TIMEOUT).unwrap() {
        ServerEvent::ProtocolError { rank: None, .. } => {}
        other => panic!("expected the refusal, got {other:?}"),
    }
    let mut pmi = from_env(&addr, 1, Some(&secret)).unwrap();
    match events.recv_timeout(TIMEOUT).unwrap() {
        ServerEvent::Connected { rank: 1 } => {}
        other => panic!("expected Connected for rank 1, got {other:?}"),
    }
    pmi.init().unwrap();
    pmi.finalize().unwrap();
    match events.recv_timeout(TIMEOUT).unwrap() {
        ServerEvent::Finalized { rank: 1 } => {}
        other => panic!("expected Finalized, got {other:?}"),
    }
    server.shutdown();
}
