//! Ordering (fi_endpoint(3) `msg_order`, `comp_order`) and `FI_FENCE`:
//! every bit a provider reports holds under load, a hint asking for more
//! than it keeps matches nothing, and a fence is kept or refused.
//!
//! Each test runs many operations in flight at once: a batch's futures
//! are polled in order, so they are posted in that order (the queue is
//! far from full), and an order the transport did not keep shows as a
//! value read too early or too late.

use bytes::{Bytes, BytesMut};
use futures::future::{join_all, BoxFuture, FutureExt};
use weft::{
    Caps, CompOrder, EpType, Error, Info, MemoryRegion, MrAccess, MrAttr, MsgOrder, OpFlags,
    RmaMsg, RmaOp,
};
use weft_integration::{msg_pair, within, Harness, Provider};

const RW: MrAccess = MrAccess::REMOTE_READ.union(MrAccess::REMOTE_WRITE);
/// Rounds per test, and rounds in flight at once.
const ROUNDS: u64 = 1024;
const BATCH: u64 = 32;
/// 8-byte slots in the target region: more than a batch, so a slot is not
/// reused while its round is in flight.
const SLOTS: u64 = 256;

fn rma_info(p: &Provider, ep_type: EpType) -> Info {
    p.try_info_with(ep_type, |h| {
        h.caps = Caps::MSG | Caps::RMA;
        h.domain_attr.mr_mode =
            weft::MrMode::PROV_KEY | weft::MrMode::VIRT_ADDR | weft::MrMode::LOCAL;
        h.mode = weft::Mode::RX_CQ_DATA;
    })
    .unwrap_or_else(|| panic!("{} offers no RMA on {ep_type:?}", p.name))
}

/// Whether `p`'s RDM offer keeps every bit of `need`; a test of bits it
/// does not claim has nothing to check, and says so.
fn claims(info: &Info, need: MsgOrder, what: &str) -> bool {
    let has = info.tx_attr.msg_order.contains(need) && info.rx_attr.msg_order.contains(need);
    if !has {
        eprintln!(
            "{}: {need:?} not claimed; {what} not checked",
            info.fabric_attr.prov_name.as_deref().unwrap_or("?")
        );
    }
    has
}

/// An initiator `a`, a target `b` reached as `to_b`, and a region of
/// `b`'s domain; over RDM or over one MSG connection.
struct Setup {
    a: weft::Endpoint,
    b: weft::Endpoint,
    to_b: weft::FiAddr,
    mr: MemoryRegion,
    /// What must outlive the endpoints (harness, queues, the other
    /// side's fabric).
    _keep: Box<dyn std::any::Any + Send + Sync>,
}

fn setup(p: &Provider) -> Setup {
    let h = Harness::with_info(p, rma_info(p, EpType::Rdm));
    let (a, b, to_b, _) = h.rdm_pair_with(&h.info);
    let mr = h
        .domain
        .mr_regattr(MrAttr::alloc((SLOTS * 8) as usize, RW).requested_key(31))
        .expect("region");
    Setup {
        a: a.ep.clone(),
        b: b.ep.clone(),
        to_b,
        mr,
        _keep: Box::new((h, a, b)),
    }
}

/// The same over a connected MSG pair: the client writes into a region
/// of the server's domain.
async fn setup_msg(p: &Provider) -> Setup {
    let info = rma_info(p, EpType::Msg);
    let pair = msg_pair(&info, &info).await;
    let mr = pair
        .sd
        .mr_regattr(MrAttr::alloc((SLOTS * 8) as usize, RW).requested_key(31))
        .expect("region");
    Setup {
        a: pair.cep.clone(),
        b: pair.sep.clone(),
        to_b: 0,
        mr,
        _keep: Box::new(pair),
    }
}

/// Both endpoint types, RDM first; RDM alone for a provider without MSG
/// endpoints (shm).
async fn setups(p: &Provider) -> Vec<Setup> {
    let mut v = vec![setup(p)];
    if p.try_info(EpType::Msg).is_some() {
        v.push(setup_msg(p).await);
    }
    v
}

impl Setup {
    fn slot(&self, i: u64) -> (u64, usize) {
        let off = (i % SLOTS) as usize * 8;
        (self.mr.addr() + off as u64, off)
    }

