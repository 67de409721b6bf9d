//! The receiver's reading of a segment without an endpoint: what the
//! fuzz target (`fuzz/fuzz_targets/shm_segment.rs`) feeds arbitrary
//! segment contents to. It takes the same steps, through the same
//! checks, as an endpoint's receive pass and a sender's look at a peer:
//! the header, each channel's claim and sender name, its records (each
//! published in band by its first word; padding, kinds, lengths within
//! the ring and the chunk) and the message rules
//! (first, continuation and last records against the total), and the
//! room a sender would compute from the receiver's head at the end of the
//! records read; CMA records and
//! direct RMA requests have their announcements parsed against their
//! totals. Each named channel's key proof is judged as a keyed owner
//! would judge it (`keyproof`), by one key and by two AV keys looked up
//! through the claim's key id: nothing a segment holds passes without
//! the key.

use std::sync::atomic::Ordering::Acquire;

use crate::layout::*;
use crate::ring::{check_first, check_next, header_geometry, Chan, Next};
use crate::segment::Segment;

/// What a scan found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Scan {
    /// The header declared a usable geometry.
    pub header_ok: bool,
    /// Records accepted.
    pub records: usize,
    /// Messages whose last record arrived.
    pub messages: usize,
    /// Payload bytes read out.
    pub bytes: usize,
    /// Channels that broke a rule.
    pub corrupt: usize,
    /// Channels whose key proof a keyed owner refused (all of them: the
    /// scan's key is its own).
    pub refused: usize,
}

/// The key a scan judges proofs with, and the nonce it "published".
const SCAN_KEY: &[u8] = b"weft-shm scan key";
/// The AV keys it judges with as well.
const SCAN_AV_KEYS: [&[u8]; 2] = [b"weft-shm scan job a", b"weft-shm scan job b"];

/// The owners a scan judges as: one key, and two AV keys.
fn scan_keys() -> Vec<crate::keys::EpKeys> {
    let key = |k: &[u8]| weft_core::auth::AuthKey::new(k).ok();
    let one = crate::keys::EpKeys::single(key(SCAN_KEY));
    let av = crate::keys::EpKeys::detached(
        SCAN_AV_KEYS
            .iter()
            .enumerate()
            .filter_map(|(h, k)| Some((h as u64, key(k)?)))
            .collect(),
    );
    one.into_iter().chain(av).collect()
}

