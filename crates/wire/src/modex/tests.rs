//! The modex blob: fixtures, round trips, and malformed input.

use super::*;
use proptest::prelude::*;

#[rustfmt::skip]
static ONE_IPV4: [u8; 68] = [
    0x55, 0x41, 0x07, 0x01,
    0x01, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2a,
    127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0x00, 0x00, 0xff, 0xcb, 0, 0, 0, 0,
    0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,
    0x00, 0x00, 0xc3, 0x50, 0x00, 0x00, 0xc3, 0x51,
    0x00, 0x00, 0xc3, 0x52, 0x00, 0x00, 0xc3, 0x53,
    0x01, 0x33, 0x01, 0x33, 0xde, 0xad, 0xbe, 0xef,
];

fn ipv4() -> Address {
    Address {
        location: Location::Ipv4([127, 0, 0, 1]),
        port: 1,
        qpns: [50_000, 50_001, 50_002, 50_003],
        proc_id: 42,
        max_msg_size: 65_483,
        packet_size: 65_483,
        network: 0x0102_0304_0506_0708,
        stream_nonce: 0,
        admission: Admission {
            qkey: 0x0133_0133,
            job_key_mask: 0xdead_beef,
        },
        auth: Auth::Off,
    }
}

#[test]
fn fixture_round_trip() {
    assert_eq!(parse_blob(&ONE_IPV4).unwrap(), vec![ipv4()]);
    assert_eq!(emit_blob(&[ipv4()]).unwrap(), ONE_IPV4);
    assert_eq!(parse_blob(&emit_blob(&[]).unwrap()).unwrap(), vec![]);
}

#[test]
fn a_key_makes_version_five_and_reaches_every_address() {
    let keyed = [
        Address {
            auth: Auth::Key(AuthKey([0xa5; KEY_LEN])),
            ..ipv4()
        },
        Address {
            port: 2,
            auth: Auth::Key(AuthKey([0x5a; KEY_LEN])),
            ..ipv4()
        },
    ];
    let blob = emit_blob(&keyed).unwrap();
    assert_eq!(blob[2], VERSION_WITH_KEY);
    assert_eq!(blob.len(), PREAMBLE_LEN + 2 * (ENTRY_LEN + KEY_LEN));
    assert_eq!(
        &blob[PREAMBLE_LEN..][..ENTRY_LEN],
        &ONE_IPV4[PREAMBLE_LEN..]
    );
    assert_eq!(
        &blob[PREAMBLE_LEN + ENTRY_LEN..][..KEY_LEN],
        &[0xa5; KEY_LEN]
    );
    assert_eq!(&blob[blob.len() - KEY_LEN..], &[0x5a; KEY_LEN]);
    assert_eq!(parse_blob(&blob).unwrap(), keyed);
    // A key cut short, keys in a version 7 blob, or a mix of keyed and
    // unkeyed addresses are all errors.
    assert!(parse_blob(&blob[..blob.len() - 1]).is_err());
    let mut v1_with_key = blob.clone();
    v1_with_key[2] = VERSION;
    assert!(parse_blob(&v1_with_key).is_err());
    assert!(emit_blob(&[keyed[0], ipv4()]).is_err());
}

#[test]
fn derived_keys_make_version_six_with_nothing_secret_in_it() {
    let derived = Address {
        auth: Auth::Derived,
        ..ipv4()
    };
    let blob = emit_blob(&[derived]).unwrap();
    assert_eq!(blob[2], VERSION_DERIVED_KEY);
    assert_eq!(&blob[PREAMBLE_LEN..], &ONE_IPV4[PREAMBLE_LEN..]);
    assert_eq!(parse_blob(&blob).unwrap(), vec![derived]);
    assert!(emit_blob(&[derived, ipv4()]).is_err());
}

#[test]
fn a_receive_key_depends_on_the_secret_and_the_module_but_not_the_process_id() {
    let job = AuthKey([3; KEY_LEN]);
    let key = derive_receive_key(&job, &ipv4());
    let same_module = Address {
        proc_id: 7,
        auth: Auth::Derived,
        ..ipv4()
    };
    assert_eq!(derive_receive_key(&job, &same_module), key);
    let other_module = Address {
        qpns: [50_004, 50_001, 50_002, 50_003],
        ..ipv4()
    };
    assert_ne!(derive_receive_key(&job, &other_module), key);
    assert_ne!(derive_receive_key(&AuthKey([4; KEY_LEN]), &ipv4()), key);
    assert_ne!(key, job);
}

