//! rdma_cm tests: a server on rxe1 (10.66.0.1) and a client bound to rxe2
//! (10.66.0.2), in two threads.

use super::*;

fn wait_cm(ch: &Arc<EventChannel>) -> CmEvent {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(ev) = ch.get_event().unwrap() {
            return ev;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "timed out waiting for an rdma_cm event");
        poll_readable(&**ch, left).unwrap();
    }
}

fn expect_cm(ch: &Arc<EventChannel>, kind: CmEventKind) -> CmEvent {
    let ev = wait_cm(ch);
    assert_eq!(ev.kind, kind, "{ev:?}");
    ev
}

fn cm_ips() -> Option<(IpAddr, IpAddr)> {
    open_or_skip("rxe1")?;
    open_or_skip("rxe2")?;
    let server = env_ip(
        &["WEFT_RXE_SERVER_IP", "RXE_A_IP"],
        Ipv4Addr::new(10, 66, 0, 1),
    );
    let client = env_ip(
        &["WEFT_RXE_CLIENT_IP", "RXE_B_IP"],
        Ipv4Addr::new(10, 66, 0, 2),
    );
    Some((server, client))
}

/// PD, CQ and a QP on a cm id's device (RC for TCP, UD for UDP ids).
fn cm_qp(id: &CmId) -> (Arc<ProtectionDomain>, Arc<Cq>, Arc<QueuePair>) {
    let ctx = id.context().unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = Cq::new(&ctx, 64, None).unwrap();
    let qp_type = match id.port_space() {
        PortSpace::Tcp => QpType::Rc,
        PortSpace::Udp => QpType::Ud,
    };
    let init = QpInitAttr {
        qp_type,
        send_cq: Arc::clone(&cq),
        recv_cq: Arc::clone(&cq),
        srq: None,
        caps: caps(),
        sq_sig_all: false,
    };
    let qp = id.create_qp(&pd, &init).unwrap();
    (pd, cq, qp)
}

/// The client side of a connection: resolved, QP created, connect sent.
struct CmClient {
    ch: Arc<EventChannel>,
    id: CmId,
    pd: Arc<ProtectionDomain>,
    cq: Arc<Cq>,
    qp: Arc<QueuePair>,
}

fn cm_client_connect(server: SocketAddr, client_ip: IpAddr, private_data: &[u8]) -> CmClient {
    cm_client_connect_ps(PortSpace::Tcp, server, client_ip, private_data)
}

fn cm_client_connect_ps(
    ps: PortSpace,
    server: SocketAddr,
    client_ip: IpAddr,
    private_data: &[u8],
) -> CmClient {
    let ch = EventChannel::new().unwrap();
    let id = CmId::new(&ch, ps).unwrap();
    assert_eq!(id.port_space(), ps);
    assert!(id.context().is_err(), "not bound to a device yet");
    id.resolve_addr(Some(SocketAddr::new(client_ip, 0)), server, 5000)
        .unwrap();
    let ev = expect_cm(&ch, CmEventKind::AddrResolved);
    assert_eq!((ev.id_token, ev.error()), (id.token(), None));
    id.resolve_route(5000).unwrap();
    expect_cm(&ch, CmEventKind::RouteResolved);
    assert_eq!(id.context().unwrap().name(), "rxe2");
    assert_eq!(id.port_num(), 1);
    assert_eq!(id.local_ip(), Some(client_ip));
    assert_eq!(id.peer_addr(), Some(server));
    let (pd, cq, qp) = cm_qp(&id);
    // A QP of the other type does not fit the port space.
    let other = QpInitAttr {
        qp_type: if ps == PortSpace::Tcp {
            QpType::Ud
        } else {
            QpType::Rc
        },
        send_cq: Arc::clone(&cq),
        recv_cq: Arc::clone(&cq),
        srq: None,
        caps: caps(),
        sq_sig_all: false,
    };
    assert_eq!(id.create_qp(&pd, &other).unwrap_err(), Error::Inval);
    // Too much private data is refused before anything is sent.
    let long = vec![0u8; ps.max_connect_private_data() + 1];
    assert_eq!(
        id.connect(&ConnParam::new(&long)).unwrap_err(),
        Error::Inval
    );
    id.connect(&ConnParam::new(private_data)).unwrap();
    CmClient { ch, id, pd, cq, qp }
}

fn cm_listen(server_ip: IpAddr) -> (Arc<EventChannel>, CmId, SocketAddr) {
    cm_listen_ps(PortSpace::Tcp, server_ip)
}