    fn write(&self, i: u64, v: u64, flags: OpFlags) -> BoxFuture<'_, ()> {
        let (at, _) = self.slot(i);
        let msg = RmaMsg {
            dest: self.to_b,
            op: RmaOp::Write {
                iov: vec![Bytes::copy_from_slice(&v.to_le_bytes())],
                data: None,
            },
            addr: at,
            key: self.mr.key(),
            context: 0,
        };
        async move {
            self.a
                .rmamsg(msg, flags)
                .await
                .unwrap_or_else(|e| panic!("write {i}: {e:?}"));
        }
        .boxed()
    }

    fn read(&self, i: u64) -> BoxFuture<'_, u64> {
        let (at, _) = self.slot(i);
        async move {
            let e = self
                .a
                .read(self.to_b, BytesMut::zeroed(8), at, self.mr.key())
                .await
                .unwrap_or_else(|e| panic!("read {i}: {e:?}"));
            let b = e.into_bytes();
            u64::from_le_bytes(b[..8].try_into().unwrap())
        }
        .boxed()
    }

    fn slot_value(&self, i: u64) -> u64 {
        let (_, off) = self.slot(i);
        let mut b = [0u8; 8];
        self.mr.read_at(off, &mut b).unwrap();
        u64::from_le_bytes(b)
    }
}

/// What a provider reports is what getinfo matches: a hint that asks for
/// every bit matches only an offer that keeps them all; transmit and
/// receive sides report the same bits; `FI_ORDER_DATA` only where data is
/// placed in order.
async fn order_claims_match_getinfo(p: Provider) {
    let ep_type = p.connless_type();
    let info = p.info(ep_type);
    assert_eq!(info.tx_attr.msg_order, info.rx_attr.msg_order);
    let all = p.try_info_with(ep_type, |h| {
        h.tx_attr.msg_order = MsgOrder::all();
        h.rx_attr.msg_order = MsgOrder::all();
    });
    assert_eq!(
        all.is_some(),
        info.tx_attr.msg_order == MsgOrder::all(),
        "a hint for every ordering bit against {:?}",
        info.tx_attr.msg_order
    );
    let data = p.try_info_with(ep_type, |h| h.rx_attr.comp_order = CompOrder::DATA);
    assert_eq!(
        data.is_some(),
        info.rx_attr.comp_order.contains(CompOrder::DATA)
    );
    // No provider orders every completion as submitted: a hint for it
    // matches nothing.
    let strict = p.try_info_with(ep_type, |h| h.tx_attr.comp_order = CompOrder::STRICT);
    assert!(
        strict.is_none(),
        "FI_ORDER_STRICT completions are not offered"
    );
    // A fence is a capability where the flag is honoured, and only there.
    let fence = p.try_info_with(ep_type, |h| h.caps = Caps::MSG | Caps::FENCE);
    assert_eq!(
        fence.is_some(),
        info.tx_attr.op_flags_supported.contains(OpFlags::FENCE)
    );
}

/// `FI_ORDER_SAW`: a message never overtakes the write posted before it.
/// Round `i` writes `i` into its slot, then sends `i`; whoever handles
/// message `i` finds the slot already holding `i`.
async fn sends_never_overtake_writes(p: Provider) {
    for s in setups(&p).await {
        sends_never_overtake_writes_on(&s).await;
    }
}

async fn sends_never_overtake_writes_on(s: &Setup) {
    if !claims(s.a.info(), MsgOrder::SAW, "send after write") {
        return;
    }
    for first in (1..=ROUNDS).step_by(BATCH as usize) {
        let batch = first..first + BATCH;
        let mut ops: Vec<BoxFuture<'_, ()>> = Vec::new();
        for i in batch.clone() {
            ops.push(s.write(i, i, OpFlags::empty()));
            let send = s.a.send(s.to_b, Bytes::copy_from_slice(&i.to_le_bytes()));
            ops.push(
                async move {
                    send.await.unwrap();
                }
                .boxed(),
            );
        }
        // Every receive of the batch is posted before any send (they are
        // polled first): an RC queue pair has no room for a message
        // nobody posted a receive for, and would make its sender retry.
        // Each checks, as it completes, that the write of its round is
        // already in place (each round has its own slot).
        let recvs: Vec<BoxFuture<'_, ()>> = batch
            .clone()
            .map(|i| {
                let r = s.b.recv(BytesMut::zeroed(8));
                async move {
                    let got = r.await.unwrap();
                    let n = u64::from_le_bytes(got.into_bytes()[..8].try_into().unwrap());
                    assert_eq!(n, i, "messages in order");
                    assert_eq!(s.slot_value(i), i, "message {i} overtook its write");
                }
                .boxed()
            })
            .collect();
        within("batch", async {
            tokio::join!(join_all(recvs), join_all(ops))
        })
        .await;
    }
}

