//! fi_pingpong's result table, column for column, so that numbers from
//! `weft` and from libfabric's own tool can be compared side by side.
//!
//! The arithmetic is fi_pingpong's. With `n` timed iterations of `size`
//! bytes and `x` transfers per iteration (pingpong: 2, the ping and the
//! pong; bw: 1), over `t` microseconds:
//!
//! * `total`      = n * size * x bytes (binary units: 125k is 128000 bytes)
//! * `MB/sec`     = total / t  (decimal megabytes per second)
//! * `usec/xfer`  = t / (n * x); for pingpong that is half a round trip
//! * `Mxfers/sec` = n * x / t
//!
//! `#sent` and `#ack` are the iteration count in decimal units (1k = 1000).

use std::io::Write;
use std::time::Duration;

use serde::Serialize;

use crate::fail::{Context, Res};

pub const HEADER: &str =
    "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec";

/// Sizes in binary units with one decimal below 10 (`1.5k`), none above.
pub fn size_str(n: u64) -> String {
    let (base, mag) = if n >= 1 << 30 {
        (1u64 << 30, "g")
    } else if n >= 1 << 20 {
        (1 << 20, "m")
    } else if n >= 1 << 10 {
        (1 << 10, "k")
    } else {
        (1, "")
    };
    let whole = n / base;
    let tenth = if whole < 10 {
        (n % base) * 10 / base
    } else {
        0
    };
    if tenth == 0 {
        format!("{whole}{mag}")
    } else {
        format!("{whole}.{tenth}{mag}")
    }
}

/// Counts in decimal units, truncated.
pub fn count_str(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{}b", n / 1_000_000_000),
        n if n >= 1_000_000 => format!("{}m", n / 1_000_000),
        n if n >= 1_000 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

/// One size's figures: what its table row shows, and what `--json`
/// gives unrounded, computed once so the two never disagree.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Figures {
    /// The transfer size.
    pub bytes: usize,
    /// Timed iterations (the table's `#sent` and `#ack`).
    pub iterations: usize,
    /// Transfers per iteration: 2 for a ping-pong, 1 for bw or an RMA read.
    pub xfers_per_iter: usize,
    pub total_bytes: u64,
    pub time_s: f64,
    pub mb_per_sec: f64,
    pub usec_per_xfer: f64,
    pub mxfers_per_sec: f64,
}

impl Figures {
    pub fn new(size: usize, iters: usize, xfers_per_iter: usize, elapsed: Duration) -> Figures {
        // A zero elapsed time would give inf; a microsecond floor keeps
        // the figures finite (and JSON-able) for absurdly fast runs.
        let secs = elapsed.as_secs_f64().max(1e-6);
        let usec = secs * 1e6;
        let xfers = (iters * xfers_per_iter) as f64;
        let total = (size as u64)
            .saturating_mul(iters as u64)
            .saturating_mul(xfers_per_iter as u64);
        Figures {
            bytes: size,
            iterations: iters,
            xfers_per_iter,
            total_bytes: total,
            time_s: secs,
            mb_per_sec: total as f64 / usec,
            usec_per_xfer: usec / xfers,
            mxfers_per_sec: xfers / usec,
        }
    }

    /// The table row.
    pub fn row(&self) -> String {
        format!(
            "{:<8}{:<8}={:<8}{:<8}{:8.2}s{:10.2}{:11.2}{:11.2}",
            size_str(self.bytes as u64),
            count_str(self.iterations as u64),
            count_str(self.iterations as u64),
            size_str(self.total_bytes),
            self.time_s,
            self.mb_per_sec,
            self.usec_per_xfer,
            self.mxfers_per_sec,
        )
    }
}

