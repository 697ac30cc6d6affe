//! The JSON Lines schema shared by the floors, `udbench` and `udplot`:
//! one object per (benchmark, size), e.g.
//!
//! ```text
//! {"tool":"udp_pingpong","bench":"latency","size":8,"iterations":10000,"avg_us":3.4,"min_us":..,"max_us":..,"p50_us":..,"p99_us":..}
//! {"tool":"udp_stream","bench":"bw","mode":"gso","size":1048576,"datagram":1472,"mb_per_s":..,"datagrams_per_s":..,"lost":0}
//! {"tool":"udbench","bench":"mbw_mr","size":8,"pairs":1,"window":64,"mb_per_s":..,"messages_per_s":..}
//! ```
//!
//! The comparison script adds `"label"` and `"path"`. Fields a tool does
//! not measure are left out, never written as null.

use serde::{Deserialize, Serialize};

/// One result line. Writers fill what they measured; readers take any
/// subset, so one type serves both.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Who measured: `udp_pingpong`, `udp_stream`, `udbench`, `osu_pt2pt`, ...
    pub tool: String,
    /// `latency`, `bw` or `mbw_mr`.
    pub bench: String,
    /// Stream mode (`single`, `mmsg`, `gso`), for `udp_stream`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Message size in bytes.
    pub size: u64,
    /// Datagram (segment) size in bytes, for `udp_stream`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datagram: Option<u64>,
    /// Timed iterations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iterations: Option<u64>,
    /// Sender–receiver pairs (`mbw_mr`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pairs: Option<u64>,
    /// Messages in flight per iteration (`mbw_mr`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<u64>,
    /// Mean one-way latency, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub avg_us: Option<f64>,
    /// Fastest one-way latency, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_us: Option<f64>,
    /// Slowest one-way latency, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_us: Option<f64>,
    /// Median one-way latency, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p50_us: Option<f64>,
    /// 99th percentile one-way latency, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_us: Option<f64>,
    /// Bandwidth, MB/s with MB = 10⁶ B (for `udp_stream`: receiver goodput).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mb_per_s: Option<f64>,
    /// Datagrams received per second (`udp_stream`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datagrams_per_s: Option<f64>,
    /// Messages per second (`mbw_mr`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages_per_s: Option<f64>,
    /// Datagrams sent but not received (`udp_stream`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost: Option<u64>,
    /// Series name, added by the comparison script.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// `loopback`, `veth1500`, `veth9000`, added by the comparison script.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

impl Record {
    /// One JSON line (no newline).
    #[must_use]
    pub fn to_line(&self) -> String {
        // NOTE(unwrap): a struct of strings, integers and finite-or-not
        // floats always serialises (serde_json writes NaN as null).
        serde_json::to_string(self).unwrap_or_default()
    }
}
