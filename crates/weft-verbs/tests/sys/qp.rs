//! Queue pair tests on rxe0 (loopback): RC send/recv, RDMA, atomics, SRQ,
//! error completions, completion channels, UD with address handles.

use super::*;

#[test]
fn rc_loopback_send_recv_rdma_atomics() {
    let Some(ctx) = open_or_skip("rxe0") else {
        return;
    };
    let p = rc_pair(&ctx, None, false);

    // Send / recv, zero-copy on both sides.
    let msg = Bytes::from(pattern(3000, 7));
    let smr = BytesMr::new(&p.pd, msg.clone(), AccessFlags::NONE).unwrap();
    let rmr = BytesMutMr::new(&p.pd, BytesMut::zeroed(4096), AccessFlags::LOCAL_WRITE).unwrap();
    p.b.post_recv(&RecvRequest {
        wr_id: 11,
        sges: &[rmr.sge().unwrap()],
    })
    .unwrap();
    let sges = [smr.sge().unwrap()];
    p.a.post_send(&SendRequest::new(1, SendOp::Send, Payload::Sges(&sges)))
        .unwrap();
    assert_ok(&wait_one(&p.cq_a), 1, WcOpcode::Send);
    let wc = wait_one(&p.cq_b);
    assert_ok(&wc, 11, WcOpcode::Recv);
    assert_eq!((wc.byte_len, wc.imm_data), (3000, None));
    assert_eq!(wc.qp_num, p.b.qp_num());
    let got = rmr.into_inner().unwrap();
    assert_eq!(&got[..3000], &msg[..]);
    assert_eq!(smr.into_inner().unwrap(), msg);

    // Send with immediate data, inline payload, into an OwnedMr.
    let mut b_mr = OwnedMr::new(&p.pd, 16384, all_access()).unwrap();
    p.b.post_recv(&RecvRequest {
        wr_id: 12,
        sges: &[b_mr.sge(0, 256).unwrap()],
    })
    .unwrap();
    p.a.post_send(&SendRequest::new(
        2,
        SendOp::SendWithImm(0xdead_beef),
        Payload::Inline(b"inline with imm"),
    ))
    .unwrap();
    assert_ok(&wait_one(&p.cq_a), 2, WcOpcode::Send);
    let wc = wait_one(&p.cq_b);
    assert_ok(&wc, 12, WcOpcode::Recv);
    assert_eq!(wc.imm_data, Some(0xdead_beef));
    assert!(wc.wc_flags.contains(WcFlags::WITH_IMM));
    let mut got = [0u8; 15];
    b_mr.read_at(0, &mut got).unwrap();
    assert_eq!(&got, b"inline with imm");
    let too_long = vec![0u8; p.a.caps().max_inline_data as usize + 1];
    assert_eq!(
        p.a.post_send(&SendRequest::new(
            3,
            SendOp::Send,
            Payload::Inline(&too_long)
        ))
        .unwrap_err(),
        Error::MsgSize
    );

    // RDMA write into B's OwnedMr.
    let wdata = Bytes::from(pattern(5000, 42));
    let wmr = BytesMr::new(&p.pd, wdata.clone(), AccessFlags::NONE).unwrap();
    let sges = [wmr.sge().unwrap()];
    let write = SendOp::RdmaWrite {
        remote_addr: b_mr.addr() + 1024,
        rkey: b_mr.rkey(),
    };
    p.a.post_send(&SendRequest::new(4, write, Payload::Sges(&sges)))
        .unwrap();
    assert_ok(&wait_one(&p.cq_a), 4, WcOpcode::RdmaWrite);
    let mut got = vec![0u8; 5000];
    b_mr.read_at(1024, &mut got).unwrap();
    assert_eq!(got, &wdata[..]);

    // RDMA write with immediate consumes a receive at B.
    p.b.post_recv(&RecvRequest {
        wr_id: 13,
        sges: &[],
    })
    .unwrap();
    let write_imm = SendOp::RdmaWriteWithImm {
        remote_addr: b_mr.addr() + 8000,
        rkey: b_mr.rkey(),
        imm: 77,
    };
    p.a.post_send(&SendRequest::new(
        5,
        write_imm,
        Payload::Inline(b"imm-write"),
    ))
    .unwrap();
    assert_ok(&wait_one(&p.cq_a), 5, WcOpcode::RdmaWrite);
    let wc = wait_one(&p.cq_b);
    assert_ok(&wc, 13, WcOpcode::RecvRdmaWithImm);
    assert_eq!(wc.imm_data, Some(77));
    let mut got = [0u8; 9];
    b_mr.read_at(8000, &mut got).unwrap();
    assert_eq!(&got, b"imm-write");

    // RDMA read of what was written, into A's BytesMut.
    let rmr = BytesMutMr::new(&p.pd, BytesMut::zeroed(5000), AccessFlags::LOCAL_WRITE).unwrap();
    let sges = [rmr.sge().unwrap()];
    let read = SendOp::RdmaRead {
        remote_addr: b_mr.addr() + 1024,
        rkey: b_mr.rkey(),
    };
    p.a.post_send(&SendRequest::new(6, read, Payload::Sges(&sges)))
        .unwrap();
    let wc = wait_one(&p.cq_a);
    assert_ok(&wc, 6, WcOpcode::RdmaRead);
    assert_eq!(&rmr.into_inner().unwrap()[..], &wdata[..]);

    // Atomics.
    let atomic_cap = ctx.query_device().unwrap().atomic_cap;
    if atomic_cap == AtomicCap::None {
        eprintln!("atomics skipped: atomic_cap = None");
    } else {
        b_mr.write_u64_at(12288, 100).unwrap();
        let result = OwnedMr::new(&p.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
        let target = b_mr.addr() + 12288;
        let rkey = b_mr.rkey();
        let ops = [
            (
                SendOp::AtomicFetchAdd {
                    remote_addr: target,
                    rkey,
                    add: 5,
                },
                100,
                105,
            ),
            (
                SendOp::AtomicCmpSwp {
                    remote_addr: target,
                    rkey,
                    compare: 105,
                    swap: 7,
                },
                105,
                7,
            ),
            (
                SendOp::AtomicCmpSwp {
                    remote_addr: target,
                    rkey,
                    compare: 1,
                    swap: 9,
                },
                7,
                7,
            ),
        ];
        for (i, (op, old, new)) in ops.into_iter().enumerate() {
            let sges = [result.sge(8, 8).unwrap()];
            p.a.post_send(&SendRequest::new(20 + i as u64, op, Payload::Sges(&sges)))
                .unwrap();
            let wc = wait_one(&p.cq_a);
            let opcode = if i == 0 {
                WcOpcode::FetchAdd
            } else {
                WcOpcode::CompSwap
            };
            assert_ok(&wc, 20 + i as u64, opcode);
            assert_eq!(result.read_u64_at(8).unwrap(), old, "op {i}");
            assert_eq!(b_mr.read_u64_at(12288).unwrap(), new, "op {i}");
        }
        // Misaligned target or wrong local size are refused before posting.
        let sges = [result.sge(8, 8).unwrap()];
        let bad = SendOp::AtomicFetchAdd {
            remote_addr: target + 4,
            rkey,
            add: 1,
        };
        assert_eq!(
            p.a.post_send(&SendRequest::new(30, bad, Payload::Sges(&sges)))
                .unwrap_err(),
            Error::Inval
        );
        let sges = [result.sge(0, 16).unwrap()];
        let bad = SendOp::AtomicFetchAdd {
            remote_addr: target,
            rkey,
            add: 1,
        };
        assert_eq!(
            p.a.post_send(&SendRequest::new(31, bad, Payload::Sges(&sges)))
                .unwrap_err(),
            Error::Inval
        );
    }

    // A list of sends (only the last signaled) against a list of receives.
    let rbufs: Vec<OwnedMr> = (0..3)
        .map(|_| OwnedMr::new(&p.pd, 64, AccessFlags::LOCAL_WRITE).unwrap())
        .collect();
    let rsges: Vec<[weft_verbs::sys::Sge<'_>; 1]> =
        rbufs.iter().map(|m| [m.sge(0, 64).unwrap()]).collect();
    let recvs: Vec<RecvRequest<'_>> = rsges
        .iter()
        .enumerate()
        .map(|(i, s)| RecvRequest {
            wr_id: 40 + i as u64,
            sges: s,
        })
        .collect();
    p.b.post_recv_list(&recvs).unwrap();
    let payloads: [&[u8]; 3] = [b"one", b"two", b"three"];
    let sends: Vec<SendRequest<'_>> = payloads
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let flags = if i == 2 {
                SendFlags::SIGNALED
            } else {
                SendFlags::NONE
            };
            SendRequest::new(50 + i as u64, SendOp::Send, Payload::Inline(d)).flags(flags)
        })
        .collect();
    p.a.post_send_list(&sends).unwrap();
    assert_ok(&wait_one(&p.cq_a), 52, WcOpcode::Send);
    let wcs = wait_cq(&p.cq_b, 3);
    for (i, wc) in wcs.iter().enumerate() {
        assert_ok(wc, 40 + i as u64, WcOpcode::Recv);
        let mut got = vec![0u8; wc.byte_len as usize];
        rbufs[i].read_at(0, &mut got).unwrap();
        assert_eq!(got, payloads[i]);
    }
    // Nothing left over.
    let mut rest = Vec::new();
    assert_eq!(p.cq_a.poll(&mut rest, 16).unwrap(), 0);
    assert_eq!(p.cq_b.poll(&mut rest, 16).unwrap(), 0);

    // UD-only and RC-only checks happen before the provider is called.
    assert_eq!(
        p.a.post_send(&SendRequest::new(
            60,
            SendOp::RdmaRead {
                remote_addr: 0,
                rkey: 0
            },
            Payload::Inline(b"x")
        ))
        .unwrap_err(),
        Error::Inval
    );
}

