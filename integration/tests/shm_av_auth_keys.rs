//! Authorization keys kept in an AV (`FI_AV_AUTH_KEY`) on shm: a claim
//! names the key it proves by id, and the owner checks that key alone.
//! One service endpoint holds two jobs' keys and talks to each job's
//! endpoints under that job's key (a message's source is the sender's
//! entry under the key its channel proved); endpoints of two jobs whose
//! AVs hold different keys refuse every send, RMA and atomic between
//! them, counted on both sides, nothing delivered and no region touched;
//! receives directed by key take only that job's senders; regions keyed
//! by AV key handle take only channels that proved that key; keys held by
//! an enabled endpoint cannot be removed (`Busy`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use weft::{
    AddressVector, AvAttr, AvFlags, CompletionQueue, Domain, EpType, Error, EventQueue, FiAddr,
    Info, MrAccess, MrAttr, OpFlags, WaitMode, FI_ADDR_UNSPEC,
};
use weft_integration::{enabled_endpoint_with_eq, payload, within, Provider, TIMEOUT};

const JOB_A: &[u8] = b"job-a key";
const JOB_B: &[u8] = b"job-b key";
const JOB_C: &[u8] = b"job-c key";
const RW: MrAccess = MrAccess::REMOTE_READ.union(MrAccess::REMOTE_WRITE);

/// The shm RDM offer with RMA, atomics and directed receives; `av_keys`:
/// on an `FI_AV_AUTH_KEY` domain, else with the endpoint key `key`.
fn info(av_keys: bool, key: Option<&[u8]>) -> Info {
    Provider::named("shm")
        .try_info_with(EpType::Rdm, |h| {
            h.caps = weft::Caps::MSG
                | weft::Caps::TAGGED
                | weft::Caps::RMA
                | weft::Caps::ATOMIC
                | weft::Caps::SOURCE
                | weft::Caps::DIRECTED_RECV;
            h.domain_attr.av_auth_key = av_keys;
            h.ep_attr.auth_key = key.map(<[u8]>::to_vec);
        })
        .expect("an shm offer")
}

fn domain(i: &Info) -> Domain {
    weft::Fabric::open(i).unwrap().domain(i).unwrap()
}

struct Ep {
    ep: weft::Endpoint,
    av: AddressVector,
    _cq: CompletionQueue,
    eq: EventQueue,
    addr: Vec<u8>,
}

/// An endpoint on `d` whose AV holds `keys` when it is enabled; their
/// handles in order.
fn open(d: &Domain, i: &Info, keys: &[&[u8]]) -> (Ep, Vec<FiAddr>) {
    let av = d.av(AvAttr::default()).unwrap();
    let handles = keys
        .iter()
        .map(|k| av.insert_auth_key(k).unwrap())
        .collect();
    let eq = d.fabric().eq(64).unwrap();
    let (ep, cq) = enabled_endpoint_with_eq(d, i, &av, Some(&eq), WaitMode::Interrupt);
    let addr = ep.local_addr().unwrap();
    (
        Ep {
            ep,
            av,
            _cq: cq,
            eq,
            addr,
        },
        handles,
    )
}

/// An endpoint of one job: its own key on a plain domain.
fn client(key: &[u8]) -> Ep {
    let i = info(false, Some(key));
    open(&domain(&i), &i, &[]).0
}

fn plain(from: &Ep, of: &Ep) -> FiAddr {
    from.av
        .insert_sync(std::slice::from_ref(&of.addr), AvFlags::empty())
        .unwrap()
        .fi_addrs[0]
}

fn keyed(from: &Ep, of: &Ep, key: FiAddr) -> FiAddr {
    let r = from
        .av
        .insert_with_auth_key(std::slice::from_ref(&of.addr), key, AvFlags::empty(), 0)
        .unwrap()
        .now()
        .unwrap();
    r.results[0].unwrap()
}

/// `from` sends one tagged message to `dest`; `to_ep` receives it from
/// `src`.
async fn delivered(from: &Ep, dest: FiAddr, to_ep: &Ep, tag: u64, src: FiAddr) {
    let recv = to_ep.ep.trecv(BytesMut::zeroed(16), FI_ADDR_UNSPEC, tag, 0);
    let send = from
        .ep
        .tsend(dest, Bytes::from(tag.to_le_bytes().to_vec()), tag);
    let (got, sent) = within("delivery", async { tokio::join!(recv, send) }).await;
    sent.unwrap();
    let got = got.unwrap();
    assert_eq!(got.src, src, "the source under the proven key");
    assert_eq!(&got.into_bytes()[..], &tag.to_le_bytes());
}

