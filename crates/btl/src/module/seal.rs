//! Sealing per peer (`auth`): the packet numbers of what goes to a peer,
//! the replay window of what comes from it, and the keys of both
//! directions, derived when first needed and again at each key phase.
//! The format and the cryptography are `udbtl_wire::seal`'s.

use udbtl_wire::datagram::{AuthKey, Epochs};
use udbtl_wire::seal::{self, PACKET_NUMBER_START_MAX, Protection, ReplayWindow, SealKey, Sender};

use super::integrity::Check;

/// A datagram to seal, as it is held.
#[derive(Debug)]
pub(super) enum Unsealed<'a> {
    /// Headers, room for the tag and the payload, whole: sealed where it
    /// is ([`seal::seal`]).
    InPlace(&'a mut [u8]),
    /// Headers and room for the tag in `out`, the payload in two pieces
    /// elsewhere: encrypted into `out` behind the headers, which is a tag
    /// longer than the datagram ([`seal::encrypt_into`]).
    Into {
        out: &'a mut [u8],
        payload: (&'a [u8], &'a [u8]),
    },
}

impl Unsealed<'_> {
    /// The bytes its headers are in.
    pub(super) fn headers(&mut self) -> &mut [u8] {
        match self {
            Self::InPlace(datagram) => datagram,
            Self::Into { out, .. } => out,
        }
    }
}

/// One peer's sealing state. An endpoint gets one (boxed, one or two KB
/// with both keys) when the first datagram to or from it is sealed, so a
/// peer that never talks costs only the pointer.
#[derive(Debug)]
pub(super) struct PairSeal {
    /// The packet number of the next datagram to the peer.
    next_pn: u64,
    /// The key of datagrams to the peer, for the phase of `next_pn`.
    send: Option<SealKey>,
    /// The key of datagrams from the peer, for the phase last seen.
    recv: Option<SealKey>,
    replay: ReplayWindow,
}

impl PairSeal {
    /// A pair that has sealed nothing yet: its packet numbers start at
    /// random below [`PACKET_NUMBER_START_MAX`], so that two senders that
    /// show the same job key and process id (a module's random id, or a
    /// launcher that reuses one) do not reuse each other's nonces.
    fn new() -> Result<Self, getrandom::Error> {
        let mut bytes = [0u8; 8];
        getrandom::fill(&mut bytes)?;
        let start = u64::from_ne_bytes(bytes) % PACKET_NUMBER_START_MAX;
        Ok(Self {
            next_pn: start.max(1),
            send: None,
            recv: None,
            replay: ReplayWindow::default(),
        })
    }

    /// The sealing state in an endpoint's `slot`, made now if it has none;
    /// `None` if the system gave no randomness to start its packet numbers
    /// with (nothing can be sealed or opened then).
    pub(super) fn of(slot: &mut Option<Box<Self>>) -> Option<&mut Self> {
        match slot {
            Some(pair) => Some(pair),
            None => Self::new()
                .ok()
                .map(|pair| &mut **slot.insert(Box::new(pair))),
        }
    }

    /// Seals `datagram` to the peer whose module's key is `peer_key` and
    /// whose receiving queue pair is `peer_qpn`, from this process, `own`.
    /// `false` if it could not be sealed as it is held ([`seal::seal`]'s
    /// and [`seal::encrypt_into`]'s errors): nothing was then sealed, and no
    /// packet number taken.
    pub(super) fn seal(
        &mut self,
        datagram: Unsealed<'_>,
        (peer_key, peer_qpn): (&AuthKey, u32),
        own: Sender,
        epochs: Epochs,
        protection: Protection,
    ) -> bool {
        let pn = self.next_pn;
        let key = key_of_phase(&mut self.send, seal::phase_of(pn), |phase| {
            SealKey::derive(peer_key, peer_qpn, own, phase, protection)
        });
        let sealed = match datagram {
            Unsealed::InPlace(datagram) => seal::seal(datagram, key, pn, epochs),
            Unsealed::Into { out, payload } => seal::encrypt_into(out, payload, key, pn, epochs),
        };
        if sealed.is_err() {
            return false;
        }
        self.next_pn += 1;
        true
    }

    /// Opens `datagram` from the peer, `sender`, to this module,
    /// whose key is `own` and receiving queue pair `own_qpn`, and takes its
    /// packet number. An encrypted payload is plaintext in place after
    /// [`Check::Intact`].
    pub(super) fn open(
        &mut self,
        datagram: &mut [u8],
        (own, own_qpn): (&AuthKey, u32),
        sender: Sender,
        epochs: Epochs,
        protection: Protection,
    ) -> Check {
        let Some(pn) = seal::packet_number(datagram) else {
            return Check::Unauthenticated;
        };
        if !self.replay.check(pn) {
            return Check::Replayed;
        }
        let key = key_of_phase(&mut self.recv, seal::phase_of(pn), |phase| {
            SealKey::derive(own, own_qpn, sender, phase, protection)
        });
        if !seal::open(datagram, key, epochs) {
            return Check::Unauthenticated;
        }
        self.replay.take(pn);
        Check::Intact
    }
}

