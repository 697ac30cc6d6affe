//! What rank 0 prints: OSU's tables, or JSON Lines for other tools, and
//! a warning for a row too noisy to trust.
//!
//! # Noisy rows
//!
//! On a busy host a few stalls of milliseconds can dominate a row. A
//! latency row is flagged when its average exceeds [`LATENCY_SKEW`] times
//! its median, or its 99th percentile: a few outliers (the Max column)
//! pulled the mean up, and P50 is the steadier figure. A bandwidth row
//! (`bw`, `bibw`, `mbw_mr`) is flagged when the fastest of its batches of
//! windows (the timed windows cut into up to [`BATCHES`] equal runs, timed
//! by rank 0) ran over [`SPREAD_LIMIT`] times the rate of the slowest. In
//! the table a flagged row is followed by a `# warning: ...` line (OSU's
//! comment mark, which parsers of its tables skip); in JSON the row says
//! `"noisy":true`, with the ratio in `"spread"` for bandwidth, and the
//! warning goes to stderr. `multi_lat` rows carry no such figure.
//!
//! # A closed stdout
//!
//! When the reader of the results goes away (`udbench ... | head`), rank 0
//! ends as a C program such as OSU's does, by SIGPIPE, quietly: no panic,
//! no message (under udrun, whose own stdout closing ends the job, nothing
//! is reported).

use std::io::{self, Write};
use std::time::{Duration, Instant};

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
        spread: Spread,
    },
    MbwMr {
        size: usize,
        pairs: u32,
        window: u64,
        mb_per_s: f64,
        messages_per_s: f64,
        /// Rank 0's batches (it is a sender).
        spread: Spread,
    },
    MultiLat {
        size: usize,
        pairs: u32,
        avg_us: f64,
    },
}

/// OSU's column headers, with udbench's percentiles and maximum after the
/// average.
pub(crate) const LATENCY_COLUMNS: &str =
    "# Size          Latency (us)          P50 (us)        P99 (us)        Max (us)";
pub(crate) const BANDWIDTH_COLUMNS: &str = "# Size      Bandwidth (MB/s)";
pub(crate) const MBW_MR_COLUMNS: &str = "# Size                  MB/s        Messages/s";
pub(crate) const MULTI_LAT_COLUMNS: &str = "# Size          Latency (us)";

/// A latency row whose average is over this many times its median is
/// flagged as noisy.
pub(crate) const LATENCY_SKEW: f64 = 1.5;
/// A bandwidth row whose fastest batch ran over this many times the rate
/// of its slowest is flagged as noisy.
pub(crate) const SPREAD_LIMIT: f64 = 2.0;
/// How many batches a bandwidth row's timed windows are cut into (fewer
/// when there are fewer windows).
pub(crate) const BATCHES: u64 = 5;

/// How far apart the rates of a run's batches of windows were.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Spread {
    /// The longest batch's time over the shortest's, so the fastest
    /// batch's rate over the slowest's: at least 1 (exactly 1 with a
    /// single batch, which tells nothing).
    pub(crate) ratio: f64,
}

/// Times the batches of a windowed loop, for its [`Spread`]: the timed
/// iterations are cut into up to [`BATCHES`] batches of equal length (the
/// few left over make no batch).
#[derive(Debug)]
pub(crate) struct Laps {
    warmup: u64,
    per_batch: u64,
    batches: u64,
    /// Timed iterations done.
    done: u64,
    /// When the current batch began.
    began: Instant,
    shortest: Option<Duration>,
    longest: Duration,
}

impl Laps {
    /// For a loop of `warmup` untimed then `iters` timed iterations that
    /// starts now.
    pub(crate) fn new(warmup: u64, iters: u64) -> Self {
        let batches = iters.clamp(1, BATCHES);
        Self {
            warmup,
            per_batch: (iters / batches).max(1),
            batches,
            done: 0,
            began: Instant::now(),
            shortest: None,
            longest: Duration::ZERO,
        }
    }

