use std::pin::pin;
use std::sync::atomic::AtomicUsize;
use std::sync::Barrier;
use std::task::{Context, Poll};

use futures::task::noop_waker;

use super::*;

fn ev(kind: AsyncEventKind, qp: u32) -> AsyncEvent {
    AsyncEvent {
        kind,
        qp_num: Some(qp),
        port: None,
    }
}

fn ready(f: std::pin::Pin<&mut LastWqe>) -> bool {
    let w = noop_waker();
    f.poll(&mut Context::from_waker(&w)) == Poll::Ready(())
}

#[test]
fn last_wqe_wakes_the_waiter_of_that_queue_pair_only() {
    let r = Router::new("test0");
    let mut a = pin!(r.last_wqe(7));
    let mut b = pin!(r.last_wqe(8));
    assert!(!ready(a.as_mut()));
    assert_eq!(
        r.route(&ev(AsyncEventKind::QpLastWqeReached, 8)),
        Routed::Woke
    );
    assert!(ready(b.as_mut()));
    assert!(!ready(a.as_mut()));
    // Another queue pair's, or another kind of event of this one: no.
    assert_eq!(
        r.route(&ev(AsyncEventKind::QpLastWqeReached, 9)),
        Routed::Logged
    );
    assert_eq!(r.route(&ev(AsyncEventKind::QpFatal, 7)), Routed::Logged);
    assert!(!ready(a.as_mut()));
    assert_eq!(
        r.route(&ev(AsyncEventKind::QpLastWqeReached, 7)),
        Routed::Woke
    );
    assert!(ready(a.as_mut()));
    assert_eq!(r.waiting(), 0);
}

#[test]
fn a_wait_dropped_is_withdrawn_and_a_later_one_for_the_number_stays() {
    let r = Router::new("test0");
    let old = r.last_wqe(5);
    assert_eq!(r.waiting(), 1);
    drop(old);
    assert_eq!(r.waiting(), 0);
    // The event after the wait was withdrawn reaches nobody.
    assert_eq!(
        r.route(&ev(AsyncEventKind::QpLastWqeReached, 5)),
        Routed::Logged
    );
    // A wait replaced by a newer one for the same number: dropping the
    // old one leaves the new one registered, and the event is the new
    // one's.
    let mut old = pin!(r.last_wqe(5));
    let mut new = pin!(r.last_wqe(5));
    assert!(!ready(old.as_mut()));
    assert_eq!(r.waiting(), 1);
    assert_eq!(
        r.route(&ev(AsyncEventKind::QpLastWqeReached, 5)),
        Routed::Woke
    );
    assert!(ready(new.as_mut()));
    assert!(!ready(old.as_mut()));
}

#[test]
fn a_replaced_wait_dropped_leaves_the_newer_one() {
    let r = Router::new("test0");
    let old = r.last_wqe(3);
    let mut new = pin!(r.last_wqe(3));
    drop(old);
    assert_eq!(r.waiting(), 1);
    assert_eq!(
        r.route(&ev(AsyncEventKind::QpLastWqeReached, 3)),
        Routed::Woke
    );
    assert!(ready(new.as_mut()));
}

#[test]
fn an_event_without_a_queue_pair_wakes_nobody() {
    let r = Router::new("test0");
    let mut a = pin!(r.last_wqe(1));
    let port = AsyncEvent {
        kind: AsyncEventKind::PortErr,
        qp_num: None,
        port: Some(1),
    };
    assert_eq!(r.route(&port), Routed::Logged);
    let odd = AsyncEvent {
        kind: AsyncEventKind::QpLastWqeReached,
        qp_num: None,
        port: None,
    };
    assert_eq!(r.route(&odd), Routed::Logged);
    assert!(!ready(a.as_mut()));
    assert_eq!(r.waiting(), 1);
}

