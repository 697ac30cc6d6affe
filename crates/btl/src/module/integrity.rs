//! How a reliable module protects its datagrams: which check it asks for,
//! checksumming what it sends and checking what it receives. Sealed
//! datagrams (`auth`) are opened and sealed per peer, in `seal.rs`.

use udbtl_wire::datagram::AuthKey;
use udbtl_wire::seal::{Protection, SEALED_HEADER_LEN};
use udbtl_wire::{datagram, modex, rel};

/// How a reliable module protects its datagrams.
#[derive(Debug, Clone, Copy)]
pub(super) enum Integrity {
    /// The fabric checks integrity end to end (InfiniBand's ICRC).
    Fabric,
    /// A CRC-32 of every datagram.
    Checksum,
    /// Every datagram sealed ([`udbtl_wire::seal`]) under keys derived
    /// from its receiver's key and receiving queue pair; `own` and
    /// `own_qpn` are this module's. With the job's datagram secret `job`,
    /// every module's key derives from it and its address, so none is
    /// published; without, `own` is random and published.
    Sealed {
        own: AuthKey,
        own_qpn: u32,
        job: Option<AuthKey>,
        protection: Protection,
    },
}

impl Integrity {
    /// How this module seals, if it does.
    pub(super) const fn protection(&self) -> Option<Protection> {
        match *self {
            Self::Sealed { protection, .. } => Some(protection),
            _ => None,
        }
    }

    /// How datagrams are protected, for the dump.
    pub(super) const fn name(&self) -> &'static str {
        match self {
            Self::Fabric => "fabric",
            Self::Checksum => "crc32",
            Self::Sealed {
                protection: Protection::Encrypt,
                job,
                ..
            } => match job {
                Some(_) => "aes-256-gcm, encrypted (keys from the job secret)",
                None => "aes-256-gcm, encrypted (published keys)",
            },
            Self::Sealed { job: Some(_), .. } => "aes-256-gcm (keys from the job secret)",
            Self::Sealed { job: None, .. } => "aes-256-gcm (published keys)",
        }
    }

    /// How datagrams are protected, in one word (`Module::integrity`).
    pub(super) const fn word(&self) -> &'static str {
        match self {
            Self::Fabric => "fabric",
            Self::Checksum => "crc32",
            Self::Sealed {
                protection: Protection::Encrypt,
                ..
            } => "encrypted",
            Self::Sealed { .. } => "sealed",
        }
    }

    /// How this module's address says it authenticates.
    pub(super) const fn auth(&self) -> modex::Auth {
        match *self {
            Self::Sealed { job: Some(_), .. } => modex::Auth::Derived,
            Self::Sealed { own, job: None, .. } => modex::Auth::Key(own),
            Self::Fabric | Self::Checksum => modex::Auth::Off,
        }
    }

    /// The key of `peer`'s module, which this one's datagrams to it are
    /// sealed under (`Some(None)`: none, as neither side seals), or `None`
    /// if the two sides cannot talk: one seals and the other not, or one
    /// derives its keys from a job secret and the other publishes them.
    pub(super) fn peer_key(&self, peer: &modex::Address) -> Option<Option<AuthKey>> {
        match (*self, peer.auth) {
            (Self::Fabric | Self::Checksum, modex::Auth::Off) => Some(None),
            (Self::Sealed { job: None, .. }, modex::Auth::Key(key)) => Some(Some(key)),
            (Self::Sealed { job: Some(job), .. }, modex::Auth::Derived) => {
                Some(Some(modex::derive_receive_key(&job, peer)))
            }
            _ => None,
        }
    }

    /// The reliability header flags that ask the receiver to check what
    /// this module sends.
    pub(super) const fn flags(&self) -> u16 {
        match self {
            Self::Fabric => 0,
            Self::Checksum => rel::FLAG_CHECKSUM,
            Self::Sealed { protection, .. } => protection.flags(),
        }
    }

    /// Checks the received datagram `bytes`, whose reliability header is
    /// `header`, on a module that does not seal (a sealing one opens each
    /// datagram with its sender's state, `seal.rs`). It cannot check a
    /// seal, so it takes no sealed datagram. One that checksums takes
    /// nothing without a checksum: every peer seals what it sends alike,
    /// and a forger would otherwise skip it.
    pub(super) fn check_unsealed(&self, bytes: &[u8], header: &rel::Repr) -> Check {
        let checksummed = header.has(rel::FLAG_CHECKSUM);
        if header.has(rel::FLAG_SEALED) {
            Check::Unauthenticated
        } else if (checksummed && !datagram::verify_checksum(bytes))
            || (matches!(self, Self::Checksum) && !checksummed)
        {
            Check::BadChecksum
        } else {
            Check::Intact
        }
    }
}

/// Where the payload of a reliable datagram with extension flags `flags`
/// starts: after the tag of a sealed one.
pub(super) const fn payload_offset(flags: u16) -> usize {
    if flags & rel::FLAG_SEALED != 0 {
        SEALED_HEADER_LEN
    } else {
        datagram::HEADER_LEN
    }
}

/// What checking a received datagram found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Check {
    Intact,
    BadChecksum,
    Unauthenticated,
    /// Sealed, with a packet number taken before or behind the replay
    /// window: refused before its tag is checked.
    Replayed,
}

/// Fills in the checksum `header`'s flags ask for, over the datagram `head`
/// followed by `rest`. `payload_crc`, if known, is the CRC-32 of everything
/// after the headers, which a checksum then does not read again.
pub(super) fn checksum(
    head: &mut [u8],
    rest: &[&[u8]],
    payload_crc: Option<u32>,
    header: &rel::Repr,
) {
    if header.has(rel::FLAG_CHECKSUM) {
        match payload_crc {
            Some(crc) => datagram::fill_checksum_after(head, crc),
            None => datagram::fill_checksum(head, rest),
        };
    }
}
