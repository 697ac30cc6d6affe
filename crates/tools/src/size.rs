//! Byte counts on the command line, shared by the tools that take sizes
//! (each bin includes this file with `#[path]`: the tools crate has no
//! library).

/// Parses a positive byte count: digits, then optionally a binary unit,
/// any case: `k`/`KiB` (2¹⁰), `m`/`MiB` (2²⁰), `g`/`GiB` (2³⁰). `4k`,
/// `1M`, `64KiB` and `4096` are all accepted.
///
/// # Errors
/// A message for clap when the text is not such a count, is zero, or does
/// not fit in a `u64`.
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let (digits, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let base: u64 = digits.parse().map_err(|e| format!("{text:?}: {e}"))?;
    let scale = match unit.to_ascii_lowercase().as_str() {
        "" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        _ => {
            return Err(format!(
                "unknown size suffix {unit:?} (use k, M, G or KiB, MiB, GiB)"
            ));
        }
    };
    match base.checked_mul(scale) {
        Some(0) => Err(format!("{text:?}: a size must be at least 1 byte")),
        Some(n) => Ok(n),
        None => Err(format!("{text:?} is out of range")),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn units_are_binary_and_case_blind() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("4M"), Ok(4 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
    }

    #[test]
    fn nonsense_zero_and_overflow_are_refused() {
        for bad in ["", "k", "0", "0k", "4q", "-1", "1.5M", "99999999999999999G"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }
}
