//! The per-job secret of authenticated port mode, and the proof a client
//! gives of it.
//!
//! A launcher that serves PMI over TCP ([`Server::listen_tcp_with`]) makes
//! one [`JobSecret`] per job with [`JobSecret::generate`], hands it to each
//! rank as the hex string of [`JobSecret::to_hex`] in the environment
//! variable [`SECRET_ENV`] (never on a command line: see the [server
//! docs](crate::server#authenticated-port-mode)), and requires it with
//! [`PortOptions::with_secret`]. The server opens every TCP connection with a
//! fresh 32-byte nonce; the client answers with
//! `proof = BLAKE3-keyed(K, nonce ‖ pmiid)`, where
//! `K = BLAKE3-derive_key(`[`PROOF_CONTEXT`]`, secret)`. The server
//! recomputes it and compares in constant time.
//!
//! The same secret can key other things a job needs (a datagram MAC, a job
//! key): [`JobSecret::derive_key`] with another context string gives an
//! independent key.
//!
//! [`Server::listen_tcp_with`]: crate::Server::listen_tcp_with
//! [`PortOptions::with_secret`]: crate::server::PortOptions::with_secret

use std::fmt;

/// The environment variable from which [`PmiClient::from_env`] reads the
/// job secret (64 hex digits) in port mode.
///
/// [`PmiClient::from_env`]: crate::PmiClient::from_env
pub const SECRET_ENV: &str = "UDBTL_PMI_SECRET";

/// The context string under which the proof key is derived from the secret
/// (see the [module docs](self)). Other uses of the secret must use other
/// context strings.
pub const PROOF_CONTEXT: &str = "udbtl-pmi 2025-06 PMI_PORT initack proof v1";

/// Bytes in a [`JobSecret`] (256 bits).
pub const SECRET_LEN: usize = 32;

/// Bytes in a challenge nonce.
pub const NONCE_LEN: usize = 32;

/// Bytes in a proof (a BLAKE3 output).
pub const PROOF_LEN: usize = 32;

/// A failure to make or read a [`JobSecret`] or a nonce.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// The OS random source failed.
    #[error("reading the OS random source for the PMI {what}: {source}")]
    Randomness {
        /// What was being generated (`"secret"`, `"nonce"`).
        what: &'static str,
        /// The error of `getrandom`.
        #[source]
        source: getrandom::Error,
    },
    /// The text is not 64 hex digits. The text itself is never quoted, since
    /// it may be (most of) a secret.
    #[error("a PMI job secret must be {expected} hex digits, got {len} characters{detail}")]
    BadHex {
        /// `2 * SECRET_LEN`.
        expected: usize,
        /// The length of the text given.
        len: usize,
        /// `""`, or `" (not all hex digits)"`.
        detail: &'static str,
    },
}

/// A per-job secret of [`SECRET_LEN`] random bytes.
///
/// Its `Debug` output never shows the bytes; only [`to_hex`](Self::to_hex)
/// reveals them. The bytes are overwritten when it is dropped (best effort:
/// copies made by moves are not).
#[derive(Clone, PartialEq, Eq)]
pub struct JobSecret([u8; SECRET_LEN]);

impl JobSecret {
    /// A fresh secret from the OS random source.
    ///
    /// # Errors
    ///
    /// [`SecretError::Randomness`] if the OS random source fails.
    pub fn generate() -> Result<Self, SecretError> {
        let mut bytes = [0u8; SECRET_LEN];
        getrandom::fill(&mut bytes).map_err(|source| SecretError::Randomness {
            what: "secret",
            source,
        })?;
        Ok(Self(bytes))
    }

    /// A secret with these bytes (for tests, or a secret obtained
    /// elsewhere; they should be uniformly random).
    pub fn from_bytes(bytes: [u8; SECRET_LEN]) -> Self {
        Self(bytes)
    }

    /// Parses the 64 hex digits (either case) of [`to_hex`](Self::to_hex),
    /// surrounding ASCII whitespace ignored (so a line read from a pipe can
    /// be passed as is).
    ///
    /// # Errors
    ///
    /// [`SecretError::BadHex`], which does not quote the text.
    pub fn from_hex(text: &str) -> Result<Self, SecretError> {
        let text = text.trim_ascii();
        let bad = |detail| SecretError::BadHex {
            expected: 2 * SECRET_LEN,
            len: text.len(),
            detail,
        };
        if text.len() != 2 * SECRET_LEN {
            return Err(bad(""));
        }
        let bytes = decode_hex::<SECRET_LEN>(text).ok_or_else(|| bad(" (not all hex digits)"))?;
        Ok(Self(bytes))
    }

