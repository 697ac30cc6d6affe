//! An off-path host holds 128 idle connections to an authenticated
//! port-mode server (twice the default handshake cap) and opens a new one
//! as soon as any closes, while the real ranks join from another address.
//! The ranks must still get in: one address gets at most
//! `DEFAULT_MAX_HANDSHAKES_PER_SOURCE` handshake slots, and as many more
//! of its connections as the cap wait without one; the rest are closed.
//! (Before, the server closed every connection beyond 64 whoever sent it,
//! and the flood, reconnecting at once, took each freed slot ahead of a
//! rank that waited up to 500 ms between attempts: the ranks gave up after
//! 30 s.) Alone in its binary: it holds 128 threads and sockets.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../../tests/support/idle_flood.rs"]
mod idle_flood;

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use socket2::{Domain, Socket, Type};
use udbtl_pmi::auth::SECRET_ENV;
use udbtl_pmi::server::{DEFAULT_MAX_HANDSHAKES, DEFAULT_MAX_HANDSHAKES_PER_SOURCE};
use udbtl_pmi::{JobSecret, PmiClient, PortOptions, Server};

const SIZE: u32 = 2;
/// Where the flood comes from: another loopback address than the ranks'.
const FLOOD_FROM: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// A connection to `to` from `FLOOD_FROM`.
fn connect_from_flood(to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    socket.bind(&SocketAddr::from((FLOOD_FROM, 0)).into())?;
    socket.connect(&to.into())?;
    Ok(socket.into())
}

#[test]
fn ranks_join_while_one_host_holds_every_handshake_slot() {
    let secret = JobSecret::generate().unwrap();
    let (tx, _events) = mpsc::channel();
    let server = Server::new(SIZE, "kvs_held", tx).unwrap();
    let (port, accept) = server
        .listen_tcp_with(
            "127.0.0.1:0",
            PortOptions::new().with_secret(secret.clone()),
        )
        .unwrap();
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));

    // The holders: each keeps one idle connection open, and opens the next
    // the moment the server closes it.
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicU64::new(0));
    let holders: Vec<_> = (0..2 * DEFAULT_MAX_HANDSHAKES)
        .map(|_| {
            let (stop, opened) = (Arc::clone(&stop), Arc::clone(&opened));
            thread::spawn(move || {
                idle_flood::hold(
                    || connect_from_flood(addr),
                    || stop.load(Ordering::Relaxed),
                    |_| {
                        opened.fetch_add(1, Ordering::Relaxed);
                    },
                );
            })
        })
        .collect();
    // The flood is in place before the ranks come: it holds what the
    // server gives one address.
    while opened.load(Ordering::Relaxed) < 2 * DEFAULT_MAX_HANDSHAKES as u64
        || server.stats().handshakes_in_progress < DEFAULT_MAX_HANDSHAKES_PER_SOURCE as u64
        || server.stats().connections_refused_over_cap == 0
    {
        thread::sleep(Duration::from_millis(5));
    }

    let ranks: Vec<_> = (0..SIZE)
        .map(|id| {
            let hex = secret.to_hex();
            thread::spawn(move || -> Result<(), String> {
                let mut pmi = PmiClient::from_env_with(|var| match var {
                    "PMI_PORT" => Some(addr.to_string()),
                    "PMI_ID" => Some(id.to_string()),
                    v if v == SECRET_ENV => Some(hex.clone()),
                    _ => None,
                })
                .map_err(|e| format!("rank {id} could not connect: {e}"))?;
                pmi.init().map_err(|e| e.to_string())?;
                pmi.put(&format!("addr-{id}"), &format!("tcp-{id}"))
                    .map_err(|e| e.to_string())?;
                pmi.barrier().map_err(|e| e.to_string())?;
                for peer in 0..SIZE {
                    let got = pmi
                        .get(&format!("addr-{peer}"))
                        .map_err(|e| e.to_string())?;
                    if got != Some(format!("tcp-{peer}")) {
                        return Err(format!("rank {id}: addr-{peer} is {got:?}"));
                    }
                }
                pmi.finalize().map_err(|e| e.to_string())
            })
        })
        .collect();
    let results: Vec<_> = ranks.into_iter().map(|r| r.join().unwrap()).collect();
    stop.store(true, Ordering::Relaxed);
    for holder in holders {
        holder.join().unwrap();
    }
    let stats = server.stats();
    eprintln!(
        "{} flood connections opened; {stats:?}",
        opened.load(Ordering::Relaxed)
    );
    for result in results {
        result.unwrap();
    }
    assert_eq!(stats.handshakes_completed, u64::from(SIZE), "{stats:?}");
    server.shutdown();
    accept.join().unwrap();
}
