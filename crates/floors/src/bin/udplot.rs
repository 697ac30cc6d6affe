//! `udplot`: turns JSON Lines results (the floors', udbench's, and the
//! comparison script's conversions of other peers) into a results folder:
//! `latency-<path>.svg`, `bandwidth-<path>.svg` (log-log) and `results.md`:
//! a summary that stands alone (the notes, the headline figures of every
//! path and label, the ratio of udbtl to every other label, and the
//! targets udbench is held to, met or missed), then
//! median tables per path.
//!
//! ```text
//! udplot --out results/2026-12-02 [--note "kernel 6.18"]... FILE.jsonl...
//! ```
//!
//! Lines that do not parse are counted and reported, not fatal: a run that
//! died half-way still leaves its finished sizes.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use plotters::prelude::*;
use udbtl_floors::record::Record;
use udbtl_floors::stats::{self, Metric, Series};
use udbtl_floors::targets;

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Median tables (results.md) and log-log SVG plots from JSON Lines results"
)]
struct Args {
    /// Folder to write results.md and the SVGs into (created if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// A line for the header of results.md (repeatable).
    #[arg(long, value_name = "TEXT")]
    note: Vec<String>,
    /// Labels containing this are the subject of the ratio tables.
    #[arg(long, default_value = "udbtl")]
    subject: String,
    /// Title of results.md.
    #[arg(long, default_value = "udbtl against its peers and the UDP floor")]
    title: String,
    /// JSON Lines files.
    #[arg(required = true, value_name = "FILE")]
    inputs: Vec<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Plot { path: PathBuf, message: String },
    #[error("no result in any input")]
    Empty,
}

fn main() -> ExitCode {
    match run(&Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("udplot: {err}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), Error> {
    let mut records = Vec::new();
    let mut bad = 0usize;
    for path in &args.inputs {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        for line in text.lines().map(str::trim).filter(|l| l.starts_with('{')) {
            match serde_json::from_str::<Record>(line) {
                Ok(r) => records.push(r),
                Err(_) => bad += 1,
            }
        }
    }
    if bad > 0 {
        eprintln!("udplot: skipped {bad} line(s) that are not result records");
    }
    if records.is_empty() {
        return Err(Error::Empty);
    }
    std::fs::create_dir_all(&args.out).map_err(|source| Error::Io {
        path: args.out.clone(),
        source,
    })?;
    let meds = stats::medians(&records);
    let paths: BTreeSet<String> = meds.keys().map(|k| k.0.clone()).collect();
    let runs = meds.values().map(|v| v.1).max().unwrap_or(0);

    // The summary stands alone (what ran where and when, the headline
    // figures and ratios) so that it can be quoted as it is; the sections
    // per path after it hold every size.
    let mut md = format!("# {}\n\n## Summary\n\n", args.title);
    for note in &args.note {
        let _ = writeln!(md, "- {note}");
    }
    let _ = writeln!(
        md,
        "- cells are medians over up to {runs} runs per (path, label, size); latency is the mean one-way µs of each run; \
         bandwidth MB/s with MB = 10^6 B (udp_stream: receiver goodput); message rate in messages/s \
         (mbw_mr's where a label has it, else bandwidth / size)\n"
    );
    if let Some(t) = stats::headline_table(&meds) {
        let _ = writeln!(md, "### Headline figures\n\n{t}");
    }
    if let Some(t) = stats::ratio_table(&meds, &args.subject) {
        let _ = writeln!(
            md,
            "### Ratios ({} / other: latency below 1 and bandwidth or rate above 1 favour {})\n\n{t}",
            args.subject, args.subject
        );
    }
    if let Some(t) = targets::target_table(&meds, &targets::TARGETS) {
        let _ = writeln!(md, "### Targets\n\n{t}");
    }
    if let Some(t) = targets::size_ratio_table(
        &meds,
        "ompi udbtl",
        "ompi tcp",
        Metric::Bandwidth,
        16 << 10..=4 << 20,
    ) {
        let _ = writeln!(
            md,
            "### Open MPI bandwidth by size, udbtl / tcp (issue 27 asks at least 1 from 16 KiB to 4 MiB)\n\n{t}"
        );
    }
    for path in &paths {
        let _ = writeln!(md, "## {path}\n");
        for (metric, title, file, unit) in [
            (
                Metric::Latency,
                "Latency, one-way µs",
                "latency",
                "one-way latency (µs)",
            ),
            (
                Metric::Bandwidth,
                "Bandwidth, MB/s",
                "bandwidth",
                "bandwidth (MB/s)",
            ),
            (Metric::MessageRate, "Message rate, messages/s", "", ""),
        ] {
            let by_label = stats::series(&meds, path, metric);
            if by_label.is_empty() {
                continue;
            }
            let _ = writeln!(md, "### {title}\n\n{}", stats::table(&by_label));
            if !file.is_empty() {
                let svg = args.out.join(format!("{file}-{path}.svg"));
                plot(&svg, &format!("{title} ({path})"), unit, &by_label)?;
                let _ = writeln!(md, "![{title} ({path})]({file}-{path}.svg)\n");
            }
        }
    }
    let md_path = args.out.join("results.md");
    std::fs::write(&md_path, md).map_err(|source| Error::Io {
        path: md_path,
        source,
    })?;
    Ok(())
}

/// A log-log line plot of every label's series.
fn plot(
    path: &Path,
    title: &str,
    unit: &str,
    by_label: &BTreeMap<String, Series>,
) -> Result<(), Error> {
    let err = |e: &dyn std::fmt::Display| Error::Plot {
        path: path.to_owned(),
        message: e.to_string(),
    };
    let points = by_label
        .values()
        .flat_map(|s| s.iter())
        .filter(|(_, v)| **v > 0.0);
    let (mut x0, mut x1, mut y0, mut y1) = (u64::MAX, 1u64, f64::MAX, f64::MIN_POSITIVE);
    for (&x, &y) in points {
        x0 = x0.min(x.max(1));
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 == u64::MAX {
        return Ok(());
    }
    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (x0 as f64..(x1 as f64) * 1.5).log_scale(),
            (y0 / 1.5..y1 * 1.5).log_scale(),
        )
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc(unit)
        .x_label_formatter(&|x| fmt_bytes(*x))
        .draw()
        .map_err(|e| err(&e))?;
    for (i, (label, s)) in by_label.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let data: Vec<(f64, f64)> = s
            .iter()
            .filter(|(_, v)| **v > 0.0)
            .map(|(&x, &y)| (x.max(1) as f64, y))
            .collect();
        chart
            .draw_series(LineSeries::new(data.clone(), color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(data.into_iter().map(|p| Circle::new(p, 3, color.filled())))
            .map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// 1024 → "1K", 1048576 → "1M".
fn fmt_bytes(x: f64) -> String {
    if x >= f64::from(1 << 20) {
        format!("{:.0}M", x / f64::from(1 << 20))
    } else if x >= 1024.0 {
        format!("{:.0}K", x / 1024.0)
    } else {
        format!("{x:.0}")
    }
}
