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

use std::time::Duration;

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

/// One table row.
pub fn row(size: usize, iters: usize, xfers_per_iter: usize, elapsed: Duration) -> String {
    // A zero elapsed time would print inf; a microsecond floor keeps the
    // row readable for absurdly fast runs.
    let usec = (elapsed.as_secs_f64() * 1e6).max(1.0);
    let xfers = (iters * xfers_per_iter) as f64;
    let total = (size as u64)
        .saturating_mul(iters as u64)
        .saturating_mul(xfers_per_iter as u64);
    format!(
        "{:<8}{:<8}={:<8}{:<8}{:8.2}s{:10.2}{:11.2}{:11.2}",
        size_str(size as u64),
        count_str(iters as u64),
        count_str(iters as u64),
        size_str(total),
        usec / 1e6,
        total as f64 / usec,
        usec / xfers,
        xfers / usec,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
