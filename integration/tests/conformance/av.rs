//! Address vectors (spec/fi_av.3.md).

use std::net::SocketAddr;

use bytes::{Bytes, BytesMut};
use weft::{
    AvAttr, AvFlags, AvType, EqEventKind, Error, OpFlags, FI_ADDR_NOTAVAIL, FI_ADDR_UNSPEC,
};
use weft_integration::{next_cq, next_eq, within, Harness, Provider};

/// Raw bytes of 127.0.0.1:`port` (nothing needs to listen there).
fn sa(port: u16) -> Vec<u8> {
    weft::encode_sockaddr(&SocketAddr::from(([127, 0, 0, 1], port)))
}

/// Bytes no provider accepts as an address.
fn bad() -> Vec<u8> {
    vec![0xEE; 3]
}

async fn open_types_report_choice(p: Provider) {
    let h = Harness::connless(&p);
    for (asked, want) in [
        (AvType::Table, Some(AvType::Table)),
        (AvType::Map, Some(AvType::Map)),
        (AvType::Unspec, None),
    ] {
        let av = h.av_with(AvAttr {
            av_type: asked,
            ..AvAttr::default()
        });
        let got = av.av_type();
        assert_ne!(got, AvType::Unspec, "open must report the chosen type");
        if let Some(w) = want {
            assert_eq!(got, w, "asked for {asked:?}");
        }
        av.close().unwrap();
    }
}

async fn open_counts_are_hints(p: Provider) {
    let h = Harness::connless(&p);
    for shift in [0u32, 1, 4, 8, 12, 16] {
        let count = 1usize << shift;
        for av_type in [AvType::Table, AvType::Map] {
            let av = h.av_with(AvAttr {
                av_type,
                count,
                ..AvAttr::default()
            });
            assert!(av.is_empty());
            av.close().unwrap();
        }
    }
    // The count is not a limit: an AV for one address takes three.
    let av = h.av_with(AvAttr {
        count: 1,
        ..AvAttr::default()
    });
    let r = av
        .insert_sync(&[sa(1001), sa(1002), sa(1003)], AvFlags::empty())
        .unwrap();
    assert_eq!(r.count, 3);
    assert_eq!(av.len(), 3);
}

async fn table_indices_sequential(p: Provider) {
    let h = Harness::connless(&p);
    let av = h.av_with(AvAttr {
        av_type: AvType::Table,
        ..AvAttr::default()
    });
    let r1 = av.insert_sync(&[sa(2001)], AvFlags::empty()).unwrap();
    let r2 = av
        .insert_sync(&[sa(2002), sa(2003)], AvFlags::empty())
        .unwrap();
    assert_eq!(r1.fi_addrs, vec![0]);
    assert_eq!(r2.fi_addrs, vec![1, 2]);
    assert_eq!(av.lookup(2).unwrap(), sa(2003));
}

async fn sync_insert_good_bad(p: Provider) {
    let h = Harness::connless(&p);
    let av = h.av();
    let r = av
        .insert_sync(&[sa(3001), bad()], AvFlags::empty())
        .unwrap();
    assert_eq!(r.count, 1);
    assert_eq!(r.fi_addrs.len(), 2);
    assert_ne!(r.fi_addrs[0], FI_ADDR_NOTAVAIL);
    assert_eq!(r.fi_addrs[1], FI_ADDR_NOTAVAIL);
    assert!(r.results[0].is_ok());
    assert!(r.results[1].is_err());
    assert!(r.status.is_none(), "no status array without SYNC_ERR");
    assert_eq!(av.len(), 1);
    assert_eq!(av.lookup(r.fi_addrs[0]).unwrap(), sa(3001));
}

async fn sync_err_status_array(p: Provider) {
    let h = Harness::connless(&p);
    let av = h.av();
    let r = av
        .insert_sync(&[bad(), sa(3002), bad()], AvFlags::SYNC_ERR)
        .unwrap();
    assert_eq!(r.count, 1);
    let st = r.status.expect("SYNC_ERR gives a status array");
    assert_eq!(st.len(), 3);
    assert_eq!(st[1], 0);
    assert!(st[0] > 0 && st[2] > 0, "errors are positive codes: {st:?}");
    assert_eq!(r.fi_addrs[0], FI_ADDR_NOTAVAIL);
    assert_eq!(r.fi_addrs[2], FI_ADDR_NOTAVAIL);
}