/// `FI_ORDER_RAW`/`RMA_RAW`: a read posted after a write to the same
/// place sees the write.
async fn reads_see_earlier_writes(p: Provider) {
    for s in setups(&p).await {
        reads_see_earlier_writes_on(&s).await;
    }
}

async fn reads_see_earlier_writes_on(s: &Setup) {
    if !claims(
        s.a.info(),
        MsgOrder::RAW | MsgOrder::RMA_RAW,
        "read after write",
    ) {
        return;
    }
    for first in (1..=ROUNDS).step_by(BATCH as usize) {
        let mut ops: Vec<BoxFuture<'_, Option<(u64, u64)>>> = Vec::new();
        for i in first..first + BATCH {
            let w = s.write(i, i * 3, OpFlags::empty());
            ops.push(
                async move {
                    w.await;
                    None
                }
                .boxed(),
            );
            let r = s.read(i);
            ops.push(async move { Some((i, r.await)) }.boxed());
        }
        for (i, v) in within("batch", join_all(ops)).await.into_iter().flatten() {
            assert_eq!(v, i * 3, "read {i} did not see the write before it");
        }
    }
}

/// `FI_ORDER_WAR`/`RMA_WAR`: a write posted after a read of the same
/// place does not show in that read.
async fn writes_never_overtake_reads(p: Provider) {
    for s in setups(&p).await {
        writes_never_overtake_reads_on(&s).await;
    }
}

async fn writes_never_overtake_reads_on(s: &Setup) {
    if !claims(
        s.a.info(),
        MsgOrder::WAR | MsgOrder::RMA_WAR,
        "write after read",
    ) {
        return;
    }
    for i in 0..SLOTS {
        let (_, off) = s.slot(i);
        s.mr.write_at(off, &i.to_le_bytes()).unwrap();
    }
    for first in (0..ROUNDS).step_by(BATCH as usize) {
        let mut reads = Vec::new();
        let mut ops: Vec<BoxFuture<'_, ()>> = Vec::new();
        for i in first..first + BATCH {
            let (tx, rx) = futures::channel::oneshot::channel();
            reads.push((i, rx));
            let r = s.read(i);
            ops.push(
                async move {
                    let _ = tx.send(r.await);
                }
                .boxed(),
            );
            ops.push(s.write(i, i + SLOTS, OpFlags::empty()));
        }
        within("batch", join_all(ops)).await;
        for (i, rx) in reads {
            assert_eq!(
                rx.await.unwrap(),
                i,
                "the write after read {i} showed in it"
            );
        }
    }
}

/// `FI_ORDER_ATOMIC_*`: fetch-adds posted together apply in posting
/// order, each one seeing all the earlier ones.
async fn atomics_apply_in_posting_order(p: Provider) {
    let Some(info) = p.try_info_with(EpType::Rdm, |h| {
        h.caps = Caps::MSG | Caps::RMA | Caps::ATOMIC;
        h.domain_attr.mr_mode =
            weft::MrMode::PROV_KEY | weft::MrMode::VIRT_ADDR | weft::MrMode::LOCAL;
        h.mode = weft::Mode::RX_CQ_DATA;
    }) else {
        eprintln!("{}: no FI_ATOMIC; atomic order not checked", p.name);
        return;
    };
    let all =
        MsgOrder::ATOMIC_RAR | MsgOrder::ATOMIC_RAW | MsgOrder::ATOMIC_WAR | MsgOrder::ATOMIC_WAW;
    if !claims(&info, all, "atomic order") {
        return;
    }
    let h = Harness::with_info(&p, info);
    let (a, _b, to_b, _) = h.rdm_pair_with(&h.info);
    let mr = h
        .domain
        .mr_regattr(MrAttr::alloc(8, RW).requested_key(32))
        .unwrap();
    let mut expect = 0u64;
    for _ in 0..ROUNDS / BATCH {
        let adds: Vec<_> = (0..BATCH)
            .map(|_| a.ep.fetch_add(to_b, mr.addr(), mr.key(), 1))
            .collect();
        for old in within("fetch-adds", join_all(adds)).await {
            assert_eq!(old.unwrap(), expect, "fetch-adds out of posting order");
            expect += 1;
        }
    }
}