#[test]
fn raw_event_types_map_to_kinds_and_elements() {
    assert_eq!(AsyncEventKind::from_raw(0), AsyncEventKind::CqErr);
    assert_eq!(AsyncEventKind::from_raw(1), AsyncEventKind::QpFatal);
    assert_eq!(
        AsyncEventKind::from_raw(16),
        AsyncEventKind::QpLastWqeReached
    );
    assert_eq!(AsyncEventKind::from_raw(19), AsyncEventKind::WqFatal);
    assert_eq!(AsyncEventKind::from_raw(20), AsyncEventKind::Other(20));
    assert_eq!(
        AsyncEventKind::from_raw(u32::MAX),
        AsyncEventKind::Other(u32::MAX)
    );
    assert_eq!(AsyncEventKind::QpLastWqeReached.element(), ElementKind::Qp);
    assert_eq!(AsyncEventKind::SrqLimitReached.element(), ElementKind::Srq);
    assert_eq!(AsyncEventKind::PortActive.element(), ElementKind::Port);
    assert_eq!(AsyncEventKind::DeviceFatal.element(), ElementKind::Device);
    assert_eq!(AsyncEventKind::CqErr.element(), ElementKind::Cq);
}

/// The positions are libibverbs' values, as its header (through
/// rdma-sys's bindings) has them.
#[cfg(feature = "rdma")]
#[test]
fn raw_values_are_the_headers() {
    use rdma_sys::ibv_event_type as T;
    for (raw, kind) in [
        (T::IBV_EVENT_CQ_ERR, AsyncEventKind::CqErr),
        (T::IBV_EVENT_QP_FATAL, AsyncEventKind::QpFatal),
        (T::IBV_EVENT_QP_ACCESS_ERR, AsyncEventKind::QpAccessErr),
        (T::IBV_EVENT_DEVICE_FATAL, AsyncEventKind::DeviceFatal),
        (T::IBV_EVENT_PORT_ERR, AsyncEventKind::PortErr),
        (
            T::IBV_EVENT_SRQ_LIMIT_REACHED,
            AsyncEventKind::SrqLimitReached,
        ),
        (
            T::IBV_EVENT_QP_LAST_WQE_REACHED,
            AsyncEventKind::QpLastWqeReached,
        ),
        (T::IBV_EVENT_GID_CHANGE, AsyncEventKind::GidChange),
        (T::IBV_EVENT_WQ_FATAL, AsyncEventKind::WqFatal),
    ] {
        assert_eq!(AsyncEventKind::from_raw(raw as u32), kind);
    }
}

/// The close of a queue pair whose connection had not ended registers
/// the wait; an end after it registers and moves nothing.
#[test]
fn a_close_first_owns_the_wait_and_a_later_end_does_nothing() {
    let r = Router::new("test0");
    let mut end = QpEnd::default();
    let c = end.close(|| Some(r.last_wqe(4))).expect("the first close");
    assert!(c.moved_at.is_none());
    let ended = end.end(
        || panic!("an end after the close registered a wait"),
        || panic!("an end after the close moved the queue pair"),
    );
    assert!(!ended);
    assert_eq!(r.waiting(), 1);
    let mut w = pin!(c.last_wqe.expect("registered"));
    assert_eq!(
        r.route(&ev(AsyncEventKind::QpLastWqeReached, 4)),
        Routed::Woke
    );
    assert!(ready(w.as_mut()));
    // A second close takes nothing and registers nothing.
    assert!(end
        .close(|| panic!("a second close registered a wait"))
        .is_none());
}

/// An end before the close registers the wait before its move, and the
/// close takes that wait and the time of the move: an event between the
/// two is not lost.
#[test]
fn an_end_first_hands_its_wait_and_move_time_to_the_close() {
    let r = Router::new("test0");
    let mut end = QpEnd::default();
    let moved = AtomicUsize::new(0);
    let before = Instant::now();
    assert!(end.end(
        || {
            assert_eq!(
                moved.load(Ordering::Relaxed),
                0,
                "registered after the move"
            );
            Some(r.last_wqe(9))
        },
        || {
            moved.fetch_add(1, Ordering::Relaxed);
        },
    ));
    // A second end (a critical error after the disconnect) changes nothing.
    assert!(!end.end(|| panic!("registered twice"), || panic!("moved twice")));
    assert_eq!(moved.load(Ordering::Relaxed), 1);
    // The event comes before the close.
    assert_eq!(
        r.route(&ev(AsyncEventKind::QpLastWqeReached, 9)),
        Routed::Woke
    );
    let c = end
        .close(|| panic!("the close registered over the end's wait"))
        .expect("the first close");
    assert!(c.moved_at.is_some_and(|at| at >= before));
    let mut w = pin!(c.last_wqe.expect("registered"));
    assert!(ready(w.as_mut()));
    assert_eq!(r.waiting(), 0);
}

