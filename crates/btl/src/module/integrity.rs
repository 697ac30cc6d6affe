//! How a reliable module protects its datagrams: which check it asks for,
//! sealing what it sends and checking what it receives.

use udbtl_wire::datagram::{AuthKey, Epochs};
use udbtl_wire::{datagram, modex, rel};

/// How a reliable module protects its datagrams.
#[derive(Debug, Clone, Copy)]
pub(super) enum Integrity {
    /// The fabric checks integrity end to end (InfiniBand's ICRC).
    Fabric,
    /// A CRC-32 of every datagram.
    Checksum,
    /// A MAC of every datagram under its receiver's key; `own` is the key
    /// this module's peers use. With the job's datagram secret `job`, every
    /// module's key derives from it and its address, so none is published;
    /// without, `own` is random and published.
    Mac { own: AuthKey, job: Option<AuthKey> },
}

impl Integrity {
    /// The key peers authenticate their datagrams to this module with.
    pub(super) const fn own_key(&self) -> Option<AuthKey> {
        match *self {
            Self::Mac { own, .. } => Some(own),
            _ => None,
        }
    }

    /// How datagrams are protected, for the dump.
    pub(super) const fn name(&self) -> &'static str {
        match self {
            Self::Fabric => "fabric",
            Self::Checksum => "crc32",
            Self::Mac { job: Some(_), .. } => "mac (keys from the job secret)",
            Self::Mac { job: None, .. } => "mac (published keys)",
        }
    }

    /// How this module's address says it authenticates.
    pub(super) const fn auth(&self) -> modex::Auth {
        match *self {
            Self::Mac { job: Some(_), .. } => modex::Auth::Derived,
            Self::Mac { own, job: None } => modex::Auth::Key(own),
            Self::Fabric | Self::Checksum => modex::Auth::Off,
        }
    }

    /// The key to MAC datagrams to `peer` with (`Some(None)`: none, as
    /// neither side authenticates), or `None` if the two sides cannot talk:
    /// one authenticates and the other not, or one derives its keys from a
    /// job secret and the other publishes them.
    pub(super) fn peer_key(&self, peer: &modex::Address) -> Option<Option<AuthKey>> {
        match (*self, peer.auth) {
            (Self::Fabric | Self::Checksum, modex::Auth::Off) => Some(None),
            (Self::Mac { job: None, .. }, modex::Auth::Key(key)) => Some(Some(key)),
            (Self::Mac { job: Some(job), .. }, modex::Auth::Derived) => {
                Some(Some(modex::derive_receive_key(&job, peer)))
            }
            _ => None,
        }
    }

    /// The reliability header flag that asks the receiver to check what
    /// this module seals.
    pub(super) const fn flag(&self) -> u16 {
        match self {
            Self::Fabric => 0,
            Self::Checksum => rel::FLAG_CHECKSUM,
            Self::Mac { .. } => rel::FLAG_MAC,
        }
    }

    /// Checks the received datagram `bytes`, whose reliability header is
    /// `header`. A module that authenticates checks its key before anything
    /// else about the sender; one that does not cannot check a MAC. One that
    /// checksums takes nothing without a checksum: every peer seals what it
    /// sends alike, and a forger would otherwise skip it.
    /// `epochs` gives the epochs the sender's MAC covers, if there is one to
    /// check.
    pub(super) fn check(
        &self,
        bytes: &[u8],
        header: &rel::Repr,
        epochs: impl FnOnce() -> Epochs,
    ) -> Check {
        match self.own_key() {
            Some(key)
                if header.has(rel::FLAG_MAC) && datagram::verify_mac(bytes, &key, epochs()) =>
            {
                Check::Intact
            }
            Some(_) => Check::Unauthenticated,
            None if header.has(rel::FLAG_MAC) => Check::Unauthenticated,
            None if header.has(rel::FLAG_CHECKSUM) && !datagram::verify_checksum(bytes) => {
                Check::BadChecksum
            }
            None if matches!(self, Self::Checksum) && !header.has(rel::FLAG_CHECKSUM) => {
                Check::BadChecksum
            }
            None => Check::Intact,
        }
    }
}

/// What checking a received datagram found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Check {
    Intact,
    BadChecksum,
    Unauthenticated,
}

/// Fills in the checksum or MAC that `header`'s flags ask for, over the
/// datagram `head` followed by `rest` (and, for a MAC, `epochs`). `payload_crc`, if known, is the CRC-32
/// of everything after the headers, which a checksum then does not read
/// again. `false` if it asks for a MAC and the peer has no key, which
/// `add_procs` never lets happen.
pub(super) fn seal(
    head: &mut [u8],
    rest: &[&[u8]],
    payload_crc: Option<u32>,
    header: &rel::Repr,
    peer_key: Option<AuthKey>,
    epochs: Epochs,
) -> bool {
    if header.has(rel::FLAG_CHECKSUM) {
        match payload_crc {
            Some(crc) => datagram::fill_checksum_after(head, crc),
            None => datagram::fill_checksum(head, rest),
        };
    } else if header.has(rel::FLAG_MAC) {
        let Some(key) = peer_key else {
            return false;
        };
        datagram::fill_mac(head, rest, &key, epochs);
    }
    true
}