    /// Records the end of iteration `i` (counted from 0, warm-up
    /// included).
    pub(crate) fn done(&mut self, i: u64) {
        let now = Instant::now();
        if i < self.warmup {
            self.began = now;
            return;
        }
        self.done += 1;
        if self.done % self.per_batch == 0 && self.done / self.per_batch <= self.batches {
            let took = now - self.began;
            self.shortest = Some(self.shortest.map_or(took, |s| s.min(took)));
            self.longest = self.longest.max(took);
            self.began = now;
        }
    }

    /// The spread of the batches timed so far.
    pub(crate) fn spread(&self) -> Spread {
        let ratio = match self.shortest {
            Some(shortest) => self.longest.as_secs_f64() / shortest.as_secs_f64().max(1e-9),
            None => 1.0,
        };
        Spread {
            ratio: ratio.max(1.0),
        }
    }
}

impl Row {
    /// Why the row cannot be trusted, if it is too noisy: see the
    /// [module docs](self).
    pub(crate) fn noise(&self) -> Option<String> {
        match *self {
            Self::Latency {
                size,
                avg_us,
                max_us,
                p50_us,
                p99_us,
                ..
            } => (avg_us > LATENCY_SKEW * p50_us || avg_us > p99_us).then(|| {
                format!(
                    "{size} B is noisy: the average is {:.1}x the median (P50), pulled up \
                     by stalls of up to {max_us:.2} us; P50 is the steadier figure",
                    avg_us / p50_us.max(1e-9)
                )
            }),
            Self::Bandwidth { size, spread, .. } | Self::MbwMr { size, spread, .. } => {
                (spread.ratio > SPREAD_LIMIT).then(|| {
                    format!(
                        "{size} B is noisy: its fastest batch of windows ran {:.1}x the rate \
                         of its slowest; rerun it on a quieter host, with the ranks pinned \
                         (--bind-to core)",
                        spread.ratio
                    )
                })
            }
            Self::MultiLat { .. } => None,
        }
    }