/// Without an event reader neither registers a wait; the close still
/// learns when the end moved the queue pair.
#[test]
fn without_a_reader_the_close_still_gets_the_move_time() {
    let mut end = QpEnd::default();
    assert!(end.end(|| None, || {}));
    let c = end.close(|| None).expect("the first close");
    assert!(c.last_wqe.is_none() && c.moved_at.is_some());
}

/// An end racing the close under one lock (as `msg::closing` holds it):
/// whichever wins, one wait is registered, the close gets it, and the
/// event wakes it; the queue pair is moved by the end only if the end
/// came first. Registrations are counted, not read off the router: both
/// sides name the same queue pair, so a second registration would
/// replace the first there and still leave one waiting.
#[test]
fn an_end_racing_the_close_leaves_the_close_one_wait() {
    for round in 0..500u32 {
        let r = Arc::new(Router::new("test0"));
        let end = Arc::new(FastMutex::new(QpEnd::default()));
        let moved = Arc::new(AtomicUsize::new(0));
        let registered = Arc::new(AtomicUsize::new(0));
        let go = Arc::new(Barrier::new(2));
        let ender = std::thread::spawn({
            let (r, end, moved, registered, go) = (
                r.clone(),
                end.clone(),
                moved.clone(),
                registered.clone(),
                go.clone(),
            );
            move || {
                go.wait();
                lock(&end).end(
                    || {
                        registered.fetch_add(1, Ordering::Relaxed);
                        Some(r.last_wqe(round))
                    },
                    || {
                        moved.fetch_add(1, Ordering::Relaxed);
                    },
                )
            }
        });
        go.wait();
        let c = lock(&end)
            .close(|| {
                registered.fetch_add(1, Ordering::Relaxed);
                Some(r.last_wqe(round))
            })
            .expect("the first close");
        let ended = ender.join().expect("the end's thread");
        assert_eq!(
            registered.load(Ordering::Relaxed),
            1,
            "round {round}: one registration"
        );
        assert_eq!(r.waiting(), 1, "round {round}: one wait registered");
        assert_eq!(c.moved_at.is_some(), ended);
        assert_eq!(moved.load(Ordering::Relaxed), usize::from(ended));
        let mut w = pin!(c.last_wqe.expect("registered"));
        assert!(!ready(w.as_mut()));
        assert_eq!(
            r.route(&ev(AsyncEventKind::QpLastWqeReached, round)),
            Routed::Woke
        );
        assert!(
            ready(w.as_mut()),
            "round {round}: the close's wait was lost"
        );
    }
}

fn os(code: i32) -> FdFault {
    FdFault::Os(std::io::Error::from_raw_os_error(code))
}

// Linux's numbers (the crate runs on Linux only).
const EINTR: i32 = 4;
const EIO: i32 = 5;
const EBADF: i32 = 9;
const EAGAIN: i32 = 11;
const ENOMEM: i32 = 12;
const EFAULT: i32 = 14;
const EINVAL: i32 = 22;
const ENODEV: i32 = 19;

#[test]
fn transient_faults_are_shortages_and_interruptions_only() {
    for code in [ENOMEM, EAGAIN, EINTR] {
        assert!(os(code).is_transient(), "errno {code}");
    }
    for code in [EIO, EBADF, EFAULT, EINVAL, ENODEV, 0, 100_000] {
        assert!(!os(code).is_transient(), "errno {code}");
    }
    // POLLERR, POLLHUP, POLLNVAL.
    for revents in [0x8, 0x10, 0x20, 0x18] {
        assert!(!FdFault::Hangup(revents).is_transient());
    }
}

