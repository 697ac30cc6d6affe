//! The address a BTL module publishes for its peers (the "modex" entry).
//!
//! A process publishes one blob: a 4-byte preamble followed by one 64-byte
//! entry per module, each followed in version 8 by a 32-byte key. Every field is
//! big-endian, so the blob means the same on hosts of either byte order (the
//! original component published host-order structs).
//!
//! ```text
//! preamble:  0..2 magic 0x5541 ("UA") | 2 version | 3 entry count
//! entry:     0 kind | 1 port | 2..4 LID | 4..8 process id | 8..24 address
//!            24..28 max message size | 28..32 stream nonce | 32..40 network id
//!            40..56 the module's four QPNs | 56..60 Q_Key | 60..64 job key mask
//! key:       (version 8 only, after each entry) the module's receive key
//! ```
//!
//! Version 7 is what a process without authentication publishes. An entry's
//! key in version 8 is the one its peers must seal their datagrams to that
//! module under ([`crate::seal::SealKey::derive`]); it reaches every
//! process that can read the job's key-value space. Version 9 has version
//! 4's layout and says that each module's receive key is derived from a
//! secret the whole job holds and the entry itself
//! ([`derive_receive_key`]), so no key is published: a launcher that hands
//! its ranks a job secret over a private channel keeps the keys off the
//! key-value space.
//!
//! The stream nonce is drawn at random when the module is made, and both
//! ends of a pair derive where their streams start from their two nonces
//! ([`stream_start`]): a forger who cannot read the key-value space or the
//! traffic cannot place a reset or an acknowledgement where a receiver
//! accepts it (RFC 5961). Older blobs hold zero there, which is a nonce
//! like any other.
//!
//! The Q_Key and the job key mask are the module's [`Admission`]: drawn at
//! random when the module is made, they are what a datagram must carry to
//! be taken in at all. Peers put the Q_Key on every send to the module (UD
//! verbs take a remote Q_Key per send; the fabric drops a datagram with
//! another) and the job key XORed with the mask into every BTL header to it.
//! Versions 1 to 3 had 56-byte entries without them and are refused.
//!
//! The first QPN receives. The module sends from all four, striping its
//! peers over them: to each peer from the one a hash of the peer's
//! receiving QPN picks, which the peer computes too and recognises the
//! sender by (`udbtl_btl::sending_qp`), so all four are published.
//! Versions 4 to 6 had this layout, from builds whose modules sent to a peer
//! from any of the four; they are refused.
//!
//! `kind` says how to read the 16-byte address field: an IPv4 address in its
//! first four bytes, an IPv6 address, a simulated port id in its first four
//! bytes, or an InfiniBand GID (with the LID field). The network id names the
//! network the port is attached to: a local module only pairs with a peer
//! address on the same network.

use crate::SeqNum;
use crate::datagram::AuthKey;
use crate::field::{Field, read_u16, read_u32, write_u16, write_u32};
use crate::{Error, Result};

/// Length of the blob preamble.
pub const PREAMBLE_LEN: usize = 4;
/// Length of one entry.
pub const ENTRY_LEN: usize = 64;
/// Queue pairs published per entry.
pub const QPNS: usize = 4;
/// Magic number of a blob.
pub const MAGIC: u16 = 0x5541;
/// The version of a blob without a key.
pub const VERSION: u8 = 7;
/// The version of a blob whose entries are each followed by a receive key.
pub const VERSION_WITH_KEY: u8 = 8;
/// The version of a blob whose receive keys derive from the job secret.
pub const VERSION_DERIVED_KEY: u8 = 9;
/// Length of the key after each entry of a [`VERSION_WITH_KEY`] blob.
pub const KEY_LEN: usize = 32;
/// Most entries one blob can carry.
pub const MAX_ENTRIES: usize = u8::MAX as usize;

mod field {
    use super::Field;
    pub(super) const KIND: usize = 0;
    pub(super) const PORT: usize = 1;
    pub(super) const LID: Field = 2..4;
    pub(super) const PROC_ID: Field = 4..8;
    pub(super) const ADDRESS: Field = 8..24;
    pub(super) const MAX_MSG: Field = 24..28;
    pub(super) const STREAM_NONCE: Field = 28..32;
    pub(super) const NETWORK_HI: Field = 32..36;
    pub(super) const NETWORK_LO: Field = 36..40;
    pub(super) const QPNS: usize = 40;
    pub(super) const QKEY: Field = 56..60;
    pub(super) const JOB_KEY_MASK: Field = 60..64;
}

