//! A verbs MSG accept given up after `rdma_accept` (its handshake never
//! completes), on real RDMA devices (soft-RoCE in the VM of
//! `integration/run-rxe`): what the server posted on the queue pair
//! during the handshake ends, with an error, credits and buffers back —
//! pool buffers in their pools, not lent or lost for good. Server on
//! rxe1 (10.66.0.1), requester on rxe2 (10.66.0.2).
//!
//! The requester is a verbs MSG endpoint on a runtime of its own, driven
//! until its request has left and never again: librdmacm moves its queue
//! pair to RTR and answers the accept (RTU) only when the application
//! reads the reply, so the server's queue pair is ready to send (after
//! `rdma_accept`) while the peer's takes nothing, and `Established`
//! never comes.
//!
//! Outside the VM the test prints why it is skipped; inside it
//! (`RXE_VM=1`) a missing device is a failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use weft::{
    BindFlags, ConnLimits, ConnRequest, CqAttr, EpType, EqEventKind, Error, Fabric, OpFlags,
};
use weft_integration::{accepted_endpoint, next_eq, verbs_offer, within};

const SERVER_DEV: &str = "rxe1";
const CLIENT_DEV: &str = "rxe2";

/// The server's handshake timeout: the accept gives up after it.
const HANDSHAKE: Duration = Duration::from_secs(3);