/// `FI_FENCE`: where offered, a fenced write after a read does not show
/// in the read, and a fenced send after a write finds it done; where not
/// offered, the flag is `BadFlags` on every operation.
async fn fence_is_kept_or_refused(p: Provider) {
    for s in setups(&p).await {
        fence_is_kept_or_refused_on(&s).await;
    }
}

async fn fence_is_kept_or_refused_on(s: &Setup) {
    let info = s.a.info();
    let fenced = info.tx_attr.op_flags_supported.contains(OpFlags::FENCE);
    if !fenced {
        let e =
            s.a.rmamsg(
                RmaMsg {
                    dest: s.to_b,
                    op: RmaOp::Write {
                        iov: vec![Bytes::from_static(b"12345678")],
                        data: None,
                    },
                    addr: s.mr.addr(),
                    key: s.mr.key(),
                    context: 0,
                },
                OpFlags::FENCE,
            )
            .await
            .unwrap_err();
        assert_eq!(e.err, Error::BadFlags);
        let msg = weft::SendMsg {
            dest: s.to_b,
            iov: vec![Bytes::from_static(b"fenced")],
            tag: None,
            data: None,
            context: 0,
        };
        let e = s.a.sendmsg(msg, OpFlags::FENCE).await.unwrap_err();
        assert_eq!(e.err, Error::BadFlags);
        assert_eq!(s.slot_value(0), 0, "a refused write wrote nothing");
        return;
    }
    for i in 0..ROUNDS / 4 {
        let (_, off) = s.slot(i);
        s.mr.write_at(off, &i.to_le_bytes()).unwrap();
        let (read, ()) = within("read, then a fenced write", async {
            tokio::join!(s.read(i), s.write(i, i + 1, OpFlags::FENCE))
        })
        .await;
        assert_eq!(read, i, "the fenced write showed in the read before it");
        let msg = weft::SendMsg {
            dest: s.to_b,
            iov: vec![Bytes::copy_from_slice(&i.to_le_bytes())],
            tag: None,
            data: None,
            context: 0,
        };
        let arrived = async {
            s.b.recv(BytesMut::zeroed(8)).await.unwrap();
            assert_eq!(s.slot_value(i), i + 2, "the fenced send overtook the write");
        };
        let ((), sent, ()) = within("write, then a fenced send", async {
            tokio::join!(
                s.write(i, i + 2, OpFlags::empty()),
                s.a.sendmsg(msg, OpFlags::FENCE),
                arrived
            )
        })
        .await;
        sent.unwrap();
    }
}

/// The next `n` completions of `cq`, in the order it has them; an error
/// entry fails the test.
async fn oks(cq: &weft::CompletionQueue, n: usize, what: &str) -> Vec<weft::CqEntry> {
    let mut v = Vec::with_capacity(n);
    while v.len() < n {
        match within(what, weft_integration::next_cq(cq)).await {
            weft::CqItem::Ok(e) => v.push(e),
            weft::CqItem::Err(e) => panic!("{what}: {} failed: {e:?}", e.context),
        }
    }
    v
}