/// Reads every channel of `seg`, laid out as `g`, as a receiver would:
/// at most `limit` records a channel, payloads copied out.
pub fn scan(seg: &Segment, g: Geometry, max_msg: usize, limit: usize) -> Scan {
    let mut out = Scan {
        header_ok: header_geometry(seg).is_some(),
        ..Scan::default()
    };
    let mut buf = vec![0u8; g.chunk()];
    let owners = scan_keys();
    for i in 0..g.channels {
        let c = Chan { g, i };
        // State and count from one load, as a receive pass reads them.
        let Some(word) = c.state_word(seg) else {
            continue;
        };
        if !matches!(state_of(word), ACTIVE | CLOSED) {
            continue;
        }
        let len = seg.load32(c.ctl(C_NAME_LEN), Acquire).unwrap_or(0) as usize;
        let mut name = [0u8; NAME_MAX];
        let named = len <= NAME_MAX
            && seg.read(c.ctl(C_NAME), &mut name[..len])
            && crate::name::valid(&name[..len]);
        if !named {
            out.corrupt += 1;
            continue;
        }
        // Judged as a keyed owner judges a claim (which writes only the
        // owner's verdict and proof words): by one key, and by several
        // named by the claim's key id (`FI_AV_AUTH_KEY`).
        let sender = std::str::from_utf8(&name[..len]).unwrap_or("");
        let gen = gen_of(word);
        for keys in &owners {
            let ok = crate::keyproof::judge(seg, &c, keys, Some([0; 16]), "scan", sender, gen);
            assert!(ok.is_none(), "a proof of a key nobody else holds accepted");
        }
        out.refused += 1;
        let mut head = 0u64;
        let mut msg: Option<(usize, usize)> = None;
        // The ring checked once, as `drain` takes it (`Chan::next` per
        // record would check it again each time).
        let ring = c.area(seg);
        for _ in 0..limit {
            let r = match ring.as_ref().map_or(Next::Corrupt, |r| c.next_in(r, head)) {
                Next::Empty => break,
                Next::Corrupt => {
                    out.corrupt += 1;
                    break;
                }
                Next::Rec(r) => r,
            };
            let n = r.head.len as usize;
            let ring = g.ring_at(i);
            assert!(r.payload >= ring + REC_HDR && r.payload + n <= ring + g.ring);
            assert!(r.next.wrapping_sub(head) <= g.ring as u64);
            if matches!(r.head.kind(), K_CMA | K_RMA_WD | K_RMA_RD) {
                // A whole message or RMA transfer announced: its ranges
                // must check out against its total, as the receive pass
                // checks them.
                let total = usize::try_from(r.head.total).unwrap_or(usize::MAX);
                let direct = r.head.kind() != K_CMA;
                let ok = msg.is_none()
                    && r.head.has(F_LAST)
                    && total <= max_msg
                    && (!direct || check_lead(&r.head, max_msg).is_some())
                    && seg.read(r.payload, &mut buf[..n])
                    && if direct {
                        crate::cma::DirectReq::parse(&buf[..n], total).is_some()
                    } else {
                        crate::cma::Announce::parse(&buf[..n], total).is_some()
                    };
                if !ok {
                    out.corrupt += 1;
                    break;
                }
                out.records += 1;
                out.messages += 1;
                out.bytes += n;
                head = r.next;
                continue;
            }
            let step = match (r.head.kind(), msg) {
                (K_FIRST, None) => check_first(&r.head, max_msg).map(|t| (0, t)),
                (K_RMA_W | K_RMA_R | K_RESP | K_ATOMIC, None) => match check_lead(&r.head, max_msg)
                {
                    // Its payload is the argument, not the transfer's
                    // bytes: those follow as continuations.
                    Some(total) if seg.read(r.payload, &mut buf[..n]) => {
                        out.records += 1;
                        if total == 0 {
                            out.messages += 1;
                        } else {
                            msg = Some((0, total));
                        }
                        head = r.next;
                        continue;
                    }
                    _ => None,
                },
                (K_CONT, Some(m)) => Some(m),
                _ => None,
            }
            .and_then(|(got, total)| Some((check_next(&r.head, got, total)?, total)));
            let Some((got, total)) = step else {
                out.corrupt += 1;
                break;
            };
            if !seg.read(r.payload, &mut buf[..n]) {
                out.corrupt += 1;
                break;
            }
            out.records += 1;
            out.bytes += n;
            if r.head.has(F_LAST) {
                out.messages += 1;
                msg = None;
            } else {
                msg = Some((got, total));
            }
            head = r.next;
        }
        // A sender's view of the same channel, its tail where the records
        // read end: the room it would write into, from a head it cannot
        // trust, never reaches the word before that head.
        let tail = head;
        if let Some(free) = c.room(seg, tail) {
            assert!(free + crate::ring::WORD_AHEAD <= g.ring);
            if let Some((pad, max)) = c.fit(tail, free) {
                assert!(pad + rec_len(max) <= free);
                assert!(max <= g.chunk());
            }
        }
    }
    out
}

/// The bytes that follow an RMA lead record (`docs/wire.md`, "RMA
/// records"), if it keeps the rules the receive pass applies: a write
/// request's 8-byte offset with `total` bytes to follow (last exactly
/// when none), a read request's offset alone (`total` 0, a length within
/// `max_msg`), an answer's empty payload with `total` bytes to follow.
pub fn check_lead(h: &crate::ring::RecHead, max_msg: usize) -> Option<usize> {
    let total = usize::try_from(h.total).ok().filter(|&t| t <= max_msg)?;
    let last_ok = h.has(F_LAST) == (total == 0);
    let ok = match h.kind() {
        K_RMA_W => h.len == 8 && last_ok,
        K_RMA_R => h.len == 8 && total == 0 && h.has(F_LAST) && h.data <= max_msg as u64,
        K_RESP => h.len == 0 && last_ok,
        // Their bytes move by CMA: one record, a payload that is an
        // offset and an announcement (checked against `total` when read).
        K_RMA_WD | K_RMA_RD => {
            (8 + crate::cma::announce_len(1)..=crate::cma::DIRECT_MAX).contains(&(h.len as usize))
                && total > 0
                && h.has(F_LAST)
        }
        K_ATOMIC => {
            h.len as usize == weft_core::wire::atomic::ATOMIC_HDR_LEN
                && last_ok
                && total <= 2 * weft_core::wire::atomic::ATOMIC_MAX
        }
        _ => false,
    };
    ok.then_some(total)
}

