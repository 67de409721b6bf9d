//! Target-visible RMA access (fi_mr(3) `FI_RMA_EVENT`, `FI_MR_RMA_EVENT`,
//! `FI_MR_ENDPOINT`, `fi_mr_bind`, `fi_mr_enable`, `FI_MR_SINGLE_USE`;
//! fi_endpoint(3) remote counters), written against the public API for
//! providers that offer `FI_RMA_EVENT`. Verbs cannot see one-sided
//! accesses at the target, so its instances are ignored here; the
//! refusals it gives instead are `mr::target_visible_access_is_refused_where_not_offered`.
//!
//! Applications read keys and addresses from their regions, so the tests
//! hold whatever the domain's other `mr_mode` bits are.

use bytes::{Bytes, BytesMut};
use weft::{BindFlags, Caps, EpType, Error, Info, MrAccess, MrAttr, MrMode, MrRegFlags};
use weft_integration::{within, Harness, Provider, RdmEp};

const RW: MrAccess = MrAccess::REMOTE_READ.union(MrAccess::REMOTE_WRITE);

/// The offer with remote events and the registration modes `extra`.
fn harness(p: &Provider, extra: MrMode) -> Harness {
    let info: Info = p
        .try_info_with(EpType::Rdm, |h| {
            h.caps = Caps::MSG | Caps::RMA | Caps::ATOMIC | Caps::RMA_EVENT;
            h.domain_attr.mr_mode = MrMode::PROV_KEY | MrMode::VIRT_ADDR | MrMode::LOCAL | extra;
        })
        .expect("an offer with FI_RMA_EVENT");
    assert!(
        info.domain_attr.mr_mode.contains(extra),
        "modes asked for are granted"
    );
    Harness::with_info(p, info)
}

fn attr(len: usize, key: u64, flags: MrRegFlags) -> MrAttr<'static> {
    MrAttr::alloc(len, RW).requested_key(key).flags(flags)
}

async fn write_to(
    a: &RdmEp,
    to: weft::FiAddr,
    data: &'static [u8],
    addr: u64,
    key: u64,
) -> Result<(), Error> {
    within("write", a.ep.write(to, Bytes::from_static(data), addr, key))
        .await
        .map(|_| ())
        .map_err(|e| e.err)
}

/// `FI_MR_ENDPOINT`: unreachable (`FI_EACCES`, memory untouched) until
/// bound to an endpoint and enabled; then reachable through that
/// endpoint only.
async fn endpoint_bound_regions_wait_for_their_endpoint(p: Provider) {
    let h = harness(&p, MrMode::ENDPOINT);
    let (b, other, a) = (h.rdm_ep(), h.rdm_ep(), h.rdm_ep());
    let (to_b, to_other) = (a.insert(&b), a.insert(&other));
    let mr = h
        .domain
        .mr_regattr(attr(64, 1, MrRegFlags::empty()))
        .unwrap();
    assert_eq!(
        write_to(&a, to_b, b"no", mr.addr(), mr.key()).await,
        Err(Error::Access)
    );
    assert_eq!(mr.enable(), Err(Error::Inval), "no endpoint bound");
    mr.bind_endpoint(&b.ep).unwrap();
    assert_eq!(
        write_to(&a, to_b, b"no", mr.addr(), mr.key()).await,
        Err(Error::Access)
    );
    assert_eq!(mr.to_vec().unwrap(), vec![0u8; 64]);
    mr.enable().unwrap();
    write_to(&a, to_b, b"yes", mr.addr(), mr.key())
        .await
        .unwrap();
    assert_eq!(
        write_to(&a, to_other, b"no", mr.addr(), mr.key()).await,
        Err(Error::Access)
    );
    assert_eq!(&mr.to_vec().unwrap()[..3], b"yes");
    assert_eq!(mr.bind_endpoint(&other.ep), Err(Error::OpBadState));
}

