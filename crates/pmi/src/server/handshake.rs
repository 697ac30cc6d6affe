//! The port-mode handshake of the sans-IO core: [`ServerCore::handle_initack`]
//! and [`ServerCore::handle_proved_initack`] turn the first message of a
//! `PMI_PORT` connection into a [`Handshake`], and [`challenge_message`] is
//! the server's first line in authenticated port mode (see the [module
//! docs](super#authenticated-port-mode)).

use tracing::debug;

use super::{ServerCore, ServerError};
use crate::auth::{self, JobSecret, NONCE_LEN};
use crate::wire::{self, Message};

/// The outcome of [`ServerCore::handle_initack`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Handshake {
    /// The connection is rank `rank`: send `replies` (`cmd=initack`, then
    /// `cmd=set size=`, `cmd=set rank=`, `cmd=set debug=0`) and carry on with
    /// [`ServerCore::handle`].
    Accepted {
        /// The rank named by `pmiid`.
        rank: u32,
        /// The four handshake lines.
        replies: Vec<Message>,
    },
    /// Send `reply` and close the connection.
    Rejected {
        /// `cmd=initack rc=-1 msg=...`.
        reply: Message,
        /// Why, for the launcher.
        detail: String,
        /// Which kind of refusal, for counting.
        reason: Refusal,
    },
}

/// Why [`ServerCore::handle_initack`] (or
/// [`handle_proved_initack`](ServerCore::handle_proved_initack)) refused a
/// connection, with the `msg` of its `cmd=initack rc=-1` reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The first message was not `cmd=initack` (`msg=expected_initack`).
    NotInitack,
    /// `pmiid` is missing, not a number, or not a rank of the job
    /// (`msg=invalid_pmiid`, or `msg=pmiid_refused` when out of range).
    InvalidPmiid,
    /// The listener requires the job secret and the `proof` is missing,
    /// malformed or wrong (`msg=authentication_failed`).
    Unauthenticated,
    /// The rank already has a connection: a rank is claimed once
    /// (`msg=pmiid_refused`).
    RankClaimed,
}

impl ServerCore {
    /// Handles the first message of a port-mode connection without the job
    /// secret, `cmd=initack pmiid=<rank>`, and attaches that rank. A rank
    /// that already has a connection is refused ([`Refusal::RankClaimed`]).
    pub fn handle_initack(&mut self, msg: &Message) -> Handshake {
        self.initack(msg, None)
    }

    /// Handles the first message of an authenticated port-mode connection,
    /// to which the server sent `cmd=challenge nonce=<hex of nonce>`: it must
    /// be `cmd=initack pmiid=<rank> proof=<hex>` with the proof of
    /// [`JobSecret::proof`]`(nonce, pmiid)`, checked in constant time before
    /// the rank is looked at. Then as [`handle_initack`](Self::handle_initack).
    pub fn handle_proved_initack(
        &mut self,
        msg: &Message,
        secret: &JobSecret,
        nonce: &[u8; NONCE_LEN],
    ) -> Handshake {
        self.initack(msg, Some((secret, nonce)))
    }

    fn initack(
        &mut self,
        msg: &Message,
        auth: Option<(&JobSecret, &[u8; NONCE_LEN])>,
    ) -> Handshake {
        let reject = |reason: Refusal, msg: &str, detail: String| Handshake::Rejected {
            reply: Message::new("initack").with("rc", "-1").with("msg", msg),
            detail,
            reason,
        };
        if msg.cmd() != "initack" || msg.is_multiline() {
            return reject(
                Refusal::NotInitack,
                "expected_initack",
                format!("expected cmd=initack, got cmd={}", wire::snippet(msg.cmd())),
            );
        }
        let pmiid = msg.get("pmiid");
        if let Some((secret, nonce)) = auth {
            let proved = match (pmiid, msg.get("proof")) {
                (Some(pmiid), Some(proof)) => secret
                    .verify(nonce, pmiid, proof)
                    .then_some(())
                    .ok_or("a wrong proof"),
                (_, None) => Err("no proof (this server requires the job secret)"),
                (None, Some(_)) => Err("a proof but no pmiid"),
            };
            if let Err(what) = proved {
                return reject(
                    Refusal::Unauthenticated,
                    "authentication_failed",
                    format!(
                        "initack for pmiid {:?} with {what}",
                        pmiid.map(wire::snippet).unwrap_or_default()
                    ),
                );
            }
        }
        let Some(rank) = pmiid.and_then(|id| id.parse::<u32>().ok()) else {
            return reject(
                Refusal::InvalidPmiid,
                "invalid_pmiid",
                format!("initack with pmiid {:?}", pmiid.map(wire::snippet)),
            );
        };
        match self.attach(rank) {
            Ok(()) => {}
            Err(e @ ServerError::AlreadyConnected { .. }) => {
                return reject(
                    Refusal::RankClaimed,
                    "pmiid_refused",
                    format!("second claim of rank {rank} refused: {e}"),
                );
            }
            Err(e) => return reject(Refusal::InvalidPmiid, "pmiid_refused", e.to_string()),
        }
        debug!(rank, authenticated = auth.is_some(), "PMI_PORT handshake");
        Handshake::Accepted {
            rank,
            replies: vec![
                Message::new("initack"),
                Message::new("set").with("size", self.size().to_string()),
                Message::new("set").with("rank", rank.to_string()),
                Message::new("set").with("debug", "0"),
            ],
        }
    }
}

