//! What an endpoint lets its peers hold: connections, buffered bytes and
//! time. Software providers enforce these against peers that never
//! authenticated, so each has a default that keeps one host's worth of
//! hostile peers from exhausting the process, and each can be changed
//! through an environment variable in libfabric's style or in code
//! (`Endpoint::set_conn_limits`) before the endpoint is enabled.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Fixed cost charged for every buffered unexpected message on top of its
/// payload: the message record, its matcher entries and their indexes
/// (measured at 390-420 bytes of heap per message by the hostile-peer
/// campaign's floods of zero- and one-byte messages). A zero-length
/// message is not free, so a flood of them runs into the budget like any
/// other.
pub const UNEXPECTED_OVERHEAD: usize = 512;

/// Connection limits of one endpoint (a passive endpoint uses
/// `max_conns` for its pending requests and `handshake_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnLimits {
    /// Connections at once, handshaking ones included
    /// (`FI_TCP_MAX_CONNS`). Beyond it new inbound connections are closed
    /// at once and reported on the EQ.
    pub max_conns: usize,
    /// Most unexpected-message bytes (payload plus
    /// [`UNEXPECTED_OVERHEAD`] each) one connection may make the endpoint
    /// buffer (`FI_TCP_MAX_PEER_BUFFERED`); the endpoint's total is
    /// `rx_attr.total_buffered_recv`. A message larger than this share
    /// waits in its sender's stream until a receive matches it.
    pub peer_buffered: usize,
    /// A connection with no traffic and nothing pending for this long is
    /// closed (`FI_TCP_IDLE_TIMEOUT`, milliseconds, 0 = never). Applies to
    /// connections the provider makes on the application's behalf (RDM);
    /// a MSG connection belongs to the application.
    pub idle_timeout: Option<Duration>,
    /// A frame that stops arriving part-way (header or payload) for this
    /// long closes its connection (`FI_TCP_STALL_TIMEOUT`, milliseconds);
    /// so does a connection whose peer left while its data waited for
    /// receive buffers.
    pub stall_timeout: Duration,
    /// How long a peer may take over each handshake frame
    /// (`FI_TCP_HANDSHAKE_TIMEOUT`, milliseconds).
    pub handshake_timeout: Duration,
}

/// Default [`ConnLimits::max_conns`].
pub const DEFAULT_MAX_CONNS: usize = 4096;
/// Default [`ConnLimits::peer_buffered`].
pub const DEFAULT_PEER_BUFFERED: usize = 16 << 20;
/// Default [`ConnLimits::idle_timeout`].
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// Default [`ConnLimits::stall_timeout`].
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`ConnLimits::handshake_timeout`].
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            max_conns: DEFAULT_MAX_CONNS,
            peer_buffered: DEFAULT_PEER_BUFFERED,
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
            stall_timeout: DEFAULT_STALL_TIMEOUT,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
        }
    }
}