async fn event_with_sync_err_is_badflags(p: Provider) {
    let h = Harness::connless(&p);
    let av = h.av();
    let eq = h.eq();
    av.bind_eq(&eq, 0).unwrap();
    let e = av
        .insert(&[sa(3003)], AvFlags::EVENT | AvFlags::SYNC_ERR, 1)
        .unwrap_err();
    assert_eq!(e, Error::BadFlags);
    assert!(av.is_empty(), "a rejected insert inserts nothing");
    assert!(eq.is_empty(), "a rejected insert posts no event");
}

async fn bind_eq_flags_must_be_zero(p: Provider) {
    let h = Harness::connless(&p);
    let av = h.av();
    let eq = h.eq();
    assert_eq!(av.bind_eq(&eq, 1).unwrap_err(), Error::BadFlags);
    av.bind_eq(&eq, 0).unwrap();
}

async fn event_insert_without_eq_is_noeq(p: Provider) {
    let h = Harness::connless(&p);
    let av = h.av();
    let e = av.insert(&[sa(3004)], AvFlags::EVENT, 1).unwrap_err();
    assert_eq!(e, Error::NoEq);
    // An AV opened with FI_EVENT needs the EQ for every insert.
    let av2 = h.av_with(AvAttr {
        flags: AvFlags::EVENT,
        ..AvAttr::default()
    });
    assert_eq!(
        av2.insert(&[sa(3004)], AvFlags::empty(), 1).unwrap_err(),
        Error::NoEq
    );
}

/// Reads the events of one `FI_EVENT` insert: the error entries (in
/// order), then the completion.
async fn read_insert_events(
    eq: &weft::EventQueue,
    av_fid: u64,
    ctx: u64,
) -> (Vec<weft::EqErrEntry>, weft::EqEvent) {
    let mut errs = Vec::new();
    loop {
        match next_eq(eq).await {
            Err(e) => {
                assert_eq!(e.fid, av_fid, "error event fid is the AV");
                assert_eq!(e.context, ctx, "error event context is the insert's");
                assert!(e.err.code() > 0);
                errs.push(e);
            }
            Ok(ev) => {
                assert_eq!(ev.kind, EqEventKind::AvComplete);
                assert_eq!(ev.fid, av_fid);
                assert_eq!(ev.context, ctx);
                return (errs, ev);
            }
        }
    }
}

async fn event_insert_errors_then_one_completion(p: Provider) {
    let h = Harness::connless(&p);
    let av = h.av();
    let eq = h.eq();
    av.bind_eq(&eq, 0).unwrap();
    let ins = av
        .insert(&[sa(4001), bad(), sa(4002), bad()], AvFlags::EVENT, 0x77)
        .unwrap();
    let (errs, done) = read_insert_events(&eq, av.fid(), 0x77).await;
    assert_eq!(
        errs.iter().map(|e| e.data).collect::<Vec<_>>(),
        vec![1, 3],
        "one error per failed address, data = its index"
    );
    assert_eq!(done.data, 2, "completion data = success count");
    assert!(eq.is_empty(), "exactly one completion per insert");
    let report = within("insert future", ins).await;
    assert_eq!(report.count, 2);
    assert_eq!(report.fi_addrs[1], FI_ADDR_NOTAVAIL);
    assert_eq!(av.lookup(report.fi_addrs[2]).unwrap(), sa(4002));
}

async fn event_insert_zero_addresses(p: Provider) {
    let h = Harness::connless(&p);
    let av = h.av();
    let eq = h.eq();
    av.bind_eq(&eq, 0).unwrap();
    let ins = av.insert(&[], AvFlags::EVENT, 5).unwrap();
    let (errs, done) = read_insert_events(&eq, av.fid(), 5).await;
    assert!(errs.is_empty());
    assert_eq!(done.data, 0);
    assert!(eq.is_empty());
    assert_eq!(within("insert future", ins).await.count, 0);
}

