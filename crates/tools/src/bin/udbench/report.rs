//! What rank 0 prints: OSU's tables, or JSON Lines for other tools.

/// One measured size of one benchmark.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Row {
    Latency {
        size: usize,
        iterations: u64,
        avg_us: f64,
        min_us: f64,
        max_us: f64,
        p50_us: f64,
        p99_us: f64,
    },
    /// `bw` or `bibw`.
    Bandwidth {
        bench: &'static str,
        size: usize,
        window: u64,
        iterations: u64,
        mb_per_s: f64,
    },
    MbwMr {
        size: usize,
        pairs: u32,
        window: u64,
        mb_per_s: f64,
        messages_per_s: f64,
    },
    MultiLat {
        size: usize,
        pairs: u32,
        avg_us: f64,
    },
}

/// OSU's column headers, with udbench's percentiles after the average.
pub(crate) const LATENCY_COLUMNS: &str =
    "# Size          Latency (us)          P50 (us)        P99 (us)";
pub(crate) const BANDWIDTH_COLUMNS: &str = "# Size      Bandwidth (MB/s)";
pub(crate) const MBW_MR_COLUMNS: &str = "# Size                  MB/s        Messages/s";
pub(crate) const MULTI_LAT_COLUMNS: &str = "# Size          Latency (us)";

impl Row {
    /// A table row in OSU's layout: the size in 10 columns, each value in
    /// 20 (16 for the percentiles), two decimals.
    fn human(&self) -> String {
        match *self {
            Self::Latency {
                size,
                avg_us,
                p50_us,
                p99_us,
                ..
            } => format!("{size:<10}{avg_us:>20.2}{p50_us:>16.2}{p99_us:>16.2}"),
            Self::Bandwidth { size, mb_per_s, .. } => format!("{size:<10}{mb_per_s:>20.2}"),
            Self::MbwMr {
                size,
                mb_per_s,
                messages_per_s,
                ..
            } => format!("{size:<10}{mb_per_s:>20.2}{messages_per_s:>20.2}"),
            Self::MultiLat { size, avg_us, .. } => format!("{size:<10}{avg_us:>20.2}"),
        }
    }

    /// One JSON object; the field names are a contract with the tools that
    /// read them. Every number is finite (elapsed times are clamped above
    /// zero and iteration counts are at least one), so `{}` formatting of
    /// the numbers is valid JSON.
    pub(crate) fn json(&self) -> String {
        match *self {
            Self::Latency {
                size,
                iterations,
                avg_us,
                min_us,
                max_us,
                p50_us,
                p99_us,
            } => format!(
                r#"{{"tool":"udbench","bench":"latency","size":{size},"iterations":{iterations},"avg_us":{},"min_us":{},"max_us":{},"p50_us":{},"p99_us":{}}}"#,
                num(avg_us),
                num(min_us),
                num(max_us),
                num(p50_us),
                num(p99_us)
            ),
            Self::Bandwidth {
                bench,
                size,
                window,
                iterations,
                mb_per_s,
            } => format!(
                r#"{{"tool":"udbench","bench":"{bench}","size":{size},"window":{window},"iterations":{iterations},"mb_per_s":{}}}"#,
                num(mb_per_s)
            ),
            Self::MbwMr {
                size,
                pairs,
                window,
                mb_per_s,
                messages_per_s,
            } => format!(
                r#"{{"tool":"udbench","bench":"mbw_mr","size":{size},"pairs":{pairs},"window":{window},"mb_per_s":{},"messages_per_s":{}}}"#,
                num(mb_per_s),
                num(messages_per_s)
            ),
            Self::MultiLat {
                size,
                pairs,
                avg_us,
            } => format!(
                r#"{{"tool":"udbench","bench":"multi_lat","size":{size},"pairs":{pairs},"avg_us":{}}}"#,
                num(avg_us)
            ),
        }
    }
}

/// A JSON number with three decimals, more below 1 so that at least four
/// significant digits remain (a 1-byte bandwidth is well under 1 MB/s);
/// `null` rather than invalid JSON if a value were ever not finite.
fn num(x: f64) -> String {
    if !x.is_finite() {
        return "null".to_owned();
    }
    let decimals = if x > 0.0 && x < 1.0 {
        // -log10 of a value in (0, 1) is positive and at most a few
        // hundred, so the cast truncates nothing but the fraction.
        let leading_zeros = (-x.log10()).floor() as usize;
        (leading_zeros + 4).min(12)
    } else {
        3
    };
    format!("{x:.decimals$}")
}

/// Where and how results go: only rank 0 prints.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Out {
    pub(crate) rank0: bool,
    pub(crate) json: bool,
    /// Progress lines on stderr.
    pub(crate) progress: bool,
}

impl Out {
    /// A benchmark's title and column headers (table only).
    pub(crate) fn header(&self, title: &str, columns: &str) {
        if self.rank0 && !self.json {
            println!("# udbench {title} (udbtl: reliable UD over UDP)");
            println!("{columns}");
        }
    }

    pub(crate) fn row(&self, row: &Row) {
        if self.rank0 {
            if self.json {
                println!("{}", row.json());
            } else {
                println!("{}", row.human());
            }
        }
    }

    /// Announces size `index` (from 0) of `count` of `bench`.
    pub(crate) fn progress(&self, bench: &str, size: usize, index: usize, count: usize) {
        if self.rank0 && self.progress {
            eprintln!("udbench: {bench} {size} B ({}/{count})", index + 1);
        }
    }
}