/// Where a fence waits for the earlier operations to complete (shm): a
/// fenced send posted behind a read completes after it (on the CQ, which
/// takes completions as they happen), and so does a write posted after
/// the fenced send; unfenced, the send would go while the read's answer
/// is still on its way.
async fn fenced_operations_wait_for_earlier_ones(p: Provider) {
    let h = Harness::with_info(&p, rma_info(&p, EpType::Rdm));
    let (a, b, to_b, _) = h.rdm_pair_with(&h.info);
    assert!(a
        .ep
        .info()
        .tx_attr
        .op_flags_supported
        .contains(OpFlags::FENCE));
    let mr = h
        .domain
        .mr_regattr(MrAttr::alloc(64 << 10, RW).requested_key(33))
        .expect("region");
    let rma = |op, context| RmaMsg {
        dest: to_b,
        op,
        addr: mr.addr(),
        key: mr.key(),
        context,
    };
    for i in 0..ROUNDS / 4 {
        b.ep.post_recv(BytesMut::zeroed(8), i).unwrap();
        let read = RmaOp::Read {
            bufs: vec![BytesMut::zeroed(64 << 10)],
        };
        a.ep.post_rmamsg(rma(read, 1), OpFlags::empty()).unwrap();
        let msg = weft::SendMsg {
            dest: to_b,
            iov: vec![Bytes::copy_from_slice(&i.to_le_bytes())],
            tag: None,
            data: None,
            context: 2,
        };
        a.ep.post_sendmsg(msg, OpFlags::FENCE).unwrap();
        let write = RmaOp::Write {
            iov: vec![Bytes::copy_from_slice(&i.to_le_bytes())],
            data: None,
        };
        a.ep.post_rmamsg(rma(write, 3), OpFlags::empty()).unwrap();
        let order: Vec<u64> = oks(&a.cq, 3, "completions")
            .await
            .into_iter()
            .map(|e| e.context)
            .collect();
        assert_eq!(order, [1, 2, 3], "round {i}: completion order");
        let e = within("the send", weft_integration::next_cq(&b.cq))
            .await
            .unwrap();
        assert_eq!(e.context, i);
    }
}

/// udp: sends leave in posting order and complete as the kernel takes
/// them, so a fenced send completes after every send posted before it;
/// a fence offers nothing more (there is no RMA), and each datagram
/// still arrives once.
async fn fenced_sends_complete_after_earlier_ones(p: Provider) {
    let h = Harness::connless(&p);
    assert!(h.info.tx_attr.op_flags_supported.contains(OpFlags::FENCE));
    let (a, b, to_b, _) = h.rdm_pair();
    const N: u64 = 64;
    for i in 0..N {
        b.ep.post_recv(BytesMut::zeroed(8), 1000 + i).unwrap();
    }
    for i in 0..N {
        let msg = weft::SendMsg {
            dest: to_b,
            iov: vec![Bytes::copy_from_slice(&i.to_le_bytes())],
            tag: None,
            data: None,
            context: i,
        };
        let flags = if i % 4 == 3 {
            OpFlags::FENCE
        } else {
            OpFlags::empty()
        };
        a.ep.post_sendmsg(msg, flags).unwrap();
    }
    let done: Vec<u64> = oks(&a.cq, N as usize, "send completions")
        .await
        .into_iter()
        .map(|e| e.context)
        .collect();
    for (k, &c) in done.iter().enumerate() {
        if c % 4 == 3 {
            let before = done[..k].iter().filter(|&&d| d < c).count();
            assert_eq!(
                before as u64, c,
                "fenced send {c} completed before earlier ones"
            );
        }
    }
    let mut got: Vec<u64> = oks(&b.cq, N as usize, "receives")
        .await
        .into_iter()
        .map(|e| u64::from_le_bytes(e.into_bytes()[..8].try_into().unwrap()))
        .collect();
    got.sort_unstable();
    assert_eq!(got, (0..N).collect::<Vec<_>>(), "each datagram once");
}

provider_tests! {
    order_claims_match_getinfo,
    sends_never_overtake_writes,
    reads_see_earlier_writes,
    writes_never_overtake_reads,
    atomics_apply_in_posting_order,
    fence_is_kept_or_refused,
}

shm_tests! {
    order_claims_match_getinfo,
    sends_never_overtake_writes,
    reads_see_earlier_writes,
    writes_never_overtake_reads,
    atomics_apply_in_posting_order,
    fence_is_kept_or_refused,
    fenced_operations_wait_for_earlier_ones,
}

udp_tests! {
    order_claims_match_getinfo,
    fenced_sends_complete_after_earlier_ones,
}