async fn event_insert_all_bad(p: Provider) {
    let h = Harness::connless(&p);
    let av = h.av();
    let eq = h.eq();
    av.bind_eq(&eq, 0).unwrap();
    av.insert(&[bad(), bad(), bad()], AvFlags::EVENT, 6)
        .unwrap();
    let (errs, done) = read_insert_events(&eq, av.fid(), 6).await;
    assert_eq!(
        errs.iter().map(|e| e.data).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert_eq!(done.data, 0);
    assert!(eq.is_empty());
    assert!(av.is_empty());
}

async fn event_av_open_flag_makes_inserts_async(p: Provider) {
    let h = Harness::connless(&p);
    let av = h.av_with(AvAttr {
        flags: AvFlags::EVENT,
        ..AvAttr::default()
    });
    let eq = h.eq();
    av.bind_eq(&eq, 0).unwrap();
    let ins = av
        .insert(&[sa(4101), sa(4102)], AvFlags::empty(), 9)
        .unwrap();
    let (errs, done) = read_insert_events(&eq, av.fid(), 9).await;
    assert!(errs.is_empty());
    assert_eq!(done.data, 2);
    assert_eq!(within("insert future", ins).await.count, 2);
}

async fn more_flag_accepted(p: Provider) {
    let h = Harness::connless(&p);
    let av = h.av();
    let r1 = av.insert_sync(&[sa(4201)], AvFlags::MORE).unwrap();
    let r2 = av.insert_sync(&[sa(4202)], AvFlags::empty()).unwrap();
    assert_eq!(r1.count + r2.count, 2);
    assert_eq!(av.len(), 2);
}

async fn remove_then_insert_reuses_index0(p: Provider) {
    let h = Harness::connless(&p);
    let av = h.av_with(AvAttr {
        av_type: AvType::Table,
        ..AvAttr::default()
    });
    let r = av
        .insert_sync(&[sa(5001), sa(5002)], AvFlags::empty())
        .unwrap();
    assert_eq!(r.fi_addrs, vec![0, 1]);
    av.remove(&[0]).unwrap();
    assert_eq!(av.lookup(0).unwrap_err(), Error::Inval);
    let r = av.insert_sync(&[sa(5003)], AvFlags::empty()).unwrap();
    assert_eq!(r.fi_addrs, vec![0], "lowest unused index is reused");
    assert_eq!(av.lookup(0).unwrap(), sa(5003));
    assert_eq!(av.lookup(1).unwrap(), sa(5002));
}

async fn remove_and_reinsert_same_address(p: Provider) {
    let h = Harness::connless(&p);
    for av_type in [AvType::Table, AvType::Map] {
        let av = h.av_with(AvAttr {
            av_type,
            ..AvAttr::default()
        });
        let a = av
            .insert_sync(&[sa(5101)], AvFlags::empty())
            .unwrap()
            .fi_addrs[0];
        av.remove(&[a]).unwrap();
        let b = av.insert_sync(&[sa(5101)], AvFlags::empty()).unwrap();
        assert_eq!(b.count, 1, "{av_type:?}: re-insertion after removal");
        assert_eq!(av.lookup(b.fi_addrs[0]).unwrap(), sa(5101));
        if av_type == AvType::Map && b.fi_addrs[0] != a {
            assert_eq!(
                av.lookup(a).unwrap_err(),
                Error::Inval,
                "a stale MAP handle stays invalid"
            );
        }
    }
}

async fn remove_twice_and_unknown_are_inval(p: Provider) {
    let h = Harness::connless(&p);
    for av_type in [AvType::Table, AvType::Map] {
        let av = h.av_with(AvAttr {
            av_type,
            ..AvAttr::default()
        });
        let a = av
            .insert_sync(&[sa(5201)], AvFlags::empty())
            .unwrap()
            .fi_addrs[0];
        av.remove(&[a]).unwrap();
        assert_eq!(av.remove(&[a]).unwrap_err(), Error::Inval, "{av_type:?}");
        assert_eq!(av.lookup(a).unwrap_err(), Error::Inval, "{av_type:?}");
        assert_eq!(av.remove(&[1000]).unwrap_err(), Error::Inval);
        assert_eq!(av.lookup(1000).unwrap_err(), Error::Inval);
        assert_eq!(av.lookup(FI_ADDR_NOTAVAIL).unwrap_err(), Error::Inval);
    }
}

async fn lookup_never_inserted_is_inval(p: Provider) {
    let h = Harness::connless(&p);
    let av = h.av();
    let mut buf = [0u8; 32];
    assert_eq!(av.lookup(0).unwrap_err(), Error::Inval);
    assert_eq!(av.lookup_into(0, &mut buf).unwrap_err(), Error::Inval);
}

async fn lookup_truncates_and_reports_full_length(p: Provider) {
    let h = Harness::connless(&p);
    let av = h.av();
    let a = av
        .insert_sync(&[sa(5301)], AvFlags::empty())
        .unwrap()
        .fi_addrs[0];
    let full = sa(5301);
    let mut big = vec![0u8; 64];
    assert_eq!(av.lookup_into(a, &mut big).unwrap(), full.len());
    assert_eq!(&big[..full.len()], &full[..]);
    let mut small = [0u8; 4];
    assert_eq!(av.lookup_into(a, &mut small).unwrap(), full.len());
    assert_eq!(&small[..], &full[..4]);
    assert_eq!(av.lookup_into(a, &mut []).unwrap(), full.len());
}

async fn straddr_printable_and_truncated(p: Provider) {
    let h = Harness::connless(&p);
    let av = h.av();
    let s = av.straddr(&sa(5401));
    assert_eq!(s, "fi_sockaddr_in://127.0.0.1:5401");
    let mut buf = [0xFFu8; 10];
    let n = av.straddr_into(&sa(5401), &mut buf);
    assert_eq!(n, s.len() + 1, "full length including the NUL");
    assert_eq!(&buf[..9], &s.as_bytes()[..9]);
    assert_eq!(buf[9], 0, "truncated copy is NUL-terminated");
    let mut big = [0xFFu8; 64];
    assert_eq!(av.straddr_into(&sa(5401), &mut big), s.len() + 1);
    assert_eq!(&big[..s.len()], s.as_bytes());
    assert_eq!(big[s.len()], 0);
}

async fn insert_svc_numeric_and_localhost(p: Provider) {
    let h = Harness::connless(&p);
    let av = h.av();
    let r = within(
        "insert_svc numeric",
        av.insert_svc("127.0.0.1", "6001", AvFlags::empty(), 0)
            .unwrap(),
    )
    .await;
    assert_eq!(r.count, 1);
    assert_eq!(av.lookup(r.fi_addrs[0]).unwrap(), sa(6001));

    let r = within(
        "insert_svc localhost",
        av.insert_svc("localhost", "6002", AvFlags::empty(), 0)
            .unwrap(),
    )
    .await;
    assert_eq!(r.count, 1, "localhost resolves: {:?}", r.results);
    let got = weft::decode_sockaddr(&av.lookup(r.fi_addrs[0]).unwrap()).unwrap();
    assert!(got.ip().is_loopback());
    assert_eq!(got.port(), 6002);
    assert_ne!(r.fi_addrs[0], FI_ADDR_NOTAVAIL);
    assert_eq!(av.len(), 2);

    // A bad service fails the address, not the call.
    let r = within(
        "insert_svc bad service",
        av.insert_svc("localhost", "not-a-port", AvFlags::empty(), 0)
            .unwrap(),
    )
    .await;
    assert_eq!(r.count, 0);
    assert_eq!(r.fi_addrs, vec![FI_ADDR_NOTAVAIL]);
    assert_eq!(av.len(), 2);
}

async fn insert_svc_event_reports_on_eq(p: Provider) {
    let h = Harness::connless(&p);
    let av = h.av();
    let eq = h.eq();
    av.bind_eq(&eq, 0).unwrap();
    av.insert_svc("localhost", "6101", AvFlags::EVENT, 0x33)
        .unwrap();
    let (errs, done) = read_insert_events(&eq, av.fid(), 0x33).await;
    assert!(errs.is_empty(), "{errs:?}");
    assert_eq!(done.data, 1);
}

async fn insert_sym_order(p: Provider) {
    let h = Harness::connless(&p);
    let av = h.av_with(AvAttr {
        av_type: AvType::Table,
        ..AvAttr::default()
    });
    let r = within(
        "insert_sym",
        av.insert_sym("127.0.0.1", 2, "7000", 2, AvFlags::empty(), 0)
            .unwrap(),
    )
    .await;
    assert_eq!(r.count, 4);
    let got: Vec<SocketAddr> = r
        .fi_addrs
        .iter()
        .map(|&a| weft::decode_sockaddr(&av.lookup(a).unwrap()).unwrap())
        .collect();
    let want: Vec<SocketAddr> = [
        "127.0.0.1:7000",
        "127.0.0.1:7001",
        "127.0.0.2:7000",
        "127.0.0.2:7001",
    ]
    .iter()
    .map(|s| s.parse().unwrap())
    .collect();
    assert_eq!(got, want, "all services of a node before the next node");
    assert_eq!(
        av.insert_sym("127.0.0.1", 0, "7000", 1, AvFlags::empty(), 0)
            .unwrap_err(),
        Error::Inval
    );
}

async fn close_with_bound_endpoint_is_busy(p: Provider) {
    let h = Harness::connless(&p);
    let av = h.av();
    let ep = h.endpoint();
    ep.bind_av(&av).unwrap();
    assert_eq!(av.clone().close().unwrap_err(), Error::Busy);
    ep.close().unwrap();
    av.close().unwrap();
}

async fn close_with_enabled_endpoint_is_busy(p: Provider) {
    let h = Harness::connless(&p);
    let e = h.rdm_ep();
    assert_eq!(e.av.clone().close().unwrap_err(), Error::Busy);
    e.ep.close().unwrap();
    e.av.clone().close().unwrap();
}

async fn user_id_reported_as_source(p: Provider) {
    let h = Harness::connless(&p);
    let uid_av = h.av_with(AvAttr {
        flags: AvFlags::AV_USER_ID,
        ..AvAttr::default()
    });
    let rx = h.rdm_ep_with(&h.info, uid_av, weft::BindFlags::empty());
    let tx = h.rdm_ep();
    let rx_in_tx = tx.insert(&rx);
    let tx_in_rx = rx.insert(&tx);

    // Until set, the source is FI_ADDR_NOTAVAIL.
    tx.ep
        .post_send(rx_in_tx, Bytes::from_static(b"one"), 1)
        .unwrap();
    rx.ep.post_recv(BytesMut::zeroed(16), 2).unwrap();
    let e = next_cq(&rx.cq).await.unwrap();
    assert_eq!(e.context, 2);
    assert_eq!(e.src, FI_ADDR_NOTAVAIL);

    rx.av.set_user_id(tx_in_rx, 0xABCD).unwrap();
    tx.ep
        .post_send(rx_in_tx, Bytes::from_static(b"two"), 3)
        .unwrap();
    rx.ep.post_recv(BytesMut::zeroed(16), 4).unwrap();
    let e = next_cq(&rx.cq).await.unwrap();
    assert_eq!(e.context, 4);
    assert!(e.flags.contains(OpFlags::RECV));
    assert_eq!(e.src, 0xABCD, "completions report the user id");
    assert_eq!(&e.into_bytes()[..], b"two");

    // A new id shows on the next message, also when its receive was
    // posted first (the message completes it as it arrives).
    rx.av.set_user_id(tx_in_rx, 0x1234).unwrap();
    rx.ep.post_recv(BytesMut::zeroed(16), 6).unwrap();
    tx.ep
        .post_send(rx_in_tx, Bytes::from_static(b"three"), 5)
        .unwrap();
    let e = next_cq(&rx.cq).await.unwrap();
    assert_eq!(e.context, 6);
    assert_eq!(e.src, 0x1234, "completions report the id set last");

    // The sender's CQ saw every send complete.
    for want in [1, 3, 5] {
        assert_eq!(next_cq(&tx.cq).await.unwrap().context, want);
    }
    // set_user_id on an AV opened without AV_USER_ID is Inval.
    assert_eq!(tx.av.set_user_id(rx_in_tx, 1).unwrap_err(), Error::Inval);
    // ... and on a handle that is not live.
    assert_eq!(rx.av.set_user_id(777, 1).unwrap_err(), Error::Inval);
    let _ = FI_ADDR_UNSPEC;
}

async fn close_after_endpoint_dropped(p: Provider) {
    let h = Harness::connless(&p);
    let av = h.av();
    {
        let e = h.rdm_ep_with(&h.info, av.clone(), weft::BindFlags::empty());
        assert_eq!(av.clone().close().unwrap_err(), Error::Busy);
        drop(e);
    }
    av.close().unwrap();
}

/// A per-insert `FI_AV_USER_ID`: the ids given with the insert are what
/// completions report as the source; the flag without ids, mismatched
/// lengths, or ids on an AV opened with `FI_AV_USER_ID` are `Inval`.
async fn per_insert_user_id_reported_as_source(p: Provider) {
    let h = Harness::connless(&p);
    let rx = h.rdm_ep();
    let tx = h.rdm_ep();
    let rx_in_tx = tx.insert(&rx);
    let tx_addr = vec![tx.addr()];
    assert_eq!(
        rx.av.insert(&tx_addr, AvFlags::AV_USER_ID, 0).unwrap_err(),
        Error::Inval,
        "the flag without ids"
    );
    assert_eq!(
        rx.av
            .insert_with_user_ids(&tx_addr, &[1, 2], AvFlags::empty(), 0)
            .unwrap_err(),
        Error::Inval,
        "one id per address"
    );
    let r = within(
        "insert",
        rx.av
            .insert_with_user_ids(&tx_addr, &[0xFEED], AvFlags::empty(), 0)
            .unwrap(),
    )
    .await;
    assert_eq!(r.count, 1);
    tx.ep
        .post_send(rx_in_tx, Bytes::from_static(b"id"), 1)
        .unwrap();
    rx.ep.post_recv(BytesMut::zeroed(16), 2).unwrap();
    let e = next_cq(&rx.cq).await.unwrap();
    assert_eq!(e.context, 2);
    assert_eq!(e.src, 0xFEED, "completions report the insert's user id");

    let uid_av = h.av_with(AvAttr {
        flags: AvFlags::AV_USER_ID,
        ..AvAttr::default()
    });
    assert_eq!(
        uid_av
            .insert_with_user_ids(&tx_addr, &[3], AvFlags::empty(), 0)
            .unwrap_err(),
        Error::Inval,
        "AVs opened with AV_USER_ID take ids through set_user_id"
    );
}

/// `FI_ADDR_STR`: hints asking for the string format get it; addresses
/// then cross the API as `fi_sockaddr_in://ip:port` strings (local
/// address, insert, lookup, straddr), and messages flow as before.
async fn string_addresses(p: Provider) {
    let mut hints = p.info(p.connless_type());
    hints.addr_format = weft::AddrFormat::Str;
    hints.src_addr = None;
    let info = weft::getinfo(Some(&hints)).unwrap().remove(0);
    assert_eq!(info.addr_format, weft::AddrFormat::Str);
    let fabric = weft::Fabric::open(&info).unwrap();
    let domain = fabric.domain(&info).unwrap();
    let open = || {
        let av = domain.av(AvAttr::default()).unwrap();
        let (ep, cq) =
            weft_integration::enabled_endpoint(&domain, &info, &av, weft::WaitMode::Interrupt);
        (ep, av, cq)
    };
    let (a, a_av, _a_cq) = open();
    let (b, _b_av, _b_cq) = open();
    let b_addr = b.local_addr().unwrap();
    let s = String::from_utf8(b_addr.clone()).unwrap();
    assert!(s.starts_with("fi_sockaddr_in"), "{s}");
    // A C caller's NUL-terminated string is taken too; garbage is not.
    let mut with_nul = b_addr.clone();
    with_nul.push(0);
    let r = a_av
        .insert_sync(
            &[with_nul, b"fi_sockaddr_in://not-an-ip:1".to_vec()],
            Default::default(),
        )
        .unwrap();
    assert_eq!(r.count, 1);
    assert_eq!(r.fi_addrs[1], weft::FI_ADDR_NOTAVAIL);
    let dest = r.fi_addrs[0];
    assert_eq!(a_av.lookup(dest).unwrap(), b_addr);
    assert_eq!(a_av.straddr(&b_addr), s);
    let recv = b.trecv(BytesMut::zeroed(8), FI_ADDR_UNSPEC, 3, 0);
    let send = a.tsend(dest, Bytes::from_static(b"strings"), 3);
    let (got, sent) = within("exchange", async { tokio::join!(recv, send) }).await;
    sent.unwrap();
    assert_eq!(&got.unwrap().bufs[0][..7], b"strings");
}

provider_tests! {
    string_addresses,
    per_insert_user_id_reported_as_source,
    close_after_endpoint_dropped,
    open_types_report_choice,
    open_counts_are_hints,
    table_indices_sequential,
    sync_insert_good_bad,
    sync_err_status_array,
    event_with_sync_err_is_badflags,
    bind_eq_flags_must_be_zero,
    event_insert_without_eq_is_noeq,
    event_insert_errors_then_one_completion,
    event_insert_zero_addresses,
    event_insert_all_bad,
    event_av_open_flag_makes_inserts_async,
    more_flag_accepted,
    remove_then_insert_reuses_index0,
    remove_and_reinsert_same_address,
    remove_twice_and_unknown_are_inval,
    lookup_never_inserted_is_inval,
    lookup_truncates_and_reports_full_length,
    straddr_printable_and_truncated,
    insert_svc_numeric_and_localhost,
    insert_svc_event_reports_on_eq,
    insert_sym_order,
    close_with_bound_endpoint_is_busy,
    close_with_enabled_endpoint_is_busy,
    user_id_reported_as_source,
}

// The cases that apply to udp's FI_EP_DGRAM endpoints.
udp_tests! {
    string_addresses,
    per_insert_user_id_reported_as_source,
    close_after_endpoint_dropped,
    open_types_report_choice,
    open_counts_are_hints,
    table_indices_sequential,
    sync_insert_good_bad,
    sync_err_status_array,
    event_with_sync_err_is_badflags,
    bind_eq_flags_must_be_zero,
    event_insert_without_eq_is_noeq,
    event_insert_errors_then_one_completion,
    event_insert_zero_addresses,
    event_insert_all_bad,
    event_av_open_flag_makes_inserts_async,
    more_flag_accepted,
    remove_then_insert_reuses_index0,
    remove_and_reinsert_same_address,
    remove_twice_and_unknown_are_inval,
    lookup_never_inserted_is_inval,
    lookup_truncates_and_reports_full_length,
    straddr_printable_and_truncated,
    insert_svc_numeric_and_localhost,
    insert_svc_event_reports_on_eq,
    insert_sym_order,
    close_with_bound_endpoint_is_busy,
    close_with_enabled_endpoint_is_busy,
    user_id_reported_as_source,
}

// The cases that apply to shm. The others insert made-up socket
// addresses (shm addresses are names of endpoints that exist: an insert
// of one that does not waits for it) or host names and services.
shm_tests! {
    per_insert_user_id_reported_as_source,
    close_after_endpoint_dropped,
    open_types_report_choice,
    event_with_sync_err_is_badflags,
    bind_eq_flags_must_be_zero,
    event_insert_without_eq_is_noeq,
    event_insert_zero_addresses,
    event_insert_all_bad,
    lookup_never_inserted_is_inval,
    straddr_printable_and_truncated,
    close_with_bound_endpoint_is_busy,
    close_with_enabled_endpoint_is_busy,
    user_id_reported_as_source,
}
