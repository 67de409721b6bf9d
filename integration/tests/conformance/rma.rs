//! RMA (spec/fi_rma.3.txt) between two RDM endpoints of the same
//! domain, written against what the offer says: keys and addresses come
//! from the target's regions (`key()`, `addr() + offset`), so the same
//! test holds for provider keys with virtual addresses (verbs) and
//! requested keys with offsets (tcp).

use bytes::{Bytes, BytesMut};
use weft::{
    BindFlags, Caps, EpType, Error, MemoryRegion, MrAccess, MrAttr, OpFlags, RmaMsg, RmaOp,
};
use weft_integration::{assert_cq_quiet, next_cq, payload, within, Harness, Provider, RdmEp};

const RW: MrAccess = MrAccess::REMOTE_READ.union(MrAccess::REMOTE_WRITE);

fn harness(p: &Provider) -> Harness {
    Harness::with_info(p, p.rma_info(EpType::Rdm))
}

fn region(h: &Harness, len: usize, access: MrAccess, key: u64) -> MemoryRegion {
    h.domain
        .mr_regattr(MrAttr::alloc(len, access).requested_key(key))
        .expect("region")
}

/// A message from `from` to `to` still goes through.
async fn still_talks(from: &RdmEp, to: &RdmEp, dest: weft::FiAddr, n: u64) {
    let msg = Bytes::from(format!("after {n}"));
    let (got, sent) = within("send after a failed RMA", async {
        tokio::join!(
            to.ep.recv(BytesMut::zeroed(64)),
            from.ep.send(dest, msg.clone())
        )
    })
    .await;
    sent.unwrap();
    assert_eq!(&got.unwrap().into_bytes()[..], &msg[..]);
}

/// Hints asking for RMA get it, with at least one remote segment per
/// operation; RMA without READ/WRITE or their remote forms stands for
/// all of them (fi_getinfo(3)), so none of those may be there alone.
async fn offers_rma(p: Provider) {
    let info = p.rma_info(EpType::Rdm);
    assert!(info.caps.contains(Caps::RMA), "{:?}", info.caps);
    let dirs = Caps::READ | Caps::WRITE | Caps::REMOTE_READ | Caps::REMOTE_WRITE;
    assert!(
        !info.caps.intersects(dirs) || info.caps.contains(dirs),
        "{:?}",
        info.caps
    );
    assert!(info.tx_attr.caps.contains(Caps::RMA));
    assert!(info.tx_attr.rma_iov_limit >= 1);
    assert!(info.domain_attr.mr_key_size > 0);
}

/// Writes of every size land at their offsets and read back the same;
/// the target's CQ stays quiet (RMA is one-sided).
async fn write_then_read_back(p: Provider) {
    let h = harness(&p);
    let (a, b, to_b, _) = h.rdm_pair_with(&h.info);
    const LEN: usize = 3 << 20;
    let mr = region(&h, LEN, RW, 11);
    assert_eq!(mr.to_vec().unwrap(), vec![0u8; LEN], "regions start zeroed");
    let mut off = 0usize;
    for (i, len) in [1usize, 64, 4096, 65_537, 300_000, 1 << 20]
        .into_iter()
        .enumerate()
    {
        let data = payload(len, i as u8 + 1);
        let at = mr.addr() + off as u64;
        let e = within("write", a.ep.write(to_b, data.clone(), at, mr.key()))
            .await
            .unwrap();
        assert_eq!(e.len, len);
        assert!(e.flags.contains(OpFlags::RMA | OpFlags::WRITE));
        let mut got = vec![0u8; len];
        mr.read_at(off, &mut got).unwrap();
        assert_eq!(got, data, "write of {len} at {off}");
        let e = within("read", a.ep.read(to_b, BytesMut::zeroed(len), at, mr.key()))
            .await
            .unwrap();
        assert!(e.flags.contains(OpFlags::RMA | OpFlags::READ));
        assert_eq!(e.len, len);
        assert_eq!(&e.into_bytes()[..], &data[..], "read of {len} at {off}");
        off += len;
    }
    let mut one = [0xffu8; 1];
    mr.read_at(off, &mut one).unwrap();
    assert_eq!(one, [0], "nothing past the last write");
    assert_cq_quiet(&b.cq, "target CQ after RMA").await;
}