/// What a run was, for the JSON document: enough for a script to tell
/// its results from another run's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Run {
    /// `pingpong` or `bw`.
    pub command: &'static str,
    /// `client`, `server`, or `self` (both in one process).
    pub role: &'static str,
    pub provider: String,
    /// `rdm`, `msg`, `dgram`, as `-e` takes it.
    pub ep_type: String,
    /// `interrupt`, `busy-poll` or `inline`.
    pub mode: &'static str,
    /// `post` or `async`.
    pub api: &'static str,
    /// `write` or `read` with `--rma`.
    pub rma: Option<&'static str>,
    pub verify: bool,
    /// Untimed iterations before the timed ones, per size.
    pub warmup: usize,
    /// bw's `-W`.
    pub window: Option<usize>,
}

/// The `--json` document: the run and a result per size, in order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Document {
    #[serde(flatten)]
    pub run: Run,
    pub results: Vec<Figures>,
}

/// Where one side's results go.
#[derive(Debug)]
pub enum Sink {
    /// Nowhere: the `--self` server, whose client prints.
    Quiet,
    /// The table, a row per size as soon as it is measured.
    Table,
    /// One document once every size is measured.
    Json(Box<Document>),
}

impl Sink {
    pub fn quiet(&self) -> bool {
        matches!(self, Sink::Quiet)
    }

    pub fn begin(&mut self) -> Res<()> {
        if let Sink::Table = self {
            let mut out = std::io::stdout().lock();
            writeln!(out, "{HEADER}").ctx("write")?;
        }
        Ok(())
    }

    pub fn add(&mut self, f: Figures) -> Res<()> {
        match self {
            Sink::Quiet => Ok(()),
            Sink::Table => {
                let mut out = std::io::stdout().lock();
                writeln!(out, "{}", f.row()).ctx("write")?;
                // A row at a time: a long run's earlier sizes are already
                // of use to whoever watches.
                out.flush().ctx("write")
            }
            Sink::Json(d) => {
                d.results.push(f);
                Ok(())
            }
        }
    }

    pub fn end(self) -> Res<()> {
        if let Sink::Json(d) = self {
            let mut out = std::io::stdout().lock();
            serde_json::to_writer_pretty(&mut out, &d).ctx("write JSON")?;
            writeln!(out).ctx("write")?;
            out.flush().ctx("write")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(size: usize, iters: usize, xfers_per_iter: usize, elapsed: Duration) -> String {
        Figures::new(size, iters, xfers_per_iter, elapsed).row()
    }

    #[test]
    fn units() {
        assert_eq!(size_str(64), "64");
        assert_eq!(size_str(1024), "1k");
        assert_eq!(size_str(1536), "1.5k");
        assert_eq!(size_str(128_000), "125k");
        assert_eq!(size_str(12_800), "12k");
        assert_eq!(size_str(209_715_200), "200m");
        assert_eq!(count_str(100), "100");
        assert_eq!(count_str(1000), "1k");
    }

    #[test]
    fn json_has_the_row_figures_unrounded() {
        let f = Figures::new(64, 1000, 2, Duration::from_micros(49_140));
        let v = serde_json::to_value(&f).unwrap_or_default();
        assert_eq!(v["bytes"], 64);
        assert_eq!(v["iterations"], 1000);
        assert_eq!(v["total_bytes"], 128_000);
        assert_eq!(v["time_s"], 0.04914);
        assert!((v["usec_per_xfer"].as_f64().unwrap_or_default() - 24.57).abs() < 1e-9);
        // Nothing elapsed still gives numbers, not inf (which JSON lacks).
        let f = Figures::new(64, 1, 1, Duration::ZERO);
        assert!(serde_json::to_value(&f).is_ok_and(|v| v["mb_per_sec"] == 64.0));
    }

    #[test]
    fn matches_fi_pingpong_row() {
        // fi_pingpong -S 64 -I 1000 printed, for 49140 us:
        // "64      1k      =1k      125k        0.05s      2.60      24.57       0.04"
        let r = row(64, 1000, 2, Duration::from_micros(49_140));
        assert_eq!(
            r,
            "64      1k      =1k      125k        0.05s      2.60      24.57       0.04"
        );
    }
}
