//! What udbtl is held to: the targets of the issues that set them, each a
//! ratio of two labels' medians at one size, and the ratio of two labels at
//! every size of a range, path by path (issue 27 asks Open MPI over udbtl
//! for at least tcp's bandwidth at every size from 16 KiB to 4 MiB).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::ops::RangeInclusive;

use crate::stats::{Key, Metric, get, ratio};

/// A performance target: on `path`, `metric` at `size` of `subject`
/// divided by that of `other` must be at least (or at most) `bound`.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// The path it is measured on.
    pub path: &'static str,
    /// What it says, for the table.
    pub what: &'static str,
    /// The figure compared.
    pub metric: Metric,
    /// The message size of the figure.
    pub size: u64,
    /// The label measured.
    pub subject: &'static str,
    /// The label it is measured against.
    pub other: &'static str,
    /// The ratio `subject / other` it needs.
    pub bound: Bound,
}

/// Which side of its bound a target's ratio must be on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bound {
    /// The ratio is at least this.
    AtLeast(f64),
    /// The ratio is at most this.
    AtMost(f64),
}

impl Bound {
    /// Whether `ratio` meets the bound.
    #[must_use]
    pub fn met(self, ratio: f64) -> bool {
        match self {
            Self::AtLeast(b) => ratio >= b,
            Self::AtMost(b) => ratio <= b,
        }
    }
}

/// The network-performance targets udbtl is held to: `udbench`'s of issue
/// 10, then Open MPI's of issue 27 (which also raised the GSO floor's from
/// 0.3 to 0.5).
pub const TARGETS: [Target; 9] = [
    Target {
        path: "veth1500",
        what: "1 MiB bandwidth against Open MPI's tcp BTL",
        metric: Metric::Bandwidth,
        size: 1 << 20,
        subject: "udbtl udbench",
        other: "ompi tcp",
        bound: Bound::AtLeast(3.0),
    },
    Target {
        path: "veth1500",
        what: "1 MiB bandwidth against the raw GSO/GRO floor",
        metric: Metric::Bandwidth,
        size: 1 << 20,
        subject: "udbtl udbench",
        other: "udp gso",
        bound: Bound::AtLeast(0.5),
    },
    Target {
        path: "veth1500",
        what: "8 B latency against Open MPI's tcp BTL",
        metric: Metric::Latency,
        size: 8,
        subject: "udbtl udbench",
        other: "ompi tcp",
        bound: Bound::AtMost(1.0),
    },
    Target {
        path: "loopback",
        what: "8 B latency against the raw UDP ping-pong",
        metric: Metric::Latency,
        size: 8,
        subject: "udbtl udbench",
        other: "udp pingpong",
        bound: Bound::AtMost(1.15),
    },
    Target {
        path: "loopback",
        what: "8 B message rate against raw UDP datagrams, one per send",
        metric: Metric::MessageRate,
        size: 8,
        subject: "udbtl udbench",
        other: "udp single",
        bound: Bound::AtLeast(2.0),
    },
    Target {
        path: "loopback",
        what: "1 MiB bandwidth against raw UDP streaming with 64 KiB datagrams",
        metric: Metric::Bandwidth,
        size: 1 << 20,
        subject: "udbtl udbench",
        other: "udp single",
        bound: Bound::AtLeast(0.8),
    },
    Target {
        path: "loopback",
        what: "1 MiB bandwidth through Open MPI against its tcp BTL",
        metric: Metric::Bandwidth,
        size: 1 << 20,
        subject: "ompi udbtl",
        other: "ompi tcp",
        bound: Bound::AtLeast(1.2),
    },
    Target {
        path: "veth1500",
        what: "1 MiB bandwidth through Open MPI against its tcp BTL",
        metric: Metric::Bandwidth,
        size: 1 << 20,
        subject: "ompi udbtl",
        other: "ompi tcp",
        bound: Bound::AtLeast(1.5),
    },
    Target {
        path: "veth9000",
        what: "1 MiB bandwidth through Open MPI against its tcp BTL",
        metric: Metric::Bandwidth,
        size: 1 << 20,
        subject: "ompi udbtl",
        other: "ompi tcp",
        bound: Bound::AtLeast(1.5),
    },
];

/// Every target of `targets` whose two figures `meds` holds: the ratio, the
/// bound and whether it is met.
#[must_use]
pub fn target_table(meds: &BTreeMap<Key, (f64, usize)>, targets: &[Target]) -> Option<String> {
    let mut rows = String::new();
    for t in targets {
        let Some(r) = ratio(
            get(meds, t.path, t.subject, t.metric, t.size),
            get(meds, t.path, t.other, t.metric, t.size),
        ) else {
            continue;
        };
        let (sign, bound) = match t.bound {
            Bound::AtLeast(b) => ("≥", b),
            Bound::AtMost(b) => ("≤", b),
        };
        let _ = writeln!(
            rows,
            "| {} | {} / {}: {} | {r:.2} | {sign} {bound} | {} |",
            t.path,
            t.subject,
            t.other,
            t.what,
            if t.bound.met(r) { "met" } else { "missed" }
        );
    }
    (!rows.is_empty())
        .then(|| format!("| path | target | ratio | needs | |\n|---|---|---:|---:|---|\n{rows}"))
}

