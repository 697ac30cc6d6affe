use proptest::prelude::*;

use super::*;
use crate::seq::SeqNum;
use crate::{btl, datagram};

const RECEIVER: AuthKey = AuthKey([7; 32]);
const SENDER: Sender = Sender {
    job_key: 0xcafe_f00d,
    id: 0x0bad_cafe,
};
const QPN: u32 = 0x1_0000;
const EPOCHS: Epochs = Epochs { seq: 3, ack: 1 };
const PN: u64 = 0x1234_5678_9abc;

/// The headers and room for the tag of a sealed datagram carrying
/// `payload`, not sealed yet.
fn unsealed(payload: &[u8], protection: Protection) -> Vec<u8> {
    let mut bytes = vec![0u8; SEALED_HEADER_LEN + payload.len()];
    btl::Repr {
        tag: 9,
        job_key: SENDER.job_key,
        reliable: true,
    }
    .emit(&mut btl::Packet::new_unchecked(&mut bytes[..]));
    rel::Repr {
        src: SENDER.id,
        seq: SeqNum(41),
        ack: SeqNum(17),
        sack: 0b101,
        credit: 64,
        flags: protection.flags() | rel::FLAG_FIRST | rel::FLAG_LAST,
        checksum: 0,
    }
    .emit(&mut datagram::extension_mut(&mut bytes).unwrap());
    bytes[SEALED_HEADER_LEN..].copy_from_slice(payload);
    bytes
}

fn key(pn: u64, protection: Protection) -> SealKey {
    SealKey::derive(&RECEIVER, QPN, SENDER, phase_of(pn), protection)
}

fn sealed(payload: &[u8], protection: Protection) -> Vec<u8> {
    let mut bytes = unsealed(payload, protection);
    seal(&mut bytes, &key(PN, protection), PN, EPOCHS).unwrap();
    bytes
}

const BOTH: [Protection; 2] = [Protection::Authenticate, Protection::Encrypt];

#[test]
fn layout() {
    assert_eq!(SEALED_HEADER_LEN, 56);
    assert_eq!(PACKET_NUMBER_FIELD, 32..40);
    assert_eq!(TAG_FIELD, 40..56);
}

#[test]
fn a_sealed_datagram_opens_under_its_key_only() {
    for protection in BOTH {
        let bytes = sealed(b"payload", protection);
        assert_eq!(packet_number(&bytes), Some(PN));
        assert!(rel::Repr::parse(&datagram::extension(&bytes).unwrap()).is_ok());
        let mut good = bytes.clone();
        assert!(
            open(&mut good, &key(PN, protection), EPOCHS),
            "{protection:?}"
        );
        assert_eq!(&good[SEALED_HEADER_LEN..], b"payload");
        for other in [
            SealKey::derive(&AuthKey([8; 32]), QPN, SENDER, phase_of(PN), protection),
            SealKey::derive(&RECEIVER, QPN + 1, SENDER, phase_of(PN), protection),
            SealKey::derive(
                &RECEIVER,
                QPN,
                Sender {
                    id: SENDER.id + 1,
                    ..SENDER
                },
                phase_of(PN),
                protection,
            ),
            SealKey::derive(
                &RECEIVER,
                QPN,
                Sender {
                    job_key: 1,
                    ..SENDER
                },
                phase_of(PN),
                protection,
            ),
        ] {
            let mut copy = bytes.clone();
            assert!(!open(&mut copy, &other, EPOCHS), "{protection:?}");
        }
        // A key of another phase is refused before any work.
        let mut copy = bytes.clone();
        let next = SealKey::derive(&RECEIVER, QPN, SENDER, phase_of(PN) + 1, protection);
        assert!(!open(&mut copy, &next, EPOCHS));
    }
}

#[test]
fn encryption_hides_the_payload_and_authentication_does_not() {
    let payload = [0x5au8; 64];
    assert_eq!(
        &sealed(&payload, Protection::Authenticate)[SEALED_HEADER_LEN..],
        &payload[..]
    );
    assert_ne!(
        &sealed(&payload, Protection::Encrypt)[SEALED_HEADER_LEN..],
        &payload[..]
    );
}

