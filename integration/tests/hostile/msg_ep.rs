//! MSG endpoints: a listener bounding its pending requests, and a fatal
//! connection fault disabling the endpoint until `enable`.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weft::{EpType, Error, Info};
use weft_core::wire::{FrameKind, Header, HEADER_LEN};

use super::{expect_closed, to, T};

/// A MSG listener bounds the connection requests it holds: beyond the
/// limit a connection is closed at once, one that never sends its request
/// is dropped at the handshake timeout, each reported on the listener's
/// EQ with the peer's address; a real client still gets through.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn listener_bounds_pending_requests_and_reports_them() {
    let mut hints = Info::default();
    hints.ep_attr.ep_type = EpType::Msg;
    let info = weft::getinfo(Some(&hints)).unwrap().remove(0);
    let fabric = weft::Fabric::open(&info).unwrap();
    let domain = fabric.domain(&info).unwrap();
    let pep = fabric.passive_endpoint(&info, None).unwrap();
    let eq = fabric.eq(64).unwrap();
    pep.bind_eq(&eq).unwrap();
    pep.set_conn_limits(
        weft::ConnLimits::default()
            .with_max_conns(2)
            .with_handshake_timeout(Duration::from_millis(200)),
    )
    .unwrap();
    pep.listen().unwrap();
    let addr = weft::decode_sockaddr(&pep.local_addr().unwrap()).unwrap();

    // The listener takes connections in the kernel's accept order, which
    // is the order the connects completed in: these two take the places.
    let mut silent = Vec::new();
    for _ in 0..2 {
        silent.push(to(TcpStream::connect(addr)).await.unwrap());
    }
    let extra = to(TcpStream::connect(addr)).await.unwrap();
    let extra_addr = extra.local_addr().unwrap();
    expect_closed(extra).await;
    let mut timed_out = 0;
    let mut refused = 0;
    for s in silent.drain(..) {
        expect_closed(s).await;
    }
    // Two timeouts and one refusal, each naming its peer.
    let t0 = std::time::Instant::now();
    while timed_out + refused < 3 && t0.elapsed() < T {
        match eq.read_err() {
            Ok(e) => {
                let peer = weft::decode_sockaddr(e.peer_addr.as_ref().unwrap()).unwrap();
                match e.err {
                    Error::TimedOut => timed_out += 1,
                    Error::ConnRefused => {
                        assert_eq!(peer, extra_addr);
                        refused += 1
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    assert_eq!((timed_out, refused), (2, 1));

    // A real client connects.
    let (cq, ceq) = (
        domain.cq(Default::default()).unwrap(),
        fabric.eq(8).unwrap(),
    );
    let c = domain.endpoint(&info).unwrap();
    c.bind_eq(&ceq).unwrap();
    c.bind_cq(&cq, weft::BindFlags::TRANSMIT | weft::BindFlags::RECV)
        .unwrap();
    let connecting = {
        let c = c.clone();
        let a = pep.local_addr().unwrap();
        tokio::spawn(async move { c.connect(a, Vec::new()).await })
    };
    let ev = to(eq.next_timeout(T)).await.unwrap().unwrap();
    assert_eq!(ev.kind, weft::EqEventKind::ConnReq);
    let req = weft::ConnRequest::from_event(&ev).unwrap();
    let s = domain.accept_endpoint(&info, &req).unwrap();
    let seq = fabric.eq(8).unwrap();
    s.bind_eq(&seq).unwrap();
    s.bind_cq(&cq, weft::BindFlags::TRANSMIT | weft::BindFlags::RECV)
        .unwrap();
    to(s.accept(Vec::new())).await.unwrap();
    to(connecting).await.unwrap().unwrap();
}

/// A MSG connection's fatal fault is a critical error (fi_endpoint(3)):
/// the endpoint is disabled (operations `OpBadState`), what was pending
/// completes with `Canceled`, the error is on the EQ, and `enable`
/// re-enables it so that it can connect again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fatal_fault_disables_and_enable_re_enables() {
    let mut hints = Info::default();
    hints.ep_attr.ep_type = EpType::Msg;
    let info = weft::getinfo(Some(&hints)).unwrap().remove(0);
    let fabric = weft::Fabric::open(&info).unwrap();
    let domain = fabric.domain(&info).unwrap();

    // A peer that accepts, then resets the connection.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fake = weft::encode_sockaddr(&l.local_addr().unwrap());
    let peer = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut req = [0u8; HEADER_LEN];
        s.read_exact(&mut req).await.unwrap();
        to(s.write_all(&Header::new(FrameKind::ConnResp).encode()))
            .await
            .unwrap();
        // Until the client has posted its receive.
        let mut b = [0u8; 1];
        let _ = tokio::time::timeout(Duration::from_millis(300), s.read(&mut b)).await;
        s.set_zero_linger().unwrap();
        drop(s);
    });
    let (cq, eq) = (
        domain.cq(Default::default()).unwrap(),
        fabric.eq(8).unwrap(),
    );
    let ep = domain.endpoint(&info).unwrap();
    ep.bind_eq(&eq).unwrap();
    ep.bind_cq(&cq, weft::BindFlags::TRANSMIT | weft::BindFlags::RECV)
        .unwrap();
    to(ep.connect(fake, Vec::new())).await.unwrap();
    let ev = to(eq.next_timeout(T)).await.unwrap().unwrap();
    assert_eq!(ev.kind, weft::EqEventKind::Connected);
    ep.post_recv(BytesMut::zeroed(16), 5).unwrap();
    to(peer).await.unwrap();

    let err = to(eq.next_timeout(T)).await.unwrap().unwrap_err();
    assert!(
        matches!(err.err, Error::ConnReset | Error::ConnAborted | Error::Io),
        "{err:?}"
    );
    let flushed = to(cq.next_timeout(T)).await.unwrap().unwrap_err();
    assert_eq!((flushed.context, flushed.err), (5, Error::Canceled));
    assert!(!ep.is_enabled());
    assert_eq!(
        ep.post_send(weft::FI_ADDR_UNSPEC, Bytes::from_static(b"x"), 1)
            .unwrap_err(),
        Error::OpBadState
    );

    // Re-enabled, it connects to a real listener.
    ep.enable().unwrap();
    assert!(ep.is_enabled());
    let pep = fabric.passive_endpoint(&info, None).unwrap();
    let peq = fabric.eq(8).unwrap();
    pep.bind_eq(&peq).unwrap();
    pep.listen().unwrap();
    let connecting = {
        let ep = ep.clone();
        let a = pep.local_addr().unwrap();
        tokio::spawn(async move { ep.connect(a, Vec::new()).await })
    };
    let ev = to(peq.next_timeout(T)).await.unwrap().unwrap();
    let req = weft::ConnRequest::from_event(&ev).unwrap();
    let server = domain.accept_endpoint(&info, &req).unwrap();
    let seq = fabric.eq(8).unwrap();
    server.bind_eq(&seq).unwrap();
    server
        .bind_cq(&cq, weft::BindFlags::TRANSMIT | weft::BindFlags::RECV)
        .unwrap();
    to(server.accept(Vec::new())).await.unwrap();
    to(connecting).await.unwrap().unwrap();
    let recv = server.recv(BytesMut::zeroed(16));
    let send = ep.send(weft::FI_ADDR_UNSPEC, Bytes::from_static(b"again"));
    let (got, sent) = to(async { tokio::join!(recv, send) }).await;
    sent.unwrap();
    assert_eq!(&got.unwrap().into_bytes()[..], b"again");
}
