//! What `udplot` computes: medians per (path, label, bench, size) over
//! however many runs the input holds, the headline ratios, and the
//! markdown tables. Pure functions, unit-tested below.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use crate::record::Record;

/// The figures a table or plot shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Metric {
    /// Mean one-way latency, µs (OSU reports the mean); from `latency`.
    Latency,
    /// MB/s from `bw` (and `mbw_mr` when a label has no `bw`).
    Bandwidth,
    /// Messages per second: `messages_per_s`, else `datagrams_per_s` when a
    /// message is one datagram, else MB/s × 10⁶ / size; from `mbw_mr`, and
    /// from `bw` when a label has no `mbw_mr`.
    MessageRate,
}

impl Metric {
    /// The value of this metric in a record, if it has one.
    #[must_use]
    pub fn value(self, r: &Record) -> Option<f64> {
        match self {
            Self::Latency => (r.bench == "latency")
                .then_some(r.avg_us.or(r.p50_us))
                .flatten(),
            Self::Bandwidth => matches!(r.bench.as_str(), "bw" | "mbw_mr")
                .then_some(r.mb_per_s)
                .flatten(),
            Self::MessageRate => {
                if !matches!(r.bench.as_str(), "bw" | "mbw_mr") {
                    return None;
                }
                let one_datagram = r.datagram.is_none_or(|d| r.size <= d);
                r.messages_per_s
                    .or(r.datagrams_per_s.filter(|_| one_datagram))
                    .or_else(|| {
                        r.mb_per_s
                            .filter(|_| r.size > 0)
                            .map(|mb| mb * 1e6 / r.size as f64)
                    })
            }
        }
    }
}

/// The median of `v` (mean of the middle two for an even count); `None`
/// when empty. NaNs sort last.
#[must_use]
pub fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    Some(if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    })
}

/// Key of one median: path, label, metric, size.
pub type Key = (String, String, Metric, u64);

/// Medians of every (path, label, metric, size) in `records`, with the run
/// count. A record's label is its `label`, else its tool (and mode); its
/// path is `path`, else "loopback". A `bw` record wins over an `mbw_mr`
/// one for the bandwidth of the same label and size, and an `mbw_mr` record
/// over a `bw` one for the message rate: each figure comes from the one
/// benchmark made for it, never a blend of both.
#[must_use]
pub fn medians(records: &[Record]) -> BTreeMap<Key, (f64, usize)> {
    let mut groups: BTreeMap<Key, Vec<f64>> = BTreeMap::new();
    let has = |bench: &str| -> BTreeSet<(String, String, u64)> {
        records
            .iter()
            .filter(|r| r.bench == bench)
            .map(|r| (path_of(r), label_of(r), r.size))
            .collect()
    };
    let (has_bw, has_mbw_mr) = (has("bw"), has("mbw_mr"));
    for r in records {
        for m in [Metric::Latency, Metric::Bandwidth, Metric::MessageRate] {
            let key = (path_of(r), label_of(r), r.size);
            let shadowed = match (r.bench.as_str(), m) {
                ("mbw_mr", Metric::Bandwidth) => has_bw.contains(&key),
                ("bw", Metric::MessageRate) => has_mbw_mr.contains(&key),
                _ => false,
            };
            if shadowed {
                continue;
            }
            if let Some(v) = m.value(r).filter(|v| v.is_finite()) {
                groups
                    .entry((path_of(r), label_of(r), m, r.size))
                    .or_default()
                    .push(v);
            }
        }
    }
    groups
        .into_iter()
        .filter_map(|(k, v)| median(&v).map(|m| (k, (m, v.len()))))
        .collect()
}

/// The series name of a record.
#[must_use]
pub fn label_of(r: &Record) -> String {
    r.label.clone().unwrap_or_else(|| match &r.mode {
        Some(mode) => format!("{} {mode}", r.tool),
        None => r.tool.clone(),
    })
}

/// The path of a record.
#[must_use]
pub fn path_of(r: &Record) -> String {
    r.path.clone().unwrap_or_else(|| "loopback".into())
}

/// `a / b` when both are there and `b` is not zero.
#[must_use]
pub fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b != 0.0 => Some(a / b),
        _ => None,
    }
}

/// One series: size → median.
pub type Series = BTreeMap<u64, f64>;

/// The series of one path and metric, by label.
#[must_use]
pub fn series(
    meds: &BTreeMap<Key, (f64, usize)>,
    path: &str,
    metric: Metric,
) -> BTreeMap<String, Series> {
    let mut out: BTreeMap<String, Series> = BTreeMap::new();
    for ((p, label, m, size), (v, _)) in meds {
        if p == path && *m == metric {
            out.entry(label.clone()).or_default().insert(*size, *v);
        }
    }
    out
}