    /// The secret as 64 lowercase hex digits, for [`SECRET_ENV`]. Whoever
    /// holds this string can join the job: keep it off command lines and out
    /// of logs.
    pub fn to_hex(&self) -> String {
        encode_hex(&self.0)
    }

    /// A 32-byte key for one purpose, derived from the secret with BLAKE3's
    /// `derive_key` under `context` (a hard-coded, globally unique string
    /// naming the purpose, e.g. `"udbtl 2025 datagram MAC v1"`). Keys for
    /// different contexts are independent; [`PROOF_CONTEXT`] is taken.
    pub fn derive_key(&self, context: &str) -> [u8; 32] {
        blake3::derive_key(context, &self.0)
    }

    /// The proof that answers the challenge `nonce` for `pmiid`:
    /// BLAKE3 keyed by `derive_key(PROOF_CONTEXT)` over `nonce ‖ pmiid`.
    pub fn proof(&self, nonce: &[u8; NONCE_LEN], pmiid: &str) -> [u8; PROOF_LEN] {
        let mut mac = blake3::Hasher::new_keyed(&self.derive_key(PROOF_CONTEXT));
        mac.update(nonce);
        mac.update(pmiid.as_bytes());
        *mac.finalize().as_bytes()
    }

    /// Whether `proof` (hex, as sent on the wire) answers `nonce` for
    /// `pmiid`. The comparison takes the same time whichever byte differs.
    pub fn verify(&self, nonce: &[u8; NONCE_LEN], pmiid: &str, proof: &str) -> bool {
        let Some(given) = decode_hex::<PROOF_LEN>(proof) else {
            return false;
        };
        // blake3::Hash's equality is constant-time.
        blake3::Hash::from_bytes(given) == blake3::Hash::from_bytes(self.proof(nonce, pmiid))
    }
}

impl fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JobSecret(<redacted>)")
    }
}

impl Drop for JobSecret {
    fn drop(&mut self) {
        self.0 = [0; SECRET_LEN];
        // Keeps the compiler from treating the wipe as a dead store.
        std::hint::black_box(&self.0);
    }
}

/// A fresh challenge nonce from the OS random source.
///
/// # Errors
///
/// [`SecretError::Randomness`].
pub fn new_nonce() -> Result<[u8; NONCE_LEN], SecretError> {
    let mut nonce = [0u8; NONCE_LEN];
    getrandom::fill(&mut nonce).map_err(|source| SecretError::Randomness {
        what: "nonce",
        source,
    })?;
    Ok(nonce)
}

/// Lowercase hex of `bytes`.
pub(crate) fn encode_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 * bytes.len());
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    out
}

/// Exactly `N` bytes from `2 * N` hex digits (either case); `None` otherwise.
pub(crate) fn decode_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    fn digit(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let text = text.as_bytes();
    if text.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (byte, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
        *byte = (digit(pair[0])? << 4) | digit(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_refusals() {
        let secret = JobSecret::generate().unwrap();
        let hex = secret.to_hex();
        assert_eq!(hex.len(), 64);
        assert_eq!(JobSecret::from_hex(&hex).unwrap(), secret);
        assert_eq!(
            JobSecret::from_hex(&format!(" {}\n", hex.to_uppercase())).unwrap(),
            secret
        );
        for bad in ["", "00", &hex[..62], &format!("{hex}00"), &"g".repeat(64)] {
            let err = JobSecret::from_hex(bad).unwrap_err();
            assert!(!err.to_string().contains(&hex[..8]), "{err}");
        }
        assert_ne!(JobSecret::generate().unwrap(), secret);
    }

    #[test]
    fn debug_hides_the_bytes() {
        let secret = JobSecret::from_bytes([0xab; SECRET_LEN]);
        let shown = format!("{secret:?} {secret:#?}");
        assert!(!shown.to_lowercase().contains("ab"), "{shown}");
        assert!(!shown.contains("171"), "{shown}");
    }

    #[test]
    fn proof_binds_secret_nonce_and_pmiid() {
        let secret = JobSecret::from_bytes([7; SECRET_LEN]);
        let nonce = [1; NONCE_LEN];
        let proof = encode_hex(&secret.proof(&nonce, "3"));
        assert!(secret.verify(&nonce, "3", &proof));
        assert!(secret.verify(&nonce, "3", &proof.to_uppercase()));
        assert!(!secret.verify(&nonce, "4", &proof));
        assert!(!secret.verify(&[2; NONCE_LEN], "3", &proof));
        assert!(!JobSecret::from_bytes([8; SECRET_LEN]).verify(&nonce, "3", &proof));
        assert!(!secret.verify(&nonce, "3", &proof[..62]));
        assert!(!secret.verify(&nonce, "3", ""));
        // Other purposes get other keys.
        assert_ne!(secret.derive_key(PROOF_CONTEXT), secret.derive_key("other"));
    }
}