/// Where a published port lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Location {
    /// An IPv4 address.
    Ipv4([u8; 4]),
    /// An IPv6 address.
    Ipv6([u8; 16]),
    /// A port of the simulated fabric.
    Sim(u32),
    /// An InfiniBand port.
    Ib {
        /// Local identifier.
        lid: u16,
        /// Global identifier.
        gid: [u8; 16],
    },
}

/// A view over one entry.
///
/// # Panics
/// The accessors index the buffer directly. On a view made by
/// [`Entry::new_checked`] they cannot panic; on one made by
/// [`Entry::new_unchecked`] over a buffer shorter than [`ENTRY_LEN`] they
/// panic.
#[derive(Debug, Clone, Copy)]
pub struct Entry<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Entry<T> {
    /// Wraps a buffer without checking its length. Use only on buffers this
    /// process sized itself, such as when emitting.
    ///
    /// # Panics
    /// Never here, but every accessor panics, and [`Address::emit`] panics,
    /// if the buffer is shorter than [`ENTRY_LEN`]: the length is the
    /// caller's promise.
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wraps a buffer after checking it holds a whole entry.
    ///
    /// # Errors
    /// [`Error`] if the buffer is shorter than [`ENTRY_LEN`].
    pub fn new_checked(buffer: T) -> Result<Self> {
        let entry = Self::new_unchecked(buffer);
        entry.check_len()?;
        Ok(entry)
    }