/// A datagram recorded before its stream's numbers wrapped carries the same
/// 32-bit numbers as one sent after, but not the same epochs.
#[test]
fn a_seal_under_other_epochs_fails() {
    for protection in BOTH {
        for other in [
            Epochs { seq: 4, ack: 1 },
            Epochs { seq: 3, ack: 2 },
            Epochs::default(),
        ] {
            let mut bytes = sealed(b"payload", protection);
            assert!(!open(&mut bytes, &key(PN, protection), other), "{other:?}");
        }
    }
}

#[test]
fn the_other_protection_does_not_open() {
    let mut bytes = sealed(b"payload", Protection::Encrypt);
    assert!(!open(
        &mut bytes,
        &key(PN, Protection::Authenticate),
        EPOCHS
    ));
    let mut bytes = sealed(b"payload", Protection::Authenticate);
    assert!(!open(&mut bytes, &key(PN, Protection::Encrypt), EPOCHS));
}

#[test]
fn short_datagrams_and_a_key_of_another_phase_are_refused() {
    for protection in BOTH {
        let bytes = sealed(b"", protection);
        assert!(open(&mut bytes.clone(), &key(PN, protection), EPOCHS));
        for len in 0..SEALED_HEADER_LEN {
            assert!(!open(
                &mut bytes[..len].to_vec(),
                &key(PN, protection),
                EPOCHS
            ));
        }
        let mut short = unsealed(b"", protection);
        short.pop();
        assert!(seal(&mut short, &key(PN, protection), PN, EPOCHS).is_err());
        let mut bytes = unsealed(b"x", protection);
        let other_phase = PN + (1 << PHASE_SHIFT);
        assert!(seal(&mut bytes, &key(PN, protection), other_phase, EPOCHS).is_err());
    }
}

#[test]
fn keys_differ_by_phase_and_stay_out_of_debug_output() {
    let mut a = unsealed(b"same", Protection::Authenticate);
    let mut b = a.clone();
    let pn_a = 5;
    let pn_b = 5 + (1 << PHASE_SHIFT);
    seal(&mut a, &key(pn_a, Protection::Authenticate), pn_a, EPOCHS).unwrap();
    seal(&mut b, &key(pn_b, Protection::Authenticate), pn_b, EPOCHS).unwrap();
    assert_ne!(a[TAG_FIELD], b[TAG_FIELD]);
    assert_eq!(
        format!("{:?}", key(pn_b, Protection::Authenticate)),
        "SealKey { phase: 1, .. }"
    );
}

#[test]
fn the_replay_window_takes_each_packet_number_once() {
    const SPAN: u64 = ReplayWindow::SPAN;
    let mut window = ReplayWindow::default();
    assert!(!window.check(0), "0 is never sent");
    assert!(window.take(100));
    assert!(!window.take(100));
    assert!(window.take(99));
    assert!(!window.take(99));
    let high = 100 + SPAN;
    assert!(window.take(high));
    assert!(window.take(high - SPAN + 1), "within the span below {high}");
    assert!(!window.check(high - SPAN), "taken before");
    assert!(!window.check(high - SPAN - 1), "older than the span");
    assert!(window.take(high + SPAN));
    assert!(window.check(high + 1), "just inside the span");
    assert!(!window.check(high), "the old highest is still taken");
    assert!(window.take(high + SPAN + 5), "a jump of a few");
    assert!(window.check(high + SPAN + 1), "skipped on the way up");
    assert!(window.take(100_000));
    assert!(!window.check(high + SPAN), "far below after a jump");
    assert!(window.check(100_000 - 1), "skipped in the jump");
}