/// [`scan`] of arbitrary bytes as the segment of a small geometry (2
/// channels of 4 KiB), and again with the geometry its header declares
/// when that fits the bytes: the fuzz target's entry point. The first
/// 768 bytes are the header and control blocks, the rest the rings (the
/// padding between them stays zero), so short inputs reach records.
pub fn scan_bytes(bytes: &[u8]) -> Scan {
    let Some(g) = Geometry::check(2, 4096) else {
        return Scan::default();
    };
    let ctl = g.ctl(g.channels);
    let mut img = vec![0u8; g.bytes()];
    let (head, rings) = bytes.split_at(bytes.len().min(ctl));
    img[..head.len()].copy_from_slice(head);
    let n = rings.len().min(g.bytes() - g.rings());
    img[g.rings()..g.rings() + n].copy_from_slice(&rings[..n]);
    let Ok(seg) = Segment::anonymous(&img) else {
        return Scan::default();
    };
    let s = scan(&seg, g, 1 << 20, 64);
    if let Some(h) = header_geometry(&seg) {
        return scan(&seg, h, 1 << 20, 64);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_message_scans_and_garbage_does_not_panic() {
        let Some(g) = Geometry::check(2, 4096) else {
            return;
        };
        let Ok(seg) = Segment::anonymous(&vec![0u8; g.bytes()]) else {
            return;
        };
        let c = Chan { g, i: 1 };
        let active = state_gen(ACTIVE, 1);
        seg.store64(
            c.ctl(C_STATE_GEN),
            active,
            std::sync::atomic::Ordering::Release,
        );
        seg.store32(c.ctl(C_NAME_LEN), 1, std::sync::atomic::Ordering::Release);
        seg.write(c.ctl(C_NAME), b"p");
        let mut tail = 0;
        let ann = crate::cma::Announce {
            ranges: [(4096u64, 1 << 20)].into_iter().collect(),
            pool: None,
        }
        .encode();
        let direct = crate::cma::DirectReq {
            off: 64,
            ann: crate::cma::Announce {
                ranges: [(4096u64, 1 << 20)].into_iter().collect(),
                pool: None,
            },
        }
        .encode();
        for (word, len, total) in [
            (K_FIRST, 1000u32, 2048u64),
            (K_CONT, 1000, 2048),
            (K_CONT | F_LAST, 48, 2048),
            (K_CMA | F_LAST, ann.len() as u32, 1 << 20),
            // An RMA write of 100 bytes, a read request, an empty answer.
            (K_RMA_W, 8, 100),
            (K_CONT | F_LAST, 100, 100),
            (K_RMA_R | F_LAST, 8, 0),
            (K_RESP | F_LAST, 0, 0),
            // An atomic's prefix, then its 16 bytes of arrays.
            (K_ATOMIC, 32, 16),
            (K_CONT | F_LAST, 16, 16),
            // A direct write of 1 MiB: one record.
            (K_RMA_WD | F_LAST, direct.len() as u32, 1 << 20),
        ] {
            let h = crate::ring::RecHead {
                word,
                len,
                total,
                ..Default::default()
            };
            let free = c.room(&seg, tail).unwrap_or(0);
            let (pad, _) = c.fit(tail, free).unwrap_or((0, 0));
            tail = c.write_pad(&seg, tail, pad);
            let (at, t) = c.write_head(&seg, tail, &h);
            if word & 0xff == K_CMA {
                seg.write(at, &ann);
            }
            if word & 0xff == K_RMA_WD {
                seg.write(at, &direct);
            }
            c.publish(&seg, tail, word);
            tail = t;
        }
        let s = scan(&seg, g, 1 << 20, 64);
        let bytes = 2048 + ann.len() + 100 + 16 + direct.len();
        assert_eq!(
            (s.records, s.messages, s.bytes, s.corrupt),
            (11, 7, bytes, 0)
        );
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..300 {
            let junk: Vec<u8> = (0..g.bytes())
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            scan_bytes(&junk);
        }
    }
}