    /// A table row in OSU's layout: the size in 10 columns, each value in
    /// 20 (16 for the percentiles and maximum), two decimals.
    fn human(&self) -> String {
        match *self {
            Self::Latency {
                size,
                avg_us,
                max_us,
                p50_us,
                p99_us,
                ..
            } => format!("{size:<10}{avg_us:>20.2}{p50_us:>16.2}{p99_us:>16.2}{max_us:>16.2}"),
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
    /// the numbers is valid JSON. `noisy` is [`Row::noise`]'s verdict.
    pub(crate) fn json(&self) -> String {
        let noisy = self.noise().is_some();
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
                r#"{{"tool":"udbench","bench":"latency","size":{size},"iterations":{iterations},"avg_us":{},"min_us":{},"max_us":{},"p50_us":{},"p99_us":{},"noisy":{noisy}}}"#,
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
                spread,
            } => format!(
                r#"{{"tool":"udbench","bench":"{bench}","size":{size},"window":{window},"iterations":{iterations},"mb_per_s":{},"spread":{},"noisy":{noisy}}}"#,
                num(mb_per_s),
                num(spread.ratio)
            ),
            Self::MbwMr {
                size,
                pairs,
                window,
                mb_per_s,
                messages_per_s,
                spread,
            } => format!(
                r#"{{"tool":"udbench","bench":"mbw_mr","size":{size},"pairs":{pairs},"window":{window},"mb_per_s":{},"messages_per_s":{},"spread":{},"noisy":{noisy}}}"#,
                num(mb_per_s),
                num(messages_per_s),
                num(spread.ratio)
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
            print_stdout(&format!(
                "# udbench {title} (udbtl: reliable UD over UDP)\n{columns}\n"
            ));
        }
    }

    /// One row, and its warning if it is noisy: see the [module
    /// docs](self).
    pub(crate) fn row(&self, row: &Row) {
        if !self.rank0 {
            return;
        }
        let noise = row.noise();
        if self.json {
            print_stdout(&format!("{}\n", row.json()));
            if let Some(noise) = noise {
                let _ = writeln!(io::stderr(), "udbench: warning: {noise}");
            }
        } else {
            let mut text = format!("{}\n", row.human());
            if let Some(noise) = noise {
                text.push_str(&format!("# warning: {noise}\n"));
            }
            print_stdout(&text);
        }
    }

    /// Announces size `index` (from 0) of `count` of `bench`.
    pub(crate) fn progress(&self, bench: &str, size: usize, index: usize, count: usize) {
        if self.rank0 && self.progress {
            // Progress is a courtesy: a stderr that cannot take it is no
            // reason to stop the run.
            let _ = writeln!(
                io::stderr(),
                "udbench: {bench} {size} B ({}/{count})",
                index + 1
            );
        }
    }
}

/// Writes `text` to stdout in one go. Returns only if it was written: see
/// the [module docs](self) for a closed stdout; on another failure (a full
/// disk) the process exits 1 saying why, since results that cannot be
/// written are not worth measuring.
fn print_stdout(text: &str) {
    let mut out = io::stdout().lock();
    let Err(err) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) else {
        return;
    };
    drop(out);
    if err.kind() == io::ErrorKind::BrokenPipe {
        crate::closed_pipe();
    }
    let _ = writeln!(io::stderr(), "udbench: cannot write the results: {err}");
    std::process::exit(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn latency(avg_us: f64, p50_us: f64, p99_us: f64, max_us: f64) -> Row {
        Row::Latency {
            size: 1,
            iterations: 10_000,
            avg_us,
            min_us: 1.0,
            max_us,
            p50_us,
            p99_us,
        }
    }

    fn bw(ratio: f64) -> Row {
        Row::Bandwidth {
            bench: "bw",
            size: 8,
            window: 64,
            iterations: 100,
            mb_per_s: 10.0,
            spread: Spread { ratio },
        }
    }

    #[test]
    fn a_mean_pulled_up_by_stalls_is_noisy() {
        // The issue's row: the average above P99.
        let noise = latency(19.67, 4.48, 17.02, 3100.0).noise().unwrap();
        assert!(noise.contains("4.4x the median"), "{noise}");
        assert!(noise.contains("3100.00 us"), "{noise}");
        assert!(latency(5.0, 3.0, 4.0, 90.0).noise().is_some());
        assert_eq!(latency(5.2, 4.8, 8.8, 60.0).noise(), None);
    }

    #[test]
    fn batches_far_apart_are_noisy() {
        assert_eq!(bw(1.3).noise(), None);
        assert!(bw(3.0).noise().unwrap().contains("3.0x the rate"));
        let json = bw(3.0).json();
        assert!(json.ends_with(r#""spread":3.000,"noisy":true}"#), "{json}");
        assert!(bw(1.0).json().ends_with(r#""noisy":false}"#));
    }

    #[test]
    fn the_table_row_holds_the_maximum() {
        let row = latency(5.2, 4.8, 8.8, 60.0).human();
        let columns: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(columns, ["1", "5.20", "4.80", "8.80", "60.00"]);
        assert_eq!(row.len(), LATENCY_COLUMNS.len());
    }

    #[test]
    fn laps_time_equal_batches() {
        // 12 timed iterations after 2: 5 batches of 2, the last 2 left out.
        let mut laps = Laps::new(2, 12);
        assert_eq!((laps.batches, laps.per_batch), (5, 2));
        for i in 0..14 {
            laps.done(i);
        }
        assert!(laps.spread().ratio >= 1.0);
        // One iteration: one batch, which tells nothing.
        let mut one = Laps::new(0, 1);
        one.done(0);
        assert_eq!(one.spread(), Spread { ratio: 1.0 });
    }
}
