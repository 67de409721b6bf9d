//! Small policies that every application of the post API ends up writing
//! for itself: posting into a queue that may be full, reading a
//! completion queue by polling without starving the threads that fill
//! it, saying why `getinfo` found nothing, and honouring libfabric's
//! `FI_LOG_LEVEL`. The `weft` command uses each of them.

use std::fmt;
use std::time::Instant;

use weft_core::progress::requeue;

use crate::{Caps, CompletionQueue, CqItem, EpType, Error, Info, Result};

/// Calls `post` until the provider takes the operation. `Again` is a
/// full transmit or receive queue, which only progress on this thread can
/// drain: the task yields to the runtime (which completes operations and
/// so makes room) and tries again. Any other outcome is returned.
///
/// On a latency path, try `post` once yourself and come here only on
/// `Again`: the queue almost always has room, and building this future
/// costs a few tens of instructions a message.
pub async fn post_when_room<T>(mut post: impl FnMut() -> Result<T>) -> Result<T> {
    loop {
        match post() {
            Err(Error::Again) => tokio::task::yield_now().await,
            r => return r,
        }
    }
}

/// [`post_when_room`] for the posts that hand their request back when
/// refused ([`Endpoint::post_recvmsg`] gives back the buffers,
/// [`Endpoint::post_rmamsg`] the operation): `post` is given `req` again
/// after each `Again`, and the last refusal keeps what it gave back.
///
/// [`Endpoint::post_recvmsg`]: crate::Endpoint::post_recvmsg
/// [`Endpoint::post_rmamsg`]: crate::Endpoint::post_rmamsg
pub async fn post_when_room_with<R>(
    mut req: R,
    mut post: impl FnMut(R) -> std::result::Result<(), (Error, R)>,
) -> std::result::Result<(), (Error, R)> {
    loop {
        match post(req) {
            Err((Error::Again, back)) => {
                req = back;
                tokio::task::yield_now().await;
            }
            r => return r,
        }
    }
}

/// How a task that polls a completion queue instead of sleeping on it
/// shares its thread. The provider's progress thread, and in a
/// single-machine run the peer's, may need the very core the poller is
/// on: a poller that never gives it away starves the thread that would
/// fill its queue (on 2 cores about 8 ms per message instead of
/// microseconds). So every [`SpinPolicy::YIELD_EVERY`]th empty poll the
/// thread itself is yielded, which is also when a deadline is worth
/// looking at (reading the clock on every poll would cost more than the
/// poll).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpinPolicy {
    empty: u32,
}

impl SpinPolicy {
    /// Empty polls between two yields of the thread.
    pub const YIELD_EVERY: u32 = 64;

    /// Counts one poll that found nothing; `true` when the thread should
    /// now be yielded (and any deadline checked).
    pub fn empty_poll(&mut self) -> bool {
        self.empty_polls(1)
    }

    /// [`empty_poll`](Self::empty_poll) of `n` polls at once: `true` when
    /// one of them was a multiple of [`YIELD_EVERY`](Self::YIELD_EVERY).
    fn empty_polls(&mut self, n: u32) -> bool {
        let before = self.empty;
        self.empty = self.empty.wrapping_add(n);
        before % Self::YIELD_EVERY + n >= Self::YIELD_EVERY
    }
}

/// Reads at least one item (at most `max`) from `cq` into `out` by
/// polling it, never sleeping, on the schedule of [`SpinPolicy`]; between
/// polls the task yields to the runtime, whose other tasks may be what
/// completes the operation. `None` when `deadline` passes with nothing
/// read; without a deadline it polls until something arrives.
pub async fn read_batch_spinning(
    cq: &CompletionQueue,
    out: &mut Vec<CqItem>,
    max: usize,
    deadline: Option<Instant>,
) -> Option<usize> {
    let mut spin = SpinPolicy::default();
    // A few polls before going back to the runtime: each return re-polls
    // every future this one is nested in, which cost more than a poll of
    // the queue (`weft_core::progress::PASSES_PER_POLL`). The queue makes
    // them itself, with the endpoint's hook looked up once for all.
    const POLLS: u32 = weft_core::progress::PASSES_PER_POLL;
    const _: () = assert!(SpinPolicy::YIELD_EVERY % POLLS == 0);
    loop {
        let n = cq.shared.pop_batch_passes(out, max, POLLS);
        if n > 0 {
            return Some(n);
        }
        // The yield falls after the same empty polls as when they were
        // counted one by one (every `YIELD_EVERY`th is a batch's last).
        if spin.empty_polls(POLLS) {
            std::thread::yield_now();
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return None;
            }
        }
        requeue().await;
    }
}

