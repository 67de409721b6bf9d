//! Progress of a long run on a terminal: a rate line on stderr, redrawn
//! in place, for as long as one size takes. The measuring loops only
//! store their iteration count in an atomic (when there is a terminal to
//! show it on at all); a thread of its own reads it a few times a second
//! and draws, so the timed path never formats, writes or takes a lock.
//! Piped or redirected, stderr gets nothing: logs and scripts see only
//! what they did before.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::report;

/// A run shorter than this never shows a line: it would only flicker.
const QUIET_START: Duration = Duration::from_secs(1);
/// How often the line is redrawn.
const REDRAW: Duration = Duration::from_millis(250);

/// What a measuring loop holds: where to store how far it got. Cloning
/// shares the count.
#[derive(Debug, Clone, Default)]
pub struct Meter(Option<Arc<AtomicUsize>>);

impl Meter {
    /// A meter nobody reads.
    pub fn off() -> Meter {
        Meter(None)
    }

    /// `done` of the size's operations (warm-up included) have completed.
    #[inline]
    pub fn set(&self, done: usize) {
        if let Some(c) = &self.0 {
            // Only the drawing thread reads it, and only for display: no
            // ordering with anything else is needed.
            c.store(done, Ordering::Relaxed);
        }
    }
}

/// The line for one size, while it runs; dropping it (or [`Progress::end`])
/// erases the line, so the table's next row starts clean.
#[derive(Debug)]
pub struct Progress {
    stop: Option<mpsc::Sender<()>>,
    drawer: Option<JoinHandle<()>>,
}

impl Progress {
    /// Shows the progress of `total` operations of `size` bytes, counted
    /// by the returned meter, if stderr is a terminal and `wanted`.
    pub fn start(wanted: bool, size: usize, total: usize, unit: &'static str) -> (Progress, Meter) {
        if !wanted || !std::io::stderr().is_terminal() {
            let none = Progress {
                stop: None,
                drawer: None,
            };
            return (none, Meter::off());
        }
        let count = Arc::new(AtomicUsize::new(0));
        let (stop, stopped) = mpsc::channel();
        let seen = Arc::clone(&count);
        let drawer = std::thread::Builder::new()
            .name("weft-progress".into())
            .spawn(move || draw(&seen, &stopped, size, total, unit))
            .ok();
        let d = Progress {
            stop: Some(stop),
            drawer,
        };
        (d, Meter(Some(count)))
    }

    /// Erases the line; returns once it is gone.
    pub fn end(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        // Dropping the sender wakes the drawer at once.
        self.stop.take();
        if let Some(d) = self.drawer.take() {
            let _ = d.join();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

fn draw(count: &AtomicUsize, stopped: &mpsc::Receiver<()>, size: usize, total: usize, unit: &str) {
    let begin = Instant::now();
    let mut shown = false;
    let mut last = (begin, 0usize);
    let mut wait = QUIET_START;
    while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(wait) {
        wait = REDRAW;
        let now = Instant::now();
        let done = count.load(Ordering::Relaxed);
        let rate = rate(done.saturating_sub(last.1), now - last.0);
        last = (now, done);
        let line = line(size, done, total, unit, rate);
        let mut err = std::io::stderr().lock();
        // A terminal that went away is no reason to stop the run.
        let _ = write!(err, "\r\x1b[2K{line}");
        let _ = err.flush();
        shown = true;
    }
    if shown {
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K");
        let _ = err.flush();
    }
}

/// Operations per second over `dt`.
fn rate(ops: usize, dt: Duration) -> f64 {
    ops as f64 / dt.as_secs_f64().max(1e-9)
}

/// `64 B: 12k/22k iterations, 45.6k/s, 2.92 MB/s`.
fn line(size: usize, done: usize, total: usize, unit: &str, per_sec: f64) -> String {
    format!(
        "{} B: {}/{} {unit}, {}/s, {:.2} MB/s",
        report::size_str(size as u64),
        report::count_str(done as u64),
        report::count_str(total as u64),
        report::count_str(per_sec as u64),
        per_sec * size as f64 / 1e6,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_reads_like_the_table() {
        assert_eq!(
            line(64, 12_345, 22_000, "iterations", 45_600.0),
            "64 B: 12k/22k iterations, 45k/s, 2.92 MB/s"
        );
        assert_eq!(rate(500, Duration::from_millis(250)), 2000.0);
        assert!(rate(1, Duration::ZERO).is_finite());
    }

    #[test]
    fn off_when_not_wanted() {
        let (d, m) = Progress::start(false, 64, 10, "iterations");
        assert!(m.0.is_none() && d.drawer.is_none());
        m.set(5);
        d.end();
    }
}
