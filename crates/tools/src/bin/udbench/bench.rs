//! The benchmark loops, OSU's patterns over `World` messages.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use udbtl::{Tag, World};

use crate::report::{self, Out, Row};

type Error = Box<dyn std::error::Error>;

/// Payload messages: pings, pongs and windows.
const PING: Tag = Tag::new(20);
/// A receiver's acknowledgement of a complete window.
const ACK: Tag = Tag::new(21);
/// A rank's measurement, sent to rank 0 to be combined.
const RESULT: Tag = Tag::new(22);
/// Sizes above this are "large" (fewer iterations), as in OSU.
const LARGE: usize = 8192;
/// The acknowledgement's length, as in `osu_bw`.
const ACK_BYTES: [u8; 4] = [0; 4];
/// The histogram's range of round trips: a round trip over a minute is
/// recorded as a minute, which no percentile of a sane run reaches.
const HIST_MAX_NS: u64 = 60_000_000_000;

/// Which of OSU's loop counts a benchmark uses.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Latency,
    Bandwidth,
}

impl Kind {
    /// OSU's (timed iterations, warm-up) for sizes up to [`LARGE`] and
    /// above.
    const fn osu(self) -> ((u64, u64), (u64, u64)) {
        match self {
            Self::Latency => ((10_000, 100), (1_000, 10)),
            Self::Bandwidth => ((100, 10), (20, 2)),
        }
    }
}

/// How many times to run each size.
#[derive(Debug, Clone, Copy)]
struct Loops {
    /// Timed; at least 1.
    iters: u64,
    warmup: u64,
}

/// What the command line asked for, shared by every benchmark.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// Message sizes, ascending, each at most the buffer's length.
    pub(crate) sizes: Vec<usize>,
    /// Timed iterations for small sizes, if not OSU's.
    pub(crate) iterations: Option<u64>,
    /// Warm-up iterations for every size, if not OSU's proportion.
    pub(crate) warmup: Option<u64>,
    /// Longest a rank waits for one message (or window) before it reports
    /// the run stuck; `None` waits for ever.
    pub(crate) stall: Option<Duration>,
    /// Messages are copied by `World::send` rather than sent from the
    /// buffer by `World::send_shared`.
    pub(crate) copy_sends: bool,
}

impl Plan {
    /// OSU's counts, or `--iterations` scaled as OSU scales its own for
    /// large sizes, with OSU's proportion of warm-up.
    fn loops(&self, kind: Kind, len: usize) -> Loops {
        let ((small, small_skip), (large, large_skip)) = kind.osu();
        let (loop_default, skip_default) = if len > LARGE {
            (large, large_skip)
        } else {
            (small, small_skip)
        };
        let iters = self
            .iterations
            .map_or(loop_default, |n| n.saturating_mul(loop_default) / small)
            .max(1);
        let warmup = self
            .warmup
            .unwrap_or_else(|| (iters.saturating_mul(skip_default) / loop_default).max(1));
        Loops { iters, warmup }
    }
}

/// Messages arriving on one tag, and how many this rank has waited for.
/// Targets are absolute, never relative to the count when a wait begins:
/// a send progresses the transport and may count the peer's next messages
/// early, and a target taken after that would wait for one too many (this
/// hung the bandwidth test once).
#[derive(Debug)]
struct Counter {
    arrived: Arc<AtomicU64>,
    awaited: u64,
    /// What one message is, for a stall report.
    what: &'static str,
}

impl Counter {
    fn new(world: &mut World, tag: Tag, what: &'static str) -> Self {
        let arrived = Arc::new(AtomicU64::new(0));
        let sink = arrived.clone();
        world.on_receive(tag, move |_, _| {
            sink.fetch_add(1, Ordering::Relaxed);
        });
        Self {
            arrived,
            awaited: 0,
            what,
        }
    }

    /// Busy-polls until `n` more messages have arrived than were awaited
    /// before.
    ///
    /// # Errors
    /// As [`progress_until`].
    fn wait(&mut self, world: &mut World, n: u64, stall: Option<Duration>) -> Result<(), Error> {
        self.awaited += n;
        let (arrived, target) = (&self.arrived, self.awaited);
        progress_until(world, stall, self.what, || {
            arrived.load(Ordering::Relaxed) >= target
        })
    }
}

