//! tcp acknowledgements wait for a frame to ride with (an RMA write's
//! `Ack`, a delivery-complete send's): the target's next frame to the
//! peer carries them in the same `writev`. These tests make sure one that
//! finds no frame still leaves, in every wait mode: the target takes its
//! completion and then stops polling altogether, and the initiator's
//! operation must still complete (the reader task, the busy-poll thread
//! or the inline ack timer sends it), each one, in order of need.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bytes::{Bytes, BytesMut};
use weft::{EpType, MrAccess, MrAttr, OpFlags, SendMsg, WaitMode};
use weft_integration::{next_cq, payload, within, Node, Provider};

const MODES: [WaitMode; 3] = [WaitMode::Inline, WaitMode::BusyPoll, WaitMode::Interrupt];

fn pair(mode: WaitMode) -> (Node, Node) {
    let info = Provider::named("tcp").info(EpType::Rdm);
    (Node::open(&info, mode), Node::open(&info, mode))
}

/// Writes with remote data, each awaited while the target takes only its
/// target completion: the write completes once the target's `Ack`
/// arrives, which no frame of the target carries.
async fn writes_complete_when_the_target_stops_polling(mode: WaitMode) {
    let (a, b) = pair(mode);
    let to_b = a.handle_of(&b);
    let mr = b
        .domain
        .mr_regattr(
            MrAttr::alloc(64, MrAccess::REMOTE_WRITE | MrAccess::REMOTE_READ).requested_key(5),
        )
        .unwrap();
    for i in 0..40u8 {
        let data = payload(8, i);
        let write =
            a.ep.writedata(to_b, data.clone(), u64::from(i), 8, mr.key());
        let target = next_cq(&b.cq);
        let what = format!("{mode:?} write {i}");
        let (w, t) = tokio::join!(within(&what, write), target);
        w.unwrap();
        let t = t.unwrap();
        assert!(t.flags.contains(OpFlags::REMOTE_CQ_DATA), "{mode:?}");
        assert_eq!(t.data, u64::from(i), "{mode:?}");
        assert_eq!(&mr.to_vec().unwrap()[8..16], &data[..], "{mode:?}");
    }
}

/// Delivery-complete sends, each received and then left alone: the send
/// completes on the receiver's `Ack`.
async fn delivery_complete_sends_complete_when_the_receiver_stops(mode: WaitMode) {
    let (a, b) = pair(mode);
    let to_b = a.handle_of(&b);
    for i in 0..40u8 {
        let msg = SendMsg {
            dest: to_b,
            iov: vec![Bytes::from(vec![i; 32])],
            ..SendMsg::default()
        };
        let send = a.ep.sendmsg(msg, OpFlags::DELIVERY_COMPLETE);
        let recv = b.ep.recv(BytesMut::zeroed(32));
        let what = format!("{mode:?} send {i}");
        let (s, r) = tokio::join!(within(&what, send), recv);
        s.unwrap();
        let r = r.unwrap();
        assert_eq!(r.len, 32, "{mode:?}");
        assert_eq!(r.bufs[0][0], i, "{mode:?}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn acks_leave_without_a_frame_current_thread() {
    for mode in MODES {
        writes_complete_when_the_target_stops_polling(mode).await;
        delivery_complete_sends_complete_when_the_receiver_stops(mode).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_leave_without_a_frame_multi_thread() {
    for mode in MODES {
        writes_complete_when_the_target_stops_polling(mode).await;
        delivery_complete_sends_complete_when_the_receiver_stops(mode).await;
    }
}

/// A request/response exchange: each side's write answers the other's,
/// so every `Ack` rides with the next write. All of them arrive, every
/// write lands, and nothing stays queued once the exchange is over.
#[tokio::test(flavor = "current_thread")]
async fn acks_ride_with_answers_in_a_ping_pong() {
    for mode in MODES {
        let (a, b) = pair(mode);
        let (to_b, to_a) = (a.handle_of(&b), b.handle_of(&a));
        let rw = MrAccess::REMOTE_WRITE | MrAccess::REMOTE_READ;
        let ma = a
            .domain
            .mr_regattr(MrAttr::alloc(8, rw).requested_key(1))
            .unwrap();
        let mb = b
            .domain
            .mr_regattr(MrAttr::alloc(8, rw).requested_key(2))
            .unwrap();
        let ping = async {
            for i in 0..200u64 {
                a.ep.writedata(
                    to_b,
                    Bytes::copy_from_slice(&i.to_le_bytes()),
                    i,
                    0,
                    mb.key(),
                )
                .await
                .unwrap();
                let t = next_cq(&a.cq).await.unwrap();
                assert_eq!(t.data, i, "{mode:?}: the answer to {i}");
            }
        };
        let pong = async {
            for i in 0..200u64 {
                let t = next_cq(&b.cq).await.unwrap();
                assert_eq!(t.data, i, "{mode:?}: ping {i}");
                b.ep.writedata(
                    to_a,
                    Bytes::copy_from_slice(&i.to_le_bytes()),
                    i,
                    0,
                    ma.key(),
                )
                .await
                .unwrap();
            }
        };
        within(&format!("{mode:?} ping-pong"), async {
            tokio::join!(ping, pong)
        })
        .await;
        assert_eq!(ma.to_vec().unwrap(), 199u64.to_le_bytes());
        assert_eq!(mb.to_vec().unwrap(), 199u64.to_le_bytes());
    }
}
