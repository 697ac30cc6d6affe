//! Fuzz targets: each takes any bytes and must neither panic nor break the
//! invariant it states. `fuzz/` runs them under libFuzzer (`cargo +nightly
//! fuzz run <name>`); `tests/corpus.rs` replays the committed corpus
//! (`corpus/<name>/`) and a burst of random inputs through them on stable,
//! which CI does.

use std::io::BufReader;

use arbitrary::{Arbitrary, Unstructured};
use udbtl_btl::{BtlConfig, Params};
use udbtl_pmi::wire::{self as pmi_wire, Message};
use udbtl_reliability::{Config, Instant, PeerId, Receipt, Reliability, Room};
use udbtl_wire::{SeqNum, btl, coalesced, datagram, modex, rel, ud};

/// A target: its name (the corpus folder) and its function.
pub type Target = (&'static str, fn(&[u8]));

/// Every target.
pub const TARGETS: [Target; 5] = [
    ("headers", headers),
    ("reliability", reliability),
    ("coalesced", coalesced_records),
    ("pmi_line", pmi_line),
    ("params", params),
];

/// Header parsing: the UD, BTL and reliability headers, the checksum, and a
/// modex blob. What parses emits back to the same bytes' meaning: parse,
/// emit, parse gives the same value.
pub fn headers(data: &[u8]) {
    if let Ok(repr) = ud::Packet::new_checked(data).and_then(|p| ud::Repr::parse(&p)) {
        let bytes = repr.to_bytes();
        let again = ud::Packet::new_checked(&bytes[..]).and_then(|p| ud::Repr::parse(&p));
        assert_eq!(again, Ok(repr), "UD header round trip");
    }
    if let Ok(repr) = btl::Packet::new_checked(data).and_then(|p| btl::Repr::parse(&p)) {
        let mut bytes = vec![0u8; repr.buffer_len()];
        repr.emit(&mut btl::Packet::new_unchecked(&mut bytes[..]));
        let again = btl::Packet::new_checked(&bytes[..]).and_then(|p| btl::Repr::parse(&p));
        assert_eq!(again, Ok(repr), "BTL header round trip");
    }
    if let Ok(repr) = datagram::extension(data).and_then(|p| rel::Repr::parse(&p)) {
        let mut bytes = [0u8; rel::HEADER_LEN];
        repr.emit(&mut rel::Packet::new_unchecked(&mut bytes[..]));
        let again = rel::Packet::new_checked(&bytes[..]).and_then(|p| rel::Repr::parse(&p));
        assert_eq!(again, Ok(repr), "reliability header round trip");
    }
    let _ = datagram::verify_checksum(data);
    if let Ok(addresses) = modex::parse_blob(data) {
        if let Ok(blob) = modex::emit_blob(&addresses) {
            assert_eq!(
                modex::parse_blob(&blob).as_ref(),
                Ok(&addresses),
                "modex round trip"
            );
        }
    }
}

/// One step of the reliability target.
#[derive(Debug, Arbitrary)]
enum Op {
    /// Queue a fragment for a peer.
    Send { peer: u8 },
    /// A datagram from a peer, with any header.
    Datagram {
        peer: u8,
        seq: u32,
        ack: u32,
        sack: u64,
        credit: u16,
        flags: u16,
        in_order: bool,
        early: bool,
    },
    /// Time passes, then due timers fire.
    Wait { micros: u16, defer_failures: bool },
    /// The credit this side advertises.
    Credit(u16),
    /// The caller did not run for a while.
    Resume { millis: u16 },
    /// The caller closes a peer.
    Close { peer: u8 },
}

/// Sequences of datagrams, sends and timers into the reliability core, with
/// every output drained after each step. Invariants: no panic, and never
/// more fragments reported (acknowledged or failed) than were sent.
pub fn reliability(data: &[u8]) {
    const PEERS: u8 = 3;
    let mut u = Unstructured::new(data);
    let config = Config {
        window: u.int_in_range(1..=64).unwrap_or(16),
        initial_credit: 1,
        keepalive: u.arbitrary().unwrap_or(false),
        ..Config::default()
    };
    let config = Config {
        initial_cwnd: config.window.min(16),
        ..config
    };
    let Ok(mut core) = Reliability::<u32, u32>::new(config) else {
        return;
    };
    let mut now = Instant::ZERO;
    for _ in 0..PEERS {
        core.add_peer();
    }
    let (mut sent, mut reported, mut next_frag, mut next_buf) = (0u64, 0u64, 0u32, 0u32);
    let mut steps = 0;
    while let Ok(op) = u.arbitrary::<Op>() {
        steps += 1;
        if steps > 2000 {
            break;
        }
        match op {
            Op::Send { peer } => {
                if core
                    .send(now, PeerId(u32::from(peer % PEERS)), next_frag)
                    .is_ok()
                {
                    sent += 1;
                }
                next_frag += 1;
            }
            Op::Datagram {
                peer,
                seq,
                ack,
                sack,
                credit,
                flags,
                in_order,
                early,
            } => {
                let header = rel::Repr {
                    src: 0,
                    seq: SeqNum(seq),
                    ack: SeqNum(ack),
                    sack,
                    credit,
                    flags,
                    checksum: 0,
                };
                let room = Room { in_order, early };
                let receipt = core.on_datagram(
                    now,
                    PeerId(u32::from(peer % PEERS)),
                    &header,
                    next_buf,
                    room,
                );
                next_buf += 1;
                if let Receipt::Discard(buf, _) | Receipt::Deliver(buf) = receipt {
                    assert!(buf < next_buf);
                }
            }
            Op::Wait {
                micros,
                defer_failures,
            } => {
                now = now + std::time::Duration::from_micros(u64::from(micros) * 16);
                if defer_failures {
                    core.handle_timeout_deferring_failures(now);
                } else {
                    core.handle_timeout(now);
                }
            }
            Op::Credit(credit) => core.set_credit(credit),
            Op::Resume { millis } => {
                now = now + std::time::Duration::from_millis(u64::from(millis));
                core.resume(now);
            }
            Op::Close { peer } => core.close_peer(now, PeerId(u32::from(peer % PEERS))),
        }
        while core.poll_deliver().is_some() {}
        while core.poll_transmit(now).is_some() {}
        while core.poll_reclaim().is_some() {}
        while let Some(event) = core.poll_event() {
            if matches!(
                event,
                udbtl_reliability::Event::Acked { .. } | udbtl_reliability::Event::Failed { .. }
            ) {
                reported += 1;
            }
        }
        let _ = core.poll_timeout();
        assert!(
            reported <= sent,
            "{reported} fragments reported of {sent} sent"
        );
    }
}

/// Coalesced record lists: iterating never panics, and `validate` agrees
/// with the iteration (the count of records, or an error exactly when the
/// iteration meets one; an empty list is an error). A list built with
/// `append` from the input's pieces, if there are any, parses back to them.
pub fn coalesced_records(data: &[u8]) {
    let parsed: Vec<_> = coalesced::Records::new(data).collect();
    let failed = parsed.iter().any(Result::is_err);
    match coalesced::validate(data) {
        Ok(count) => {
            assert!(!failed, "validate accepts what iteration refuses");
            assert_eq!(count, parsed.len());
        }
        Err(_) => assert!(failed || parsed.is_empty(), "validate refuses a good list"),
    }
    // Build: the input's bytes cut into pieces of its first bytes' lengths.
    let mut pieces = Vec::new();
    let mut rest = data;
    while let Some((&len, tail)) = rest.split_first() {
        let take = usize::from(len).min(tail.len());
        pieces.push((len, &tail[..take]));
        rest = &tail[take..];
    }
    if pieces.is_empty() {
        // An empty list is malformed by definition: nothing to build.
        return;
    }
    let mut list = vec![0u8; data.len() + 4 * pieces.len()];
    let mut at = 0;
    for (tag, bytes) in &pieces {
        at = coalesced::append(&mut list, at, *tag, bytes).expect("sized for every record");
    }
    let back: Vec<(u8, Vec<u8>)> = coalesced::Records::new(&list[..at])
        .map(|r| {
            let r = r.expect("a built list parses");
            (r.tag, r.bytes.to_vec())
        })
        .collect();
    let want: Vec<(u8, Vec<u8>)> = pieces.iter().map(|(t, b)| (*t, b.to_vec())).collect();
    assert_eq!(back, want, "built records parse back");
}

/// The PMI wire: a line that parses prints back to a line that parses to
/// the same message; a stream of bytes is read message by message until it
/// ends or fails, never panicking.
pub fn pmi_line(data: &[u8]) {
    if let Ok(message) = Message::parse(data) {
        if let Ok(line) = message.to_line() {
            assert_eq!(
                Message::parse(line.as_bytes()).as_ref(),
                Ok(&message),
                "PMI line round trip"
            );
        }
    }
    let mut reader = BufReader::new(data);
    for _ in 0..1000 {
        match pmi_wire::read_message(&mut reader) {
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break,
        }
    }
}

/// Parameter parsing: any values for any parameters' environment
/// variables load or fail with an error, never a panic.
pub fn params(data: &[u8]) {
    let Ok(defaults) = Params::load(&BtlConfig::default()) else {
        return;
    };
    let names: Vec<String> = defaults
        .describe()
        .into_iter()
        .map(|info| info.env_var)
        .collect();
    let mut u = Unstructured::new(data);
    let mut env: Vec<(String, String)> = Vec::new();
    while let (Ok(index), Ok(value)) = (u.choose_index(names.len()), u.arbitrary::<String>()) {
        env.push((names[index].clone(), value));
        if env.len() > 8 {
            break;
        }
    }
    let _ = Params::load_from(&BtlConfig::default(), |name| {
        env.iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    });
}
