//! Memory registration (spec/fi_mr.3.txt): the argument checks every
//! provider shares, registration of application buffers in place, raw
//! keys, sub-regions and unsupported flags. A provider without memory
//! registration answers valid requests with `NoSys` and hands the
//! buffers back.
//!
//! The tests follow the domain's `mr_mode`: without `FI_MR_PROV_KEY`
//! (tcp) every live region gets a key of its own through
//! `requested_key`, and a key in use is refused with `NoKey`; without
//! `FI_MR_VIRT_ADDR` a region's address is 0 and sub-regions are
//! addressed from their own start.

use bytes::BytesMut;
use weft::{
    BindFlags, Caps, Domain, EpType, Error, MemoryRegion, MrAccess, MrAttr, MrMode, MrRegFlags,
    RegError,
};
use weft_integration::{Harness, Provider};

const RW: MrAccess = MrAccess::REMOTE_READ.union(MrAccess::REMOTE_WRITE);

/// A domain opened for RMA: the `mr_mode` bits of RMA targets (provider
/// keys, virtual addresses) are part of the result only then, and a
/// provider that needs them (verbs) uses them either way.
fn harness(p: &Provider) -> Harness {
    Harness::with_info(p, p.rma_info(EpType::Rdm))
}

fn mr_mode(d: &Domain) -> MrMode {
    d.info().domain_attr.mr_mode
}

/// `buf` registered under `key` (ignored by provider-key domains).
fn reg_key(
    d: &Domain,
    buf: BytesMut,
    access: MrAccess,
    key: u64,
) -> Result<MemoryRegion, RegError> {
    d.mr_regattr(MrAttr::buffer(buf, access).requested_key(key))
}

/// `len` provider bytes registered under `key`.
fn alloc_key(d: &Domain, len: usize, access: MrAccess, key: u64) -> MemoryRegion {
    d.mr_regattr(MrAttr::alloc(len, access).requested_key(key))
        .expect("mr_alloc")
}

fn registers(h: &Harness) -> bool {
    match h.domain.mr_alloc(1, MrAccess::REMOTE_READ) {
        Ok(_) => true,
        Err(Error::NoSys) => false,
        Err(e) => panic!("mr_alloc(1): {e}"),
    }
}

fn filled(len: usize, seed: u8) -> BytesMut {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect::<Vec<u8>>()
        .as_slice()
        .into()
}

/// Bad requests fail with the same error on every provider, before the
/// provider sees them, and the buffers come back untouched.
async fn bad_requests_are_refused_and_lose_nothing(p: Provider) {
    let h = harness(&p);
    let d = &h.domain;
    let check = |attr: MrAttr<'_>, want: Error, bufs: &[BytesMut]| {
        let e = d.mr_regattr(attr).expect_err("must be refused");
        assert_eq!(e.error, want);
        assert_eq!(e.buffers, bufs, "buffers come back as they were");
    };
    let b = filled(64, 1);
    check(
        MrAttr::buffer(b.clone(), MrAccess::empty()),
        Error::Inval,
        std::slice::from_ref(&b),
    );
    check(
        MrAttr::buffer(BytesMut::new(), RW),
        Error::Inval,
        &[BytesMut::new()],
    );
    check(MrAttr::alloc(0, RW), Error::Inval, &[]);
    check(
        MrAttr::buffer(b.clone(), RW).offset(8),
        Error::Inval,
        std::slice::from_ref(&b),
    );
    let limit = d.info().domain_attr.mr_iov_limit.max(1);
    let many: Vec<BytesMut> = (0..=limit).map(|i| filled(16, i as u8)).collect();
    check(MrAttr::iov(many.clone(), RW), Error::Inval, &many);
    check(MrAttr::iov(Vec::new(), RW), Error::Inval, &[]);
    // Flags that need a capability the domain lacks.
    for f in [
        MrRegFlags::RMA_EVENT,
        MrRegFlags::RMA_PMEM,
        MrRegFlags::HMEM_DEVICE_ONLY,
        MrRegFlags::DMABUF,
    ] {
        check(
            MrAttr::buffer(b.clone(), RW).flags(f),
            Error::BadFlags,
            std::slice::from_ref(&b),
        );
    }
    if !registers(&h) {
        // A well-formed request: NoSys, buffer back.
        let e = d.mr_reg(b.clone(), RW).expect_err("no registration");
        assert_eq!((e.error, e.buffers), (Error::NoSys, vec![b.clone()]));
        let e = d.mr_regv(vec![b.clone()], RW).expect_err("no registration");
        assert_eq!(e.error, Error::NoSys);
        return;
    }
    // Single-use keys need a target that sees remote accesses (tcp,
    // rma_events.rs); verbs refuses them, again losing nothing.
    if !sees_remote_accesses(&p) {
        check(
            MrAttr::buffer(b.clone(), RW).flags(MrRegFlags::SINGLE_USE),
            Error::BadFlags,
            std::slice::from_ref(&b),
        );
    }
}