#[test]
fn backoff_doubles_to_its_cap_and_gives_up_after_its_retries() {
    let mut b = Backoff::default();
    let pauses: Vec<Duration> = std::iter::from_fn(|| b.after(&os(ENOMEM))).collect();
    assert_eq!(pauses.len(), Backoff::MAX_RETRIES as usize);
    assert_eq!(pauses[0], Backoff::FIRST);
    for w in pauses.windows(2) {
        assert_eq!(w[1], (w[0] * 2).min(Backoff::MAX_DELAY), "{pauses:?}");
    }
    assert_eq!(pauses.last(), Some(&Backoff::MAX_DELAY));
    // Seconds, not minutes, before a persisting shortage ends the reader.
    let total: Duration = pauses.iter().sum();
    assert!(
        total > Duration::from_secs(2) && total < Duration::from_secs(10),
        "{total:?}"
    );
    // Given up: it stays given up until a read succeeds.
    assert_eq!(b.after(&os(EAGAIN)), None);
    b.reset();
    assert_eq!(b.after(&os(ENOMEM)), Some(Backoff::FIRST));
    assert_eq!(b.after(&os(ENOMEM)), Some(Backoff::FIRST * 2));
}

#[test]
fn backoff_gives_up_at_once_on_a_permanent_fault() {
    let mut b = Backoff::default();
    assert_eq!(b.after(&os(EIO)), None);
    assert_eq!(b.after(&os(EBADF)), None);
    assert_eq!(b.after(&FdFault::Hangup(0x10)), None);
    // Nor does a permanent fault in the middle of transient ones wait.
    assert_eq!(b.after(&os(ENOMEM)), Some(Backoff::FIRST));
    assert_eq!(b.after(&os(EIO)), None);
}

/// A connect or accept that failed gives its queue pair up: the wait is
/// registered before the move, the bound counts from the move, and the
/// state stays `Live` for the next connection's queue pair (whose close
/// must register its own wait, not find this one's).
#[test]
fn abandon_of_a_live_queue_pair_registers_then_moves_and_stays_live() {
    let r = Router::new("test0");
    let mut end = QpEnd::default();
    let moved = AtomicUsize::new(0);
    let before = Instant::now();
    let c = end.abandon(
        || {
            assert_eq!(
                moved.load(Ordering::Relaxed),
                0,
                "registered after the move"
            );
            Some(r.last_wqe(7))
        },
        || {
            moved.fetch_add(1, Ordering::Relaxed);
        },
    );
    assert_eq!(moved.load(Ordering::Relaxed), 1);
    assert!(c.moved_at.is_some_and(|at| at >= before));
    assert!(matches!(end, QpEnd::Live));
    let mut w = pin!(c.last_wqe.expect("registered"));
    assert_eq!(
        r.route(&ev(AsyncEventKind::QpLastWqeReached, 7)),
        Routed::Woke
    );
    assert!(ready(w.as_mut()));
    // The next queue pair's close registers its own.
    let next = end.close(|| Some(r.last_wqe(8))).expect("the first close");
    assert!(next.moved_at.is_none() && next.last_wqe.is_some());
}

/// A queue pair whose connection ended before the failure was reported
/// keeps the end's wait and time; nothing registers or moves twice.
#[test]
fn abandon_after_an_end_takes_its_wait_and_resets() {
    let r = Router::new("test0");
    let mut end = QpEnd::default();
    assert!(end.end(|| Some(r.last_wqe(3)), || {}));
    let c = end.abandon(
        || panic!("registered over the end's wait"),
        || panic!("moved twice"),
    );
    assert!(c.moved_at.is_some() && c.last_wqe.is_some());
    assert!(matches!(end, QpEnd::Live));
    assert_eq!(r.waiting(), 1);
}

/// A close that came after the failure took the link found no queue
/// pair and registered nothing: the failure still registers and moves
/// the one it owns, and the endpoint stays closed.
#[test]
fn abandon_after_a_close_without_a_queue_pair_still_hands_off() {
    let r = Router::new("test0");
    let mut end = QpEnd::default();
    let closing = end.close(|| None).expect("the first close");
    assert!(closing.last_wqe.is_none());
    let moved = AtomicUsize::new(0);
    let c = end.abandon(
        || Some(r.last_wqe(5)),
        || {
            moved.fetch_add(1, Ordering::Relaxed);
        },
    );
    assert_eq!(moved.load(Ordering::Relaxed), 1);
    assert!(c.last_wqe.is_some() && c.moved_at.is_some());
    assert!(matches!(end, QpEnd::Closed));
    assert!(!end.end(|| panic!("registered"), || panic!("moved")));
}
