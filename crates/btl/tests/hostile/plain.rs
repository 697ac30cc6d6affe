//! Hostile datagrams against checksummed modules: dropped and counted while
//! the real traffic flows.

use super::*;

#[test]
fn hostile_datagrams_are_dropped_and_counted_while_real_traffic_flows() {
    let Pair {
        mut a,
        mut b,
        ab,
        ba,
        heard,
    } = Pair::new(false);

    // The attacker: a plain socket that A is made to send to.
    let attacker = UdpSocket::bind("127.0.0.1:0").unwrap();
    attacker
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut fake = modex::parse_blob(&b.modex()).unwrap();
    fake[0].qpns = [u32::from(attacker.local_addr().unwrap().port()); 4];
    fake[0].proc_id ^= 0x5a5a_5a5a;
    let fake_blob = modex::emit_blob(&fake).unwrap();
    let a_to_attacker = a.add_procs(&[Some(&fake_blob)]).unwrap()[0].endpoints[0].unwrap();
    let mut captured: Vec<(Vec<u8>, SocketAddr)> = Vec::new();
    for i in 0..4u32 {
        a.modules_mut()[0]
            .send_message(a_to_attacker, Tag::PML, &message(i))
            .unwrap();
        a.progress();
        let mut buf = vec![0u8; 70_000];
        let (n, from) = attacker.recv_from(&mut buf).unwrap();
        buf.truncate(n);
        captured.push((buf, from));
    }
    let (sample, _) = captured[0].clone();
    assert!(sample.len() >= BTL_AT + datagram::HEADER_LEN);
    // Where B hears A from (A sent to the attacker from another queue pair).
    let a_addr = sending_addr(&a, &b);
    let b_port = receive_port(&b);
    let b_addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, b_port);

    let before_resources = b.modules()[0].with_context(|c| c.resources());
    let before = drops(&b);
    let mut rng = fastrand::Rng::with_seed(61);
    let mut hostile = [0u64; 7];
    let spoofer = Spoofer::new();
    if spoofer.is_none() {
        println!("no raw socket (not root): replays from the sender's address are not tried");
    }

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
        // One hostile datagram of each kind per round, while the real
        // traffic runs.
        if sent < n {
            let random: Vec<u8> = (0..rng.usize(0..=9000)).map(|_| rng.u8(..)).collect();
            attacker.send_to(&random, b_addr).unwrap();
            hostile[0] += 1;

            let cut = rng.usize(0..BTL_AT + datagram::HEADER_LEN);
            attacker.send_to(&sample[..cut], b_addr).unwrap();
            hostile[1] += 1;

            let mut wrong_key = sample.clone();
            let mut header = btl::Packet::new_unchecked(&mut wrong_key[BTL_AT..]);
            header.set_job_key(header.job_key() ^ (1 + rng.u32(..u32::MAX - 1)));
            reseal(&mut wrong_key);
            attacker.send_to(&wrong_key, b_addr).unwrap();
            hostile[2] += 1;

            let mut far = sample.clone();
            let jump = (1 << 20) + rng.u32(0..1 << 20);
            edit_extension(&mut far, |r| r.seq += jump);
            // From the sender's address if it can be forged, else from the
            // attacker's (then it counts as an unknown source).
            match &spoofer {
                Some(s) => s.send(a_addr, b_addr, &far),
                None => {
                    attacker.send_to(&far, b_addr).unwrap();
                }
            }
            hostile[3] += 1;

            attacker.send_to(&sample, b_addr).unwrap();
            hostile[4] += 1;

            let mut oversized = sample.clone();
            oversized.truncate(BTL_AT + datagram::HEADER_LEN);
            let mut list = vec![0u8; 64];
            let end = coalesced::append(&mut list, 0, Tag::PML.0, &[1, 2, 3]).unwrap();
            list.truncate(end);
            // The record says 60 000 bytes follow; three do.
            list[2..4].copy_from_slice(&60_000u16.to_le_bytes());
            oversized.extend_from_slice(&list);
            edit_extension(&mut oversized, |r| r.flags |= rel::FLAG_COALESCED);
            attacker.send_to(&oversized, b_addr).unwrap();
            hostile[5] += 1;

            // Replays come once the real stream is well past their numbers.
            if let (Some(s), true) = (&spoofer, sent > 100) {
                let (replay, _) = &captured[rng.usize(0..captured.len())];
                s.send(a_addr, b_addr, replay);
                hostile[6] += 1;
            }
        }
        a.progress();
        b.progress();
    }
    // Drain: whatever hostile datagrams are still in the socket get read.
    progress_for(&mut [&mut a, &mut b], Duration::from_millis(300));

    // Real traffic: every message once, in order, intact.
    let heard = heard.lock().unwrap();
    assert_heard_in_order(&heard, n, ba);
    // Every hostile datagram dropped and counted somewhere.
    let after = drops(&b);
    let counted: u64 = after.iter().zip(before).map(|(a, b)| a - b).sum();
    let tried: u64 = hostile.iter().sum();
    println!(
        "hostile datagrams tried {tried} ({hostile:?}: random, cut, job key, far, unknown source, \
         oversized records, replays); counted {counted}: {:?} (fabric, malformed, job key, \
         checksum, unknown peer, duplicates, out of window, orphans, unauthenticated)",
        after
            .iter()
            .zip(before)
            .map(|(a, b)| a - b)
            .collect::<Vec<_>>()
    );
    assert!(counted >= tried, "{counted} counted of {tried} tried");
    let delta = |i: usize| after[i] - before[i];
    assert!(delta(0) > 0, "random bytes die in the fabric");
    assert!(delta(2) >= hostile[2], "wrong job keys counted");
    assert!(delta(4) >= hostile[4], "unknown sources counted");
    assert!(delta(1) > 0, "cut headers counted as malformed");
    if spoofer.is_some() {
        assert!(delta(6) >= hostile[3], "far sequence numbers counted");
        assert!(delta(5) >= hostile[6], "replays counted as duplicates");
    }
    // Nothing grew: the fabric holds what it held.
    assert_eq!(
        b.modules()[0].with_context(|c| c.resources()),
        before_resources
    );
    drop(heard);
    a.finalize().unwrap();
    b.finalize().unwrap();
}