    /// Checks the buffer is long enough for every accessor.
    ///
    /// # Errors
    /// [`Error`] if the buffer is shorter than [`ENTRY_LEN`].
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < ENTRY_LEN {
            Err(Error)
        } else {
            Ok(())
        }
    }

    fn byte(&self, index: usize) -> u8 {
        self.buffer.as_ref()[index]
    }

    /// The address kind byte.
    pub fn kind(&self) -> u8 {
        self.byte(field::KIND)
    }

    /// The port number.
    pub fn port(&self) -> u8 {
        self.byte(field::PORT)
    }

    /// The LID field.
    pub fn lid(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::LID)
    }

    /// The published queue pair numbers; the first receives.
    pub fn qpns(&self) -> [u32; QPNS] {
        core::array::from_fn(|i| {
            let start = field::QPNS + 4 * i;
            read_u32(self.buffer.as_ref(), start..start + 4)
        })
    }

    /// The 16-byte address field.
    pub fn address(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out.copy_from_slice(&self.buffer.as_ref()[field::ADDRESS]);
        out
    }

    /// The raw datagram size field: see [`Address::max_msg_size`] and
    /// [`Address::packet_size`] for what it holds.
    pub fn max_msg_size(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::MAX_MSG)
    }

    /// The module's stream nonce.
    pub fn stream_nonce(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::STREAM_NONCE)
    }

    /// The Q_Key peers put on every send to the module.
    pub fn qkey(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::QKEY)
    }

    /// The mask peers XOR into the job key of every datagram to the module.
    pub fn job_key_mask(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::JOB_KEY_MASK)
    }

    /// The publishing process's id.
    pub fn proc_id(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::PROC_ID)
    }

    /// The network id.
    pub fn network(&self) -> u64 {
        let bytes = self.buffer.as_ref();
        (u64::from(read_u32(bytes, field::NETWORK_HI)) << 32)
            | u64::from(read_u32(bytes, field::NETWORK_LO))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Entry<T> {
    fn set_byte(&mut self, index: usize, value: u8) {
        self.buffer.as_mut()[index] = value;
    }

    /// Sets every field from `address`.
    fn fill(&mut self, address: &Address) {
        let (kind, lid, bytes) = match address.location {
            Location::Ipv4(ip) => {
                let mut bytes = [0u8; 16];
                bytes[..4].copy_from_slice(&ip);
                (1, 0, bytes)
            }
            Location::Ipv6(ip) => (2, 0, ip),
            Location::Sim(id) => {
                let mut bytes = [0u8; 16];
                bytes[..4].copy_from_slice(&id.to_be_bytes());
                (3, 0, bytes)
            }
            Location::Ib { lid, gid } => (4, lid, gid),
        };
        self.set_byte(field::KIND, kind);
        self.set_byte(field::PORT, address.port);
        let buffer = self.buffer.as_mut();
        write_u16(buffer, field::LID, lid);
        write_u32(buffer, field::PROC_ID, address.proc_id);
        for (i, qpn) in address.qpns.iter().enumerate() {
            let start = field::QPNS + 4 * i;
            write_u32(buffer, start..start + 4, *qpn);
        }
        buffer[field::ADDRESS].copy_from_slice(&bytes);
        write_u32(buffer, field::MAX_MSG, sizes_field(address));
        write_u32(buffer, field::STREAM_NONCE, address.stream_nonce);
        write_u32(buffer, field::NETWORK_HI, (address.network >> 32) as u32);
        write_u32(buffer, field::NETWORK_LO, address.network as u32);
        write_u32(buffer, field::QKEY, address.admission.qkey);
        write_u32(buffer, field::JOB_KEY_MASK, address.admission.job_key_mask);
    }
}

/// The validated contents of one entry: how to reach one module of a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Address {
    /// Where the port is.
    pub location: Location,
    /// The port number on its device.
    pub port: u8,
    /// The module's queue pairs; the first one receives.
    pub qpns: [u32; QPNS],
    /// An id of the publishing process, carried in its reliable datagrams:
    /// a receiver drops datagrams from a process that reused the address.
    pub proc_id: u32,
    /// The largest payload the port accepts.
    pub max_msg_size: u32,
    /// The largest payload of a datagram that leaves as one packet: less
    /// than `max_msg_size` where the port cuts longer ones into pieces.
    /// In the entry's size field, a port that cuts sets the top bit, its
    /// packet size in bits 16 to 30 and its largest payload in the low 16
    /// bits; any other port writes its largest payload (below 2^31), which
    /// is also its packet size. A size pair the field cannot hold is
    /// published as the packet size alone.
    pub packet_size: u32,
    /// The network the port is attached to.
    pub network: u64,
    /// Drawn at random by the module: with a peer's, where the two streams
    /// between them start ([`stream_start`]).
    pub stream_nonce: u32,
    /// What a datagram to the module must carry to be taken in.
    pub admission: Admission,
    /// Whether the module authenticates datagrams, and with what key.
    pub auth: Auth,
}

/// The top bit of an entry's size field: the port cuts long datagrams
/// into pieces, and the field holds two sizes ([`Address::packet_size`]).
const CUTS: u32 = 1 << 31;

/// The size field of `address`'s entry.
fn sizes_field(address: &Address) -> u32 {
    let (size, packet) = (address.max_msg_size, address.packet_size);
    if packet >= size {
        size & !CUTS
    } else if size <= 0xffff && packet <= 0x7fff {
        CUTS | (packet << 16) | size
    } else {
        packet & !CUTS
    }
}

/// The largest payload and the packet size an entry's size field holds.
const fn sizes_of(field: u32) -> (u32, u32) {
    if field & CUTS != 0 {
        (field & 0xffff, (field >> 16) & 0x7fff)
    } else {
        (field, field)
    }
}

/// What a datagram must carry for a module to take it in: 63 bits drawn at
/// random per module (or fixed by configuration), which reach its peers
/// through the modex and no one else. A forger who cannot read the job's
/// key-value space or its traffic has to guess them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Admission {
    /// The UD Q_Key of the module's queue pairs. Its top bit is always
    /// clear: verbs reserve Q_Keys with it set (controlled Q_Keys), and a
    /// send work request with it set means "the sending queue pair's own".
    pub qkey: u32,
    /// XORed into the job key of every BTL header sent to the module
    /// ([`crate::btl::Repr::job_key`]); the module XORs it out again.
    pub job_key_mask: u32,
}

impl Admission {
    /// The largest Q_Key an admission can hold: the top bit is reserved.
    pub const MAX_QKEY: u32 = 0x7fff_ffff;