/// Idle polls between two looks at the clock while a wait stalls: the fast
/// path reads no clock.
const POLLS_PER_CLOCK_READ: u32 = 4096;

/// Busy-polls `world` until `done` holds.
///
/// # Errors
/// The transport lost a peer or a message: what is awaited may never come,
/// so the wait ends with the transport's account. Or nothing came within
/// `stall` although the transport reports no failure: the error says what
/// was awaited and holds the transport's state, so that a stuck run is
/// reported, never silent.
fn progress_until(
    world: &mut World,
    stall: Option<Duration>,
    what: &str,
    mut done: impl FnMut() -> bool,
) -> Result<(), Error> {
    let mut polls = 0u32;
    let mut since = None;
    while !done() {
        world.check()?;
        world.progress();
        polls = polls.wrapping_add(1);
        if let Some(limit) = stall.filter(|_| polls % POLLS_PER_CLOCK_READ == 0) {
            let started = *since.get_or_insert_with(Instant::now);
            if started.elapsed() > limit {
                return Err(format!(
                    "rank {}: {what} did not come within {} s (--stall-timeout), and the \
                     transport reports no failure; its state:\n{}",
                    world.rank(),
                    limit.as_secs(),
                    world.dump()
                )
                .into());
            }
        }
    }
    Ok(())
}

/// The running job and its buffers.
#[derive(Debug)]
pub(crate) struct Cx {
    world: World,
    rank: u32,
    ranks: u32,
    plan: Plan,
    buf: Vec<u8>,
    /// The first bytes of `buf` as the last size sent them, shared with
    /// the transport (`World::send_shared`).
    message: Arc<[u8]>,
    pings: Counter,
    acks: Counter,
    /// Measurements other ranks sent to rank 0.
    results: Arc<Mutex<Vec<f64>>>,
}

impl Cx {
    /// Installs the receive callbacks and allocates the one message buffer.
    ///
    /// # Errors
    /// A buffer over the address space.
    pub(crate) fn new(mut world: World, max_size: u64, plan: Plan) -> Result<Self, Error> {
        let pings = Counter::new(&mut world, PING, "a message of the benchmark");
        let acks = Counter::new(&mut world, ACK, "the acknowledgement of a window");
        let results = Arc::new(Mutex::new(Vec::new()));
        let sink = results.clone();
        world.on_receive(RESULT, move |_, bytes: &[u8]| {
            if let Ok(raw) = <[u8; 8]>::try_from(bytes) {
                sink.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(f64::from_le_bytes(raw));
            }
        });
        let len = usize::try_from(max_size)?;
        Ok(Self {
            rank: world.rank(),
            ranks: world.size(),
            world,
            plan,
            buf: vec![0x5a; len],
            message: Arc::from(Vec::new()),
            pings,
            acks,
            results,
        })
    }

    /// Ends the job cleanly.
    ///
    /// # Errors
    /// Messages the transport reports lost.
    pub(crate) fn finalize(self) -> Result<(), Error> {
        self.world.finalize()?;
        Ok(())
    }

    fn need_two(&self, bench: &str) -> Result<(), Error> {
        if self.ranks < 2 {
            return Err(
                format!("{bench} needs at least 2 ranks, e.g. udrun -n 2 udbench {bench}").into(),
            );
        }
        Ok(())
    }