/// Gathered writes and scattered reads through `post_rmamsg`, reported
/// with their contexts on the CQ and counted on READ/WRITE counters.
async fn gather_scatter_and_counters(p: Provider) {
    let h = harness(&p);
    let (wc, rc) = (h.domain.counter().unwrap(), h.domain.counter().unwrap());
    let a = {
        let (av, cq) = (h.av(), h.cq());
        let ep = h.domain.endpoint(&h.info).unwrap();
        ep.bind_av(&av).unwrap();
        ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
            .unwrap();
        ep.bind_counter(&wc, BindFlags::WRITE).unwrap();
        ep.bind_counter(&rc, BindFlags::READ).unwrap();
        ep.enable().unwrap();
        RdmEp { ep, av, cq }
    };
    let b = h.rdm_ep();
    let to_b = a.insert(&b);
    b.insert(&a);
    let mr = region(&h, 4096, RW, 21);
    a.ep.post_rmamsg(
        RmaMsg {
            dest: to_b,
            op: RmaOp::Write {
                iov: vec![
                    Bytes::from_static(b"hello, "),
                    Bytes::from_static(b"gathered "),
                    Bytes::from_static(b"region"),
                ],
                data: None,
            },
            addr: mr.addr() + 10,
            key: mr.key(),
            context: 77,
        },
        OpFlags::empty(),
    )
    .unwrap();
    let e = within("write completion", next_cq(&a.cq)).await.unwrap();
    assert_eq!((e.context, e.len), (77, 22));
    let mut got = [0u8; 22];
    mr.read_at(10, &mut got).unwrap();
    assert_eq!(&got, b"hello, gathered region");
    a.ep.post_rmamsg(
        RmaMsg {
            dest: to_b,
            op: RmaOp::Read {
                bufs: vec![
                    BytesMut::zeroed(5),
                    BytesMut::zeroed(9),
                    BytesMut::zeroed(8),
                ],
            },
            addr: mr.addr() + 10,
            key: mr.key(),
            context: 78,
        },
        OpFlags::empty(),
    )
    .unwrap();
    let e = within("read completion", next_cq(&a.cq)).await.unwrap();
    assert_eq!((e.context, e.len), (78, 22));
    let lens: Vec<usize> = e.bufs.iter().map(|b| b.len()).collect();
    assert_eq!(lens, [5, 9, 8], "each buffer filled in order");
    assert_eq!(&e.into_bytes()[..], b"hello, gathered region");
    assert_eq!((wc.read(), rc.read()), (1, 1));
    // A failed read counts as an error on the READ counter.
    let e = within(
        "bad read",
        a.ep.read(to_b, BytesMut::zeroed(4), mr.addr() + 4094, mr.key()),
    )
    .await
    .unwrap_err();
    assert_eq!(e.err, Error::Access);
    assert_eq!((rc.read(), rc.read_err()), (1, 1));
}

/// `writedata`: the target sees a receive-CQ entry with the data, the
/// length and `FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA`, without a posted
/// receive (RDM has no `FI_RX_CQ_DATA`).
async fn writedata_reports_at_the_target(p: Provider) {
    let h = harness(&p);
    let (a, b, to_b, _) = h.rdm_pair_with(&h.info);
    let mr = region(&h, 1024, MrAccess::REMOTE_WRITE, 31);
    let e = within(
        "writedata",
        a.ep.writedata(
            to_b,
            Bytes::from_static(b"note"),
            0xabcd,
            mr.addr() + 8,
            mr.key(),
        ),
    )
    .await
    .unwrap();
    assert_eq!(e.len, 4);
    let t = within("target entry", next_cq(&b.cq)).await.unwrap();
    assert!(
        t.flags
            .contains(OpFlags::RMA | OpFlags::REMOTE_WRITE | OpFlags::REMOTE_CQ_DATA),
        "{:?}",
        t.flags
    );
    assert_eq!((t.data, t.len), (0xabcd, 4));
    let mut got = [0u8; 4];
    mr.read_at(8, &mut got).unwrap();
    assert_eq!(&got, b"note", "the bytes landed before the entry");
    // A plain write reports nothing at the target.
    a.ep.write(to_b, Bytes::from_static(b"x"), mr.addr(), mr.key())
        .await
        .unwrap();
    assert_cq_quiet(&b.cq, "plain write").await;
}

