//! Against sealed modules (`auth`), with published keys or a job secret: a
//! stranger can neither inject nor replay.

use super::*;

/// Rewrites a captured datagram's extension with `change`, then seals it as
/// a stranger could: with a CRC, or sealed under a key of its own for the
/// receiving queue pair and job key mask given, with a packet number ahead
/// of the real ones.
fn forge(
    d: &[u8],
    change: impl FnOnce(&mut rel::Repr),
    key: Option<(&datagram::AuthKey, u32, u32)>,
) -> Vec<u8> {
    let mut d = d.to_vec();
    let mut repr = rel::Repr::parse(&datagram::extension(&d[BTL_AT..]).unwrap()).unwrap();
    change(&mut repr);
    repr.flags &= !(rel::FLAG_CHECKSUM | rel::FLAG_SEALED);
    repr.flags |= if key.is_some() {
        rel::FLAG_SEALED
    } else {
        rel::FLAG_CHECKSUM
    };
    repr.emit(&mut datagram::extension_mut(&mut d[BTL_AT..]).unwrap());
    match key {
        Some((key, qpn, mask)) => {
            let pn = seal::packet_number(&d[BTL_AT..]).unwrap() + 1000;
            let key = SealKey::derive(
                key,
                qpn,
                sender_of(&d[BTL_AT..], mask),
                seal::phase_of(pn),
                Protection::Authenticate,
            );
            seal::seal(&mut d[BTL_AT..], &key, pn, Epochs::default()).unwrap();
        }
        None => reseal(&mut d),
    }
    d
}

/// Who the datagram `d` (from its BTL header on) says it is from, to a
/// receiver whose job key mask is `mask`.
fn sender_of(d: &[u8], mask: u32) -> Sender {
    Sender {
        job_key: btl::Packet::new_checked(d).unwrap().job_key() ^ mask,
        id: datagram::extension(d).unwrap().src(),
    }
}

/// `true` if `d`, a sealed datagram as captured, opens under the keys of
/// the module whose key is `receiver`, receiving queue pair `qpn` and job
/// key mask `mask`.
fn opens_under(d: &[u8], receiver: &datagram::AuthKey, qpn: u32, mask: u32) -> bool {
    let mut d = d[BTL_AT..].to_vec();
    let pn = seal::packet_number(&d).unwrap();
    let key = SealKey::derive(
        receiver,
        qpn,
        sender_of(&d, mask),
        seal::phase_of(pn),
        Protection::Authenticate,
    );
    seal::open(&mut d, &key, Epochs::default())
}

