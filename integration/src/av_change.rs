//! The AV changing between messages, as `tests/shm.rs` and
//! `tests/udp.rs` check it: sends and arrivals cache what they looked up
//! for as long as the AV's version stays the same, which they read
//! without the AV's lock.

use bytes::{Bytes, BytesMut};
use weft::{AddressVector, AvFlags, Endpoint, Error, FiAddr, WaitMode, FI_ADDR_NOTAVAIL};

use crate::{enabled_endpoint, within, Harness};

/// One of the two endpoints: itself, its private TABLE AV, and the
/// other endpoint's handle in that AV.
pub type Side<'a> = (&'a Endpoint, &'a AddressVector, FiAddr);

async fn exchange(
    from: &Endpoint,
    to: &Endpoint,
    dest: FiAddr,
    what: &'static [u8],
) -> (
    Result<weft::CqEntry, weft::CqErrEntry>,
    Result<weft::CqEntry, weft::CqErrEntry>,
) {
    let recv = to.recv(BytesMut::zeroed(16));
    let send = from.send(dest, Bytes::from_static(what));
    within("exchange", async { tokio::join!(recv, send) }).await
}

/// A send to a removed handle is `AddrNotAvail`, one to a handle reused
/// for another peer goes to that peer, and a message from a sender
/// removed from (then put back into) the receiver's AV reports its
/// source anew, as its handle or, inserted with one, its user id.
pub async fn changes_between_messages_are_seen(h: &Harness, a: Side<'_>, b: Side<'_>) {
    let ((a, aav, b_in_a), (b, bav, a_in_b)) = (a, b);
    for _ in 0..3 {
        let (got, sent) = exchange(a, b, b_in_a, b"to b").await;
        sent.unwrap();
        assert_eq!(got.unwrap().src, a_in_b);
    }
    aav.remove(&[b_in_a]).unwrap();
    let e = within("removed", a.send(b_in_a, Bytes::from_static(b"gone")))
        .await
        .unwrap_err();
    assert_eq!(e.err, Error::AddrNotAvail);

    // The lowest free index again, now naming another endpoint.
    let cav = h.av();
    let (c, _ccq) = enabled_endpoint(&h.domain, &h.info, &cav, WaitMode::Interrupt);
    let c_in_a = aav
        .insert_sync(&[c.local_addr().unwrap()], Default::default())
        .unwrap()
        .fi_addrs[0];
    assert_eq!(c_in_a, b_in_a, "TABLE reuses the lowest index");
    let (got, sent) = exchange(a, &c, c_in_a, b"to c").await;
    sent.unwrap();
    assert_eq!(&got.unwrap().into_bytes()[..], b"to c");

    // b forgets a: its messages have no source until a is back.
    let b_in_a = aav
        .insert_sync(&[b.local_addr().unwrap()], Default::default())
        .unwrap()
        .fi_addrs[0];
    bav.remove(&[a_in_b]).unwrap();
    let (got, sent) = exchange(a, b, b_in_a, b"unknown").await;
    sent.unwrap();
    assert_eq!(got.unwrap().src, FI_ADDR_NOTAVAIL);
    let a_in_b = bav
        .insert_sync(&[a.local_addr().unwrap()], Default::default())
        .unwrap()
        .fi_addrs[0];
    let (got, sent) = exchange(a, b, b_in_a, b"known").await;
    sent.unwrap();
    assert_eq!(got.unwrap().src, a_in_b);

    // Put back with a user id (`FI_AV_USER_ID` on the insert): what an
    // arrival reports changes again, to the id, not the cached handle.
    bav.remove(&[a_in_b]).unwrap();
    let put_back = bav
        .insert_with_user_ids(&[a.local_addr().unwrap()], &[0x5EED], AvFlags::empty(), 0)
        .unwrap();
    assert_eq!(within("insert with an id", put_back).await.count, 1);
    let (got, sent) = exchange(a, b, b_in_a, b"by id").await;
    sent.unwrap();
    assert_eq!(got.unwrap().src, 0x5EED, "the insert's user id");
}