/// `subject / other` for `metric` at every size in `sizes` that either
/// label has on some path: sizes down, paths across, "–" where a figure is
/// missing, and a last row with each path's lowest ratio. `None` when no
/// size has both figures on any path.
#[must_use]
pub fn size_ratio_table(
    meds: &BTreeMap<Key, (f64, usize)>,
    subject: &str,
    other: &str,
    metric: Metric,
    sizes: RangeInclusive<u64>,
) -> Option<String> {
    let paths: BTreeSet<&str> = meds.keys().map(|k| k.0.as_str()).collect();
    let mut rows: BTreeMap<u64, Vec<Option<f64>>> = BTreeMap::new();
    for (_, label, m, size) in meds.keys() {
        if *m == metric && sizes.contains(size) && (label == subject || label == other) {
            rows.entry(*size).or_insert_with(|| {
                paths
                    .iter()
                    .map(|path| {
                        ratio(
                            get(meds, path, subject, metric, *size),
                            get(meds, path, other, metric, *size),
                        )
                    })
                    .collect()
            });
        }
    }
    let lowest: Vec<Option<f64>> = (0..paths.len())
        .map(|i| rows.values().filter_map(|r| r[i]).min_by(f64::total_cmp))
        .collect();
    if lowest.iter().all(Option::is_none) {
        return None;
    }
    let cell = |v: Option<f64>| v.map_or_else(|| "–".to_owned(), |v| format!("{v:.2}"));
    let mut out = String::from("| size B |");
    for path in &paths {
        let _ = write!(out, " {path} |");
    }
    out.push_str("\n|---:|");
    out.push_str(&"---:|".repeat(paths.len()));
    out.push('\n');
    for (size, cells) in &rows {
        let _ = write!(out, "| {size} |");
        for c in cells {
            let _ = write!(out, " {} |", cell(*c));
        }
        out.push('\n');
    }
    out.push_str("| lowest |");
    for c in lowest {
        let _ = write!(out, " {} |", cell(c));
    }
    out.push('\n');
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Record;
    use crate::stats::{medians, rec};

    fn on(path: &str, mut r: Record) -> Record {
        r.path = Some(path.into());
        r
    }

    #[test]
    fn targets_give_ratio_bound_and_verdict_and_skip_missing_figures() {
        let mut udbench_bw = rec("udbtl udbench", "bw", 1 << 20, 900.0);
        udbench_bw.path = Some("veth1500".into());
        let mut tcp_bw = rec("ompi tcp", "bw", 1 << 20, 300.0);
        tcp_bw.path = Some("veth1500".into());
        let rs = vec![
            udbench_bw,
            tcp_bw,
            rec("udbtl udbench", "latency", 8, 3.0),
            rec("udp pingpong", "latency", 8, 2.0),
        ];
        let table = target_table(&medians(&rs), &TARGETS).unwrap();
        let rows: Vec<&str> = table.lines().skip(2).collect();
        assert_eq!(rows.len(), 2, "{table}");
        assert!(rows[0].starts_with("| veth1500 |"), "{table}");
        assert!(rows[0].ends_with("| 3.00 | ≥ 3 | met |"), "{table}");
        assert!(rows[1].starts_with("| loopback |"), "{table}");
        assert!(rows[1].ends_with("| 1.50 | ≤ 1.15 | missed |"), "{table}");
        assert_eq!(target_table(&medians(&[]), &TARGETS), None);
    }

    #[test]
    fn size_ratios_by_path_with_the_lowest_and_gaps() {
        let rs = vec![
            on("veth1500", rec("ompi udbtl", "bw", 16384, 1000.0)),
            on("veth1500", rec("ompi tcp", "bw", 16384, 2000.0)),
            on("veth1500", rec("ompi udbtl", "bw", 1 << 20, 3000.0)),
            on("veth1500", rec("ompi tcp", "bw", 1 << 20, 2000.0)),
            rec("ompi udbtl", "bw", 1 << 20, 900.0),
            rec("ompi udbtl", "bw", 8192, 1.0),
            rec("ompi tcp", "bw", 8192, 1.0),
        ];
        let t = size_ratio_table(
            &medians(&rs),
            "ompi udbtl",
            "ompi tcp",
            Metric::Bandwidth,
            16384..=(4 << 20),
        )
        .unwrap();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "| size B | loopback | veth1500 |", "{t}");
        assert_eq!(lines[2], "| 16384 | – | 0.50 |", "{t}");
        assert_eq!(lines[3], "| 1048576 | – | 1.50 |", "{t}");
        assert_eq!(lines[4], "| lowest | – | 0.50 |", "{t}");
        assert_eq!(lines.len(), 5, "{t}");
        let none = size_ratio_table(
            &medians(&rs[4..]),
            "ompi udbtl",
            "ompi tcp",
            Metric::Bandwidth,
            16384..=(4 << 20),
        );
        assert_eq!(none, None);
    }
}