/// Whether `p` offers `FI_RMA_EVENT` (it sees remote accesses at the
/// target): the offer of `rma_events.rs`.
pub fn sees_remote_accesses(p: &Provider) -> bool {
    p.try_info_with(EpType::Rdm, |h| {
        h.caps = Caps::MSG | Caps::RMA | Caps::RMA_EVENT;
        h.domain_attr.mr_mode = MrMode::PROV_KEY | MrMode::VIRT_ADDR | MrMode::LOCAL;
    })
    .is_some()
}

/// A provider that cannot see remote accesses never offers what needs
/// it, and refuses each call with its documented error: `FI_RMA_EVENT`
/// and the modes `FI_MR_RMA_EVENT`/`FI_MR_ENDPOINT` are in no result,
/// `fi_mr_bind` is `NoSys` (fi_mr(3)), as are `fi_mr_enable` (regions are
/// reachable from registration) and remote counters on endpoints,
/// single-use keys are `BadFlags`. Providers that do see them are
/// checked in `rma_events.rs`.
async fn target_visible_access_is_refused_where_not_offered(p: Provider) {
    if sees_remote_accesses(&p) {
        // Offered, but only on request: RMA hints without it get neither
        // the cap nor a mode that would make regions wait.
        let info = p.rma_info(EpType::Rdm);
        assert!(!info.caps.contains(Caps::RMA_EVENT));
        assert!(!info
            .domain_attr
            .mr_mode
            .intersects(MrMode::RMA_EVENT | MrMode::ENDPOINT));
        return;
    }
    let every =
        MrMode::PROV_KEY | MrMode::VIRT_ADDR | MrMode::LOCAL | MrMode::RMA_EVENT | MrMode::ENDPOINT;
    let info = p
        .try_info_with(EpType::Rdm, |h| {
            h.caps = Caps::MSG | Caps::RMA;
            h.domain_attr.mr_mode = every;
        })
        .expect("an RMA offer");
    assert!(!info.caps.contains(Caps::RMA_EVENT));
    assert!(!info
        .domain_attr
        .mr_mode
        .intersects(MrMode::RMA_EVENT | MrMode::ENDPOINT));
    let h = Harness::with_info(&p, info);
    let d = &h.domain;
    let mr = d.mr_alloc(64, RW).expect("register");
    let c = d.counter().unwrap();
    assert_eq!(
        mr.bind_counter(&c, BindFlags::REMOTE_WRITE),
        Err(Error::NoSys)
    );
    let ep = h.endpoint();
    assert_eq!(mr.bind_endpoint(&ep), Err(Error::NoSys));
    assert_eq!(mr.enable(), Err(Error::NoSys));
    for f in [BindFlags::REMOTE_READ, BindFlags::REMOTE_WRITE] {
        assert_eq!(ep.bind_counter(&c, f), Err(Error::NoSys));
    }
    let b = filled(16, 4);
    let e = d
        .mr_regattr(MrAttr::buffer(b.clone(), RW).flags(MrRegFlags::SINGLE_USE))
        .unwrap_err();
    assert_eq!((e.error, e.buffers), (Error::BadFlags, vec![b]));
    // An info made up with the cap opens no endpoint.
    let mut forged = h.info.clone();
    forged.caps |= Caps::RMA_EVENT;
    assert_eq!(d.endpoint(&forged).unwrap_err(), Error::NoSys);
}

