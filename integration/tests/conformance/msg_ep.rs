//! MSG endpoints: passive endpoint, connection requests with CM data,
//! accept, reject, shutdown (spec/fi_endpoint.3.md, fi_cm(3)).

use bytes::{Bytes, BytesMut};
use weft::{
    BindFlags, CompletionQueue, ConnRequest, Endpoint, EqEventKind, Error, EventQueue,
    PassiveEndpoint,
};
use weft_integration::{next_eq, within, Harness, Provider};

struct Listener {
    pep: PassiveEndpoint,
    eq: EventQueue,
    addr: Vec<u8>,
}

fn listen(h: &Harness) -> Listener {
    let pep = h.fabric.passive_endpoint(&h.info, None).unwrap();
    let eq = h.eq();
    pep.bind_eq(&eq).unwrap();
    pep.listen().unwrap();
    let addr = pep.local_addr().unwrap();
    Listener { pep, eq, addr }
}

/// An enabled MSG endpoint (optionally the accepting side of `req`) with
/// its own EQ and CQ.
fn msg_ep(h: &Harness, req: Option<&ConnRequest>) -> (Endpoint, EventQueue, CompletionQueue) {
    let ep = match req {
        Some(r) => h.domain.accept_endpoint(&h.info, r).unwrap(),
        None => h.endpoint(),
    };
    let eq = h.eq();
    let cq = h.cq();
    ep.bind_eq(&eq).unwrap();
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
        .unwrap();
    ep.enable().unwrap();
    (ep, eq, cq)
}

async fn conn_req(l: &Listener) -> ConnRequest {
    let ev = next_eq(&l.eq).await.unwrap();
    assert_eq!(ev.kind, EqEventKind::ConnReq);
    assert_eq!(ev.fid, l.pep.fid());
    ConnRequest::from_event(&ev).unwrap()
}

async fn expect_connected(eq: &EventQueue, fid: u64) {
    let ev = next_eq(eq).await.unwrap();
    assert_eq!(ev.kind, EqEventKind::Connected);
    assert_eq!(ev.fid, fid);
}

struct Pair {
    client: (Endpoint, EventQueue, CompletionQueue),
    server: (Endpoint, EventQueue, CompletionQueue),
    _listener: Listener,
}

async fn connect_pair(h: &Harness) -> Pair {
    let l = listen(h);
    let client = msg_ep(h, None);
    let c = client.0.clone();
    let addr = l.addr.clone();
    let connecting = tokio::spawn(async move { c.connect(addr, b"hello server".to_vec()).await });
    let req = conn_req(&l).await;
    assert_eq!(req.cm_data, b"hello server");
    assert_eq!(req.pep_fid, l.pep.fid());
    let server = msg_ep(h, Some(&req));
    within("accept", server.0.accept(b"hello client".to_vec()))
        .await
        .unwrap();
    let got = within("connect", connecting).await.unwrap().unwrap();
    assert_eq!(got, b"hello client", "connector gets the server's CM data");
    expect_connected(&client.1, client.0.fid()).await;
    expect_connected(&server.1, server.0.fid()).await;
    Pair {
        client,
        server,
        _listener: l,
    }
}

async fn listen_accept_and_data_both_ways(p: Provider) {
    let h = Harness::msg(&p);
    let pair = connect_pair(&h).await;
    let (c, s) = (&pair.client.0, &pair.server.0);
    assert_eq!(
        weft::decode_sockaddr(&c.peer_addr().unwrap()).unwrap(),
        weft::decode_sockaddr(&s.local_addr().unwrap()).unwrap(),
        "the client's peer is the accepting endpoint"
    );
    let (got, sent) = within("client to server", async {
        tokio::join!(
            s.recv(BytesMut::zeroed(32)),
            c.send(0, Bytes::from_static(b"ping"))
        )
    })
    .await;
    sent.unwrap();
    assert_eq!(&got.unwrap().into_bytes()[..], b"ping");
    // Post form the other way, tagged where the provider's MSG endpoints
    // offer tags (verbs MSG is a plain RC QP: untagged only).
    if h.info.caps.contains(weft::Caps::TAGGED) {
        c.post_trecv(BytesMut::zeroed(32), weft::FI_ADDR_UNSPEC, 3, 0, 0xC)
            .unwrap();
        s.post_tsend(0, Bytes::from_static(b"pong"), 3, 0x5)
            .unwrap();
        let r = weft_integration::next_cq(&pair.client.2).await.unwrap();
        assert_eq!((r.context, r.tag), (0xC, 3));
        assert_eq!(&r.into_bytes()[..], b"pong");
    } else {
        assert_eq!(
            c.post_trecv(BytesMut::zeroed(32), weft::FI_ADDR_UNSPEC, 3, 0, 0xC),
            Err(Error::NoSys),
            "a tagged receive without FI_TAGGED"
        );
        c.post_recv(BytesMut::zeroed(32), 0xC).unwrap();
        s.post_send(0, Bytes::from_static(b"pong"), 0x5).unwrap();
        let r = weft_integration::next_cq(&pair.client.2).await.unwrap();
        assert_eq!(r.context, 0xC);
        assert_eq!(&r.into_bytes()[..], b"pong");
    }
    assert_eq!(
        weft_integration::next_cq(&pair.server.2)
            .await
            .unwrap()
            .context,
        0x5
    );
}

