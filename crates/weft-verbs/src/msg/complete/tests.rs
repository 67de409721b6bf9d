use std::collections::VecDeque;

use bytes::BytesMut;
use futures::channel::oneshot;
use weft_core::completion::Finished;
use weft_core::credits::Credits;

use super::recv_mem::*;
use super::recv_side::*;
use super::rx_queue::*;
use super::*;

/// Work request memory that is only a shape.
struct Fake(Vec<usize>);

impl Shape for Fake {
    fn shape(&self) -> Vec<usize> {
        self.0.clone()
    }
}

/// A receive's completion that a future awaits, and that future's end.
pub(in crate::msg) fn awaited(context: u64) -> (OpDone, oneshot::Receiver<Finished>) {
    let (tx, rx) = oneshot::channel();
    let done = OpDone {
        context,
        flags: OpFlags::RECV | OpFlags::MSG,
        report: true,
        cq: None,
        cntr: None,
        waiter: Some(tx),
    };
    (done, rx)
}

pub(in crate::msg) fn message(n: u64) -> Arrived {
    Arrived {
        body: Body::Data {
            bufs: vec![BytesMut::from(&n.to_le_bytes()[..])],
            len: 8,
        },
        imm: None,
        route: Route::default(),
    }
}

/// A receive the device failed (`err`), held as an arrival.
pub(in crate::msg) fn failed_arrival(err: Error) -> Arrived {
    Arrived {
        body: Body::Failed(err),
        imm: None,
        route: Route::default(),
    }
}

/// A write with remote CQ data that consumed a receive, held.
pub(in crate::msg) fn remote_write_arrival(len: usize) -> Arrived {
    Arrived {
        body: Body::RemoteWrite { len },
        imm: Some(7),
        route: Route::default(),
    }
}