/// The endpoint types `prov` offers here (on `domain`, when given) with
/// at least `caps`, in offer order, each once: what a refused `-e` could
/// have been instead.
pub fn ep_types_offered(prov: &str, domain: Option<&str>, caps: Caps) -> Vec<EpType> {
    let mut v: Vec<EpType> = Vec::new();
    for i in crate::all_offers() {
        if i.fabric_attr.prov_name.as_deref() != Some(prov)
            || domain.is_some_and(|d| i.domain_attr.name.as_deref() != Some(d))
            || !i.caps.contains(caps)
        {
            continue;
        }
        if !v.contains(&i.ep_attr.ep_type) {
            v.push(i.ep_attr.ep_type);
        }
    }
    v
}

/// What the offers here say about hints that [`getinfo`](crate::getinfo)
/// matched with nothing: `NoData` alone does not tell a user whether the
/// provider is missing, filtered out by `FI_PROVIDER`, or there but
/// without the endpoint type asked for. See [`explain_no_match`]; its
/// `Display` is one line for an error message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoMatch {
    /// The provider the hints named, if any.
    pub provider: Option<String>,
    /// Providers with any offer here, in offer order, after `FI_PROVIDER`.
    pub offering: Vec<String>,
    /// `FI_PROVIDER` as set, since it hides providers that exist.
    pub fi_provider: Option<String>,
    /// The endpoint types the named provider offers (on the named
    /// domain, if any), whatever the other hints; empty without a named
    /// provider.
    pub ep_types: Vec<EpType>,
    /// The named provider's own reason for offering nothing here (no
    /// device, not compiled in).
    pub unavailable: Option<String>,
}

/// Explains why `hints` matched no offer; see [`NoMatch`].
pub fn explain_no_match(hints: &Info) -> NoMatch {
    let mut offering: Vec<String> = Vec::new();
    for i in crate::all_offers() {
        let n = i.fabric_attr.prov_name.unwrap_or_default();
        if !offering.contains(&n) {
            offering.push(n);
        }
    }
    let provider = hints.fabric_attr.prov_name.clone();
    let ep_types = provider.as_deref().map_or_else(Vec::new, |p| {
        ep_types_offered(p, hints.domain_attr.name.as_deref(), Caps::empty())
    });
    let unavailable = provider.as_deref().and_then(crate::provider_unavailable);
    NoMatch {
        provider,
        offering,
        fi_provider: std::env::var("FI_PROVIDER").ok(),
        ep_types,
        unavailable,
    }
}

impl fmt::Display for NoMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let offering = if self.offering.is_empty() {
            "none".to_string()
        } else {
            self.offering.join(", ")
        };
        write!(f, "no offer matches (providers offering: {offering}")?;
        if let Some(fp) = &self.fi_provider {
            write!(f, "; FI_PROVIDER={fp}")?;
        }
        f.write_str(")")?;
        if let Some(p) = &self.provider {
            if !self.ep_types.is_empty() {
                let types: Vec<&str> = self.ep_types.iter().map(|t| t.fi_name()).collect();
                write!(f, "; {p} offers {} only", types.join(", "))?;
            }
            if let Some(why) = &self.unavailable {
                write!(f, "; {p}: {why}")?;
            }
        }
        Ok(())
    }
}

/// The crates whose diagnostics [`fi_log_directives`] turns on.
pub const LOG_TARGETS: &[&str] = &["weft", "weft_core", "weft_tcp", "weft_verbs"];