#[test]
fn rc_srq_receive() {
    let Some(ctx) = open_or_skip("rxe0") else {
        return;
    };
    let p = rc_pair(&ctx, None, true);
    let srq = p.b.srq().unwrap();
    let buf = OwnedMr::new(&p.pd, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    // Posting to the QP of an SRQ user is refused.
    assert_eq!(
        p.b.post_recv(&RecvRequest {
            wr_id: 1,
            sges: &[buf.sge(0, 64).unwrap()]
        })
        .unwrap_err(),
        Error::Inval
    );
    srq.post_recv(&RecvRequest {
        wr_id: 2,
        sges: &[buf.sge(128, 256).unwrap()],
    })
    .unwrap();
    p.a.post_send(&SendRequest::new(
        3,
        SendOp::Send,
        Payload::Inline(b"via srq"),
    ))
    .unwrap();
    assert_ok(&wait_one(&p.cq_a), 3, WcOpcode::Send);
    let wc = wait_one(&p.cq_b);
    assert_ok(&wc, 2, WcOpcode::Recv);
    assert_eq!(wc.byte_len, 7);
    let mut got = [0u8; 7];
    buf.read_at(128, &mut got).unwrap();
    assert_eq!(&got, b"via srq");
}

#[test]
fn rc_wrong_rkey_is_an_error_completion() {
    let Some(ctx) = open_or_skip("rxe0") else {
        return;
    };
    let p = rc_pair(&ctx, None, false);
    let target = OwnedMr::new(&p.pd, 4096, all_access()).unwrap();
    let src = OwnedMr::new(&p.pd, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    let sges = [src.sge(0, 128).unwrap()];
    let op = SendOp::RdmaWrite {
        remote_addr: target.addr(),
        rkey: target.rkey() ^ 0x5a5a_0000,
    };
    p.a.post_send(&SendRequest::new(9, op, Payload::Sges(&sges)))
        .unwrap();
    let wc = wait_one(&p.cq_a);
    assert_eq!(wc.wr_id, 9);
    assert_eq!(wc.status, WcStatus::RemAccessErr, "{wc:?}");
    assert_eq!(wc.to_error(), Some(Error::Access));
    assert!(!wc.is_ok());
    let deadline = Instant::now() + TIMEOUT;
    while p.a.state().unwrap() != QpState::Error {
        assert!(Instant::now() < deadline, "QP not in error state");
        thread::sleep(Duration::from_millis(5));
    }
    // Later work requests are flushed.
    p.a.post_send(&SendRequest::new(
        10,
        SendOp::Send,
        Payload::Inline(b"late"),
    ))
    .unwrap();
    let wc = wait_one(&p.cq_a);
    assert_eq!((wc.wr_id, wc.status), (10, WcStatus::WrFlushErr));
    assert_eq!(wc.to_error(), Some(Error::Canceled));
    // to_error / reset on the healthy side.
    p.b.to_error().unwrap();
    assert_eq!(p.b.state().unwrap(), QpState::Error);
    p.b.reset().unwrap();
    assert_eq!(p.b.state().unwrap(), QpState::Reset);
}

#[test]
fn completion_channel_poll_and_asyncfd() {
    let Some(ctx) = open_or_skip("rxe0") else {
        return;
    };
    let ch = CompChannel::new(&ctx).unwrap();
    let p = rc_pair(&ctx, Some(&ch), false);
    let buf = OwnedMr::new(&p.pd, 4096, AccessFlags::LOCAL_WRITE).unwrap();

    // Nothing pending yet.
    assert!(
        ch.get_events().unwrap().is_empty(),
        "non-blocking when empty"
    );
    p.cq_b.req_notify(false).unwrap();
    assert!(!poll_readable(&*ch, Duration::ZERO).unwrap());

    for round in 0..2u64 {
        recv_then_send(&p, &buf, 100 + round, round, b"wake up");
        assert!(poll_readable(&*ch, TIMEOUT).unwrap(), "channel fd readable");
        let events = ch.get_events().unwrap();
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!((events[0].cq_id, events[0].count), (p.cq_b.id(), 1));
        assert!(ch.get_events().unwrap().is_empty());
        // Re-arm, then poll (catches completions that raced the arming).
        p.cq_b.req_notify(false).unwrap();
        let wc = wait_one(&p.cq_b);
        assert_ok(&wc, 100 + round, WcOpcode::Recv);
        assert_ok(&wait_one(&p.cq_a), round, WcOpcode::Send);
    }

    // The same through tokio's AsyncFd on a current-thread runtime.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let afd = ch.register_async().unwrap();
        p.b.post_recv(&RecvRequest {
            wr_id: 200,
            sges: &[buf.sge(0, 64).unwrap()],
        })
        .unwrap();
        p.a.post_send(&SendRequest::new(
            7,
            SendOp::Send,
            Payload::Inline(b"async"),
        ))
        .unwrap();
        let events = loop {
            let mut guard = tokio::time::timeout(TIMEOUT, afd.readable())
                .await
                .expect("AsyncFd readable in time")
                .unwrap();
            let events = guard.get_inner().get_events().unwrap();
            if events.is_empty() {
                guard.clear_ready();
                continue;
            }
            break events;
        };
        assert_eq!(events[0].cq_id, p.cq_b.id());
        p.cq_b.req_notify(false).unwrap();
        assert_ok(&wait_one(&p.cq_b), 200, WcOpcode::Recv);
        assert_ok(&wait_one(&p.cq_a), 7, WcOpcode::Send);
    });
}

