//! Multi-receive buffers placed by `soft_rx` (udp and shm): a post takes
//! the held messages that fit, an arrival the part cut for it, and a
//! buffer that ends is reported once the lock is let go.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use crate::completion::{CqFormat, CqShared, WaitMode};
use crate::credits::Credits;
use crate::multi_recv::tests::{buffer, items, msg, Ep};
use crate::recv_completion::copy_and_deliver;

type M = FastMutex<Matcher<RecvReq, Vec<u8>, ()>>;

fn post(ep: &Ep, m: &M, req: RecvReq) {
    let r = post_recv(ep, m, req, 4, &|_: &()| 0, &|req, info, held: Vec<u8>| {
        copy_and_deliver(ep, req, info, &held)
    });
    assert!(r.is_ok());
}

#[test]
fn a_posted_buffer_takes_the_held_messages_that_fit_in_order() {
    let cq = CqShared::new(1, CqFormat::Tagged, WaitMode::Interrupt, 8);
    let ep = Ep(Credits::new(4));
    let m: M = FastMutex::new(Matcher::new());
    for (i, len) in [40usize, 50, 30].into_iter().enumerate() {
        lock(&m).push_unexpected((), msg(len), vec![i as u8 + 1; len]);
    }
    let b = buffer(&cq, 100, 30);
    let base = b.bufs[0].as_ptr() as usize;
    post(&ep, &m, b);
    // 40 and 50 fit; 10 bytes are left, below the minimum: released by
    // the second completion. The third message stays held.
    let got = items(&cq);
    assert_eq!(got.len(), 2);
    for (i, it) in got.into_iter().enumerate() {
        let e = it.expect("completions");
        assert_eq!(e.context, 9);
        assert_eq!(e.flags.contains(OpFlags::MULTI_RECV), i == 1, "entry {i}");
        let off = e.bufs[0].as_ptr() as usize - base;
        assert_eq!((off, e.len), [(0, 40), (40, 50)][i]);
        assert!(e.bufs[0][..e.len].iter().all(|&x| x == i as u8 + 1));
    }
    assert_eq!(ep.0.left(), 4, "the credit is back");
    assert_eq!(lock(&m).posted_len(), 0);
    let (got, ended) = arrival(&mut lock(&m), &msg(10));
    assert!(got.is_none());
    ended.report(&ep);
}

#[test]
fn an_arrival_that_does_not_fit_ends_the_buffer_and_goes_on() {
    let cq = CqShared::new(1, CqFormat::Tagged, WaitMode::Interrupt, 8);
    let ep = Ep(Credits::new(4));
    let m: M = FastMutex::new(Matcher::new());
    post(&ep, &m, buffer(&cq, 100, 10));
    assert_eq!(ep.0.left(), 3);
    let (part, ended) = arrival(&mut lock(&m), &msg(60));
    ended.report(&ep);
    let part = part.expect("a part of the buffer");
    assert!(multi_recv::is_piece(&part));
    assert_eq!(part.capacity(), 60);
    // The buffer stays posted with 40 bytes; 50 does not fit: the
    // buffer ends, the message goes on (nothing else is posted).
    let (got, ended) = arrival(&mut lock(&m), &msg(50));
    assert!(got.is_none());
    assert_eq!(lock(&m).posted_len(), 0);
    ended.report(&ep);
    // The first part is still arriving: the release waits for it.
    assert!(items(&cq).is_empty());
    assert_eq!(ep.0.left(), 3);
    copy_and_deliver(&ep, part, msg(60), &[5; 60]);
    let got = items(&cq);
    assert_eq!(got.len(), 1);
    let e = got.into_iter().next().unwrap().expect("a completion");
    assert!(e.flags.contains(OpFlags::MULTI_RECV));
    assert_eq!(e.len, 60);
    assert_eq!(ep.0.left(), 4);
}

#[test]
fn a_plain_receive_still_takes_one_message_whole() {
    let cq = CqShared::new(1, CqFormat::Tagged, WaitMode::Interrupt, 8);
    let ep = Ep(Credits::new(4));
    let m: M = FastMutex::new(Matcher::new());
    let mut req = buffer(&cq, 100, 10);
    req.multi = None;
    req.flags = OpFlags::empty();
    post(&ep, &m, req);
    let (got, ended) = arrival(&mut lock(&m), &msg(30));
    ended.report(&ep);
    let got = got.expect("the receive");
    assert!(!multi_recv::is_piece(&got));
    assert_eq!(got.capacity(), 100);
    assert_eq!(lock(&m).posted_len(), 0);
    copy_and_deliver(&ep, got, msg(30), &[1; 30]);
    let e = items(&cq)
        .into_iter()
        .next()
        .unwrap()
        .expect("a completion");
    assert!(!e.flags.contains(OpFlags::MULTI_RECV));
    assert_eq!(ep.0.left(), 4);
}