proptest! {
    #[test]
    fn any_flipped_byte_fails(
        payload in proptest::collection::vec(any::<u8>(), 0..96),
        index: prop::sample::Index,
        flip in 1u8..,
        encrypt: bool,
    ) {
        let protection = if encrypt { Protection::Encrypt } else { Protection::Authenticate };
        let mut bytes = sealed(&payload, protection);
        let at = index.index(bytes.len());
        bytes[at] ^= flip;
        prop_assert!(!open(&mut bytes, &key(PN, protection), EPOCHS), "byte {}", at);
    }

    /// An authenticated datagram's tag is the GCM tag of an empty plaintext
    /// whose associated data is the whole datagram with the epochs in its
    /// tag field, as the module documentation says; opening it leaves the
    /// datagram as it came.
    #[test]
    fn authentication_is_a_gmac_of_the_whole_datagram(
        payload in proptest::collection::vec(any::<u8>(), 0..400),
    ) {
        let whole = sealed(&payload, Protection::Authenticate);
        let mut covered = whole.clone();
        covered[TAG_FIELD].fill(0);
        covered[TAG_FIELD][..4].copy_from_slice(&EPOCHS.seq.to_be_bytes());
        covered[TAG_FIELD][4..8].copy_from_slice(&EPOCHS.ack.to_be_bytes());
        let nonce = lc::Nonce::assume_unique_for_key(nonce_bytes(PN));
        let gmac = key(PN, Protection::Authenticate)
            .aead
            .seal_in_place_separate_tag(nonce, lc::Aad::from(&covered[..]), &mut [])
            .unwrap();
        prop_assert_eq!(gmac.as_ref(), &whole[TAG_FIELD]);
        let mut opened = whole.clone();
        prop_assert!(open(&mut opened, &key(PN, Protection::Authenticate), EPOCHS));
        prop_assert_eq!(opened, whole);
    }

    /// Encrypting out of place, from a payload in two pieces anywhere,
    /// makes the datagram that encrypting it whole in place makes.
    #[test]
    fn encryption_out_of_place_seals_as_in_place(
        payload in proptest::collection::vec(any::<u8>(), 0..400),
        cut: prop::sample::Index,
    ) {
        let whole = sealed(&payload, Protection::Encrypt);
        let at = cut.index(payload.len() + 1);
        let mut out = unsealed(&[], Protection::Encrypt);
        out.resize(whole.len() + TAG_LEN, 0xee);
        let pieces = (&payload[..at], &payload[at..]);
        encrypt_into(&mut out, pieces, &key(PN, Protection::Encrypt), PN, EPOCHS).unwrap();
        prop_assert_eq!(&out[..whole.len()], &whole[..]);
        let short = &mut out[..whole.len()];
        prop_assert!(encrypt_into(short, pieces, &key(PN, Protection::Encrypt), PN, EPOCHS).is_err());
        let mut plain = unsealed(&[], Protection::Authenticate);
        plain.resize(whole.len() + TAG_LEN, 0);
        let authenticating = key(PN, Protection::Authenticate);
        prop_assert!(encrypt_into(&mut plain, pieces, &authenticating, PN, EPOCHS).is_err());
    }

    #[test]
    fn seal_then_open_round_trips(
        payload in proptest::collection::vec(any::<u8>(), 0..300),
        pn in 1u64..u64::MAX,
        encrypt: bool,
    ) {
        let protection = if encrypt { Protection::Encrypt } else { Protection::Authenticate };
        let mut bytes = unsealed(&payload, protection);
        seal(&mut bytes, &key(pn, protection), pn, EPOCHS).unwrap();
        prop_assert!(open(&mut bytes, &key(pn, protection), EPOCHS));
        prop_assert_eq!(&bytes[SEALED_HEADER_LEN..], &payload[..]);
    }

    /// Against a model that remembers every packet number taken: the
    /// window never takes one twice, and takes every new one within its
    /// span of the highest.
    #[test]
    fn the_replay_window_matches_a_model(pns in proptest::collection::vec(1u64..6000, 1..400)) {
        let mut window = ReplayWindow::default();
        let mut taken = std::collections::BTreeSet::new();
        for pn in pns {
            let highest = taken.last().copied().unwrap_or(0);
            let expected = !taken.contains(&pn) && (pn > highest || highest - pn <= ReplayWindow::SPAN);
            prop_assert_eq!(window.take(pn), expected, "pn {}", pn);
            if expected {
                taken.insert(pn);
            }
        }
    }

    #[test]
    fn open_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..120), encrypt: bool) {
        let protection = if encrypt { Protection::Encrypt } else { Protection::Authenticate };
        let mut bytes = bytes;
        let _ = open(&mut bytes, &key(PN, protection), EPOCHS);
    }
}