/// A wrong key, a range past either end, a missing right: the
/// initiator's operation fails with `FI_EACCES`, the target's memory is
/// untouched, and the two endpoints go on talking (messages and RMA).
async fn refused_rma_fails_with_access_and_the_peer_stays_usable(p: Provider) {
    let h = harness(&p);
    let (a, b, to_b, _) = h.rdm_pair_with(&h.info);
    let mr = region(&h, 4096, RW, 41);
    let ro = region(&h, 4096, MrAccess::REMOTE_READ, 42);
    let wo = region(&h, 4096, MrAccess::REMOTE_WRITE, 43);
    mr.write_at(0, &payload(4096, 9)).unwrap();
    let before = (mr.to_vec().unwrap(), ro.to_vec().unwrap());
    let bad_key = mr.key() ^ 0x5a5a;
    let writes = [
        ("wrong key", mr.addr(), bad_key),
        ("past the end", mr.addr() + 4095, mr.key()),
        ("below the start", mr.addr().wrapping_sub(8), mr.key()),
        ("far past the end", u64::MAX - 1, mr.key()),
        ("no remote write", ro.addr(), ro.key()),
    ];
    let mut n = 0;
    for (what, addr, key) in writes {
        let e = within(what, a.ep.write(to_b, Bytes::from_static(b"12"), addr, key))
            .await
            .expect_err(what);
        assert_eq!(e.err, Error::Access, "{what}");
        assert!(e.flags.contains(OpFlags::RMA | OpFlags::WRITE), "{what}");
        assert_eq!(
            (mr.to_vec().unwrap(), ro.to_vec().unwrap()),
            before,
            "{what}: memory untouched"
        );
        n += 1;
        still_talks(&a, &b, to_b, n).await;
    }
    let reads = [
        ("wrong key", mr.addr(), bad_key),
        ("past the end", mr.addr() + 4090, mr.key()),
        ("below the start", mr.addr().wrapping_sub(1), mr.key()),
        ("no remote read", wo.addr(), wo.key()),
    ];
    for (what, addr, key) in reads {
        let e = within(what, a.ep.read(to_b, BytesMut::zeroed(16), addr, key))
            .await
            .expect_err(what);
        assert_eq!(e.err, Error::Access, "{what}");
        assert_eq!(
            e.bufs.iter().map(|b| b.len()).sum::<usize>(),
            16,
            "{what}: buffer back"
        );
        n += 1;
        still_talks(&a, &b, to_b, n).await;
    }
    // A closed region's key stops working at once.
    let gone = region(&h, 64, RW, 44);
    let (addr, key) = (gone.addr(), gone.key());
    gone.close().unwrap();
    let e = within(
        "closed key",
        a.ep.write(to_b, Bytes::from_static(b"z"), addr, key),
    )
    .await
    .expect_err("closed key");
    assert_eq!(e.err, Error::Access);
    // And RMA itself still works on the same pair.
    within(
        "good write",
        a.ep.write(to_b, Bytes::from_static(b"ok"), mr.addr() + 100, mr.key()),
    )
    .await
    .unwrap();
    let mut got = [0u8; 2];
    mr.read_at(100, &mut got).unwrap();
    assert_eq!(&got, b"ok");
}

/// `fi_inject_write` and `fi_inject_writedata`: the bytes land and the
/// initiator gets no completion (the target's entry carries the data);
/// past `inject_size` is `MsgSize`, an inject read `BadFlags`, and an
/// inject the target refuses still reports its error.
async fn inject_writes_land_without_a_completion(p: Provider) {
    let h = harness(&p);
    let (a, b, to_b, _) = h.rdm_pair_with(&h.info);
    let mr = region(&h, 4096, RW, 51);
    let inject = h.info.tx_attr.inject_size;
    let n = inject.min(32);
    assert!(n > 0, "inject_size {inject}");
    let data = payload(n, 5);
    a.ep.inject_write(to_b, data.clone(), mr.addr() + 16, mr.key())
        .unwrap();
    within("the injected bytes land", async {
        loop {
            let mut got = vec![0u8; n];
            mr.read_at(16, &mut got).unwrap();
            if got[..] == data[..] {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    })
    .await;
    a.ep.inject_writedata(
        to_b,
        Bytes::from_static(b"wd"),
        0x77,
        mr.addr() + 200,
        mr.key(),
    )
    .unwrap();
    let t = within("target entry", next_cq(&b.cq)).await.unwrap();
    assert!(t.flags.contains(OpFlags::REMOTE_CQ_DATA), "{:?}", t.flags);
    assert_eq!((t.data, t.len), (0x77, 2));
    let mut got = [0u8; 2];
    mr.read_at(200, &mut got).unwrap();
    assert_eq!(&got, b"wd");
    assert_cq_quiet(&a.cq, "inject writes").await;
    assert_eq!(
        a.ep.inject_write(to_b, payload(inject + 1, 1), mr.addr(), mr.key()),
        Err(Error::MsgSize)
    );
    let read = RmaMsg {
        dest: to_b,
        op: RmaOp::Read {
            bufs: vec![BytesMut::zeroed(8)],
        },
        addr: mr.addr(),
        key: mr.key(),
        context: 9,
    };
    assert_eq!(
        a.ep.post_rmamsg(read, OpFlags::INJECT).unwrap_err().0,
        Error::BadFlags
    );
    a.ep.inject_write(
        to_b,
        Bytes::from_static(b"no"),
        mr.addr(),
        mr.key() ^ 0x5a5a,
    )
    .unwrap();
    let e = within("the refusal", next_cq(&a.cq)).await.unwrap_err();
    assert_eq!(e.err, Error::Access);
    let mut got = [0u8; 2];
    mr.read_at(0, &mut got).unwrap();
    assert_ne!(&got, b"no", "a refused inject leaves the region alone");
}

provider_tests! {
    inject_writes_land_without_a_completion,
    offers_rma,
    write_then_read_back,
    gather_scatter_and_counters,
    writedata_reports_at_the_target,
    refused_rma_fails_with_access_and_the_peer_stays_usable,
}

shm_tests! {
    inject_writes_land_without_a_completion,
    offers_rma,
    write_then_read_back,
    gather_scatter_and_counters,
    writedata_reports_at_the_target,
    refused_rma_fails_with_access_and_the_peer_stays_usable,
}
