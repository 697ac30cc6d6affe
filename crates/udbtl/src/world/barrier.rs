//! The job's barrier, over the transport itself.

use std::sync::PoisonError;

use super::{CONTROL, InitError, World};

impl World {
    /// Waits until every rank has called `barrier`, progressing the
    /// transport meanwhile. The barrier runs over the transport itself (a
    /// dissemination barrier: ⌈log₂ N⌉ rounds, in round k each rank
    /// messages rank + 2^k and waits for rank − 2^k), through the same
    /// progress as every other call, so peers not connected yet are
    /// connected while it waits.
    ///
    /// # Errors
    /// A barrier message could not be sent, or messages were lost.
    pub fn barrier(&mut self) -> Result<(), InitError> {
        let barrier = self.barriers;
        self.barriers = self.barriers.wrapping_add(1);
        let mut distance = 1u32;
        let mut round = 0u8;
        while distance < self.size {
            let to = (self.rank + distance) % self.size;
            self.send_datagram(to, CONTROL, &barrier_message(barrier, round))?;
            let key = (barrier, round);
            loop {
                let arrived = self
                    .arrivals
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&key);
                if arrived {
                    break;
                }
                self.check()?;
                if self.progress() == 0 {
                    std::thread::yield_now();
                }
            }
            distance *= 2;
            round += 1;
        }
        Ok(())
    }
}

/// A barrier message: the barrier's number and the round.
fn barrier_message(barrier: u32, round: u8) -> [u8; 5] {
    let mut message = [0; 5];
    message[..4].copy_from_slice(&barrier.to_be_bytes());
    message[4] = round;
    message
}

pub(super) fn parse_barrier_message(payload: &[u8]) -> Option<(u32, u8)> {
    let (barrier, round) = payload.split_first_chunk::<4>()?;
    match round {
        [round] => Some((u32::from_be_bytes(*barrier), *round)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn barrier_messages_round_trip_and_reject_other_lengths() {
        assert_eq!(
            parse_barrier_message(&barrier_message(0x0102_0304, 7)),
            Some((0x0102_0304, 7))
        );
        assert_eq!(parse_barrier_message(&[0; 4]), None);
        assert_eq!(parse_barrier_message(&[0; 6]), None);
    }
}