/// Formats a figure with sensible precision.
#[must_use]
pub fn fmt_value(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// A markdown table: sizes down, labels across, "–" where a label has no
/// value at a size.
#[must_use]
pub fn table(by_label: &BTreeMap<String, Series>) -> String {
    let sizes: BTreeSet<u64> = by_label.values().flat_map(|s| s.keys().copied()).collect();
    let mut out = String::from("| size B |");
    for label in by_label.keys() {
        let _ = write!(out, " {label} |");
    }
    out.push_str("\n|---:|");
    out.push_str(&"---:|".repeat(by_label.len()));
    out.push('\n');
    for size in sizes {
        let _ = write!(out, "| {size} |");
        for s in by_label.values() {
            let cell = s
                .get(&size)
                .map_or_else(|| "–".to_owned(), |&v| fmt_value(v));
            let _ = write!(out, " {cell} |");
        }
        out.push('\n');
    }
    out
}

/// The headline figures: 8 B latency, 1 MiB bandwidth, 8 B message rate.
pub const HEADLINE: [(Metric, u64, &str); 3] = [
    (Metric::Latency, 8, "8 B latency µs"),
    (Metric::Bandwidth, 1 << 20, "1 MiB bandwidth MB/s"),
    (Metric::MessageRate, 8, "8 B message rate /s"),
];

/// The (path, label) pairs of `meds`, paths in order and labels within.
fn path_labels(meds: &BTreeMap<Key, (f64, usize)>) -> BTreeSet<(&str, &str)> {
    meds.keys().map(|k| (k.0.as_str(), k.1.as_str())).collect()
}

/// The median of one figure, if `meds` has it.
pub(crate) fn get(
    meds: &BTreeMap<Key, (f64, usize)>,
    path: &str,
    label: &str,
    m: Metric,
    size: u64,
) -> Option<f64> {
    meds.get(&(path.to_owned(), label.to_owned(), m, size))
        .map(|v| v.0)
}

/// The headline figures of every path and label, one row each: the short
/// table that a summary quotes. Rows only where a label has one of them.
#[must_use]
pub fn headline_table(meds: &BTreeMap<Key, (f64, usize)>) -> Option<String> {
    let mut rows = String::new();
    for (path, label) in path_labels(meds) {
        let cells: Vec<Option<f64>> = HEADLINE
            .iter()
            .map(|&(m, s, _)| get(meds, path, label, m, s))
            .collect();
        if cells.iter().all(Option::is_none) {
            continue;
        }
        let _ = write!(rows, "| {path} | {label} |");
        for c in cells {
            let _ = write!(rows, " {} |", c.map_or_else(|| "–".to_owned(), fmt_value));
        }
        rows.push('\n');
    }
    (!rows.is_empty()).then(|| {
        let mut out = String::from("| path | label |");
        for (_, _, name) in HEADLINE {
            let _ = write!(out, " {name} |");
        }
        out.push_str("\n|---|---|---:|---:|---:|\n");
        out + &rows
    })
}

/// The headline ratios of every path: every label containing `subject`
/// against every label of the same path that does not, at 8 B latency
/// (below 1: subject faster), 1 MiB bandwidth and 8 B message rate (above
/// 1: subject faster). Rows only where both sides have a figure.
#[must_use]
pub fn ratio_table(meds: &BTreeMap<Key, (f64, usize)>, subject: &str) -> Option<String> {
    let pairs = path_labels(meds);
    let mut rows = String::new();
    for &(path, a) in pairs.iter().filter(|(_, l)| l.contains(subject)) {
        for &(_, b) in pairs
            .iter()
            .filter(|(p, l)| *p == path && !l.contains(subject))
        {
            let cells: Vec<Option<f64>> = HEADLINE
                .iter()
                .map(|&(m, s, _)| ratio(get(meds, path, a, m, s), get(meds, path, b, m, s)))
                .collect();
            if cells.iter().all(Option::is_none) {
                continue;
            }
            let _ = write!(rows, "| {path} | {a} / {b} |");
            for c in cells {
                let _ = write!(
                    rows,
                    " {} |",
                    c.map_or_else(|| "–".to_owned(), |v| format!("{v:.2}"))
                );
            }
            rows.push('\n');
        }
    }
    (!rows.is_empty()).then(|| {
        let mut out =
            String::from("| path | ratio | 8 B latency | 1 MiB bandwidth | 8 B message rate |");
        out.push_str("\n|---|---|---:|---:|---:|\n");
        out + &rows
    })
}

/// A record of `label`'s `bench` at `size` with value `v` (mean latency
/// for `latency`, MB/s otherwise), for the tests here and in `targets`.
#[cfg(test)]
pub(crate) fn rec(label: &str, bench: &str, size: u64, v: f64) -> Record {
    let mut r = Record {
        tool: "t".into(),
        bench: bench.into(),
        size,
        label: Some(label.into()),
        ..Record::default()
    };
    match bench {
        "latency" => r.avg_us = Some(v),
        _ => r.mb_per_s = Some(v),
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn medians_group_by_path_label_and_size() {
        let mut rs = vec![
            rec("udbtl", "latency", 8, 5.0),
            rec("udbtl", "latency", 8, 4.0),
            rec("udbtl", "latency", 8, 100.0),
            rec("tcp", "latency", 8, 6.0),
        ];
        let mut other = rec("udbtl", "latency", 8, 9.0);
        other.path = Some("veth1500".into());
        rs.push(other);
        let m = medians(&rs);
        assert_eq!(
            m[&("loopback".into(), "udbtl".into(), Metric::Latency, 8)],
            (5.0, 3)
        );
        assert_eq!(
            m[&("veth1500".into(), "udbtl".into(), Metric::Latency, 8)],
            (9.0, 1)
        );
        assert_eq!(
            m[&("loopback".into(), "tcp".into(), Metric::Latency, 8)],
            (6.0, 1)
        );
    }

    #[test]
    fn message_rate_from_bandwidth_and_size() {
        let r = rec("x", "bw", 8, 16.0);
        assert_eq!(Metric::MessageRate.value(&r), Some(2e6));
        let mut m = rec("x", "mbw_mr", 8, 16.0);
        m.messages_per_s = Some(3e6);
        assert_eq!(Metric::MessageRate.value(&m), Some(3e6));
        assert_eq!(Metric::Latency.value(&r), None);
    }

    #[test]
    fn bandwidth_from_bw_and_message_rate_from_mbw_mr() {
        let mut mr = rec("x", "mbw_mr", 8, 1.0);
        mr.messages_per_s = Some(5e5);
        let rs = vec![rec("x", "bw", 8, 16.0), mr, rec("y", "bw", 8, 8.0)];
        let m = medians(&rs);
        let key = |l: &str, metric| ("loopback".to_owned(), l.to_owned(), metric, 8);
        assert_eq!(m[&key("x", Metric::Bandwidth)], (16.0, 1));
        assert_eq!(m[&key("x", Metric::MessageRate)], (5e5, 1));
        // Without an mbw_mr, the rate comes from bw.
        assert_eq!(m[&key("y", Metric::MessageRate)], (1e6, 1));
    }

    #[test]
    fn ratios_pit_the_subject_against_the_others() {
        let mut rs = vec![
            rec("udbtl", "latency", 8, 4.0),
            rec("tcp", "latency", 8, 8.0),
            rec("udbtl", "bw", 1 << 20, 3000.0),
            rec("tcp", "bw", 1 << 20, 1000.0),
            rec("udbtl other", "latency", 8, 2.0),
        ];
        let mut far = rec("tcp", "latency", 8, 1.0);
        far.path = Some("veth1500".into());
        rs.push(far);
        let m = medians(&rs);
        let t = ratio_table(&m, "udbtl").unwrap();
        assert!(
            t.contains("| loopback | udbtl / tcp | 0.50 | 3.00 | – |"),
            "{t}"
        );
        assert!(
            t.contains("| loopback | udbtl other / tcp | 0.25 | – | – |"),
            "{t}"
        );
        assert!(!t.contains("udbtl / udbtl other"), "{t}");
        // No udbtl on the veth: no row pits the loopback's against its tcp.
        assert!(!t.contains("veth1500"), "{t}");
        assert_eq!(ratio(Some(1.0), Some(0.0)), None);
        assert!(ratio_table(&medians(&rs[1..2]), "udbtl").is_none());
    }

    #[test]
    fn headline_rows_per_path_and_label() {
        let mut rs = vec![
            rec("udbtl", "latency", 8, 4.0),
            rec("udbtl", "bw", 1 << 20, 3000.0),
            rec("tcp", "latency", 64, 8.0),
        ];
        let mut far = rec("udbtl", "latency", 8, 6.0);
        far.path = Some("veth9000".into());
        rs.push(far);
        let t = headline_table(&medians(&rs)).unwrap();
        assert!(t.contains("| loopback | udbtl | 4.00 | 3000 | – |"), "{t}");
        assert!(t.contains("| veth9000 | udbtl | 6.00 | – | – |"), "{t}");
        // tcp has none of the headline sizes.
        assert!(!t.contains("| tcp |"), "{t}");
        assert!(headline_table(&medians(&rs[2..3])).is_none());
    }

    #[test]
    fn table_marks_missing_cells() {
        let m = medians(&[rec("a", "latency", 1, 1.0), rec("b", "latency", 2, 2.0)]);
        let t = table(&series(&m, "loopback", Metric::Latency));
        assert!(t.contains("| 1 | 1.00 | – |"), "{t}");
        assert!(t.contains("| 2 | – | 2.00 |"), "{t}");
    }
}
