//! Critical errors of verbs MSG endpoints (fi_endpoint(3)), on real RDMA
//! devices (soft-RoCE in the VM of `integration/run-rxe`): a failed work
//! request leaves the connection's queue pair in the error state, which
//! disables the endpoint (operations `OpBadState`), completes what was
//! pending with `Canceled`, puts one error on the EQ, and leaves the
//! endpoint for good (`enable` is `NoSys`: verbs cannot re-enable it). An
//! orderly end stays `FI_SHUTDOWN`. Server on rxe1, client on rxe2.
//!
//! Outside the VM every test is ignored; inside it a missing device is a
//! failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bytes::{Bytes, BytesMut};
use weft::{Endpoint, EpType, Error, EventQueue, FI_ADDR_UNSPEC};
use weft_integration::{msg_pair, next_cq, payload, verbs_offer, within, MsgPair, QUIET};

const SERVER_DEV: &str = "rxe1";
const CLIENT_DEV: &str = "rxe2";

async fn pair() -> Option<MsgPair> {
    let si = verbs_offer(SERVER_DEV, EpType::Msg)?;
    let ci = verbs_offer(CLIENT_DEV, EpType::Msg)?;
    Some(msg_pair(&si, &ci).await)
}

/// The endpoint is disabled for good: every operation `OpBadState`,
/// `enable` `NoSys`.
fn assert_disabled(ep: &Endpoint, who: &str) {
    assert!(!ep.is_enabled(), "{who}");
    assert_eq!(
        ep.post_send(FI_ADDR_UNSPEC, Bytes::from_static(b"x"), 1)
            .unwrap_err(),
        Error::OpBadState,
        "{who} send"
    );
    assert_eq!(
        ep.post_recv(BytesMut::zeroed(8), 2).unwrap_err(),
        Error::OpBadState,
        "{who} recv"
    );
    assert_eq!(ep.enable().unwrap_err(), Error::NoSys, "{who} enable");
    assert!(!ep.is_enabled(), "{who} after enable");
}

/// Exactly one entry on `eq` from now on: returned (whatever it is).
async fn only_entry(eq: &EventQueue, who: &str) -> weft::EqItem {
    let first = within("eq entry", eq.next_timeout(weft_integration::TIMEOUT))
        .await
        .unwrap_or_else(|e| panic!("{who}: nothing on the EQ: {e}"));
    // Long enough for the peer's disconnect to have arrived: it must not
    // add a second report.
    tokio::time::sleep(QUIET * 10).await;
    if let Ok(more) = eq.next_timeout(QUIET).await {
        panic!("{who}: a second EQ entry {more:?} after {first:?}");
    }
    first
}

/// A message longer than the receive it lands in: the receiver's queue
/// pair fails that receive (a length error) and enters the error state,
/// a critical error there; the sender's send fails too (the responder's
/// NAK).
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_message_is_a_critical_error() {
    let Some(p) = pair().await else {
        return;
    };
    p.sep.post_recv(BytesMut::zeroed(16), 1).unwrap();
    p.sep.post_recv(BytesMut::zeroed(16), 2).unwrap();
    p.cep.post_recv(BytesMut::zeroed(16), 7).unwrap();
    let sent = within(
        "oversized send",
        p.cep.send(FI_ADDR_UNSPEC, payload(4096, 1)),
    )
    .await;
    let e = sent.expect_err("a send its receiver cannot hold");
    eprintln!("sender's completion: {:?}", e.err);

    // The receiver: the receive it landed in fails, the next is flushed.
    let first = within("server recv 1", next_cq(&p.scq)).await.unwrap_err();
    assert_eq!(first.context, 1);
    assert_eq!(first.err, Error::Trunc, "{first:?}");
    let second = within("server recv 2", next_cq(&p.scq)).await.unwrap_err();
    assert_eq!((second.context, second.err), (2, Error::Canceled));
    let ev = only_entry(&p.seq, "server").await;
    let err = ev.expect_err("an error event, not a shutdown");
    eprintln!("server EQ: {err:?}");
    assert_eq!(err.err, Error::Trunc);
    assert_disabled(&p.sep, "server");

    // The sender's receive is flushed whichever it heard of first.
    let flushed = within("client recv", next_cq(&p.ccq)).await.unwrap_err();
    assert_eq!((flushed.context, flushed.err), (7, Error::Canceled));
    // Its own failed send (the responder's NAK) makes it a critical error
    // there too, unless the receiver's disconnect arrived before it: then
    // the connection had ended in order already.
    match only_entry(&p.ceq, "client").await {
        Err(e) => {
            eprintln!("client EQ: error {:?}", e.err);
            assert_eq!(e.err, Error::RemoteIo);
            assert_disabled(&p.cep, "client");
        }
        Ok(ev) => {
            eprintln!("client EQ: {:?}", ev.kind);
            assert_eq!(ev.kind, weft::EqEventKind::Shutdown);
        }
    }
}

/// An orderly end is no critical error: `FI_SHUTDOWN`, the endpoint's
/// pending receive `Canceled`, and it stays enabled (its operations fail
/// on the ended connection instead).
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orderly_shutdown_raises_nothing() {
    let Some(p) = pair().await else {
        return;
    };
    p.sep.post_recv(BytesMut::zeroed(16), 3).unwrap();
    p.cep.shutdown().unwrap();
    let ev = only_entry(&p.seq, "server").await.unwrap();
    assert_eq!(ev.kind, weft::EqEventKind::Shutdown);
    let flushed = within("server recv", next_cq(&p.scq)).await.unwrap_err();
    assert_eq!((flushed.context, flushed.err), (3, Error::Canceled));
    assert!(p.sep.is_enabled());
}
