//! A flood of idle connections, as an off-path host holds them against a
//! PMI port: each holder keeps one connection open without a word, and
//! opens the next the moment the server closes it. For the PMI tests of
//! the pmi and tools crates; included with `#[path]`, since tests of
//! different crates share no module otherwise.

use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::time::Duration;

/// Holds one idle connection from `connect`, reopening it as the server
/// closes it, until `stop`. Calls `opened(first)` at each connection,
/// `first` for the holder's first. Whatever the server sends (a challenge)
/// is read and ignored.
pub(crate) fn hold(
    connect: impl Fn() -> std::io::Result<TcpStream>,
    stop: impl Fn() -> bool,
    mut opened: impl FnMut(bool),
) {
    let mut first = true;
    let mut sink = [0u8; 256];
    while !stop() {
        let Ok(mut conn) = connect() else {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        };
        opened(std::mem::take(&mut first));
        if conn
            .set_read_timeout(Some(Duration::from_millis(50)))
            .is_err()
        {
            continue;
        }
        while !stop() {
            match conn.read(&mut sink) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => break,
            }
        }
    }
}