#[test]
fn malformed_blobs_are_errors() {
    assert!(parse_blob(&ONE_IPV4[..67]).is_err());
    assert!(parse_blob(&[]).is_err());
    for (index, value) in [(0, 0), (2, 10), (3, 2), (4, 9), (6, 1), (17, 1)] {
        let mut bad = ONE_IPV4;
        bad[index] = value;
        assert!(parse_blob(&bad).is_err(), "byte {index}");
    }
}

#[test]
fn the_stream_nonce_travels_and_the_two_directions_start_apart() {
    let mut bytes = ONE_IPV4;
    bytes[PREAMBLE_LEN + 28] = 0xab;
    let parsed = parse_blob(&bytes).unwrap();
    assert_eq!(parsed[0].stream_nonce, 0xab00_0000);
    assert_eq!(emit_blob(&parsed).unwrap(), bytes);
    assert_eq!(stream_start(7, 9), stream_start(7, 9));
    assert_ne!(stream_start(1, 2), stream_start(2, 1));
    assert_ne!(stream_start(1, 2), stream_start(1, 3));
}

#[test]
fn the_admission_travels_and_a_controlled_qkey_or_an_older_blob_is_refused() {
    let parsed = parse_blob(&ONE_IPV4).unwrap();
    assert_eq!(parsed[0].admission.qkey, 0x0133_0133);
    assert_eq!(parsed[0].admission.job_key_mask, 0xdead_beef);
    let mut controlled = ONE_IPV4;
    controlled[PREAMBLE_LEN + 56] |= 0x80;
    assert!(parse_blob(&controlled).is_err());
    // A version 1 blob of the same entry, from a build before admissions.
    let mut older = ONE_IPV4[..PREAMBLE_LEN + 56].to_vec();
    older[2] = 1;
    assert!(parse_blob(&older).is_err());
    // A version 4 blob: the same layout, from a build whose modules sent to
    // a peer from any of their queue pairs.
    let mut striped_anyhow = ONE_IPV4;
    striped_anyhow[2] = 4;
    assert!(parse_blob(&striped_anyhow).is_err());
    let random = Admission::from_random([0xff; 8]);
    assert_eq!(random.qkey, Admission::MAX_QKEY);
    assert_eq!(random.job_key_mask, u32::MAX);
}

#[test]
fn parse_of_a_short_unchecked_entry_is_an_error() {
    let entry = Entry::new_unchecked(&ONE_IPV4[PREAMBLE_LEN..ONE_IPV4.len() - 1]);
    assert!(Address::parse(&entry).is_err());
}

#[test]
#[should_panic(expected = "out of range")]
fn emit_into_short_buffer_panics() {
    let mut bytes = [0u8; ENTRY_LEN - 1];
    ipv4().emit(&mut Entry::new_unchecked(&mut bytes[..]));
}

fn location() -> impl Strategy<Value = Location> {
    prop_oneof![
        any::<[u8; 4]>().prop_map(Location::Ipv4),
        any::<[u8; 16]>().prop_map(Location::Ipv6),
        any::<u32>().prop_map(Location::Sim),
        (any::<u16>(), any::<[u8; 16]>()).prop_map(|(lid, gid)| Location::Ib { lid, gid }),
    ]
}

proptest! {
    #[test]
    fn emit_then_parse(entries in proptest::collection::vec(
        (location(), any::<u8>(), any::<[u32; QPNS]>(), any::<(u32, u32, u32)>(), any::<u64>(), any::<[u8; 8]>()), 0..8),
        auth in 0u8..3,
    ) {
        let addresses: Vec<Address> = entries
            .into_iter()
            .map(|(location, port, qpns, (max_msg_size, proc_id, stream_nonce), network, random)| Address { location, port, qpns, proc_id, max_msg_size: max_msg_size >> 1, packet_size: max_msg_size >> 1, network, stream_nonce, admission: Admission::from_random(random), auth: [Auth::Off, Auth::Key(AuthKey([port; KEY_LEN])), Auth::Derived][usize::from(auth)] })
            .collect();
        prop_assert_eq!(parse_blob(&emit_blob(&addresses).unwrap()).unwrap(), addresses);
    }

    /// A port that cuts long datagrams publishes both sizes in one field.
    #[test]
    fn both_sizes_of_a_port_that_cuts_round_trip(size in 2u32..=0xffff, packet in 1u32..0x8000) {
        let address = Address {
            max_msg_size: size,
            packet_size: packet.min(size - 1),
            ..ipv4()
        };
        prop_assert_eq!(parse_blob(&emit_blob(&[address]).unwrap()).unwrap(), vec![address]);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
        let _ = parse_blob(&bytes);
        let _ = Address::parse(&Entry::new_unchecked(&bytes[..]));
    }
}