async fn next_err(eq: &EventQueue) -> weft::EqErrEntry {
    within("an EQ report", async {
        loop {
            match eq.read_err() {
                Ok(e) => return e,
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    })
    .await
}

fn rejected(e: &Ep) -> u64 {
    e.ep.stats().unwrap().rx_key_rejected
}

async fn until(what: &str, ok: impl Fn() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < TIMEOUT, "{what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn getinfo_offers_av_keys() {
    let i = info(true, None);
    assert!(i.domain_attr.av_auth_key);
    assert_eq!(
        i.domain_attr.max_ep_auth_key,
        weft_core::av::MAX_AV_AUTH_KEYS
    );
    // Not together with a domain key, and no own key for its endpoints.
    let mut both = i.clone();
    both.domain_attr.auth_key = Some(JOB_A.to_vec());
    assert_eq!(
        weft::Fabric::open(&i).unwrap().domain(&both).err(),
        Some(Error::Inval)
    );
    let d = domain(&i);
    let mut own = i.clone();
    own.ep_attr.auth_key = Some(JOB_A.to_vec());
    assert_eq!(d.endpoint(&own).err(), Some(Error::Inval));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_endpoint_serves_two_jobs_under_their_keys_and_refuses_a_third() {
    let i = info(true, None);
    let d = domain(&i);
    let (svc, keys) = open(&d, &i, &[JOB_A, JOB_B]);
    let (ka, kb) = (keys[0], keys[1]);
    let (a, b, c) = (client(JOB_A), client(JOB_B), client(JOB_C));
    let a_at_svc = keyed(&svc, &a, ka);
    let b_at_svc = keyed(&svc, &b, kb);
    let (svc_from_a, svc_from_b) = (plain(&a, &svc), plain(&b, &svc));
    // Both ways, small and CMA-sized.
    delivered(&a, svc_from_a, &svc, 1, a_at_svc).await;
    delivered(&b, svc_from_b, &svc, 2, b_at_svc).await;
    delivered(&svc, a_at_svc, &a, 3, svc_from_a).await;
    delivered(&svc, b_at_svc, &b, 4, svc_from_b).await;
    let big = payload(100_000, 5);
    let recv = svc.ep.recv(BytesMut::zeroed(100_000));
    let (got, sent) = within("a large message", async {
        tokio::join!(recv, b.ep.send(svc_from_b, big.clone()))
    })
    .await;
    sent.unwrap();
    let got = got.unwrap();
    assert_eq!(got.src, b_at_svc);
    assert!(got.into_bytes()[..] == big[..]);

    // A third job is refused on both sides, counted on both; nothing
    // arrives.
    let svc_from_c = plain(&c, &svc);
    let before = rejected(&svc);
    let sent = within(
        "refused",
        c.ep.tsend(svc_from_c, Bytes::from_static(b"x"), 5),
    )
    .await;
    assert_eq!(sent.unwrap_err().err, Error::KeyRejected);
    assert_eq!(next_err(&svc.eq).await.err, Error::KeyRejected);
    assert_eq!(next_err(&c.eq).await.err, Error::KeyRejected);
    assert_eq!(rejected(&c), 1);
    until("the service counts it", || rejected(&svc) == before + 1).await;

    // Job A's address under job B's key: its channel proved A, so a send
    // through this entry is refused rather than sent under A.
    let a_under_b = keyed(&svc, &a, kb);
    let sent = within(
        "other key",
        svc.ep.tsend(a_under_b, Bytes::from_static(b"x"), 6),
    )
    .await;
    assert_eq!(sent.unwrap_err().err, Error::KeyRejected);

    // An entry under no key, or a key inserted after the endpoint was
    // enabled: the endpoint holds keys, so it cannot be reached.
    let c_plain = plain(&svc, &c);
    let r = svc.ep.tsend(c_plain, Bytes::from_static(b"x"), 7).await;
    assert_eq!(r.unwrap_err().err, Error::NoKey);
    let kc = svc.av.insert_auth_key(JOB_C).unwrap();
    let c_at_svc = keyed(&svc, &c, kc);
    let r = svc.ep.tsend(c_at_svc, Bytes::from_static(b"x"), 8).await;
    assert_eq!(r.unwrap_err().err, Error::NoKey);

    // Both jobs still served.
    delivered(&a, svc_from_a, &svc, 9, a_at_svc).await;
    delivered(&svc, b_at_svc, &b, 10, svc_from_b).await;

    // Held keys cannot be removed while the endpoint is enabled; a key no
    // endpoint holds can.
    assert_eq!(svc.av.remove_auth_keys(&[ka]), Err(Error::Busy));
    assert_eq!(svc.av.remove_auth_keys(&[kb]), Err(Error::Busy));
    svc.av.remove_auth_keys(&[kc]).unwrap();
    svc.ep.close().unwrap();
    svc.av.remove_auth_keys(&[ka, kb]).unwrap();
}

/// Two jobs whose AVs hold different keys, each AV holding the other's
/// endpoint under its own key: every send, RMA write, read and atomic
/// from one to the other is refused and counted on both sides; nothing
/// is delivered and no region changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_jobs_with_different_av_keys_never_cross() {
    let i = info(true, None);
    let (dx, dy) = (domain(&i), domain(&i));
    let (x, kx) = open(&dx, &i, &[JOB_A]);
    let (y, ky) = open(&dy, &i, &[JOB_B]);
    let (y_at_x, x_at_y) = (keyed(&x, &y, kx[0]), keyed(&y, &x, ky[0]));
    let mr = dy
        .mr_regattr(MrAttr::alloc(4096, RW).requested_key(1))
        .unwrap();
    // Posted receives that must stay empty.
    let mut recvs = Vec::new();
    for t in 0..4u64 {
        recvs.push(y.ep.trecv(BytesMut::zeroed(64), FI_ADDR_UNSPEC, t, 0));
    }
    let mut refusals = 0;
    for round in 0..2 {
        let before = (rejected(&x), rejected(&y));
        let r = match round {
            0 => within("send", x.ep.tsend(y_at_x, payload(32, 1), 0))
                .await
                .map(|_| ()),
            _ => within("write", x.ep.write(y_at_x, payload(32, 1), 0, mr.key()))
                .await
                .map(|_| ()),
        };
        assert_eq!(r.unwrap_err().err, Error::KeyRejected, "round {round}");
        refusals += 1;
        assert_eq!(rejected(&x), before.0 + 1);
        until("the target counts it", || rejected(&y) == before.1 + 1).await;
    }
    let r = within("read", x.ep.read(y_at_x, BytesMut::zeroed(32), 0, mr.key())).await;
    assert_eq!(r.unwrap_err().err, Error::KeyRejected);
    let r = within(
        "atomic",
        x.ep.atomic(
            y_at_x,
            weft::AtomicOp::Sum,
            weft::Datatype::U64,
            Bytes::copy_from_slice(&5u64.to_ne_bytes()),
            0,
            mr.key(),
        ),
    )
    .await;
    assert_eq!(r.unwrap_err().err, Error::KeyRejected);
    refusals += 2;
    // The other way round as well.
    let r = within("send back", y.ep.tsend(x_at_y, payload(8, 2), 1)).await;
    assert_eq!(r.unwrap_err().err, Error::KeyRejected);
    refusals += 1;
    until("every refusal counted at the target side", || {
        rejected(&x) + rejected(&y) == 2 * refusals
    })
    .await;
    let mut untouched = [1u8; 4096];
    mr.read_at(0, &mut untouched).unwrap();
    assert!(untouched.iter().all(|&b| b == 0), "the region untouched");
    tokio::time::sleep(Duration::from_millis(50)).await;
    for r in recvs {
        let poll = futures::FutureExt::now_or_never(r);
        assert!(poll.is_none(), "nothing delivered");
    }
    assert_eq!(y.ep.stats().unwrap().rx_malformed, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regions_keyed_by_av_key_take_only_channels_that_proved_it() {
    let i = info(true, None);
    let d = domain(&i);
    let (svc, keys) = open(&d, &i, &[JOB_A, JOB_B]);
    let (a, b) = (client(JOB_A), client(JOB_B));
    keyed(&svc, &a, keys[0]);
    keyed(&svc, &b, keys[1]);
    let (to_a, to_b) = (plain(&a, &svc), plain(&b, &svc));
    let b_only = d
        .mr_regattr(
            MrAttr::alloc(64, RW)
                .requested_key(3)
                .av_auth_key(&svc.av, keys[1]),
        )
        .unwrap();
    let anyone = d
        .mr_regattr(MrAttr::alloc(64, RW).requested_key(4))
        .unwrap();
    let w = within("write", a.ep.write(to_a, payload(8, 1), 0, b_only.key())).await;
    assert_eq!(w.unwrap_err().err, Error::Access);
    let r = within(
        "read",
        a.ep.read(to_a, BytesMut::zeroed(8), 0, b_only.key()),
    )
    .await;
    assert_eq!(r.unwrap_err().err, Error::Access);
    let f = within(
        "atomic",
        a.ep.atomic(
            to_a,
            weft::AtomicOp::Sum,
            weft::Datatype::U64,
            Bytes::copy_from_slice(&5u64.to_ne_bytes()),
            8,
            b_only.key(),
        ),
    )
    .await;
    assert_eq!(f.unwrap_err().err, Error::Access);
    assert_eq!(b_only.to_vec().unwrap(), vec![0; 64], "nothing written");
    within(
        "b writes",
        b.ep.write(to_b, Bytes::from_static(b"from b"), 0, b_only.key()),
    )
    .await
    .unwrap();
    assert_eq!(&b_only.to_vec().unwrap()[..6], b"from b");
    within(
        "a writes",
        a.ep.write(to_a, Bytes::from_static(b"a"), 0, anyone.key()),
    )
    .await
    .unwrap();
    within(
        "b writes",
        b.ep.write(to_b, Bytes::from_static(b"b"), 1, anyone.key()),
    )
    .await
    .unwrap();
    assert_eq!(&anyone.to_vec().unwrap()[..2], b"ab");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receives_directed_by_key_take_only_that_jobs_messages() {
    let i = info(true, None);
    let d = domain(&i);
    let (svc, keys) = open(&d, &i, &[JOB_A, JOB_B]);
    let (ka, kb) = (keys[0], keys[1]);
    let (a1, a2, b) = (client(JOB_A), client(JOB_A), client(JOB_B));
    let mut at_svc = Vec::new();
    let mut to_svc = Vec::new();
    for (c, k) in [(&a1, ka), (&a2, ka), (&b, kb)] {
        at_svc.push(keyed(&svc, c, k));
        to_svc.push(plain(c, &svc));
    }
    let by_key = |k: FiAddr, tag: u64, ignore: u64| weft::RecvMsg {
        src: k,
        bufs: vec![BytesMut::zeroed(16)],
        tagged: true,
        tag,
        ignore,
        context: tag,
    };
    // Unexpected: B's message first, then A's; the receive directed at
    // key A takes A's and leaves B's.
    within("b", b.ep.tsend(to_svc[2], Bytes::from_static(b"from b"), 7))
        .await
        .unwrap();
    within(
        "a1",
        a1.ep.tsend(to_svc[0], Bytes::from_static(b"from a1"), 7),
    )
    .await
    .unwrap();
    let got = within(
        "by key",
        svc.ep.recvmsg(by_key(ka, 7, 0), OpFlags::AUTH_KEY),
    )
    .await
    .unwrap();
    assert_eq!(got.src, at_svc[0]);
    assert_eq!(&got.into_bytes()[..7], b"from a1");
    let got = within(
        "any",
        svc.ep.trecv(BytesMut::zeroed(16), FI_ADDR_UNSPEC, 7, 0),
    )
    .await
    .unwrap();
    assert_eq!(got.src, at_svc[2]);

    // Posted (wildcard tag): only a sender of job A completes it.
    let recv = svc.ep.recvmsg(by_key(ka, 0, u64::MAX), OpFlags::AUTH_KEY);
    let other = svc.ep.trecv(BytesMut::zeroed(16), FI_ADDR_UNSPEC, 8, 0);
    let (got_a, got_o, s1, s2) = within("posted", async {
        tokio::join!(
            recv,
            other,
            b.ep.tsend(to_svc[2], Bytes::from_static(b"b again"), 8),
            a2.ep.tsend(to_svc[1], Bytes::from_static(b"from a2"), 9),
        )
    })
    .await;
    s1.unwrap();
    s2.unwrap();
    assert_eq!(got_a.unwrap().src, at_svc[1]);
    assert_eq!(got_o.unwrap().src, at_svc[2]);

    // A key the endpoint does not hold, or no key: Inval; the flag on an
    // endpoint without AV keys: BadFlags.
    let kc = svc.av.insert_auth_key(JOB_C).unwrap();
    let r = svc.ep.recvmsg(by_key(kc, 1, 0), OpFlags::AUTH_KEY).await;
    assert_eq!(r.unwrap_err().err, Error::Inval);
    let r = svc
        .ep
        .recvmsg(by_key(FI_ADDR_UNSPEC, 1, 0), OpFlags::AUTH_KEY)
        .await;
    assert_eq!(r.unwrap_err().err, Error::Inval);
    let r = a1.ep.recvmsg(by_key(0, 1, 0), OpFlags::AUTH_KEY).await;
    assert_eq!(r.unwrap_err().err, Error::BadFlags);
}

/// A sender that is not in the AV yet: its message is held, and a
/// receive directed at its entry under the key it proved, inserted
/// later, takes it (the held message keeps the key it came under).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_inserted_later_is_found_under_its_key() {
    let i = info(true, None);
    let d = domain(&i);
    let (svc, keys) = open(&d, &i, &[JOB_A, JOB_B]);
    let (a, b) = (client(JOB_A), client(JOB_B));
    within(
        "a",
        a.ep.tsend(plain(&a, &svc), Bytes::from_static(b"a"), 1),
    )
    .await
    .unwrap();
    within(
        "b",
        b.ep.tsend(plain(&b, &svc), Bytes::from_static(b"b"), 1),
    )
    .await
    .unwrap();
    // b's address under a's key first: not b's entry for its message.
    let b_under_a = keyed(&svc, &b, keys[0]);
    let b_at_svc = keyed(&svc, &b, keys[1]);
    let got = within(
        "b's message",
        svc.ep.trecv(BytesMut::zeroed(4), b_at_svc, 1, 0),
    )
    .await
    .unwrap();
    assert_eq!(got.src, b_at_svc);
    assert_eq!(&got.into_bytes()[..], b"b");
    let pending = svc.ep.trecv(BytesMut::zeroed(4), b_under_a, 1, 0);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(futures::FutureExt::now_or_never(pending).is_none());
}

/// `FI_SOURCE_ERR`: a sender not in the AV completes the receive as an
/// `FI_EADDRNOTAVAIL` error whose source is the key its channel proved
/// (its user id on an AV opened with `FI_AV_USER_ID`) and whose error
/// data is its address alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_errors_name_the_proven_key() {
    let i = Provider::named("shm")
        .try_info_with(EpType::Rdm, |h| {
            h.caps = weft::Caps::MSG | weft::Caps::SOURCE | weft::Caps::SOURCE_ERR;
            h.domain_attr.av_auth_key = true;
        })
        .expect("an shm offer with FI_SOURCE_ERR");
    let d = domain(&i);
    for user_ids in [false, true] {
        let attr = AvAttr {
            flags: if user_ids {
                AvFlags::AV_USER_ID
            } else {
                AvFlags::empty()
            },
            ..AvAttr::default()
        };
        let av = d.av(attr).unwrap();
        let k = av.insert_auth_key(JOB_A).unwrap();
        if user_ids {
            av.set_auth_key_user_id(k, 4242).unwrap();
        }
        let eq = d.fabric().eq(8).unwrap();
        let (rx, _cq) = enabled_endpoint_with_eq(&d, &i, &av, Some(&eq), WaitMode::Interrupt);
        let rx_addr = rx.local_addr().unwrap();
        let tx = client(JOB_A);
        let dest = tx
            .av
            .insert_sync(std::slice::from_ref(&rx_addr), AvFlags::empty())
            .unwrap()
            .fi_addrs[0];
        let (got, sent) = within("unknown sender", async {
            tokio::join!(
                rx.recv(BytesMut::zeroed(16)),
                tx.ep.send(dest, Bytes::from_static(b"keyed"))
            )
        })
        .await;
        sent.unwrap();
        let e = got.unwrap_err();
        assert_eq!(e.err, Error::AddrNotAvail);
        assert_eq!(e.src, if user_ids { 4242 } else { k });
        assert_eq!(e.err_data, tx.addr);
        assert_eq!(&e.bufs[0][..5], b"keyed");
    }
}