    /// Ping-pong between ranks 0 and 1; rank 0 reports.
    ///
    /// # Errors
    /// Too few ranks, or a failed send or barrier.
    pub(crate) fn latency(&mut self, out: &Out) -> Result<(), Error> {
        self.need_two("latency")?;
        out.header("latency: ranks 0 and 1", report::LATENCY_COLUMNS);
        let mut hist = Histogram::<u64>::new_with_bounds(1, HIST_MAX_NS, 3)?;
        let sizes = self.plan.sizes.clone();
        for (index, &len) in sizes.iter().enumerate() {
            let loops = self.plan.loops(Kind::Latency, len);
            out.progress("latency", len, index, sizes.len());
            self.world.barrier()?;
            match self.rank {
                0 => {
                    for _ in 0..loops.warmup {
                        self.ping(1, len)?;
                    }
                    hist.reset();
                    let start = Instant::now();
                    let mut last = start;
                    for _ in 0..loops.iters {
                        self.ping(1, len)?;
                        let now = Instant::now();
                        hist.saturating_record(nanos(now - last));
                        last = now;
                    }
                    let half_us = |ns: u64| ns as f64 / 2e3;
                    out.row(&Row::Latency {
                        size: len,
                        iterations: loops.iters,
                        avg_us: per_iteration_us(last - start, 2 * loops.iters),
                        min_us: half_us(hist.min()),
                        max_us: half_us(hist.max()),
                        p50_us: half_us(hist.value_at_quantile(0.5)),
                        p99_us: half_us(hist.value_at_quantile(0.99)),
                    });
                }
                1 => {
                    for _ in 0..loops.warmup + loops.iters {
                        self.pong(0, len)?;
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Every rank below half the job ping-pongs with its partner in the
    /// upper half; rank 0 reports the average of the pairs' latencies.
    ///
    /// # Errors
    /// An odd or too small job, or a failed send or barrier.
    pub(crate) fn multi_lat(&mut self, out: &Out) -> Result<(), Error> {
        if self.ranks < 2 || self.ranks % 2 != 0 {
            return Err(format!(
                "multi_lat needs an even number of ranks (at least 2), the job has {}",
                self.ranks
            )
            .into());
        }
        let half = self.ranks / 2;
        out.header(
            &format!("multi_lat: {half} pairs, rank i with rank i+{half}"),
            report::MULTI_LAT_COLUMNS,
        );
        let sizes = self.plan.sizes.clone();
        for (index, &len) in sizes.iter().enumerate() {
            let loops = self.plan.loops(Kind::Latency, len);
            out.progress("multi_lat", len, index, sizes.len());
            self.world.barrier()?;
            if self.rank < half {
                let peer = self.rank + half;
                for _ in 0..loops.warmup {
                    self.ping(peer, len)?;
                }
                let start = Instant::now();
                for _ in 0..loops.iters {
                    self.ping(peer, len)?;
                }
                let us = per_iteration_us(start.elapsed(), 2 * loops.iters);
                if let Some(sum) = self.gather(half, us)? {
                    out.row(&Row::MultiLat {
                        size: len,
                        pairs: half,
                        avg_us: sum / f64::from(half),
                    });
                }
            } else {
                for _ in 0..loops.warmup + loops.iters {
                    self.pong(self.rank - half, len)?;
                }
            }
        }
        Ok(())
    }

    /// Rank 0 streams windows to rank 1.
    ///
    /// # Errors
    /// Too few ranks, or a failed send or barrier.
    pub(crate) fn bw(&mut self, out: &Out, window: u64) -> Result<(), Error> {
        self.need_two("bw")?;
        out.header(
            &format!("bw: rank 0 to rank 1, window {window}"),
            report::BANDWIDTH_COLUMNS,
        );
        let sizes = self.plan.sizes.clone();
        for (index, &len) in sizes.iter().enumerate() {
            let loops = self.plan.loops(Kind::Bandwidth, len);
            out.progress("bw", len, index, sizes.len());
            self.world.barrier()?;
            let elapsed = self.stream(1, len, window, loops)?;
            if let (0, Some((elapsed, spread))) = (self.rank, elapsed) {
                out.row(&Row::Bandwidth {
                    bench: "bw",
                    size: len,
                    window,
                    iterations: loops.iters,
                    mb_per_s: mb_per_s(len, window * loops.iters, elapsed),
                    spread,
                });
            }
        }
        Ok(())
    }

    /// Ranks 0 and 1 each stream windows to the other.
    ///
    /// # Errors
    /// Too few ranks, or a failed send or barrier.
    pub(crate) fn bibw(&mut self, out: &Out, window: u64) -> Result<(), Error> {
        self.need_two("bibw")?;
        out.header(
            &format!("bibw: ranks 0 and 1 both ways, window {window}"),
            report::BANDWIDTH_COLUMNS,
        );
        let sizes = self.plan.sizes.clone();
        for (index, &len) in sizes.iter().enumerate() {
            let loops = self.plan.loops(Kind::Bandwidth, len);
            out.progress("bibw", len, index, sizes.len());
            self.world.barrier()?;
            if self.rank > 1 {
                continue;
            }
            let peer = 1 - self.rank;
            let mut start = Instant::now();
            let mut laps = report::Laps::new(loops.warmup, loops.iters);
            for i in 0..loops.warmup + loops.iters {
                if i == loops.warmup {
                    start = Instant::now();
                }
                for _ in 0..window {
                    self.send_payload(peer, len)?;
                }
                self.pings.wait(&mut self.world, window, self.plan.stall)?;
                laps.done(i);
            }
            if self.rank == 0 {
                out.row(&Row::Bandwidth {
                    bench: "bibw",
                    size: len,
                    window,
                    iterations: loops.iters,
                    mb_per_s: mb_per_s(len, 2 * window * loops.iters, start.elapsed()),
                    spread: laps.spread(),
                });
            }
        }
        Ok(())
    }

    /// `pairs` senders stream windows at once; rank 0 reports the aggregate
    /// from the senders' average time, as `osu_mbw_mr` does.
    ///
    /// # Errors
    /// Fewer than `2 × pairs` ranks, or a failed send or barrier.
    pub(crate) fn mbw_mr(&mut self, out: &Out, pairs: u32, window: u64) -> Result<(), Error> {
        if u64::from(self.ranks) < 2 * u64::from(pairs) {
            return Err(format!(
                "mbw_mr --pairs {pairs} needs at least {} ranks, the job has {}",
                2 * u64::from(pairs),
                self.ranks
            )
            .into());
        }
        out.header(
            &format!(
                "mbw_mr: [ pairs: {pairs} ] [ window size: {window} ], rank i to rank i+{pairs}"
            ),
            report::MBW_MR_COLUMNS,
        );
        let sizes = self.plan.sizes.clone();
        for (index, &len) in sizes.iter().enumerate() {
            let loops = self.plan.loops(Kind::Bandwidth, len);
            out.progress("mbw_mr", len, index, sizes.len());
            self.world.barrier()?;
            let Some((elapsed, spread)) = self.stream(pairs, len, window, loops)? else {
                continue;
            };
            if let Some(sum) = self.gather(pairs, elapsed.as_secs_f64())? {
                let secs = (sum / f64::from(pairs)).max(1e-9);
                let messages = (window * loops.iters * u64::from(pairs)) as f64;
                out.row(&Row::MbwMr {
                    size: len,
                    pairs,
                    window,
                    mb_per_s: messages * len as f64 / secs / 1e6,
                    messages_per_s: messages / secs,
                    spread,
                });
            }
        }
        Ok(())
    }

    /// The `osu_bw` pattern for `pairs` pairs: ranks below `pairs` send
    /// `window` messages of `len` bytes to rank + `pairs`, which
    /// acknowledges each complete window. Returns a sender's timed span
    /// and the spread of its batches.
    fn stream(
        &mut self,
        pairs: u32,
        len: usize,
        window: u64,
        loops: Loops,
    ) -> Result<Option<(Duration, report::Spread)>, Error> {
        let total = loops.warmup + loops.iters;
        if self.rank < pairs {
            let peer = self.rank + pairs;
            let mut start = Instant::now();
            let mut laps = report::Laps::new(loops.warmup, loops.iters);
            for i in 0..total {
                if i == loops.warmup {
                    start = Instant::now();
                }
                for _ in 0..window {
                    self.send_payload(peer, len)?;
                }
                self.acks.wait(&mut self.world, 1, self.plan.stall)?;
                laps.done(i);
            }
            Ok(Some((start.elapsed(), laps.spread())))
        } else if self.rank < 2 * pairs {
            let peer = self.rank - pairs;
            for _ in 0..total {
                self.pings.wait(&mut self.world, window, self.plan.stall)?;
                self.world.send(peer, ACK, &ACK_BYTES)?;
            }
            Ok(None)
        } else {
            Ok(None)
        }
    }

    /// Rank 0 sums its own `value` and those of ranks 1..`senders`; the
    /// others send theirs to it. Returns the sum on rank 0.
    fn gather(&mut self, senders: u32, value: f64) -> Result<Option<f64>, Error> {
        if self.rank != 0 {
            self.world.send(0, RESULT, &value.to_le_bytes())?;
            return Ok(None);
        }
        let others = usize::try_from(senders - 1)?;
        let results = &self.results;
        let arrived = || results.lock().unwrap_or_else(PoisonError::into_inner).len() >= others;
        progress_until(
            &mut self.world,
            self.plan.stall,
            "the other senders' results",
            arrived,
        )?;
        let sum = results
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
            .sum::<f64>();
        Ok(Some(sum + value))
    }

    /// Sends `len` bytes of the benchmark's buffer to `peer`: from the
    /// buffer itself (`World::send_shared`), or copied (`World::send`)
    /// with `--copy-sends`.
    fn send_payload(&mut self, peer: u32, len: usize) -> Result<(), Error> {
        if self.plan.copy_sends {
            self.world.send(peer, PING, &self.buf[..len])?;
            return Ok(());
        }
        if self.message.len() != len {
            self.message = Arc::from(&self.buf[..len]);
        }
        self.world.send_shared(peer, PING, &self.message)?;
        Ok(())
    }

    /// One round trip from this rank.
    fn ping(&mut self, peer: u32, len: usize) -> Result<(), Error> {
        self.send_payload(peer, len)?;
        self.pings.wait(&mut self.world, 1, self.plan.stall)?;
        Ok(())
    }

    /// Answers one ping.
    fn pong(&mut self, peer: u32, len: usize) -> Result<(), Error> {
        self.pings.wait(&mut self.world, 1, self.plan.stall)?;
        self.send_payload(peer, len)?;
        Ok(())
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Microseconds per iteration; the span is clamped above zero so the
/// result is always finite.
fn per_iteration_us(span: Duration, iterations: u64) -> f64 {
    span.as_secs_f64().max(1e-9) * 1e6 / iterations as f64
}

/// MB/s, MB = 10⁶ bytes.
fn mb_per_s(len: usize, messages: u64, span: Duration) -> f64 {
    len as f64 * messages as f64 / span.as_secs_f64().max(1e-9) / 1e6
}

#[cfg(test)]
mod tests {
    use super::{Kind, LARGE, Plan};

    fn plan(iterations: Option<u64>, warmup: Option<u64>) -> Plan {
        Plan {
            sizes: Vec::new(),
            iterations,
            warmup,
            stall: None,
            copy_sends: false,
        }
    }

    fn counts(plan: &Plan, kind: Kind, len: usize) -> (u64, u64) {
        let loops = plan.loops(kind, len);
        (loops.iters, loops.warmup)
    }

    #[test]
    fn defaults_are_osus() {
        let osu = plan(None, None);
        assert_eq!(counts(&osu, Kind::Latency, LARGE), (10_000, 100));
        assert_eq!(counts(&osu, Kind::Latency, LARGE + 1), (1_000, 10));
        assert_eq!(counts(&osu, Kind::Bandwidth, LARGE), (100, 10));
        assert_eq!(counts(&osu, Kind::Bandwidth, LARGE + 1), (20, 2));
    }

    #[test]
    fn iterations_scale_large_sizes_and_warm_up_never_below_one() {
        let some = plan(Some(50), None);
        assert_eq!(counts(&some, Kind::Latency, 8), (50, 1));
        assert_eq!(counts(&some, Kind::Latency, 1 << 20), (5, 1));
        assert_eq!(counts(&some, Kind::Bandwidth, 8), (50, 5));
        assert_eq!(counts(&some, Kind::Bandwidth, 1 << 20), (10, 1));
        let one = plan(Some(1), Some(0));
        assert_eq!(counts(&one, Kind::Latency, 1 << 20), (1, 0));
        assert_eq!(counts(&one, Kind::Bandwidth, 1 << 20), (1, 0));
    }
}