/// A buffer registered in place: the region is the buffer (its bytes,
/// its address), copies go through to it, and taking it back returns
/// the same allocation with what was written.
async fn application_buffers_register_in_place(p: Provider) {
    let h = harness(&p);
    if !registers(&h) {
        return;
    }
    let d = &h.domain;
    let mut access = Vec::new();
    for bits in 1u64..64 {
        let a = MrAccess::from_bits_truncate(bits << 8);
        access.push(a);
    }
    for (i, len) in [1usize, 7, 4096, 65_537, 1 << 20, 8 << 20]
        .into_iter()
        .enumerate()
    {
        let buf = filled(len, i as u8);
        let ptr = buf.as_ptr() as u64;
        let want = buf.clone();
        let a = access[i * 11 % access.len()];
        let mr = d.mr_reg(buf, a).expect("register in place");
        assert_eq!(mr.len(), len);
        assert_eq!(mr.access(), a);
        if mr_mode(d).contains(MrMode::VIRT_ADDR) {
            assert_eq!(mr.addr(), ptr, "FI_MR_VIRT_ADDR: the buffer's own address");
        } else {
            assert_eq!(mr.addr(), 0, "offsets address the region");
        }
        assert_eq!(mr.to_vec().unwrap(), want, "the region is the buffer");
        mr.write_at(len - 1, b"Z").unwrap();
        assert_eq!(mr.write_at(len, b"Z"), Err(Error::Inval));
        let back = mr.take_buffers().expect("take back");
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].as_ptr() as u64, ptr, "the same allocation");
        assert_eq!(&back[0][..len - 1], &want[..len - 1]);
        assert_eq!(back[0][len - 1], b'Z');
        assert_eq!(mr.take_buffers().unwrap_err(), Error::Canceled);
        assert_eq!(mr.read_at(0, &mut [0u8; 1]), Err(Error::Canceled));
        mr.close().unwrap();
    }
    // Every access combination registers.
    for a in access {
        let mr = d
            .mr_reg(filled(64, 3), a)
            .expect("every access combination");
        assert_eq!(mr.access(), a);
    }
    // Regions on provider memory have no buffers to give back.
    let mr = alloc_key(d, 64, RW, 1000);
    assert_eq!(mr.take_buffers().unwrap_err(), Error::Inval);
    // Register, take back, free, allocate anew (the allocator may hand
    // out the same address) and register again: each region holds the
    // bytes it was given.
    for round in 0..8u8 {
        let mr = d.mr_reg(filled(256 << 10, round), RW).unwrap();
        let mut first = [0u8; 4];
        mr.read_at(0, &mut first).unwrap();
        assert_eq!(&first[..], &filled(4, round)[..], "round {round}");
        drop(mr.take_buffers().unwrap());
    }
}

