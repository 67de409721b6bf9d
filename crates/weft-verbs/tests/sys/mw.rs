//! Type 2 memory windows: bound ahead of a send, read by the peer,
//! revoked by the peer's send with invalidate.

use super::*;
use weft_verbs::sys::MemoryWindow;

/// A region the window binds over: bindable, not remotely readable by
/// its own key.
fn source(p: &Pair, seed: u8) -> OwnedMr {
    let mut mr = OwnedMr::new(&p.pd, 8192, AccessFlags::MW_BIND).unwrap();
    mr.write_at(0, &pattern(8192, seed)).unwrap();
    mr
}

/// `b` reads `len` bytes at `addr` under `rkey` into `dst`.
fn read_from_b(p: &Pair, dst: &OwnedMr, wr_id: u64, addr: u64, rkey: u32, len: usize) {
    let sges = [dst.sge(0, len).unwrap()];
    p.b.post_send(&SendRequest::new(
        wr_id,
        SendOp::RdmaRead {
            remote_addr: addr,
            rkey,
        },
        Payload::Sges(&sges),
    ))
    .unwrap();
}

/// `a` binds `w` over `len` bytes at `off` of `src` and announces the key
/// with an inline send that `b` receives.
fn bind_and_announce(
    p: &Pair,
    w: &mut MemoryWindow,
    src: &OwnedMr,
    off: usize,
    len: usize,
    id: u64,
) {
    let note = OwnedMr::new(&p.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    p.b.post_recv(&RecvRequest {
        wr_id: id + 1,
        sges: &[note.sge(0, 64).unwrap()],
    })
    .unwrap();
    let rkey = w.next_rkey();
    let send = SendRequest::new(id, SendOp::Send, Payload::Inline(b"window"));
    p.a.post_bind_then_send((w, rkey), (src, off, len), &send)
        .unwrap();
    assert_eq!(w.rkey(), rkey);
    // One completion: the bind is unsignaled.
    assert_ok(&wait_one(&p.cq_a), id, WcOpcode::Send);
    assert_ok(&wait_one(&p.cq_b), id + 1, WcOpcode::Recv);
}

/// `b` revokes `rkey` with a send with invalidate; `a`'s receive names it.
fn revoke_from_b(p: &Pair, rkey: u32, id: u64) {
    let note = OwnedMr::new(&p.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    p.a.post_recv(&RecvRequest {
        wr_id: id + 1,
        sges: &[note.sge(0, 64).unwrap()],
    })
    .unwrap();
    p.b.post_send(&SendRequest::new(
        id,
        SendOp::SendWithInv(rkey),
        Payload::Inline(b"done"),
    ))
    .unwrap();
    assert_ok(&wait_one(&p.cq_b), id, WcOpcode::Send);
    let wc = wait_one(&p.cq_a);
    assert_ok(&wc, id + 1, WcOpcode::Recv);
    assert!(wc.wc_flags.contains(WcFlags::WITH_INV), "{wc:?}");
    assert!(!wc.wc_flags.contains(WcFlags::IP_CSUM_OK), "{wc:?}");
    assert_eq!(wc.invalidated_rkey, Some(rkey), "{wc:?}");
    assert_eq!(wc.byte_len, 4);
}

fn windows_or_skip() -> Option<(Arc<Context>, Pair)> {
    let ctx = open_or_skip("rxe0")?;
    let attr = ctx.query_device().unwrap();
    assert!(attr.has_windows(), "rxe binds type 2 windows: {attr:?}");
    let p = rc_pair(&ctx, None, false);
    Some((ctx, p))
}

#[test]
fn window_exposes_its_range_until_the_peer_revokes_it() {
    let Some((_ctx, p)) = windows_or_skip() else {
        return;
    };
    let src = source(&p, 7);
    let dst = OwnedMr::new(&p.pd, 8192, AccessFlags::LOCAL_WRITE).unwrap();
    let mut w = MemoryWindow::new(&p.pd).unwrap();

    // Refused before anything is posted: the same key byte, a range
    // outside the region, a region not bindable.
    let send = SendRequest::new(1, SendOp::Send, Payload::Inline(b"x"));
    let same = w.rkey();
    assert_eq!(
        p.a.post_bind_then_send((&mut w, same), (&src, 0, 100), &send)
            .unwrap_err(),
        Error::Inval
    );
    let next = w.next_rkey();
    assert_eq!(
        p.a.post_bind_then_send((&mut w, next), (&src, 8000, 193), &send)
            .unwrap_err(),
        Error::Inval
    );
    let plain = OwnedMr::new(&p.pd, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(
        p.a.post_bind_then_send((&mut w, next), (&plain, 0, 100), &send)
            .unwrap_err(),
        Error::Inval
    );
    assert_eq!(w.rkey(), same, "nothing was bound");

    bind_and_announce(&p, &mut w, &src, 4096, 1000, 10);
    let rkey = w.rkey();
    read_from_b(&p, &dst, 20, src.addr() + 4096, rkey, 1000);
    let wc = wait_one(&p.cq_b);
    assert_ok(&wc, 20, WcOpcode::RdmaRead);
    let mut got = vec![0u8; 1000];
    dst.read_at(0, &mut got).unwrap();
    assert_eq!(got, pattern(8192, 7)[4096..5096]);

    revoke_from_b(&p, rkey, 30);

    // Revoked, the window binds again under the next key.
    bind_and_announce(&p, &mut w, &src, 0, 512, 40);
    assert_ne!(w.rkey(), rkey);
    assert_eq!(w.rkey() & !0xff, rkey & !0xff);
    read_from_b(&p, &dst, 50, src.addr(), w.rkey(), 512);
    assert_ok(&wait_one(&p.cq_b), 50, WcOpcode::RdmaRead);
    dst.read_at(0, &mut got[..512]).unwrap();
    assert_eq!(got[..512], pattern(8192, 7)[..512]);

    // The region's own key grants nothing: it has no remote rights.
    read_from_b(&p, &dst, 60, src.addr(), src.rkey(), 64);
    let wc = wait_one(&p.cq_b);
    assert_eq!(
        (wc.wr_id, wc.status),
        (60, WcStatus::RemAccessErr),
        "{wc:?}"
    );
    // The window goes before its region, whose deregistration it would
    // otherwise hold up.
    drop(w);
    drop(src);
}

#[test]
fn a_revoked_windows_old_rkey_reads_nothing() {
    let Some((_ctx, p)) = windows_or_skip() else {
        return;
    };
    let src = source(&p, 9);
    let mut dst = OwnedMr::new(&p.pd, 8192, AccessFlags::LOCAL_WRITE).unwrap();
    let mut w = MemoryWindow::new(&p.pd).unwrap();
    bind_and_announce(&p, &mut w, &src, 0, 4096, 1);
    let old = w.rkey();
    revoke_from_b(&p, old, 3);
    dst.write_at(0, &[0xee; 64]).unwrap();
    read_from_b(&p, &dst, 5, src.addr(), old, 64);
    let wc = wait_one(&p.cq_b);
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::RemAccessErr), "{wc:?}");
    let mut got = [0u8; 64];
    dst.read_at(0, &mut got).unwrap();
    assert_eq!(got, [0xee; 64], "nothing landed");
    drop(w);
}