fn cm_listen_ps(ps: PortSpace, server_ip: IpAddr) -> (Arc<EventChannel>, CmId, SocketAddr) {
    let ch = EventChannel::new().unwrap();
    let listener = CmId::new(&ch, ps).unwrap();
    listener.bind_addr(SocketAddr::new(server_ip, 0)).unwrap();
    listener.listen(8).unwrap();
    let addr = listener.local_addr().unwrap();
    assert_eq!(addr.ip(), server_ip);
    assert_ne!(addr.port(), 0);
    assert_eq!(listener.context().unwrap().name(), "rxe1");
    (ch, listener, addr)
}

#[test]
fn cm_connect_accept_send_disconnect() {
    let Some((server_ip, client_ip)) = cm_ips() else {
        return;
    };
    let (addr_tx, addr_rx) = mpsc::channel::<SocketAddr>();
    let server = thread::spawn(move || {
        let (ch, listener, addr) = cm_listen(server_ip);
        addr_tx.send(addr).unwrap();
        let ev = expect_cm(&ch, CmEventKind::ConnectRequest);
        assert_eq!(ev.listen_token, Some(listener.token()));
        assert_eq!(ev.id_token, listener.token());
        assert!(
            ev.private_data.starts_with(b"hello from the client"),
            "{ev:?}"
        );
        assert_ne!(ev.conn.unwrap().qp_num, 0);
        let id = ev.new_id.unwrap();
        assert_ne!(id.token(), listener.token());
        assert_eq!(id.peer_addr().unwrap().ip(), client_ip);
        assert_eq!(id.context().unwrap().name(), "rxe1");
        let (pd, cq, qp) = cm_qp(&id);
        assert_eq!(qp.state().unwrap(), QpState::Init);
        let rmr = BytesMutMr::new(&pd, BytesMut::zeroed(256), AccessFlags::LOCAL_WRITE).unwrap();
        qp.post_recv(&RecvRequest {
            wr_id: 1,
            sges: &[rmr.sge().unwrap()],
        })
        .unwrap();
        let long = [0u8; 197];
        assert_eq!(id.accept(&ConnParam::new(&long)).unwrap_err(), Error::Inval);
        id.accept(&ConnParam::new(b"welcome, client")).unwrap();
        // The kernel CM left RNR timer code 0 (655 ms) at RTR; accept
        // shortened it once rdma_accept had sent the reply and returned.
        assert_eq!(qp.min_rnr_timer().unwrap(), RNR_TIMER);
        let ev = expect_cm(&ch, CmEventKind::Established);
        assert_eq!(ev.id_token, id.token());
        assert_eq!(qp.state().unwrap(), QpState::Rts);
        let wc = wait_one(&cq);
        assert_ok(&wc, 1, WcOpcode::Recv);
        let got = rmr.into_inner().unwrap();
        assert_eq!(&got[..wc.byte_len as usize], b"ping over rdma_cm");
        let ev = expect_cm(&ch, CmEventKind::Disconnected);
        assert_eq!(ev.id_token, id.token());
        // Dropping the id while its QP lives is fine: the QP keeps it.
        drop(id);
        drop(qp);
        drop(listener);
    });

    let server_addr = addr_rx.recv_timeout(TIMEOUT).unwrap();
    let c = cm_client_connect(server_addr, client_ip, b"hello from the client");
    let ev = expect_cm(&c.ch, CmEventKind::Established);
    assert_eq!(ev.id_token, c.id.token());
    assert!(ev.private_data.starts_with(b"welcome, client"), "{ev:?}");
    assert_eq!(c.qp.state().unwrap(), QpState::Rts);
    assert_eq!(c.qp.min_rnr_timer().unwrap(), RNR_TIMER);
    // Static (read-only) memory can be registered for sending.
    let smr = BytesMr::new(
        &c.pd,
        Bytes::from_static(b"ping over rdma_cm"),
        AccessFlags::NONE,
    )
    .unwrap();
    let sges = [smr.sge().unwrap()];
    c.qp.post_send(&SendRequest::new(5, SendOp::Send, Payload::Sges(&sges)))
        .unwrap();
    assert_ok(&wait_one(&c.cq), 5, WcOpcode::Send);
    c.id.disconnect().unwrap();
    let ev = expect_cm(&c.ch, CmEventKind::Disconnected);
    assert_eq!(ev.id_token, c.id.token());
    server.join().unwrap();
}