fn rt(multi: bool) -> tokio::runtime::Runtime {
    let mut b = if multi {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(2);
        b
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    b.enable_all().build().unwrap()
}

/// Sends and receives posted during the handshake of an accept that is
/// given up end once the device reported them: the pool send `Canceled`
/// (or the transport's error), the posted pool receive `Canceled` with
/// its buffer in the entry (reclaimed), the awaited pool receive
/// `Canceled` with its buffer back in its pool; every credit back, the
/// pools whole (nothing lent, nothing lost).
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[test]
fn verbs_given_up_accept_ends_what_was_posted() {
    let Some(sinfo) = verbs_offer(SERVER_DEV, EpType::Msg) else {
        return;
    };
    let Some(cinfo) = verbs_offer(CLIENT_DEV, EpType::Msg) else {
        return;
    };
    let main = rt(true);
    let _g = main.enter();
    let fabric = Fabric::open(&sinfo).unwrap();
    let domain = fabric.domain(&sinfo).unwrap();
    let peq = fabric.eq(8).unwrap();
    let pep = fabric.passive_endpoint(&sinfo, None).unwrap();
    pep.bind_eq(&peq).unwrap();
    pep.listen().unwrap();
    let paddr = pep.local_addr().unwrap();

    // The requester: driven until its request left, then never again.
    let crt = rt(false);
    let (cfab, cdom, ceq, ccq, client) = crt.block_on(async {
        let fabric = Fabric::open(&cinfo).unwrap();
        let domain = fabric.domain(&cinfo).unwrap();
        let eq = fabric.eq(8).unwrap();
        let cq = domain.cq(CqAttr::default()).unwrap();
        let ep = domain.endpoint(&cinfo).unwrap();
        ep.bind_eq(&eq).unwrap();
        ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
            .unwrap();
        ep.enable().unwrap();
        (fabric, domain, eq, cq, ep)
    });
    let ep = client.clone();
    let pending = crt.spawn(async move { ep.connect(paddr, b"stuck".to_vec()).await });
    crt.block_on(async {
        // The request is sent in the poll that builds the link (and so
        // makes the peer address known).
        let deadline = Instant::now() + Duration::from_secs(60);
        while client.peer_addr().is_err() {
            assert!(Instant::now() < deadline, "the request never left");
            tokio::task::yield_now().await;
        }
    });

    main.block_on(async {
        let ev = within("the request", next_eq(&peq)).await.unwrap();
        assert_eq!(ev.kind, EqEventKind::ConnReq);
        let req = ConnRequest::from_event(&ev).unwrap();
        let limits = ConnLimits::default().with_handshake_timeout(HANDSHAKE);
        let (server, _seq, scq) = accepted_endpoint(&fabric, &domain, &sinfo, &req, limits);
        let (tx0, rx0) = (
            server.tx_size_left().unwrap(),
            server.rx_size_left().unwrap(),
        );
        let pool = domain.buffer_pool(4, 4096).unwrap();
        // Receives posted before the accept go to the queue pair when
        // its link is built.
        server.post_recv_pooled(pool.try_get().unwrap(), 1).unwrap();
        let s = server.clone();
        let awaited_buf = pool.try_get().unwrap();
        let awaited = tokio::spawn(async move { s.recv_pooled(awaited_buf).await });
        let s = server.clone();
        let accepting = tokio::spawn(async move { s.accept(Vec::new()).await });
        // The link exists once the endpoint counts the connection, and
        // `rdma_accept` is called in the same poll; a little later the
        // queue pair is surely ready to send.
        within("the accept's link", async {
            while server.stats().unwrap().conns == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut out = pool.try_get().unwrap();
        out.set_len(4096).unwrap();
        out.fill(7);
        server.post_send_pooled(0, out, 2).unwrap();
        assert_eq!(server.tx_size_left().unwrap(), tx0 - 1);

        let r = within("the accept's end", accepting).await.unwrap();
        assert_eq!(r.unwrap_err(), Error::TimedOut, "the handshake timed out");
        // A cancel of the posted pool receive while its queue pair is
        // flushed: found (left to its flush), or already ended by the
        // give-up's task (which usually wins: it polls every 1 ms). Either
        // way it ends `Canceled` once, with its own pool buffer.
        let found = server.cancel(1);
        if let Err(e) = found {
            assert_eq!(e, Error::NoEnt, "only not found");
        }
        eprintln!("cancel after the give-up: {found:?}");

        // Both posted operations end, each once.
        let (mut send_done, mut recv_done) = (None, None);
        while send_done.is_none() || recv_done.is_none() {
            let e = match scq.next_timeout(Duration::from_secs(60)).await {
                Some(Err(e)) => e,
                Some(Ok(e)) => panic!("nothing posted here succeeds: {e:?}"),
                None => panic!("the posted operations did not end"),
            };
            match e.context {
                2 => {
                    assert!(send_done.is_none(), "the send ends once");
                    assert!(e.flags.contains(OpFlags::SEND), "{e:?}");
                    assert_ne!(e.err, Error::Again);
                    send_done = Some(e.err);
                }
                1 => {
                    assert!(recv_done.is_none(), "the receive ends once");
                    assert_eq!(e.err, Error::Canceled, "{e:?}");
                    let mut bufs = e.bufs;
                    let back = pool
                        .reclaim(&mut bufs)
                        .expect("the flushed receive carries its pool buffer");
                    assert_eq!(back.capacity(), 4096);
                    recv_done = Some(back);
                }
                // The awaited receive's entry, if the queue reports it.
                _ => {}
            }
        }
        drop(recv_done);
        let e = within("the awaited receive's end", awaited)
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(e.err, Error::Canceled, "{e:?}");
        assert_eq!(
            server.tx_size_left().unwrap(),
            tx0,
            "the send's credit back"
        );
        assert_eq!(
            server.rx_size_left().unwrap(),
            rx0,
            "the receives' credits back"
        );
        within("every buffer back in its pool", async {
            while pool.stats().free != 4 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        let st = pool.stats();
        assert_eq!((st.lent, st.lost), (0, 0), "{st:?}");
        eprintln!(
            "given-up accept: send ended {:?}, receives Canceled, pool whole",
            send_done
        );
        server.close().unwrap();
    });
    pending.abort();
    crt.block_on(async move {
        client.close().unwrap();
        drop((client, ccq, ceq, cdom, cfab));
    });
    drop(crt);
}