/// `cmd=challenge nonce=<hex>`, the first line of an authenticated
/// port-mode connection.
pub fn challenge_message(nonce: &[u8; NONCE_LEN]) -> Message {
    Message::new("challenge").with("nonce", auth::encode_hex(nonce))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::Action;

    fn core(size: u32) -> ServerCore {
        ServerCore::new(size, "kvs_test").unwrap()
    }

    fn msg(line: &str) -> Message {
        Message::parse(line.as_bytes()).unwrap()
    }

    #[test]
    fn initack_handshake() {
        let mut c = core(2);
        match c.handle_initack(&msg("cmd=initack pmiid=1")) {
            Handshake::Accepted { rank, replies } => {
                assert_eq!(rank, 1);
                let lines: Vec<_> = replies.iter().map(|m| m.to_line().unwrap()).collect();
                assert_eq!(
                    lines,
                    [
                        "cmd=initack\n",
                        "cmd=set size=2\n",
                        "cmd=set rank=1\n",
                        "cmd=set debug=0\n"
                    ]
                );
            }
            other => panic!("{other:?}"),
        }
        for bad in [
            "cmd=initack pmiid=1",
            "cmd=initack pmiid=2",
            "cmd=initack",
            "cmd=init",
        ] {
            match c.handle_initack(&msg(bad)) {
                Handshake::Rejected { reply, .. } => {
                    assert_eq!((reply.cmd(), reply.get("rc")), ("initack", Some("-1")));
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
        assert!(matches!(
            c.attach(1),
            Err(ServerError::AlreadyConnected { rank: 1 })
        ));
        assert!(matches!(
            c.attach(2),
            Err(ServerError::RankOutOfRange { rank: 2, size: 2 })
        ));
        assert!(c.attach(0).is_ok());
        assert!(matches!(
            c.handle(0, &msg("cmd=initack pmiid=0")),
            Action::Close { .. }
        ));
    }

    fn refusal(h: Handshake) -> (Refusal, Message) {
        match h {
            Handshake::Rejected { reason, reply, .. } => (reason, reply),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn proved_initack() {
        let secret = JobSecret::from_bytes([9; 32]);
        let nonce = [3; NONCE_LEN];
        let proof = |pmiid: &str| auth::encode_hex(&secret.proof(&nonce, pmiid));
        let mut c = core(3);
        // No proof, a wrong one, one for another rank or nonce, or another
        // secret's: refused before the rank is looked at.
        let other_nonce = auth::encode_hex(&secret.proof(&[4; NONCE_LEN], "0"));
        let other_secret = auth::encode_hex(&JobSecret::from_bytes([1; 32]).proof(&nonce, "0"));
        for bad in [
            "cmd=initack pmiid=0".to_owned(),
            format!("cmd=initack pmiid=0 proof={}", "0".repeat(64)),
            format!("cmd=initack pmiid=0 proof={}", proof("1")),
            format!("cmd=initack pmiid=0 proof={other_nonce}"),
            format!("cmd=initack pmiid=0 proof={other_secret}"),
            format!("cmd=initack pmiid=0 proof={}", &proof("0")[..63]),
            format!("cmd=initack proof={}", proof("0")),
        ] {
            let (reason, reply) = refusal(c.handle_proved_initack(&msg(&bad), &secret, &nonce));
            assert_eq!(reason, Refusal::Unauthenticated, "{bad}");
            assert_eq!(
                reply.to_line().unwrap(),
                "cmd=initack rc=-1 msg=authentication_failed\n"
            );
        }
        // Nothing was attached by the refusals.
        let good = msg(&format!("cmd=initack pmiid=0 proof={}", proof("0")));
        assert!(matches!(
            c.handle_proved_initack(&good, &secret, &nonce),
            Handshake::Accepted { rank: 0, .. }
        ));
        // A second claim, proved or not, is refused.
        let (reason, _) = refusal(c.handle_proved_initack(&good, &secret, &nonce));
        assert_eq!(reason, Refusal::RankClaimed);
        let (reason, _) = refusal(c.handle_initack(&msg("cmd=initack pmiid=0")));
        assert_eq!(reason, Refusal::RankClaimed);
        // A proved pmiid out of range or not a number.
        for id in ["3", "x"] {
            let line = format!("cmd=initack pmiid={id} proof={}", proof(id));
            let (reason, _) = refusal(c.handle_proved_initack(&msg(&line), &secret, &nonce));
            assert_eq!(reason, Refusal::InvalidPmiid, "{id}");
        }
        let (reason, _) = refusal(c.handle_proved_initack(&msg("cmd=init"), &secret, &nonce));
        assert_eq!(reason, Refusal::NotInitack);
        assert_eq!(
            challenge_message(&nonce).to_line().unwrap(),
            format!("cmd=challenge nonce={}\n", "03".repeat(NONCE_LEN))
        );
    }
}