/// Several buffers make one region, addressed as their concatenation, up
/// to the domain's `mr_iov_limit`; taking them back returns each one.
async fn buffers_register_as_one_region(p: Provider) {
    let h = harness(&p);
    if !registers(&h) {
        return;
    }
    let d = &h.domain;
    let limit = d.info().domain_attr.mr_iov_limit.max(1);
    let bufs: Vec<BytesMut> = (0..limit).map(|i| filled(3 + i, i as u8)).collect();
    let all: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
    let mr = d.mr_regv(bufs.clone(), RW).expect("regv up to the limit");
    assert_eq!(mr.len(), all.len());
    assert_eq!(mr.to_vec().unwrap(), all);
    // A write across every boundary.
    let mark = vec![0xeeu8; all.len() - 2];
    mr.write_at(1, &mark).unwrap();
    let back = mr.take_buffers().unwrap();
    assert_eq!(back.len(), limit);
    for (b, orig) in back.iter().zip(&bufs) {
        assert_eq!(b.len(), orig.len(), "each buffer comes back whole");
    }
    let joined: Vec<u8> = back.iter().flat_map(|b| b.iter().copied()).collect();
    assert_eq!(joined[0], all[0]);
    assert_eq!(&joined[1..all.len() - 1], &mark[..]);
    assert_eq!(joined[all.len() - 1], all[all.len() - 1]);
}

/// Without `FI_MR_PROV_KEY` the key is the one asked for, and a key in
/// use in the domain is refused with `NoKey`, the buffer coming back;
/// once its region closes the key is free again.
async fn requested_keys_are_used_and_unique(p: Provider) {
    let h = harness(&p);
    if !registers(&h) || mr_mode(&h.domain).contains(MrMode::PROV_KEY) {
        return;
    }
    let d = &h.domain;
    let a = reg_key(d, filled(16, 1), RW, 0xfeed).unwrap();
    assert_eq!(a.key(), 0xfeed);
    let b = filled(16, 2);
    let e = reg_key(d, b.clone(), RW, 0xfeed).unwrap_err();
    assert_eq!((e.error, e.buffers), (Error::NoKey, vec![b.clone()]));
    let e = d
        .mr_regattr(MrAttr::sub(&a, 0, 4, RW).requested_key(0xfeed))
        .unwrap_err();
    assert_eq!(e.error, Error::NoKey, "sub-regions share the key space");
    // Another domain has keys of its own.
    let other = h.other_domain();
    let o = reg_key(&other, b.clone(), RW, 0xfeed).unwrap();
    assert_eq!(o.key(), 0xfeed);
    a.close().unwrap();
    let again = reg_key(d, filled(8, 3), RW, 0xfeed).expect("key free after close");
    assert_eq!(again.key(), 0xfeed);
}

/// fi_mr_raw_attr / fi_mr_map_raw / fi_mr_unmap_key work on any region.
async fn raw_keys_round_trip(p: Provider) {
    let h = harness(&p);
    if !registers(&h) {
        return;
    }
    let d = &h.domain;
    let mr = d.mr_alloc(4096, RW).unwrap();
    let size = mr.raw_key_size();
    assert_eq!(size, d.info().domain_attr.mr_key_size);
    let mut short = vec![0u8; size - 1];
    assert_eq!(mr.raw_attr(&mut short).unwrap_err(), Error::TooSmall);
    let mut raw = vec![0xaau8; size + 4];
    let (base, n) = mr.raw_attr(&mut raw).unwrap();
    assert_eq!((base, n), (mr.addr(), size));
    assert_eq!(&raw[size..], &[0xaa; 4], "nothing written past the key");
    let key = d.map_raw(base, &raw[..n]).unwrap();
    assert_eq!(key, mr.key());
    d.unmap_key(key).unwrap();
    assert_eq!(d.map_raw(base, &raw[..n + 1]).unwrap_err(), Error::Inval);
    mr.close().unwrap();
    assert_eq!(mr.raw_attr(&mut raw).unwrap_err(), Error::Canceled);
}