#[test]
fn with_auth_a_stranger_can_neither_inject_nor_replay() {
    let mut a = component_with(true);
    let mut b = component_with(true);
    let a_published = modex::parse_blob(&a.modex()).unwrap();
    let b_published = modex::parse_blob(&b.modex()).unwrap();
    let (modex::Auth::Key(a_key), modex::Auth::Key(b_key)) =
        (a_published[0].auth, b_published[0].auth)
    else {
        panic!("modules with auth publish their keys");
    };
    assert_ne!(a_key, b_key, "every module draws its own key");
    let b_mask = b_published[0].admission.job_key_mask;

    // Modules set differently cannot pair, in either direction.
    let mut plain = component();
    assert_refuse_to_pair(&mut plain, &mut b);
    plain.finalize().unwrap();

    let (ab, ba, heard) = Pair::connect(&mut a, &mut b);

    // What an on-path observer captures of A→B: A sends the first messages
    // of the real stream to a tap that published B's key and process id, so
    // they leave with the numbers, key and bytes of the real ones.
    let tap = UdpSocket::bind("127.0.0.1:0").unwrap();
    tap.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut tapped = b_published.clone();
    tapped[0].qpns = [u32::from(tap.local_addr().unwrap().port()); 4];
    let a_to_tap = a
        .add_procs(&[Some(&modex::emit_blob(&tapped).unwrap())])
        .unwrap()[0]
        .endpoints[0]
        .unwrap();
    let mut captured: Vec<Vec<u8>> = Vec::new();
    for i in 0..4u32 {
        a.modules_mut()[0]
            .send_message(a_to_tap, Tag::PML, &message(i))
            .unwrap();
        a.progress();
        let mut buf = vec![0u8; 70_000];
        let (n, _) = tap.recv_from(&mut buf).unwrap();
        buf.truncate(n);
        // The first datagrams of a stream: its numbers have not wrapped
        // (unless it started within four of the wrap: once in 2^30 runs).
        assert!(
            opens_under(&buf, &b_key, tapped[0].qpns[0], b_mask),
            "sealed under B's key for the tap"
        );
        // The tap copied B's key but not its queue pair: what A sealed for
        // it does not open at B.
        assert!(!opens_under(&buf, &b_key, b_published[0].qpns[0], b_mask));
        captured.push(buf);
    }
    // Where B hears A from (A sent to the tap from another queue pair).
    let a_addr = sending_addr(&a, &b);
    let b_addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, receive_port(&b));
    let attacker = UdpSocket::bind("127.0.0.1:0").unwrap();
    let spoofer = Spoofer::new();
    if spoofer.is_none() {
        println!("no raw socket (not root): forgeries and replays come from a stranger's address");
    }
    let send_hostile = |d: &[u8]| match &spoofer {
        Some(s) => s.send(a_addr, b_addr, d),
        None => {
            attacker.send_to(d, b_addr).unwrap();
        }
    };

    let before = drops(&b);
    let before_resources = b.modules()[0].with_context(|c| c.resources());
    let mut rng = fastrand::Rng::with_seed(67);
    let b_qpn = b_published[0].qpns[0];
    let stranger_key = datagram::AuthKey([0x42; 32]);
    let (mut forged, mut replayed) = (0u64, 0u64);
    let n = 3000u32;
    let mut sent = 0u32;
    let deadline = Instant::now() + Duration::from_secs(60);
    while heard.lock().unwrap().len() < n as usize {
        assert!(Instant::now() < deadline, "timed out");
        if sent < n
            && a.modules_mut()[0]
                .send_message(ab, Tag::PML, &message(sent))
                .is_ok()
        {
            sent += 1;
        }
        if sent < n {
            // Forgeries that claim the next numbers of the real stream, so
            // that only the seal stands in their way.
            let sample = &captured[rng.usize(0..captured.len())];
            let ahead = sent + rng.u32(0..4);
            let next = |r: &mut rel::Repr| r.seq += ahead;
            send_hostile(&forge(sample, next, None));
            send_hostile(&forge(sample, next, Some((&stranger_key, b_qpn, b_mask))));
            let mut flipped = sample.clone();
            // In the payload: a flip in the headers may be caught before
            // the seal is looked at (a malformed header, another job's key).
            let at = rng.usize(BTL_AT + datagram::HEADER_LEN..flipped.len());
            flipped[at] ^= 1 << rng.u32(0..8);
            send_hostile(&flipped);
            forged += 3;
            // Genuine datagrams again, once the stream is past them.
            if sent > 100 {
                send_hostile(&captured[rng.usize(0..captured.len())]);
                replayed += 1;
            }
        }
        a.progress();
        b.progress();
    }
    progress_for(&mut [&mut a, &mut b], Duration::from_millis(300));

    let heard = heard.lock().unwrap();
    assert_heard_in_order(&heard, n, ba);
    let after = drops(&b);
    let delta: Vec<u64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
    println!(
        "with auth: forged {forged}, replayed {replayed}; counted {delta:?} (fabric, malformed, \
         job key, checksum, unknown peer, duplicates, out of window, orphans, unauthenticated, \
         replayed)"
    );
    // A forgery whose packet number is behind the window is refused
    // before its tag is checked, and counted with the replays.
    assert!(
        delta[8] + delta[9] >= forged,
        "every forgery refused as unauthenticated or replayed"
    );
    assert_eq!(delta[3], 0, "no checksum is checked where a seal is due");
    if spoofer.is_some() {
        // The captured datagrams went to the tap, which A numbers apart
        // from B: under B's key they are refused by their packet numbers,
        // or as sealed under another phase's key.
        assert!(
            delta[8] + delta[9] >= forged + replayed,
            "replays refused by their seal"
        );
    } else {
        assert!(delta[4] >= replayed, "replays from a stranger refused");
    }
    assert_eq!(
        b.modules()[0].with_context(|c| c.resources()),
        before_resources
    );
    drop(heard);
    a.finalize().unwrap();
    b.finalize().unwrap();
}