pub(in crate::msg) fn number_of(done: Finished) -> u64 {
    let e = done.into_result(0).expect("a message");
    let b = e.into_bytes();
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

#[test]
fn copy_into_spans_buffers_and_stops_when_full() {
    let src = [BytesMut::from(&b"abc"[..]), BytesMut::from(&b"defg"[..])];
    let mut dst = vec![
        BytesMut::zeroed(2),
        BytesMut::zeroed(0),
        BytesMut::zeroed(4),
    ];
    assert_eq!(copy_into(&src, &mut dst), 6);
    assert_eq!((&dst[0][..], &dst[2][..]), (&b"ab"[..], &b"cdef"[..]));
}

#[test]
fn a_copy_longer_than_the_receive_is_truncation_with_olen() {
    let (done, mut rx) = awaited(7);
    let w = Waiting::new(1, done, Some(vec![BytesMut::zeroed(3)]));
    assert!(deliver(w, message(0x0807_0605_0403_0201)).is_none());
    let e = rx.try_recv().unwrap().unwrap().into_result(7).unwrap_err();
    assert_eq!((e.err, e.len, e.olen, e.context), (Error::Trunc, 3, 5, 7));
    assert_eq!(&e.bufs[0][..], &[1, 2, 3]);
}

#[test]
fn a_completion_for_a_dropped_future_comes_back() {
    let (done, rx) = awaited(3);
    drop(rx);
    let w = Waiting::new(1, done, Some(vec![BytesMut::zeroed(8)]));
    let back = deliver(w, message(42)).expect("the message comes back");
    assert!(matches!(back.body, Body::Data { len: 8, .. }));
}

#[test]
fn a_withdrawn_receives_message_goes_to_the_next_then_is_held() {
    let credits = Credits::new(4);
    let mut q: RxQueue<Fake> = RxQueue::default();
    let (d1, _r1) = awaited(1);
    let (d2, mut r2) = awaited(2);
    for (id, d) in [(10, d1), (11, d2)] {
        assert!(credits.try_take() && q.needs_wr());
        // Registered receives: their buffers are the device's.
        q.push(id, d, None, Some(Fake(vec![8])));
    }
    let w = q.cancel(1, &credits).expect("receive 1 waits");
    assert!(w.bufs.unwrap().is_empty(), "an awaited receive needs none");
    assert_eq!(credits.left(), 3);
    // Its work request catches the next message, which goes to
    // receive 2 in the memory it landed in.
    let (_, own) = q.landed(10, &credits).unwrap();
    assert!(own.is_none());
    let (w, a) = q.route(message(100), false, &credits).unwrap();
    assert_eq!(w.bufs.as_ref().map(|b| b[0].len()), Some(8));
    credits.release(1);
    assert!(deliver(w, a).is_none());
    assert_eq!(number_of(r2.try_recv().unwrap().unwrap()), 100);
    // Receive 2's own request then catches a message nobody waits for.
    let (_, own) = q.landed(11, &credits).unwrap();
    assert!(own.is_none());
    assert!(q.route(message(101), false, &credits).is_none());
    assert_eq!(credits.left(), 4);
    assert!(q.take_held().is_some() && q.take_held().is_none());
}

#[test]
fn a_spare_work_request_is_reused_by_the_next_receive() {
    let credits = Credits::new(2);
    let mut q: RxQueue<Fake> = RxQueue::default();
    let (d1, r1) = awaited(1);
    assert!(credits.try_take());
    q.push(
        10,
        d1,
        Some(vec![BytesMut::zeroed(8)]),
        Some(Fake(Vec::new())),
    );
    drop(r1);
    assert_eq!(q.sweep(&credits), 1);
    assert_eq!(credits.left(), 2);
    assert!(!q.needs_wr(), "request 10 is spare");
    let (d2, _r2) = awaited(2);
    q.push(11, d2, Some(vec![BytesMut::zeroed(8)]), None);
    assert!(q.needs_wr());
    // A flush of the spare request ends the receive that relied on it.
    let (_, own) = q.landed(10, &credits).unwrap();
    assert!(own.is_none());
    assert_eq!(q.take_wrless(&credits).map(|w| w.done.context), Some(2));
    assert!(q.take_wrless(&credits).is_none());
}

/// A queue pair in miniature: receives posted, cancelled and dropped
/// at random while messages land in work requests in post order;
/// every message reaches exactly one receive that is still awaited,
/// in order, and none is left over.
#[test]
fn random_withdrawals_lose_nothing_and_keep_order() {
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut rnd = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let credits = Credits::new(16);
    let mut q: RxQueue<Fake> = RxQueue::default();
    let mut posted_wrs = VecDeque::new();
    let mut live: Vec<(u64, oneshot::Receiver<Finished>)> = Vec::new();
    let mut got = Vec::new();
    let (mut next_id, mut next_msg) = (1u64, 0u64);
    let mut by_receive = Vec::new();
    let mut collect = |live: &mut Vec<(u64, oneshot::Receiver<Finished>)>, got: &mut Vec<u64>| {
        live.retain_mut(|(id, rx)| match rx.try_recv() {
            Ok(Some(item)) => {
                let n = number_of(item);
                got.push(n);
                by_receive.push((*id, n));
                false
            }
            _ => true,
        });
    };
    let hand = |q: &mut RxQueue<Fake>, mut a: Arrived, mut first: bool| {
        while let Some((w, m)) = q.route(a, first, &credits) {
            credits.release(1);
            match deliver(w, m) {
                Some(back) => (a, first) = (back, true),
                None => return,
            }
        }
    };
    for step in 0..20_000 {
        match rnd(10) {
            0..=3 if credits.try_take() => {
                let id = next_id;
                next_id += 1;
                let (done, rx) = awaited(id);
                live.push((id, rx));
                let registered = rnd(2) == 0;
                if let Some(a) = q.take_held() {
                    credits.release(1);
                    let w = Waiting::new(id, done, Some(vec![BytesMut::zeroed(8)]));
                    if let Some(back) = deliver(w, a) {
                        hand(&mut q, back, true);
                    }
                } else if !q.needs_wr() {
                    q.push(id, done, Some(vec![BytesMut::zeroed(8)]), None);
                } else if registered {
                    q.push(id, done, None, Some(Fake(vec![8])));
                    posted_wrs.push_back(id);
                } else {
                    let bufs = Some(vec![BytesMut::zeroed(8)]);
                    q.push(id, done, bufs, Some(Fake(Vec::new())));
                    posted_wrs.push_back(id);
                }
            }
            4 if !live.is_empty() => {
                let (id, _) = live.swap_remove(rnd(live.len() as u64) as usize);
                if let Some(w) = q.cancel(id, &credits) {
                    drop(w);
                }
            }
            5 if !live.is_empty() => {
                // A future dropped without a cancel (a shared
                // context's), noticed later.
                drop(live.swap_remove(rnd(live.len() as u64) as usize));
            }
            6 if step % 50 == 0 => {
                q.sweep(&credits);
            }
            _ => {
                let Some(id) = posted_wrs.pop_front() else {
                    continue;
                };
                let (_, own) = q.landed(id, &credits).unwrap();
                let msg = message(next_msg);
                next_msg += 1;
                match own {
                    Some(w) => {
                        credits.release(1);
                        let w = Waiting {
                            bufs: w.bufs.or(Some(like(&[8]))),
                            ..w
                        };
                        if let Some(back) = deliver(w, msg) {
                            hand(&mut q, back, true);
                        }
                    }
                    None => hand(&mut q, msg, false),
                }
            }
        }
        collect(&mut live, &mut got);
        assert!(
            q.wrs.len() <= 16,
            "the device never holds more than the size"
        );
        assert!(q.held.is_empty() || q.waiting.is_empty());
    }
    // Whatever is held or still to land is taken by new receives.
    while let Some(id) = posted_wrs.pop_front() {
        let (_, own) = q.landed(id, &credits).unwrap();
        let msg = message(next_msg);
        next_msg += 1;
        match own {
            Some(w) => {
                credits.release(1);
                let w = Waiting {
                    bufs: w.bufs.or(Some(like(&[8]))),
                    ..w
                };
                assert!(deliver(w, msg).is_none());
            }
            None => hand(&mut q, msg, false),
        }
    }
    collect(&mut live, &mut got);
    while let Some(a) = q.take_held() {
        let (done, mut rx) = awaited(0);
        assert!(deliver(Waiting::new(0, done, Some(like(&[8]))), a).is_none());
        got.push(number_of(rx.try_recv().unwrap().unwrap()));
    }
    by_receive.sort_unstable();
    assert!(
        by_receive.windows(2).all(|p| p[0].1 < p[1].1),
        "receives take messages in the order they were posted"
    );
    let want: Vec<u64> = (0..next_msg).collect();
    assert!(next_msg > 1000, "the run delivered {next_msg} messages");
    assert_eq!(got, want, "every message once, in order");
    assert_eq!(
        credits.left() + q.waiting(),
        16,
        "credits match waiting receives"
    );
}

/// The fast path of a completion takes only the oldest receive's own
/// work request while that receive is awaited; everything else is left
/// as it was, for `landed`.
#[test]
fn the_own_front_path_takes_only_the_usual_case() {
    let credits = Credits::new(4);
    let mut q: RxQueue<Fake> = RxQueue::default();
    let pick = |m: &Fake| m.0.first().copied();
    let (d1, _r1) = awaited(1);
    let (d2, r2) = awaited(2);
    let (d3, _r3) = awaited(3);
    for (id, d) in [(10, d1), (11, d2), (12, d3)] {
        assert!(credits.try_take());
        q.push(id, d, Some(vec![BytesMut::zeroed(8)]), Some(Fake(vec![8])));
    }
    assert!(q.take_own_front(11, pick).is_none(), "not the oldest");
    let (n, done, bufs) = q.take_own_front(10, pick).expect("the usual case");
    assert_eq!((n, done.context, bufs.map(|b| b.len())), (8, 1, Some(1)));
    assert_eq!(q.waiting(), 2);
    // A receive whose future is gone is left to `landed`, which gives
    // its credit back and its message to the next receive.
    drop(r2);
    assert!(q.take_own_front(11, pick).is_none(), "gone");
    assert_eq!(q.waiting(), 2, "untouched");
    let (_, own) = q.landed(11, &credits).unwrap();
    assert!(own.is_none());
    assert_eq!(credits.left(), 2);
    // Memory `pick` refuses (registered, not a slot) is left too.
    assert!(q.take_own_front(12, |_| None::<usize>).is_none());
    assert!(q.landed(12, &credits).unwrap().1.is_some());
}