impl ConnLimits {
    /// The defaults with the environment's overrides applied.
    pub fn from_env() -> ConnLimits {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// The defaults with overrides from `var` (a name to its value).
    /// A value that does not parse keeps the default: a typo must not
    /// turn a limit off.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> ConnLimits {
        let num = |name: &str| -> Option<u64> { var(name)?.trim().parse::<u64>().ok() };
        let mut l = ConnLimits::default();
        if let Some(n) = num("FI_TCP_MAX_CONNS") {
            l.max_conns = usize::try_from(n).unwrap_or(usize::MAX).max(1);
        }
        if let Some(n) = num("FI_TCP_MAX_PEER_BUFFERED") {
            l.peer_buffered = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(n) = num("FI_TCP_IDLE_TIMEOUT") {
            l.idle_timeout = (n > 0).then(|| Duration::from_millis(n));
        }
        if let Some(n) = num("FI_TCP_STALL_TIMEOUT") {
            l.stall_timeout = Duration::from_millis(n.max(1));
        }
        if let Some(n) = num("FI_TCP_HANDSHAKE_TIMEOUT") {
            l.handshake_timeout = Duration::from_millis(n.max(1));
        }
        l
    }

    /// Sets [`max_conns`](Self::max_conns) (at least 1).
    pub fn with_max_conns(mut self, n: usize) -> Self {
        self.max_conns = n.max(1);
        self
    }

    /// Sets [`peer_buffered`](Self::peer_buffered).
    pub fn with_peer_buffered(mut self, n: usize) -> Self {
        self.peer_buffered = n;
        self
    }

    /// Sets [`idle_timeout`](Self::idle_timeout) (`None`: never).
    pub fn with_idle_timeout(mut self, t: Option<Duration>) -> Self {
        self.idle_timeout = t.filter(|t| !t.is_zero());
        self
    }

    /// Sets [`stall_timeout`](Self::stall_timeout).
    pub fn with_stall_timeout(mut self, t: Duration) -> Self {
        self.stall_timeout = t.max(Duration::from_millis(1));
        self
    }

    /// Sets [`handshake_timeout`](Self::handshake_timeout).
    pub fn with_handshake_timeout(mut self, t: Duration) -> Self {
        self.handshake_timeout = t.max(Duration::from_millis(1));
        self
    }

    /// How often a sweeper should look at its connections: often enough
    /// that a timeout fires within a quarter of its length late.
    pub fn sweep_interval(&self) -> Duration {
        let shortest = match self.idle_timeout {
            Some(i) => i.min(self.stall_timeout),
            None => self.stall_timeout,
        };
        (shortest / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }
}

/// One place in a connection count (an endpoint's, or a passive
/// endpoint's pending requests), given back by `Drop`, so no path that
/// ends a connection can forget to. Inbound connections are refused
/// beyond the limit ([`try_take`](Self::try_take)); the ones the
/// application asked for are counted but never refused
/// ([`take`](Self::take)).
#[derive(Debug)]
pub struct ConnSlot {
    count: Arc<AtomicUsize>,
}

impl ConnSlot {
    /// A place if fewer than `max` are taken.
    pub fn try_take(count: &Arc<AtomicUsize>, max: usize) -> Option<ConnSlot> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| ConnSlot {
                count: count.clone(),
            })
    }

    /// A place whatever the count.
    pub fn take(count: &Arc<AtomicUsize>) -> ConnSlot {
        count.fetch_add(1, Ordering::AcqRel);
        ConnSlot {
            count: count.clone(),
        }
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn environment_overrides_defaults_and_ignores_garbage() {
        let vars = |k: &str| match k {
            "FI_TCP_MAX_CONNS" => Some("12".to_string()),
            "FI_TCP_IDLE_TIMEOUT" => Some("0".to_string()),
            "FI_TCP_STALL_TIMEOUT" => Some("250".to_string()),
            "FI_TCP_MAX_PEER_BUFFERED" => Some("lots".to_string()),
            _ => None,
        };
        let l = ConnLimits::from_vars(vars);
        assert_eq!(l.max_conns, 12);
        assert_eq!(l.idle_timeout, None);
        assert_eq!(l.stall_timeout, Duration::from_millis(250));
        assert_eq!(l.peer_buffered, DEFAULT_PEER_BUFFERED);
        assert_eq!(l.handshake_timeout, DEFAULT_HANDSHAKE_TIMEOUT);
    }

    #[test]
    fn slots_stop_at_the_limit_and_come_back_on_drop() {
        let count = Arc::new(AtomicUsize::new(0));
        let a = ConnSlot::try_take(&count, 2).unwrap();
        let b = ConnSlot::try_take(&count, 2).unwrap();
        assert!(ConnSlot::try_take(&count, 2).is_none());
        // Counted beyond the limit, never refused.
        let c = ConnSlot::take(&count);
        assert_eq!(count.load(Ordering::Acquire), 3);
        drop((a, c));
        assert_eq!(count.load(Ordering::Acquire), 1);
        assert!(ConnSlot::try_take(&count, 2).is_some());
        drop(b);
        assert_eq!(count.load(Ordering::Acquire), 0);
    }

    #[test]
    fn sweep_interval_follows_the_shortest_timeout() {
        let l = ConnLimits::default().with_stall_timeout(Duration::from_millis(400));
        assert_eq!(l.sweep_interval(), Duration::from_millis(100));
        let l = ConnLimits::default()
            .with_idle_timeout(Some(Duration::from_millis(8)))
            .with_stall_timeout(Duration::from_secs(60));
        assert_eq!(l.sweep_interval(), Duration::from_millis(10));
        assert_eq!(
            ConnLimits::default().sweep_interval(),
            Duration::from_secs(1)
        );
    }
}
