//! Unsignaled sends of verbs MSG endpoints, on real RDMA devices
//! (soft-RoCE in the VM of `integration/run-rxe`): an inject copied
//! inline is posted without a completion of its own and ends with the
//! next signaled one of its queue, so nothing is lost, no entry appears
//! for it, its credit comes back, and a failure is still reported.
//! Server on rxe1, client on rxe2.
//!
//! Outside the VM every test is ignored; inside it a missing device is a
//! failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use bytes::BytesMut;
use weft::{EpType, Error, FI_ADDR_UNSPEC};
use weft_integration::{assert_cq_quiet, msg_pair, next_cq, payload, verbs_offer, within, MsgPair};

const SERVER_DEV: &str = "rxe1";
const CLIENT_DEV: &str = "rxe2";

/// A connected pair whose client has `tx` transmit credits.
async fn pair(tx: usize) -> Option<MsgPair> {
    let si = verbs_offer(SERVER_DEV, EpType::Msg)?;
    let mut ci = verbs_offer(CLIENT_DEV, EpType::Msg)?;
    ci.tx_attr.size = tx;
    Some(msg_pair(&si, &ci).await)
}

/// The size of the tests' injects: what the client's device copies
/// inline, at most 64 bytes.
fn inline_len(p: &MsgPair) -> usize {
    p.cep.info().tx_attr.inject_size.min(64)
}

/// Many more injects than the client has credits, each waited out when
/// refused (`Again`): all arrive, in order and intact; none leaves an
/// entry on the client's CQ; the credits of the unsignaled ones come back
/// (a send with a completion after them completes, and so do later
/// injects); most went unsignaled.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injects_lose_nothing_and_give_their_credits_back() {
    const TX: usize = 8;
    const N: usize = 300;
    let Some(p) = pair(TX).await else {
        return;
    };
    let inline = inline_len(&p);
    assert!(inline > 0, "the device takes inline data");
    for round in 0..2u8 {
        // Posted in order before the first message, so message i lands in
        // receive i (a message without a posted receive would be an RNR
        // retry, not a loss, but the test is about the sender).
        for i in 0..N {
            p.sep.post_recv(BytesMut::zeroed(inline), i as u64).unwrap();
        }
        within("injects", async {
            for i in 0..N {
                let msg = payload(inline, i as u8 ^ round);
                loop {
                    match p.cep.inject(FI_ADDR_UNSPEC, msg.clone()) {
                        Ok(()) => break,
                        Err(Error::Again) => tokio::time::sleep(Duration::from_millis(1)).await,
                        Err(e) => panic!("inject {i}: {e}"),
                    }
                }
            }
        })
        .await;
        for i in 0..N {
            let got = next_cq(&p.scq).await.unwrap();
            assert_eq!((got.context, got.len), (i as u64, inline), "message {i}");
            assert_eq!(
                &got.into_bytes()[..],
                &payload(inline, i as u8 ^ round)[..],
                "message {i} of round {round}, intact"
            );
        }
        // A send with a completion: it needs a credit, and it reports.
        let echo = p.sep.clone();
        let r = tokio::spawn(async move { echo.recv(BytesMut::zeroed(4096)).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        p.cep
            .post_send(FI_ADDR_UNSPEC, payload(4096, 7), 77)
            .unwrap();
        let c = next_cq(&p.ccq).await.unwrap();
        assert_eq!((c.context, c.len), (77, 4096), "the send's own completion");
        within("last receive", r).await.unwrap().unwrap();
        assert_cq_quiet(&p.ccq, "no entry for any inject").await;
    }
    let s = p.cep.stats().unwrap();
    assert!(
        s.tx_unsignaled >= (N as u64) && s.tx_unsignaled < 2 * N as u64,
        "most of {} injects unsignaled, at most {} in a row: {}",
        2 * N,
        TX / 4,
        s.tx_unsignaled
    );
}

/// An unsignaled inject that fails (longer than the receive it lands in)
/// is reported as a signaled one is: an error entry on the sender's CQ,
/// and the endpoint disabled (a critical error).
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_unsignaled_inject_is_reported() {
    let Some(p) = pair(64).await else {
        return;
    };
    let inline = inline_len(&p);
    assert!(inline > 8, "the device takes inline data");
    // A first inject that fits: it goes unsignaled (and so, by the rule
    // of runs, does the next).
    p.sep.post_recv(BytesMut::zeroed(8), 1).unwrap();
    p.cep.inject(FI_ADDR_UNSPEC, payload(8, 2)).unwrap();
    let ok = next_cq(&p.scq).await.unwrap();
    assert_eq!((ok.context, ok.len), (1, 8));
    assert_eq!(
        p.cep.stats().unwrap().tx_unsignaled,
        1,
        "it went unsignaled"
    );
    p.sep.post_recv(BytesMut::zeroed(8), 2).unwrap();
    p.cep.inject(FI_ADDR_UNSPEC, payload(inline, 3)).unwrap();
    let e = next_cq(&p.ccq)
        .await
        .expect_err("the inject's failure is reported");
    assert_eq!(e.context, 0, "an inject has no context");
    assert_ne!(e.err, Error::Canceled, "its own failure, not a flush");
    assert_eq!(
        p.cep.inject(FI_ADDR_UNSPEC, payload(8, 1)).unwrap_err(),
        Error::OpBadState,
        "the endpoint is disabled"
    );
}