async fn reject_with_data(p: Provider) {
    let h = Harness::msg(&p);
    let l = listen(&h);
    let (c, c_eq, _cq) = msg_ep(&h, None);
    let c2 = c.clone();
    let addr = l.addr.clone();
    let connecting = tokio::spawn(async move { c2.connect(addr, b"let me in".to_vec()).await });
    let req = conn_req(&l).await;
    assert_eq!(req.cm_data, b"let me in");
    l.pep.reject(&req, b"go away".to_vec()).unwrap();
    let r = within("rejected connect", connecting).await.unwrap();
    assert_eq!(r.unwrap_err(), Error::ConnRefused);
    let e = next_eq(&c_eq).await.unwrap_err();
    assert_eq!(e.err, Error::ConnRefused);
    assert_eq!(e.fid, c.fid());
    assert_eq!(
        e.err_data, b"go away",
        "the reject data reaches the connector"
    );
}

async fn shutdown_notifies_peer(p: Provider) {
    let h = Harness::msg(&p);
    let pair = connect_pair(&h).await;
    pair.client.0.shutdown().unwrap();
    let ev = next_eq(&pair.server.1).await.unwrap();
    assert_eq!(ev.kind, EqEventKind::Shutdown);
    assert_eq!(ev.fid, pair.server.0.fid());
}

async fn cm_data_size_limit(p: Provider) {
    let h = Harness::msg(&p);
    let max = h.info.ep_attr.cm_data_size;
    assert!(max > 0);
    let l = listen(&h);
    let (c, _eq, _cq) = msg_ep(&h, None);
    assert_eq!(c.cm_data_size(), max);
    let r = within(
        "oversize connect",
        c.connect(l.addr.clone(), vec![7; max + 1]),
    )
    .await;
    assert_eq!(r.unwrap_err(), Error::Inval);

    // Exactly cm_data_size is fine; oversize accept/reject data is Inval.
    let c2 = c.clone();
    let addr = l.addr.clone();
    let connecting = tokio::spawn(async move { c2.connect(addr, vec![1; max]).await });
    let req = conn_req(&l).await;
    assert_eq!(req.cm_data, vec![1; max]);
    assert_eq!(
        l.pep.reject(&req, vec![0; max + 1]).unwrap_err(),
        Error::Inval
    );
    let (s, _seq, _scq) = msg_ep(&h, Some(&req));
    let r = within("oversize accept", s.accept(vec![0; max + 1])).await;
    assert_eq!(r.unwrap_err(), Error::Inval);
    within("accept", s.accept(vec![2; max])).await.unwrap();
    let got = within("connect", connecting).await.unwrap().unwrap();
    assert_eq!(got, vec![2; max]);
}

async fn passive_endpoint_rules(p: Provider) {
    let h = Harness::msg(&p);
    let pep = h.fabric.passive_endpoint(&h.info, None).unwrap();
    assert_eq!(pep.listen().unwrap_err(), Error::NoEq, "listen needs an EQ");
    assert_eq!(pep.local_addr().unwrap_err(), Error::OpBadState);
    assert_eq!(pep.set_backlog(0).unwrap_err(), Error::Inval);
    pep.set_backlog(8).unwrap();
    let eq = h.eq();
    pep.bind_eq(&eq).unwrap();
    pep.listen().unwrap();
    assert_eq!(pep.listen().unwrap_err(), Error::OpBadState);
    assert!(weft::decode_sockaddr(&pep.local_addr().unwrap()).is_ok());
    pep.close().unwrap();
    // RDM infos make no passive endpoint.
    let rdm = Harness::rdm(&p);
    assert_eq!(
        rdm.fabric.passive_endpoint(&rdm.info, None).unwrap_err(),
        Error::Inval
    );
}

