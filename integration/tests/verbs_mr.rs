//! Remote access to application buffers registered in place and to
//! sub-regions, over the verbs provider on soft-RoCE (the VM of
//! `integration/run-rxe`): an RDM client on rxe2 writes and reads a
//! server's regions on rxe1 through their keys; each sub-region's key
//! reaches its own range with its own rights and nothing else.
//!
//! Outside the VM every test prints why it is skipped; inside it a missing
//! device is a failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bytes::{Bytes, BytesMut};
use weft::{Caps, EpType, Error, FiAddr, Info, MrAccess, MrAttr, MrMode, WaitMode};
use weft_integration::{payload, verbs_offer_with, within, Node};

const RW: MrAccess = MrAccess::REMOTE_READ.union(MrAccess::REMOTE_WRITE);

fn offer(dev: &str) -> Option<Info> {
    verbs_offer_with(dev, EpType::Rdm, |h| {
        h.caps = Caps::MSG | Caps::TAGGED | Caps::RMA;
        h.domain_attr.mr_mode = MrMode::PROV_KEY | MrMode::VIRT_ADDR;
    })
}

fn pair() -> Option<(Node, Node, FiAddr)> {
    let s = Node::open(&offer("rxe1")?, WaitMode::Interrupt);
    let c = Node::open(&offer("rxe2")?, WaitMode::Interrupt);
    let to_s = c.handle_of(&s);
    Some((s, c, to_s))
}

async fn write(c: &Node, to: FiAddr, data: &Bytes, addr: u64, key: u64) -> Result<(), Error> {
    within("rma write", c.ep.write(to, data.clone(), addr, key))
        .await
        .map(|_| ())
        .map_err(|e| e.err)
}

async fn read(c: &Node, to: FiAddr, len: usize, addr: u64, key: u64) -> Result<Vec<u8>, Error> {
    within("rma read", c.ep.read(to, BytesMut::zeroed(len), addr, key))
        .await
        .map(|e| e.into_bytes().to_vec())
        .map_err(|e| e.err)
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_write_and_read_application_buffers_in_place() {
    let Some((s, c, to_s)) = pair() else {
        return;
    };
    for len in [1usize, 4096, 1 << 20, 8 << 20] {
        let mut buf = BytesMut::zeroed(len);
        buf[len - 1] = 0x5a;
        let ptr = buf.as_ptr() as u64;
        let mr = s.domain.mr_reg(buf, RW).unwrap();
        assert_eq!(mr.addr(), ptr);
        // A peer reads what the application put there...
        let got = read(&c, to_s, 1, mr.addr() + len as u64 - 1, mr.key()).await;
        assert_eq!(got.unwrap(), vec![0x5a]);
        // ...and writes into the buffer itself.
        let data = payload(len, len as u8);
        write(&c, to_s, &data, mr.addr(), mr.key()).await.unwrap();
        let key = mr.key();
        let back = mr.take_buffers().unwrap().pop().unwrap();
        assert_eq!(back.as_ptr() as u64, ptr, "the same allocation");
        assert_eq!(&back[..], &data[..], "{len} bytes written in place");
        // Taken back means deregistered: the key is dead, the buffer safe.
        let e = write(&c, to_s, &data.slice(..1), ptr, key).await;
        assert_eq!(e, Err(Error::Access));
        assert_eq!(back[0], data[0], "untouched after take_buffers");
    }
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sub_region_keys_reach_their_range_with_their_rights() {
    let Some((s, c, to_s)) = pair() else {
        return;
    };
    let base = s.domain.mr_reg(BytesMut::zeroed(16384), RW).unwrap();
    let ro = s
        .domain
        .mr_regattr(MrAttr::sub(&base, 4096, 4096, MrAccess::REMOTE_READ))
        .unwrap();
    let wo = s
        .domain
        .mr_regattr(MrAttr::sub(&base, 8192, 4096, MrAccess::REMOTE_WRITE))
        .unwrap();
    base.write_at(4096, b"read me").unwrap();
    // Each key within its own range and rights works.
    let got = read(&c, to_s, 7, ro.addr(), ro.key()).await.unwrap();
    assert_eq!(&got, b"read me");
    write(
        &c,
        to_s,
        &Bytes::from_static(b"written"),
        wo.addr() + 10,
        wo.key(),
    )
    .await
    .unwrap();
    let mut w = [0u8; 7];
    base.read_at(8192 + 10, &mut w).unwrap();
    assert_eq!(&w, b"written");
    // Rights: no writes through the read-only key, no reads through the
    // write-only one.
    let e = write(&c, to_s, &Bytes::from_static(b"no"), ro.addr(), ro.key()).await;
    assert_eq!(e, Err(Error::Access));
    let e = read(&c, to_s, 4, wo.addr(), wo.key()).await;
    assert_eq!(e, Err(Error::Access));
    // Range: a sub-region's key does not reach the rest of the base,
    // even where the base's key would.
    let e = read(&c, to_s, 8, ro.addr() + 4092, ro.key()).await;
    assert_eq!(e, Err(Error::Access), "straddles the sub-region's end");
    let e = write(&c, to_s, &Bytes::from_static(b"x"), base.addr(), wo.key()).await;
    assert_eq!(e, Err(Error::Access), "below the sub-region");
    // The base's key still covers everything.
    let got = read(&c, to_s, 7, base.addr() + 8202, base.key()).await;
    assert_eq!(got.unwrap(), b"written");
    // None of the refused writes landed.
    let all = base.to_vec().unwrap();
    assert_eq!(&all[..4096], &[0u8; 4096][..]);
    assert_eq!(&all[4096..4103], b"read me");
    assert!(all[4103..8192].iter().all(|&b| b == 0));
    // Dropping the base revokes its key; the sub-regions keep the memory
    // and their keys keep working.
    let base_key = base.key();
    let base_addr = base.addr();
    drop(base);
    let e = read(&c, to_s, 1, base_addr, base_key).await;
    assert_eq!(e, Err(Error::Access));
    let got = read(&c, to_s, 7, ro.addr(), ro.key()).await.unwrap();
    assert_eq!(&got, b"read me");
    write(&c, to_s, &Bytes::from_static(b"later"), wo.addr(), wo.key())
        .await
        .unwrap();
    let mut l = [0u8; 5];
    wo.read_at(0, &mut l).unwrap();
    assert_eq!(&l, b"later");
}