/// Sub-regions: inside the base, own key and access, same memory; the
/// base cannot close or give its buffers back while they live.
async fn sub_regions_share_memory_and_hold_the_base(p: Provider) {
    let h = harness(&p);
    if !registers(&h) {
        return;
    }
    let d = &h.domain;
    let virt = mr_mode(d).contains(MrMode::VIRT_ADDR);
    let base = reg_key(d, filled(8192, 9), RW, 1).unwrap();
    let sub = d
        .mr_regattr(MrAttr::sub(&base, 4096, 1024, MrAccess::REMOTE_READ).requested_key(2))
        .unwrap();
    assert!(sub.is_sub_region() && !base.is_sub_region());
    if virt {
        assert_eq!(sub.addr(), base.addr() + 4096);
    } else {
        assert_eq!(sub.addr(), 0, "addressed from its own start");
    }
    assert_eq!(sub.len(), 1024);
    assert_eq!(sub.access(), MrAccess::REMOTE_READ);
    assert_ne!(sub.key(), base.key(), "a key of its own");
    // One memory: a write through either is seen by the other.
    base.write_at(4096, b"base").unwrap();
    let mut got = [0u8; 4];
    sub.read_at(0, &mut got).unwrap();
    assert_eq!(&got, b"base");
    sub.write_at(1020, b"sub!").unwrap();
    base.read_at(5116, &mut got).unwrap();
    assert_eq!(&got, b"sub!");
    // Outside the base, zero length, with flags, another domain's base.
    for (off, len) in [(8192, 1), (8000, 193), (0, 0), (usize::MAX, 2)] {
        let e = d.mr_regattr(MrAttr::sub(&base, off, len, RW)).unwrap_err();
        assert_eq!(e.error, Error::Inval, "sub {off}+{len}");
    }
    let e = d
        .mr_regattr(MrAttr::sub(&base, 0, 8, RW).flags(MrRegFlags::SINGLE_USE))
        .unwrap_err();
    assert_eq!(e.error, Error::BadFlags);
    let other = h.other_domain();
    let e = other.mr_regattr(MrAttr::sub(&base, 0, 8, RW)).unwrap_err();
    assert_eq!(e.error, Error::Domain);
    // A sub-region of a sub-region is inside both.
    let subsub = d
        .mr_regattr(MrAttr::sub(&sub, 16, 16, MrAccess::REMOTE_WRITE).requested_key(3))
        .unwrap();
    if virt {
        assert_eq!(subsub.addr(), base.addr() + 4096 + 16);
    }
    // The base stays while they live.
    assert_eq!(base.close().unwrap_err(), Error::Busy);
    assert_eq!(base.take_buffers().unwrap_err(), Error::Busy);
    assert_eq!(sub.close().unwrap_err(), Error::Busy);
    base.read_at(0, &mut got).unwrap();
    subsub.close().unwrap();
    sub.close().unwrap();
    assert_eq!(sub.take_buffers().unwrap_err(), Error::Inval);
    let back = base.take_buffers().unwrap();
    assert_eq!(&back[0][4096..4100], b"base");
    assert_eq!(&back[0][5116..5120], b"sub!");
    // A closed base takes no new sub-regions.
    let e = d.mr_regattr(MrAttr::sub(&base, 0, 8, RW)).unwrap_err();
    assert_eq!(e.error, Error::Canceled);
    // Dropping a base before its sub-region leaves the sub-region whole:
    // the memory stays with it.
    let base = alloc_key(d, 4096, RW, 4);
    base.write_at(100, b"kept").unwrap();
    let sub = d
        .mr_regattr(MrAttr::sub(&base, 100, 4, RW).requested_key(5))
        .unwrap();
    drop(base);
    let mut got = [0u8; 4];
    sub.read_at(0, &mut got).unwrap();
    assert_eq!(&got, b"kept");
}

provider_tests! {
    bad_requests_are_refused_and_lose_nothing,
    application_buffers_register_in_place,
    raw_keys_round_trip,
    sub_regions_share_memory_and_hold_the_base,
    buffers_register_as_one_region,
    requested_keys_are_used_and_unique,
    target_visible_access_is_refused_where_not_offered,
}

shm_tests! {
    bad_requests_are_refused_and_lose_nothing,
    application_buffers_register_in_place,
    raw_keys_round_trip,
    sub_regions_share_memory_and_hold_the_base,
    buffers_register_as_one_region,
    requested_keys_are_used_and_unique,
    target_visible_access_is_refused_where_not_offered,
}