/// With a job secret, every module's key derives from it and the module's
/// address: the published blob (version 3) holds no key, the job's modules
/// talk, and a process that read the blobs but holds another secret can pair
/// but cannot inject: everything it sends is refused as unauthenticated.
/// Modules that derive keys and modules that publish them do not pair.
#[test]
fn with_a_job_secret_no_key_is_published_and_a_stranger_cannot_inject() {
    const JOB: [u8; 32] = [0x17; 32];
    let (mut a, mut b) = (
        component_keyed(true, Some(JOB)),
        component_keyed(true, Some(JOB)),
    );
    let blob = b.modex();
    assert_eq!(blob[2], modex::VERSION_DERIVED_KEY);
    assert_eq!(
        blob.len(),
        modex::PREAMBLE_LEN + modex::ENTRY_LEN,
        "no key bytes"
    );
    assert_eq!(
        modex::parse_blob(&blob).unwrap()[0].auth,
        modex::Auth::Derived
    );

    // Published keys and derived keys do not mix, in either direction.
    let mut published = component_with(true);
    assert_refuse_to_pair(&mut published, &mut b);
    published.finalize().unwrap();

    let (ab, ba, heard) = Pair::connect(&mut a, &mut b);
    let mut stranger = component_keyed(true, Some([0x18; 32]));
    let to_b = stranger.add_procs(&[Some(&blob)]).unwrap()[0].endpoints[0]
        .expect("a stranger with the blob pairs: the seal is what stops it");
    let before = drops(&b);
    let n = 500u32;
    let (mut sent, mut forged) = (0u32, 0u32);
    let deadline = Instant::now() + Duration::from_secs(30);
    while heard.lock().unwrap().len() < n as usize {
        assert!(Instant::now() < deadline, "timed out");
        if sent < n
            && a.modules_mut()[0]
                .send_message(ab, Tag::PML, &message(sent))
                .is_ok()
        {
            sent += 1;
        }
        if forged < n
            && stranger.modules_mut()[0]
                .send_message(to_b, Tag::PML, &message(forged))
                .is_ok()
        {
            forged += 1;
        }
        a.progress();
        b.progress();
        stranger.progress();
    }
    progress_for(
        &mut [&mut a, &mut b, &mut stranger],
        Duration::from_millis(200),
    );
    // The stranger falls silent, and B takes in what it sent last.
    progress_for(&mut [&mut a, &mut b], Duration::from_millis(50));
    // Only the job's messages arrive.
    let heard = heard.lock().unwrap();
    assert_heard_in_order(&heard, n, ba);
    let delta: Vec<u64> = drops(&b).iter().zip(before).map(|(x, y)| x - y).collect();
    // Unacknowledged, the stranger sends its first window and then repeats
    // itself on timeouts: every datagram it sent went to B.
    let stranger_datagrams = stranger.modules()[0]
        .with_context(|c| c.stats())
        .tx_datagrams;
    println!(
        "derived keys: the stranger queued {forged} messages in {stranger_datagrams} datagrams; \
         B counted {delta:?}"
    );
    assert!(stranger_datagrams > 0);
    assert_eq!(
        delta[8], stranger_datagrams,
        "every stranger datagram refused"
    );
    assert_eq!(delta[3], 0, "no checksum is checked where a seal is due");
    drop(heard);
    for btl in [a, b, stranger] {
        btl.finalize().unwrap();
    }
}