/// A `tracing` filter (in `RUST_LOG` / `EnvFilter` syntax) for libfabric's
/// `FI_LOG_LEVEL` value, so that someone who sets what they would set for
/// libfabric gets Weft's diagnostics: `warn`, `info`, `debug` and `trace`
/// (any case) become the `tracing` level of the same name for
/// [`LOG_TARGETS`], and anything else is `None`, as libfabric ignores it.
///
/// By name, not by rank: libfabric ranks `trace` (function-call tracing)
/// between `warn` and `info`, but Weft's `trace` events are its most
/// detailed, and a user reading `TRACE` lines expects to have asked for
/// `trace`.
pub fn fi_log_directives(value: &str) -> Option<String> {
    let level = match value.trim().to_ascii_lowercase().as_str() {
        "warn" => "warn",
        "info" => "info",
        "debug" => "debug",
        "trace" => "trace",
        _ => return None,
    };
    let d: Vec<String> = LOG_TARGETS.iter().map(|t| format!("{t}={level}")).collect();
    Some(d.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spin_yields_every_64th_empty_poll() {
        let mut s = SpinPolicy::default();
        let yields: Vec<u32> = (1..=200).filter(|_| s.empty_poll()).collect();
        assert_eq!(yields.len(), 3);
        let mut s = SpinPolicy::default();
        for _ in 1..SpinPolicy::YIELD_EVERY {
            assert!(!s.empty_poll());
        }
        assert!(s.empty_poll());
        // The count wraps rather than overflowing on a long spin.
        let mut s = SpinPolicy { empty: u32::MAX };
        assert!(s.empty_poll());
        // Counted sixteen at a time (`read_batch_spinning`), the yields
        // fall on the same polls.
        let mut one = SpinPolicy::default();
        let mut many = SpinPolicy::default();
        for _ in 0..40 {
            let mut any = false;
            for _ in 0..16 {
                any |= one.empty_poll();
            }
            assert_eq!(many.empty_polls(16), any);
        }
        let mut s = SpinPolicy {
            empty: u32::MAX - 15,
        };
        assert!(s.empty_polls(16), "a wrap is a multiple");
    }

    #[test]
    fn fi_log_level_maps_by_name() {
        assert_eq!(
            fi_log_directives("debug").as_deref(),
            Some("weft=debug,weft_core=debug,weft_tcp=debug,weft_verbs=debug")
        );
        assert_eq!(
            fi_log_directives(" WARN").as_deref(),
            Some("weft=warn,weft_core=warn,weft_tcp=warn,weft_verbs=warn")
        );
        assert!(fi_log_directives("trace").is_some_and(|d| d.contains("weft_tcp=trace")));
        assert!(fi_log_directives("info").is_some_and(|d| d.starts_with("weft=info,")));
        for bad in ["", "verbose", "3", "warning"] {
            assert_eq!(fi_log_directives(bad), None, "{bad}");
        }
    }

    /// Nothing here sets `FI_PROVIDER`; a run with it set to hide tcp
    /// has nothing to check.
    fn tcp_offered() -> bool {
        crate::all_offers()
            .iter()
            .any(|i| i.fabric_attr.prov_name.as_deref() == Some("tcp"))
    }

    #[test]
    fn no_match_names_what_is_offered() {
        if !tcp_offered() {
            return;
        }
        let types = ep_types_offered("tcp", None, Caps::empty());
        assert!(types.contains(&EpType::Rdm) && types.contains(&EpType::Msg));
        assert!(ep_types_offered("tcp", Some("no-such-domain"), Caps::empty()).is_empty());
        assert!(ep_types_offered("nope", None, Caps::empty()).is_empty());

        let mut hints = Info::default();
        hints.fabric_attr.prov_name = Some("tcp".into());
        hints.ep_attr.ep_type = EpType::Dgram;
        let m = explain_no_match(&hints);
        assert_eq!(m.provider.as_deref(), Some("tcp"));
        assert!(m.offering.iter().any(|p| p == "tcp"));
        assert_eq!(m.ep_types, types);
        assert_eq!(m.unavailable, None);
        let s = m.to_string();
        assert!(
            s.starts_with("no offer matches (providers offering: tcp"),
            "{s}"
        );
        assert!(s.contains("; tcp offers FI_EP_"), "{s}");

        hints.fabric_attr.prov_name = Some("nope".into());
        let m = explain_no_match(&hints);
        assert!(m.ep_types.is_empty());
        assert!(!m.to_string().contains("nope offers"));
    }

    #[tokio::test]
    async fn a_requeued_spinner_lets_tasks_and_io_progress() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        // A task woken by the reactor (a datagram arriving) runs while
        // this one spins on the same single-threaded runtime: the driver
        // is still polled, just not after every requeue.
        let rx = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let to = rx.local_addr().unwrap();
        let got = Arc::new(AtomicBool::new(false));
        let g = got.clone();
        tokio::spawn(async move {
            let mut b = [0u8; 8];
            rx.recv(&mut b).await.unwrap();
            g.store(true, Ordering::Release);
        });
        // The spinner is a task of its own, as `weft pingpong`'s is (the
        // `block_on` future itself is polled after a driver poll anyway).
        let spinner = tokio::spawn(async move {
            requeue().await;
            let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            tx.send_to(b"x", to).unwrap();
            let start = Instant::now();
            let mut spins = 0u64;
            while !got.load(Ordering::Acquire) {
                assert!(
                    start.elapsed() < std::time::Duration::from_secs(10),
                    "the reader never ran"
                );
                requeue().await;
                spins += 1;
            }
            spins
        });
        assert!(spinner.await.unwrap() > 0, "the spinner did spin");
    }
}