    /// An admission from 8 random bytes: the Q_Key from the first four with
    /// its top bit cleared, the mask from the others.
    #[must_use]
    pub const fn from_random(bytes: [u8; 8]) -> Self {
        Self {
            qkey: u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) & Self::MAX_QKEY,
            job_key_mask: u32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
        }
    }
}

impl core::fmt::Display for Location {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Self::Ipv4(ip) => write!(f, "{}", core::net::Ipv4Addr::from(ip)),
            Self::Ipv6(ip) => write!(f, "{}", core::net::Ipv6Addr::from(ip)),
            Self::Sim(id) => write!(f, "sim node {id}"),
            Self::Ib { lid, .. } => write!(f, "InfiniBand LID {lid}"),
        }
    }
}

/// For messages: where the port is, and its network.
impl core::fmt::Display for Address {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} (network {:016x})", self.location, self.network)
    }
}

/// How a module authenticates the datagrams it receives: the key its peers
/// seal what they send it under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Auth {
    /// It does not: datagrams carry a checksum or nothing.
    Off,
    /// Under this key, published with the address (version 8).
    Key(AuthKey),
    /// Under the key [`derive_receive_key`] gives from the job's secret and
    /// the address (version 9).
    Derived,
}

/// The first sequence number of the stream from the module whose stream
/// nonce is `sender` to the one whose nonce is `receiver`. Both ends compute
/// it alike; the two directions start at unrelated numbers. The nonces are
/// the secret: this only spreads them over the whole sequence space
/// (`MurmurHash3`'s 64-bit finalizer, a bijection), so that a nonce near
/// another does not start near it.
#[must_use]
pub const fn stream_start(sender: u32, receiver: u32) -> SeqNum {
    let mut x = ((sender as u64) << 32) | receiver as u64;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    SeqNum((x >> 32) as u32)
}

/// The context string of [`derive_receive_key`]'s hash: no other use of a
/// job secret may use it.
pub const RECEIVE_KEY_CONTEXT: &[u8] = b"udbtl 2026-12 module receive key v1";

/// The receive key of the module at `address` in a job whose datagram
/// secret is `job`: keyed BLAKE3 under `job` of a context string and the
/// address's entry with its process id zeroed (the one field a module may
/// change after it publishes). Every entry differs, so a datagram MACed for
/// one module fails at every other, and the key is the same whoever
/// computes it: the module itself, or a peer from the published entry.
#[must_use]
pub fn derive_receive_key(job: &AuthKey, address: &Address) -> AuthKey {
    let canonical = Address {
        proc_id: 0,
        auth: Auth::Off,
        ..*address
    };
    let mut entry = [0u8; ENTRY_LEN];
    canonical.emit(&mut Entry::new_unchecked(&mut entry[..]));
    let mut hasher = blake3::Hasher::new_keyed(&job.0);
    hasher.update(RECEIVE_KEY_CONTEXT);
    hasher.update(&entry);
    AuthKey(*hasher.finalize().as_bytes())
}

impl Address {
    /// Parses a checked entry.
    ///
    /// # Errors
    /// [`Error`] on a buffer shorter than [`ENTRY_LEN`], an unknown kind,
    /// padding bytes that should be zero, or a Q_Key with its reserved top
    /// bit set.
    pub fn parse<T: AsRef<[u8]>>(entry: &Entry<T>) -> Result<Self> {
        entry.check_len()?;
        let bytes = entry.address();
        let four = [bytes[0], bytes[1], bytes[2], bytes[3]];
        let tail_clear = bytes[4..].iter().all(|b| *b == 0);
        let location = match entry.kind() {
            1 if tail_clear && entry.lid() == 0 => Location::Ipv4(four),
            2 if entry.lid() == 0 => Location::Ipv6(bytes),
            3 if tail_clear && entry.lid() == 0 => Location::Sim(u32::from_be_bytes(four)),
            4 => Location::Ib {
                lid: entry.lid(),
                gid: bytes,
            },
            _ => return Err(Error),
        };
        if entry.qkey() > Admission::MAX_QKEY {
            return Err(Error);
        }
        let sizes = sizes_of(entry.max_msg_size());
        Ok(Self {
            location,
            port: entry.port(),
            qpns: entry.qpns(),
            proc_id: entry.proc_id(),
            max_msg_size: sizes.0,
            packet_size: sizes.1,
            network: entry.network(),
            stream_nonce: entry.stream_nonce(),
            admission: Admission {
                qkey: entry.qkey(),
                job_key_mask: entry.job_key_mask(),
            },
            auth: Auth::Off,
        })
    }