/// The key in `cache` if it is of `phase`, else the one `derive` makes
/// for it, kept in `cache` from now on.
fn key_of_phase(
    cache: &mut Option<SealKey>,
    phase: u32,
    derive: impl FnOnce(u32) -> SealKey,
) -> &SealKey {
    if cache.as_ref().is_some_and(|key| key.phase() != phase) {
        *cache = None;
    }
    cache.get_or_insert_with(|| derive(phase))
}

/// Opens `datagram` from `sender`, which this module, whose key is
/// `own` and receiving queue pair `own_qpn`, does not know yet. There is no
/// replay window for it: the datagram is only noted, never delivered.
pub(super) fn open_from_stranger(
    datagram: &mut [u8],
    (own, own_qpn): (&AuthKey, u32),
    sender: Sender,
    protection: Protection,
) -> Check {
    let Some(pn) = seal::packet_number(datagram) else {
        return Check::Unauthenticated;
    };
    let key = SealKey::derive(own, own_qpn, sender, seal::phase_of(pn), protection);
    if seal::open(datagram, &key, Epochs::default()) {
        Check::Intact
    } else {
        Check::Unauthenticated
    }
}

/// Whether a module that seals with `own` opens a datagram with extension
/// flags `flags`: only if it is sealed the same way. A module that
/// encrypts takes nothing in clear; one that authenticates has no key for
/// encrypted datagrams (the protection is part of the key).
pub(super) fn sealed_as(flags: u16, own: Protection) -> bool {
    flags & (udbtl_wire::rel::FLAG_SEALED | udbtl_wire::rel::FLAG_ENCRYPTED) == own.flags()
}

#[cfg(test)]
mod tests {
    use super::*;
    use udbtl_wire::rel::{FLAG_ENCRYPTED, FLAG_SEALED};

    #[test]
    fn a_module_opens_only_what_is_sealed_as_it_seals() {
        use Protection::{Authenticate, Encrypt};
        assert!(!sealed_as(0, Authenticate));
        assert!(sealed_as(FLAG_SEALED, Authenticate));
        assert!(!sealed_as(FLAG_SEALED | FLAG_ENCRYPTED, Authenticate));
        assert!(!sealed_as(FLAG_SEALED, Encrypt));
        assert!(sealed_as(FLAG_SEALED | FLAG_ENCRYPTED, Encrypt));
    }

    /// A stream that crosses a key phase: the sender and the receiver each
    /// move to the next phase's key by themselves, and every datagram
    /// opens, once.
    #[test]
    fn both_ends_change_keys_at_a_phase_boundary() {
        use udbtl_wire::datagram::{self, HEADER_LEN};
        use udbtl_wire::seal::{PHASE_SHIFT, SEALED_HEADER_LEN};
        let receiver = AuthKey([9; 32]);
        let sender = Sender { job_key: 5, id: 1 };
        for protection in [Protection::Authenticate, Protection::Encrypt] {
            let mut out = PairSeal::new().unwrap();
            out.next_pn = (3 << PHASE_SHIFT) - 2;
            let mut back = PairSeal::new().unwrap();
            for i in 0..4u8 {
                let mut bytes = vec![i; SEALED_HEADER_LEN + 100];
                let flags = protection.flags();
                udbtl_wire::rel::Repr {
                    src: sender.id,
                    flags,
                    ..Default::default()
                }
                .emit(&mut datagram::extension_mut(&mut bytes[..HEADER_LEN]).unwrap());
                let unsealed = Unsealed::InPlace(&mut bytes);
                assert!(out.seal(
                    unsealed,
                    (&receiver, 7),
                    sender,
                    Epochs::default(),
                    protection
                ));
                let mut copy = bytes.clone();
                let opened = back.open(
                    &mut bytes,
                    (&receiver, 7),
                    sender,
                    Epochs::default(),
                    protection,
                );
                assert_eq!(opened, Check::Intact, "datagram {i}, {protection:?}");
                assert_eq!(bytes[SEALED_HEADER_LEN..], [i; 100], "payload {i}");
                let again = back.open(
                    &mut copy,
                    (&receiver, 7),
                    sender,
                    Epochs::default(),
                    protection,
                );
                assert_eq!(again, Check::Replayed);
            }
            assert_eq!(seal::phase_of(out.next_pn), 3);
            assert_eq!(back.recv.as_ref().map(SealKey::phase), Some(3));
        }
    }

    #[test]
    fn packet_numbers_start_at_random_and_never_at_zero() {
        let a = PairSeal::new().unwrap().next_pn;
        let b = PairSeal::new().unwrap().next_pn;
        assert!((1..PACKET_NUMBER_START_MAX).contains(&a));
        assert_ne!(a, b);
    }
}