#[test]
fn completion_channel_holds_one_event_per_arm() {
    let Some(ctx) = open_or_skip("rxe0") else {
        return;
    };
    let ch = CompChannel::new(&ctx).unwrap();
    let p = rc_pair(&ctx, Some(&ch), false);
    let buf = OwnedMr::new(&p.pd, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(ch.get_event().unwrap(), None, "non-blocking when empty");
    p.cq_b.req_notify(false).unwrap();
    // Two completions on one arming: one event, so the cq_poller driver's
    // single read per wake-up takes everything the channel holds.
    for round in 0..2u64 {
        recv_then_send(&p, &buf, 300 + round, round, b"one event");
        assert_ok(&wait_one(&p.cq_a), round, WcOpcode::Send);
    }
    assert!(poll_readable(&*ch, TIMEOUT).unwrap(), "channel fd readable");
    let ev = ch.get_event().unwrap().expect("one event");
    assert_eq!((ev.cq_id, ev.count), (p.cq_b.id(), 1));
    assert_eq!(ch.get_event().unwrap(), None, "disarmed: no second event");
    p.cq_b.req_notify(false).unwrap();
    assert_ok(&wait_one(&p.cq_b), 300, WcOpcode::Recv);
    assert_ok(&wait_one(&p.cq_b), 301, WcOpcode::Recv);
}

#[test]
fn ud_loopback_with_address_handle() {
    let Some(ctx) = open_or_skip("rxe0") else {
        return;
    };
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = Cq::new(&ctx, 64, None).unwrap();
    let init = QpInitAttr {
        qp_type: QpType::Ud,
        send_cq: Arc::clone(&cq),
        recv_cq: Arc::clone(&cq),
        srq: None,
        caps: caps(),
        sq_sig_all: true,
    };
    let a = QueuePair::new(&pd, &init).unwrap();
    let b = QueuePair::new(&pd, &init).unwrap();
    const QKEY: u32 = 0x1111_2222;
    a.activate_ud(1, 0, QKEY, 0).unwrap();
    b.activate_ud(1, 0, QKEY, 0).unwrap();
    assert_eq!(
        a.connect_rc(&RcConnectParams::roce(
            1,
            1,
            weft_verbs::sys::Mtu::Mtu1024,
            Gid::default(),
            0,
            0,
            0
        ))
        .unwrap_err(),
        Error::Inval
    );
    let gidx = lo_gid_index();
    let gid = ctx.query_gid(1, u32::from(gidx)).unwrap();
    let ah = AddressHandle::new(&pd, &AhAttr::roce(gid, 1, gidx, 0)).unwrap();

    let rmr = BytesMutMr::new(&pd, BytesMut::zeroed(40 + 1024), AccessFlags::LOCAL_WRITE).unwrap();
    b.post_recv(&RecvRequest {
        wr_id: 1,
        sges: &[rmr.sge().unwrap()],
    })
    .unwrap();
    let msg = Bytes::from(pattern(900, 9));
    let smr = BytesMr::new(&pd, msg.clone(), AccessFlags::NONE).unwrap();
    let sges = [smr.sge().unwrap()];
    let dest = UdDest {
        ah: &ah,
        remote_qpn: b.qp_num(),
        remote_qkey: QKEY,
    };
    // A UD send needs a destination.
    assert_eq!(
        a.post_send(&SendRequest::new(2, SendOp::Send, Payload::Sges(&sges)))
            .unwrap_err(),
        Error::Inval
    );
    a.post_send(&SendRequest::new(2, SendOp::SendWithImm(5), Payload::Sges(&sges)).ud(dest))
        .unwrap();
    let wcs = wait_cq(&cq, 2);
    let send = wcs.iter().find(|w| w.wr_id == 2).unwrap();
    assert_ok(send, 2, WcOpcode::Send);
    let recv = wcs.iter().find(|w| w.wr_id == 1).unwrap();
    assert_ok(recv, 1, WcOpcode::Recv);
    assert_eq!(recv.byte_len, 40 + 900);
    assert_eq!(recv.src_qp, a.qp_num());
    assert_eq!(recv.imm_data, Some(5));
    assert!(recv.wc_flags.contains(WcFlags::GRH));
    let got = rmr.into_inner().unwrap();
    assert_eq!(&got[40..940], &msg[..]);
}

#[test]
fn device_cannot_write_bytes_registrations() {
    let Some(ctx) = open_or_skip("rxe0") else {
        return;
    };
    // An RDMA read landing in a read-only `Bytes` registration fails and
    // leaves the bytes untouched.
    let p = rc_pair(&ctx, None, false);
    let data = Bytes::from(pattern(256, 1));
    let ro = BytesMr::new(&p.pd, data.clone(), AccessFlags::REMOTE_READ).unwrap();
    let zeros = OwnedMr::new(&p.pd, 4096, all_access()).unwrap();
    let sges = [ro.sge().unwrap()];
    let read = SendOp::RdmaRead {
        remote_addr: zeros.addr(),
        rkey: zeros.rkey(),
    };
    p.a.post_send(&SendRequest::new(1, read, Payload::Sges(&sges)))
        .unwrap();
    let wc = wait_one(&p.cq_a);
    assert!(!wc.is_ok(), "{wc:?}");
    eprintln!("RDMA read into a read-only registration: {:?}", wc.status);
    assert_eq!(ro.bytes(), &data);
    assert_eq!(ro.into_inner().unwrap(), data);

    // Peers may still read it (REMOTE_READ).
    let p = rc_pair(&ctx, None, false);
    let ro = BytesMr::new(&p.pd, data.clone(), AccessFlags::REMOTE_READ).unwrap();
    let dst = BytesMutMr::new(&p.pd, BytesMut::zeroed(256), AccessFlags::LOCAL_WRITE).unwrap();
    let sges = [dst.sge().unwrap()];
    let read = SendOp::RdmaRead {
        remote_addr: ro.addr(),
        rkey: ro.rkey(),
    };
    p.b.post_send(&SendRequest::new(2, read, Payload::Sges(&sges)))
        .unwrap();
    assert_ok(&wait_one(&p.cq_b), 2, WcOpcode::RdmaRead);
    assert_eq!(&dst.into_inner().unwrap()[..], &data[..]);
}