async fn accept_on_plain_endpoint_is_inval(p: Provider) {
    let h = Harness::msg(&p);
    let (ep, _eq, _cq) = msg_ep(&h, None);
    let r = within("accept without request", ep.accept(vec![])).await;
    assert_eq!(r.unwrap_err(), Error::Inval);
    let rdm = Harness::rdm(&p);
    let e = rdm.rdm_ep();
    let r = within("connect on RDM", e.ep.connect(e.addr(), vec![])).await;
    assert_eq!(r.unwrap_err(), Error::NoSys);
}

async fn connect_to_nobody_fails(p: Provider) {
    let h = Harness::msg(&p);
    let (c, eq, _cq) = msg_ep(&h, None);
    let r = within("connect to a dead port", c.connect(h.dead_addr(), vec![])).await;
    assert!(r.is_err(), "connect to a closed port fails");
    let e = next_eq(&eq).await.unwrap_err();
    assert_eq!(e.fid, c.fid());
    assert_eq!(Err(e.err), r.map(|_| ()));
}

async fn send_after_peer_shutdown_fails(p: Provider) {
    let h = Harness::msg(&p);
    let pair = connect_pair(&h).await;
    let s = &pair.server.0;
    pair.client.0.shutdown().unwrap();
    let ev = next_eq(&pair.server.1).await.unwrap();
    assert_eq!(ev.kind, EqEventKind::Shutdown);
    let mut failed = false;
    for _ in 0..50 {
        if within(
            "send after shutdown",
            s.send(0, Bytes::from_static(b"late")),
        )
        .await
        .is_err()
        {
            failed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(failed, "sends on a shut-down connection fail");
}

async fn close_notifies_peer(p: Provider) {
    let h = Harness::msg(&p);
    let pair = connect_pair(&h).await;
    pair.client.0.close().unwrap();
    let ev = next_eq(&pair.server.1).await.unwrap();
    assert_eq!(
        ev.kind,
        EqEventKind::Shutdown,
        "closing disconnects the peer"
    );
}

/// fi_endpoint(3): connect and accept enable an endpoint that was not
/// enabled, with enable's checks (an endpoint without a CQ is `NoCq`).
async fn connect_and_accept_enable_the_endpoint(p: Provider) {
    let h = Harness::msg(&p);
    let l = listen(&h);
    let bare = h.endpoint();
    bare.bind_eq(&h.eq()).unwrap();
    let r = within(
        "connect without a CQ",
        bare.connect(l.addr.clone(), Vec::new()),
    )
    .await;
    assert_eq!(r.unwrap_err(), Error::NoCq);

    let bind = |ep: &Endpoint| {
        let (eq, cq) = (h.eq(), h.cq());
        ep.bind_eq(&eq).unwrap();
        ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
            .unwrap();
        (eq, cq)
    };
    let client = h.endpoint();
    let (ceq, _ccq) = bind(&client);
    let c = client.clone();
    let addr = l.addr.clone();
    let connecting = tokio::spawn(async move { c.connect(addr, Vec::new()).await });
    let req = conn_req(&l).await;
    let server = h.domain.accept_endpoint(&h.info, &req).unwrap();
    let (seq, _scq) = bind(&server);
    within("accept", server.accept(Vec::new())).await.unwrap();
    within("connect", connecting).await.unwrap().unwrap();
    expect_connected(&ceq, client.fid()).await;
    expect_connected(&seq, server.fid()).await;
    assert!(client.local_addr().is_ok(), "connect enabled the client");
    assert!(server.local_addr().is_ok(), "accept enabled the server");
}

provider_tests! {
    connect_and_accept_enable_the_endpoint,
    close_notifies_peer,
    connect_to_nobody_fails,
    send_after_peer_shutdown_fails,
    listen_accept_and_data_both_ways,
    reject_with_data,
    shutdown_notifies_peer,
    cm_data_size_limit,
    passive_endpoint_rules,
    accept_on_plain_endpoint_is_inval,
}