/// `FI_MR_RMA_EVENT`: an `FI_RMA_EVENT` region waits for `enable`, and
/// its counters count completed writes (and atomics that modify) and
/// reads (and atomics that return), never refusals.
async fn region_counters_count_completed_accesses(p: Provider) {
    let h = harness(&p, MrMode::RMA_EVENT);
    let (a, _b, to_b, _) = h.rdm_pair();
    let mr = h
        .domain
        .mr_regattr(attr(64, 2, MrRegFlags::RMA_EVENT))
        .unwrap();
    let (w, r) = (h.domain.counter().unwrap(), h.domain.counter().unwrap());
    assert_eq!(
        write_to(&a, to_b, b"no", mr.addr(), mr.key()).await,
        Err(Error::Access)
    );
    mr.bind_counter(&w, BindFlags::REMOTE_WRITE).unwrap();
    mr.bind_counter(&r, BindFlags::REMOTE_READ).unwrap();
    mr.enable().unwrap();
    write_to(&a, to_b, b"abc", mr.addr(), mr.key())
        .await
        .unwrap();
    let got = within(
        "read",
        a.ep.read(to_b, BytesMut::zeroed(3), mr.addr(), mr.key()),
    )
    .await
    .unwrap();
    assert_eq!(&got.into_bytes()[..], b"abc");
    within(
        "fetch-add",
        a.ep.fetch_add(to_b, mr.addr() + 8, mr.key(), 1),
    )
    .await
    .unwrap();
    assert_eq!(
        write_to(&a, to_b, b"past", mr.addr() + 62, mr.key()).await,
        Err(Error::Access)
    );
    assert_eq!((w.read(), r.read()), (2, 2));
    assert_eq!((w.read_err(), r.read_err()), (0, 0));
}

/// Remote counters bound to an endpoint count the accesses completed at
/// it: writes and plain atomics on `FI_REMOTE_WRITE`, reads and fetching
/// atomics on `FI_REMOTE_READ`.
async fn endpoint_counters_count_remote_accesses(p: Provider) {
    let h = harness(&p, MrMode::empty());
    let (rr, rw) = (h.domain.counter().unwrap(), h.domain.counter().unwrap());
    let (av, cq) = (h.av(), h.cq());
    let ep = h.domain.endpoint(&h.info).unwrap();
    ep.bind_av(&av).unwrap();
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
        .unwrap();
    ep.bind_counter(&rr, BindFlags::REMOTE_READ).unwrap();
    ep.bind_counter(&rw, BindFlags::REMOTE_WRITE).unwrap();
    assert_eq!(
        ep.bind_counter(&rw, BindFlags::REMOTE_WRITE),
        Err(Error::Inval)
    );
    ep.enable().unwrap();
    let b = RdmEp { ep, av, cq };
    let a = h.rdm_ep();
    let to_b = a.insert(&b);
    let mr = h
        .domain
        .mr_regattr(attr(64, 3, MrRegFlags::empty()))
        .unwrap();
    write_to(&a, to_b, b"w", mr.addr(), mr.key()).await.unwrap();
    within(
        "read",
        a.ep.read(to_b, BytesMut::zeroed(1), mr.addr(), mr.key()),
    )
    .await
    .unwrap();
    within(
        "fetch-add",
        a.ep.fetch_add(to_b, mr.addr() + 8, mr.key(), 1),
    )
    .await
    .unwrap();
    assert_eq!(
        write_to(&a, to_b, b"x", mr.addr(), mr.key() + 1).await,
        Err(Error::Access)
    );
    assert_eq!((rw.read(), rr.read()), (1, 2));
}

/// `FI_MR_SINGLE_USE`: one access, then `FI_EACCES` with memory as the
/// one access left it.
async fn single_use_keys_take_one_access(p: Provider) {
    let h = harness(&p, MrMode::empty());
    let (a, _b, to_b, _) = h.rdm_pair();
    let mr = h
        .domain
        .mr_regattr(attr(16, 4, MrRegFlags::SINGLE_USE))
        .unwrap();
    write_to(&a, to_b, b"once", mr.addr(), mr.key())
        .await
        .unwrap();
    assert_eq!(
        write_to(&a, to_b, b"twice", mr.addr(), mr.key()).await,
        Err(Error::Access)
    );
    let r = within(
        "read",
        a.ep.read(to_b, BytesMut::zeroed(4), mr.addr(), mr.key()),
    )
    .await;
    assert_eq!(r.unwrap_err().err, Error::Access);
    assert_eq!(&mr.to_vec().unwrap()[..5], b"once\0");
}

provider_tests! {
    verbs_ignore = "verbs cannot see one-sided accesses at the target: no FI_RMA_EVENT, no region bindings, no single-use keys (mr::target_visible_access_is_refused_where_not_offered checks its refusals)";
    endpoint_bound_regions_wait_for_their_endpoint,
    region_counters_count_completed_accesses,
    endpoint_counters_count_remote_accesses,
    single_use_keys_take_one_access,
}