#[test]
fn cm_reject_delivers_private_data() {
    let Some((server_ip, client_ip)) = cm_ips() else {
        return;
    };
    let (addr_tx, addr_rx) = mpsc::channel::<SocketAddr>();
    let server = thread::spawn(move || {
        let (ch, _listener, addr) = cm_listen(server_ip);
        addr_tx.send(addr).unwrap();
        let ev = expect_cm(&ch, CmEventKind::ConnectRequest);
        assert!(ev.private_data.starts_with(b"may I?"), "{ev:?}");
        let id = ev.new_id.unwrap();
        let long = [0u8; 149];
        assert_eq!(id.reject(&long).unwrap_err(), Error::Inval);
        id.reject(b"no: server full").unwrap();
    });
    let server_addr = addr_rx.recv_timeout(TIMEOUT).unwrap();
    let c = cm_client_connect(server_addr, client_ip, b"may I?");
    let ev = expect_cm(&c.ch, CmEventKind::Rejected);
    assert_eq!(ev.id_token, c.id.token());
    assert!(ev.private_data.starts_with(b"no: server full"), "{ev:?}");
    assert_eq!(ev.error(), Some(Error::ConnRefused));
    eprintln!(
        "rejected: status {} private data {} bytes",
        ev.status,
        ev.private_data.len()
    );
    assert_eq!(c.qp.state().unwrap(), QpState::Error);
    server.join().unwrap();
}

#[test]
fn cm_ud_resolve_and_send() {
    let Some((server_ip, client_ip)) = cm_ips() else {
        return;
    };
    let (addr_tx, addr_rx) = mpsc::channel::<SocketAddr>();
    let server = thread::spawn(move || {
        let (ch, _listener, addr) = cm_listen_ps(PortSpace::Udp, server_ip);
        addr_tx.send(addr).unwrap();
        let ev = expect_cm(&ch, CmEventKind::ConnectRequest);
        assert!(ev.private_data.starts_with(b"ud hello"), "{ev:?}");
        assert!(ev.conn.is_none());
        let ud = ev.ud.unwrap();
        eprintln!("UD connect request: {ud:?}");
        let id = ev.new_id.unwrap();
        assert_eq!(id.port_space(), PortSpace::Udp);
        let (pd, cq, qp) = cm_qp(&id);
        // librdmacm brings UD QPs to RTS at creation.
        assert_eq!(qp.state().unwrap(), QpState::Rts);
        let rmr =
            BytesMutMr::new(&pd, BytesMut::zeroed(40 + 256), AccessFlags::LOCAL_WRITE).unwrap();
        qp.post_recv(&RecvRequest {
            wr_id: 1,
            sges: &[rmr.sge().unwrap()],
        })
        .unwrap();
        let long = [0u8; 137];
        assert_eq!(id.accept(&ConnParam::new(&long)).unwrap_err(), Error::Inval);
        id.accept(&ConnParam::new(b"ud welcome")).unwrap();
        let wc = wait_one(&cq);
        assert_ok(&wc, 1, WcOpcode::Recv);
        assert_eq!(wc.imm_data, Some(0x42));
        assert!(wc.wc_flags.contains(WcFlags::GRH));
        let got = rmr.into_inner().unwrap();
        assert_eq!(&got[40..wc.byte_len as usize], b"datagram via rdma_cm");
        wc.src_qp
    });
    let server_addr = addr_rx.recv_timeout(TIMEOUT).unwrap();
    let c = cm_client_connect_ps(PortSpace::Udp, server_addr, client_ip, b"ud hello");
    let ev = expect_cm(&c.ch, CmEventKind::Established);
    assert!(ev.private_data.starts_with(b"ud welcome"), "{ev:?}");
    let ud = ev.ud.unwrap();
    eprintln!("UD established: {ud:?}");
    assert_ne!(ud.qp_num, 0);
    assert!(ud.ah_attr.dgid.is_some());
    let ah = AddressHandle::new(&c.pd, &ud.ah_attr).unwrap();
    let dest = UdDest {
        ah: &ah,
        remote_qpn: ud.qp_num,
        remote_qkey: ud.qkey,
    };
    c.qp.post_send(
        &SendRequest::new(
            3,
            SendOp::SendWithImm(0x42),
            Payload::Inline(b"datagram via rdma_cm"),
        )
        .ud(dest),
    )
    .unwrap();
    assert_ok(&wait_one(&c.cq), 3, WcOpcode::Send);
    let src_qp = server.join().unwrap();
    assert_eq!(src_qp, c.qp.qp_num());
}