    /// Writes the entry into the first [`ENTRY_LEN`] bytes of `entry`; the
    /// key goes after it, in the blob ([`emit_blob`]).
    ///
    /// # Panics
    /// If `entry`'s buffer is shorter than [`ENTRY_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, entry: &mut Entry<T>) {
        entry.fill(self);
    }
}

/// Serializes a process's addresses into one blob: version 7 without
/// authentication, version 8 with each entry followed by its key, version 9
/// with derived keys.
///
/// # Errors
/// [`Error`] if there are more than [`MAX_ENTRIES`] addresses, or if they do
/// not all authenticate the same way (all off, all keyed or all derived).
pub fn emit_blob(addresses: &[Address]) -> Result<Vec<u8>> {
    let count = u8::try_from(addresses.len()).map_err(|_| Error)?;
    let version = match addresses.first().map(|a| a.auth) {
        None | Some(Auth::Off) => VERSION,
        Some(Auth::Key(_)) => VERSION_WITH_KEY,
        Some(Auth::Derived) => VERSION_DERIVED_KEY,
    };
    if addresses.iter().any(|a| version_of(a.auth) != version) {
        return Err(Error);
    }
    let stride = stride_of(version);
    let mut blob = vec![0u8; PREAMBLE_LEN + stride * addresses.len()];
    blob[..2].copy_from_slice(&MAGIC.to_be_bytes());
    blob[2] = version;
    blob[3] = count;
    for (address, chunk) in addresses
        .iter()
        .zip(blob[PREAMBLE_LEN..].chunks_exact_mut(stride))
    {
        let (entry, key) = chunk.split_at_mut(ENTRY_LEN);
        address.emit(&mut Entry::new_unchecked(entry));
        if let Auth::Key(auth_key) = address.auth {
            key.copy_from_slice(&auth_key.0);
        }
    }
    Ok(blob)
}

const fn version_of(auth: Auth) -> u8 {
    match auth {
        Auth::Off => VERSION,
        Auth::Key(_) => VERSION_WITH_KEY,
        Auth::Derived => VERSION_DERIVED_KEY,
    }
}

/// Bytes per entry in a blob of a known `version`.
const fn stride_of(version: u8) -> usize {
    if version == VERSION_WITH_KEY {
        ENTRY_LEN + KEY_LEN
    } else {
        ENTRY_LEN
    }
}

/// Parses a blob into its addresses, with how each authenticates.
///
/// # Errors
/// [`Error`] on a wrong magic or version, a length that disagrees with the
/// entry count and version, or any malformed entry.
pub fn parse_blob(blob: &[u8]) -> Result<Vec<Address>> {
    if blob.len() < PREAMBLE_LEN || read_u16(blob, 0..2) != MAGIC {
        return Err(Error);
    }
    let version = blob[2];
    if !matches!(version, VERSION | VERSION_WITH_KEY | VERSION_DERIVED_KEY) {
        return Err(Error);
    }
    let stride = stride_of(version);
    if blob.len() != PREAMBLE_LEN + stride * usize::from(blob[3]) {
        return Err(Error);
    }
    blob[PREAMBLE_LEN..]
        .chunks_exact(stride)
        .map(|chunk| {
            let (entry, key) = chunk.split_at(ENTRY_LEN);
            let address = Address::parse(&Entry::new_checked(entry)?)?;
            let auth = match (version, key.try_into()) {
                (VERSION_WITH_KEY, Ok(key)) => Auth::Key(AuthKey(key)),
                (VERSION_DERIVED_KEY, _) => Auth::Derived,
                _ => Auth::Off,
            };
            Ok(Address { auth, ..address })
        })
        .collect()
}

#[cfg(test)]
mod tests;
