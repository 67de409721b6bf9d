//! What the soaks and fault tests share: a replayable random source, a
//! microsecond deadline, and the senders' window of the cancel-safety
//! soaks. Re-exported at the crate root.

use std::time::Duration;

/// xorshift64 for tests: they need no crate for randomness, and a printed
/// seed replays a run.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// Seeded from the environment variable `var` if set, else from the
    /// clock; the seed is printed with the variable that replays it.
    pub fn seeded(var: &str) -> Rng {
        let seed = std::env::var(var)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
                    | 1
            });
        eprintln!("seed {seed} ({var} replays it)");
        Rng(seed)
    }

    /// A number below `n` (at least 1).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// Ready once `at` has passed: polls the clock and asks to be polled
/// again, so the deadline is kept to the microsecond (Tokio's timers
/// tick in milliseconds).
#[derive(Debug)]
pub struct Until(pub std::time::Instant);

impl std::future::Future for Until {
    type Output = ();

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if std::time::Instant::now() >= self.0 {
            return std::task::Poll::Ready(());
        }
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

/// `f`, or `None` (with `f` dropped) once `us` microseconds have passed:
/// how the cancel-safety soaks withdraw receives at random.
pub async fn under_timeout<F: std::future::Future>(f: F, us: u64) -> Option<F::Output> {
    let f = std::pin::pin!(f);
    let deadline = Until(std::time::Instant::now() + Duration::from_micros(us));
    tokio::select! {
        biased;
        r = f => Some(r),
        () = deadline => None,
    }
}

/// The senders' window of a cancel-safety soak: a permit per message a
/// sender may have in flight, handed back as the receiver takes each one.
///
/// How often a receive times out by chance depends on the machine's
/// speed (a CI run once saw 60 in 4,000, where the soaks ask for one in
/// 50). So every [`Self::STARVE_EVERY`] deliveries the window holds its
/// permits back until one of the receiver's receives times out: at most
/// the window's messages can still come, so a withdrawal is certain.
/// The random timeouts still give the races between a message's arrival
/// and its receive's drop.
#[derive(Debug)]
pub struct SoakWindow {
    /// What the senders acquire, one permit per message.
    pub permits: std::sync::Arc<tokio::sync::Semaphore>,
    delivered: u64,
    held: usize,
}

impl SoakWindow {
    /// Deliveries between two starved spells.
    pub const STARVE_EVERY: u64 = 25;

    /// A window of `n` messages.
    pub fn new(n: usize) -> Self {
        SoakWindow {
            permits: std::sync::Arc::new(tokio::sync::Semaphore::new(n)),
            delivered: 0,
            held: 0,
        }
    }

    /// The receiver took a message.
    pub fn delivered(&mut self) {
        self.delivered += 1;
        if self.held > 0 || self.delivered % Self::STARVE_EVERY == 0 {
            self.held += 1;
        } else {
            self.permits.add_permits(1);
        }
    }

    /// A receive timed out: the senders may go on.
    pub fn withdrawn(&mut self) {
        self.permits.add_permits(std::mem::take(&mut self.held));
    }
}
