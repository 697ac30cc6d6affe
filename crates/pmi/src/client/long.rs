//! Values longer than the server's limit: [`PmiClient::put_long`] splits
//! one across `key`, `key#1`, `key#2`, ... with a `<count>:` header in the
//! first, and [`PmiClient::get_long`] joins them again.

use super::{PmiClient, check_put_key, invalid_value};
use crate::error::PmiError;
use crate::wire;

/// Separator between a [`put_long`](PmiClient::put_long) key and its chunk
/// index.
pub const LONG_SEP: char = '#';

impl PmiClient {
    /// Stores a value of any length: [`put`](Self::put) of `key` holding
    /// `<n>:<chunk 0>`, where `n` is the number of chunks, and of
    /// `key#1`..`key#<n-1>` holding the others, each chunk as long as the
    /// server's value limit allows. Read it back with
    /// [`get_long`](Self::get_long) (only). Same rules as `put` for `value`;
    /// `key#<n-1>` must fit the key limit.
    ///
    /// # Errors
    ///
    /// As [`put`](Self::put); nothing is stored if a key or the value is
    /// invalid.
    pub fn put_long(&mut self, key: &str, value: &str) -> Result<(), PmiError> {
        let job = self.ready("put")?;
        let maxes = job.maxes;
        check_put_key(key, maxes)?;
        if !wire::is_valid_value(value) {
            return Err(invalid_value(key, "holds a space or a non-printable byte"));
        }
        let cap = maxes.value.saturating_sub(1);
        let count = chunk_count(value.len(), cap)
            .ok_or_else(|| invalid_value(key, &format!("value limit {cap} too small to chunk")))?;
        let last = long_key(key, count - 1);
        if count > 1 && last.len() >= maxes.key {
            return Err(PmiError::InvalidKey {
                key: wire::snippet(key),
                reason: format!(
                    "chunk key {last:?} of {count} chunks exceeds the key limit {}",
                    maxes.key
                ),
            });
        }
        let header = format!("{count}:");
        let (first, mut rest) = value.split_at(value.len().min(cap - header.len()));
        self.put(key, &format!("{header}{first}"))?;
        for index in 1..count {
            let (chunk, tail) = rest.split_at(rest.len().min(cap));
            self.put(&long_key(key, index), chunk)?;
            rest = tail;
        }
        Ok(())
    }

    /// Reads a value stored by [`put_long`](Self::put_long); `Ok(None)` if
    /// `key` is not there.
    ///
    /// # Errors
    ///
    /// [`PmiError::LongValue`] if the header is malformed or a chunk is
    /// missing, and the errors of [`get`](Self::get).
    pub fn get_long(&mut self, key: &str) -> Result<Option<String>, PmiError> {
        let Some(first) = self.get(key)? else {
            return Ok(None);
        };
        let bad = |reason: String| PmiError::LongValue {
            key: wire::snippet(key),
            reason,
        };
        let (count, chunk) = first
            .split_once(':')
            .and_then(|(n, chunk)| Some((n.parse::<usize>().ok().filter(|&n| n > 0)?, chunk)))
            .ok_or_else(|| bad("no <count>: header (was it stored by put_long?)".into()))?;
        let mut value = String::with_capacity(chunk.len().saturating_mul(count.min(1 << 16)));
        value.push_str(chunk);
        for index in 1..count {
            match self.get(&long_key(key, index))? {
                Some(chunk) => value.push_str(&chunk),
                None => return Err(bad(format!("chunk {index} of {count} is missing"))),
            }
        }
        Ok(Some(value))
    }
}

/// Number of chunks `put_long` needs for `len` bytes when a value holds at
/// most `cap` bytes and the first carries the `<n>:` header. `None` if `cap`
/// cannot even hold a header and one byte.
fn chunk_count(len: usize, cap: usize) -> Option<usize> {
    let mut count = 1usize;
    loop {
        let header = decimal_len(count) + 1;
        let first = cap.checked_sub(header).filter(|&c| c > 0)?;
        if len <= first.saturating_add((count - 1).saturating_mul(cap)) {
            return Some(count);
        }
        count += 1;
    }
}

fn decimal_len(n: usize) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

fn long_key(key: &str, index: usize) -> String {
    if index == 0 {
        key.to_owned()
    } else {
        format!("{key}{LONG_SEP}{index}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_counts() {
        // cap 10: first chunk holds 8 ("1:") or 8 ("2:"), others 10.
        assert_eq!(chunk_count(0, 10), Some(1));
        assert_eq!(chunk_count(8, 10), Some(1));
        assert_eq!(chunk_count(9, 10), Some(2));
        assert_eq!(chunk_count(18, 10), Some(2));
        assert_eq!(chunk_count(19, 10), Some(3));
        // 10 chunks: header "10:" leaves 7 in the first.
        assert_eq!(chunk_count(7 + 9 * 10, 10), Some(10));
        assert_eq!(chunk_count(7 + 9 * 10 + 1, 10), Some(11));
        assert_eq!(chunk_count(5, 2), None);
        assert_eq!(chunk_count(1, 3), Some(1));
    }

    #[test]
    fn decimal_lengths() {
        assert_eq!(decimal_len(1), 1);
        assert_eq!(decimal_len(9), 1);
        assert_eq!(decimal_len(10), 2);
        assert_eq!(decimal_len(1000), 4);
    }
}
