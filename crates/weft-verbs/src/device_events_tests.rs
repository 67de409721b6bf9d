use std::pin::pin;
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
