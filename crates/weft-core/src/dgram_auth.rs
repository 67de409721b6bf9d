//! Authorization keys on datagrams (udp `FI_EP_DGRAM`; `docs/wire.md`
//! section 15, `docs/design.md` "Authorization keys"): a datagram has no
//! connection to prove a key on once, so every datagram of a keyed
//! endpoint proves it itself, with a trailer after its payload: a
//! sequence number and a short MAC ([`SHORT_MAC_LEN`] bytes of
//! HMAC-SHA256) over the sender's and the receiver's addresses, the
//! header, the sequence number and the payload. The addresses keep a
//! captured datagram from being replayed from another source (where it
//! would find no window) or to another receiver of the same key.
//!
//! The MAC key is not the authorization key itself but one derived from
//! it with a label of its own ([`DgramKey::new`]), so a datagram MAC can
//! never stand in for a connection proof (`auth::Transcript`) or a key
//! selector, which use the raw key.
//!
//! A captured datagram sent again is refused by a per-source anti-replay
//! window ([`Replay`]): the highest sequence number seen and a 64-bit
//! bitmap of the 64 before it, as IPsec (RFC 4303 section 3.4.3) keeps.
//! Windows are created only for datagrams whose MAC verified, and at most
//! [`MAX_SOURCES`] of them are kept, so datagrams from anyone without the
//! key cannot make the table grow at all.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::addr::FiAddr;
use crate::auth::{AuthKey, SHORT_MAC_LEN};
use crate::wire::claim::canonical;
use crate::{Error, Result};

/// Bytes of the sequence number in a trailer.
pub const SEQ_LEN: usize = 8;
/// Bytes of a datagram's trailer: the sequence number, then the MAC.
pub const TRAILER_LEN: usize = SEQ_LEN + SHORT_MAC_LEN;
/// Bytes of a key identifier ([`DgramKey::id`]).
pub const KEY_ID_LEN: usize = 8;
/// Bytes of the trailer of a datagram that names its key (an endpoint
/// holding an AV's keys, `FI_AV_AUTH_KEY`): the key identifier, then a
/// [`TRAILER_LEN`] trailer.
pub const ID_TRAILER_LEN: usize = KEY_ID_LEN + TRAILER_LEN;
/// Sequence numbers below a source's highest that are still told apart
/// (older ones are refused as replays).
pub const WINDOW: u64 = 64;
/// Sources a receiver keeps a window for; past it the least recently
/// heard one is forgotten.
pub const MAX_SOURCES: usize = 1024;

/// Label of the derived datagram MAC key: no other use of the key
/// hashes it.
const DERIVE_LABEL: &[u8] = b"weft-udp-1 datagram mac key";
/// Label of the key identifier: another use of the key, so the
/// identifier says nothing about the MAC key.
const ID_LABEL: &[u8] = b"weft-udp-1 key identifier";

/// A key identifier: the first [`KEY_ID_LEN`] bytes of HMAC-SHA256(key,
/// label), the same for every datagram of the key.
pub type KeyId = [u8; KEY_ID_LEN];
/// The MAC key of datagrams of one authorization key. Its `Debug` form
/// does not show it.
#[derive(Clone)]
pub struct DgramKey {
    /// HMAC keyed with the derived key, before any data: cloned for each
    /// datagram, so the key's padding is hashed once, not per datagram.
    base: Hmac<Sha256>,
    id: KeyId,
}

impl fmt::Debug for DgramKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DgramKey")
    }
}

/// The bytes a MAC takes of an address: the family (4 or 6), the IP
/// address, the port (big-endian). An IPv4-mapped IPv6 address is its
/// IPv4 form; flow label and scope are left out, as a peer on another
/// host sees them differently.
pub type AddrBytes = ([u8; 19], usize);

/// [`AddrBytes`] of `a`.
pub fn addr_bytes(a: &SocketAddr) -> AddrBytes {
    let a = canonical(*a);
    let mut b = [0u8; 19];
    let n = match a.ip() {
        IpAddr::V4(ip) => {
            b[0] = 4;
            b[1..5].copy_from_slice(&ip.octets());
            5
        }
        IpAddr::V6(ip) => {
            b[0] = 6;
            b[1..17].copy_from_slice(&ip.octets());
            17
        }
    };
    b[n..n + 2].copy_from_slice(&a.port().to_be_bytes());
    (b, n + 2)
}

impl DgramKey {
    /// The datagram MAC key of `key`: HMAC-SHA256(key, label).
    pub fn new(key: &AuthKey) -> Result<DgramKey> {
        let mut d = Hmac::<Sha256>::new_from_slice(key.as_bytes()).map_err(|_| Error::Inval)?;
        d.update(DERIVE_LABEL);
        let derived = d.finalize().into_bytes();
        let base = Hmac::<Sha256>::new_from_slice(&derived).map_err(|_| Error::Inval)?;
        let mut i = Hmac::<Sha256>::new_from_slice(key.as_bytes()).map_err(|_| Error::Inval)?;
        i.update(ID_LABEL);
        let mut id = [0u8; KEY_ID_LEN];
        id.copy_from_slice(&i.finalize().into_bytes()[..KEY_ID_LEN]);
        Ok(DgramKey { base, id })
    }

    /// The key's identifier, which a datagram naming its key carries in
    /// the clear: the same for every datagram of the key, so it links
    /// them (and a guess of the key can be checked against it, as
    /// against any MAC), but it proves nothing and cannot be turned back
    /// into the key.
    pub fn id(&self) -> KeyId {
        self.id
    }

    fn mac<'a>(
        &self,
        (src, dst): (&AddrBytes, &AddrBytes),
        header: &[u8],
        id: Option<&KeyId>,
        seq: u64,
        payload: impl IntoIterator<Item = &'a [u8]>,
    ) -> Hmac<Sha256> {
        let mut m = self.base.clone();
        for (b, n) in [src, dst] {
            m.update(b.get(..*n).unwrap_or(&[]));
        }
        m.update(header);
        if let Some(id) = id {
            m.update(id);
        }
        m.update(&seq.to_le_bytes());
        for p in payload {
            m.update(p);
        }
        m
    }

    /// The trailer of a datagram from `src` to `dst` with `header`,
    /// sequence number `seq` and the payload in `payload`'s pieces.
    pub fn seal<'a>(
        &self,
        src: &AddrBytes,
        dst: &AddrBytes,
        header: &[u8],
        seq: u64,
        payload: impl IntoIterator<Item = &'a [u8]>,
    ) -> [u8; TRAILER_LEN] {
        let mut t = [0u8; TRAILER_LEN];
        self.seal_into(&mut t, None, (src, dst), header, seq, payload);
        t
    }

    /// [`seal`](Self::seal) for a datagram that names its key: the key
    /// identifier first, then the sequence number and a MAC that covers
    /// the identifier too.
    pub fn seal_with_id<'a>(
        &self,
        src: &AddrBytes,
        dst: &AddrBytes,
        header: &[u8],
        seq: u64,
        payload: impl IntoIterator<Item = &'a [u8]>,
    ) -> [u8; ID_TRAILER_LEN] {
        let mut t = [0u8; ID_TRAILER_LEN];
        let (id, rest) = t.split_at_mut(KEY_ID_LEN);
        id.copy_from_slice(&self.id);
        self.seal_into(rest, Some(&self.id), (src, dst), header, seq, payload);
        t
    }

    /// Writes the sequence number and the MAC into `t` (`TRAILER_LEN`
    /// bytes).
    fn seal_into<'a>(
        &self,
        t: &mut [u8],
        id: Option<&KeyId>,
        ends: (&AddrBytes, &AddrBytes),
        header: &[u8],
        seq: u64,
        payload: impl IntoIterator<Item = &'a [u8]>,
    ) {
        let full = self
            .mac(ends, header, id, seq, payload)
            .finalize()
            .into_bytes();
        let (s, m) = t.split_at_mut(SEQ_LEN);
        s.copy_from_slice(&seq.to_le_bytes());
        m.copy_from_slice(&full[..SHORT_MAC_LEN]);
    }

    /// Checks a datagram's trailer in constant time and returns its
    /// sequence number; `KeyRejected` for a trailer of another length or
    /// a MAC this key did not make for exactly these bytes from `src` to
    /// `dst`.
    pub fn open(
        &self,
        src: &AddrBytes,
        dst: &AddrBytes,
        header: &[u8],
        payload: &[u8],
        trailer: &[u8],
    ) -> Result<u64> {
        self.check(None, (src, dst), header, payload, trailer)
    }

    /// [`open`](Self::open) for a datagram that names its key: the
    /// trailer is [`ID_TRAILER_LEN`] bytes and its identifier this key's.
    pub fn open_with_id(
        &self,
        src: &AddrBytes,
        dst: &AddrBytes,
        header: &[u8],
        payload: &[u8],
        trailer: &[u8],
    ) -> Result<u64> {
        // The identifier is public (it travels in the clear), so an
        // ordinary comparison gives nothing away.
        match trailer.split_at_checked(KEY_ID_LEN) {
            Some((id, rest)) if id == self.id => {
                self.check(Some(&self.id), (src, dst), header, payload, rest)
            }
            _ => Err(Error::KeyRejected),
        }
    }

    fn check(
        &self,
        id: Option<&KeyId>,
        ends: (&AddrBytes, &AddrBytes),
        header: &[u8],
        payload: &[u8],
        trailer: &[u8],
    ) -> Result<u64> {
        if trailer.len() != TRAILER_LEN {
            return Err(Error::KeyRejected);
        }
        let (s, tag) = trailer.split_at(SEQ_LEN);
        let mut w = [0u8; SEQ_LEN];
        w.copy_from_slice(s);
        let seq = u64::from_le_bytes(w);
        self.mac(ends, header, id, seq, [payload])
            .verify_truncated_left(tag)
            .map_err(|_| Error::KeyRejected)?;
        Ok(seq)
    }

    /// The identifier a trailer of [`ID_TRAILER_LEN`] bytes names, if it
    /// is that long.
    pub fn named_id(trailer: &[u8]) -> Option<KeyId> {
        if trailer.len() != ID_TRAILER_LEN {
            return None;
        }
        let mut id = [0u8; KEY_ID_LEN];
        id.copy_from_slice(trailer.get(..KEY_ID_LEN)?);
        Some(id)
    }
}

/// The datagram keys of an endpoint that holds an AV's keys
/// (`FI_AV_AUTH_KEY`), by key handle, and found by the identifier a
/// datagram names: a receiver checks the MAC of the key(s) with that
/// identifier only — one, unless two of its keys' identifiers collide
/// (then each is tried) — never every key it holds.
#[derive(Debug, Clone, Default)]
pub struct NamedKeys {
    /// By handle, ascending.
    keys: Vec<(FiAddr, DgramKey)>,
    /// Indexes into `keys`, by identifier.
    by_id: Vec<(KeyId, usize)>,
}

impl NamedKeys {
    /// The datagram keys of `keys` (an AV's keys with their handles).
    pub fn new(keys: &[(FiAddr, AuthKey)]) -> Result<NamedKeys> {
        let mut v = keys
            .iter()
            .map(|(h, k)| DgramKey::new(k).map(|d| (*h, d)))
            .collect::<Result<Vec<_>>>()?;
        v.sort_by_key(|(h, _)| *h);
        let mut by_id: Vec<(KeyId, usize)> =
            v.iter().enumerate().map(|(i, (_, k))| (k.id, i)).collect();
        by_id.sort_unstable();
        Ok(NamedKeys { keys: v, by_id })
    }

    /// No key held.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key of handle `h`, if held.
    pub fn get(&self, h: FiAddr) -> Option<&DgramKey> {
        self.keys
            .binary_search_by_key(&h, |(k, _)| *k)
            .ok()
            .and_then(|i| self.keys.get(i))
            .map(|(_, k)| k)
    }

    /// The handles held.
    pub fn handles(&self) -> impl Iterator<Item = FiAddr> + '_ {
        self.keys.iter().map(|(h, _)| *h)
    }

    /// Checks a datagram that names its key ([`ID_TRAILER_LEN`] trailer):
    /// the handle of the held key whose MAC it carries, and its sequence
    /// number; `KeyRejected` when no held key has its identifier or the
    /// MAC is not that key's.
    pub fn open(
        &self,
        ends: (&AddrBytes, &AddrBytes),
        header: &[u8],
        payload: &[u8],
        trailer: &[u8],
    ) -> Result<(FiAddr, u64)> {
        let id = DgramKey::named_id(trailer).ok_or(Error::KeyRejected)?;
        let from = self.by_id.partition_point(|(k, _)| *k < id);
        for (_, i) in self.by_id.iter().skip(from).take_while(|(k, _)| *k == id) {
            if let Some((h, k)) = self.keys.get(*i) {
                if let Ok(seq) = k.open_with_id(ends.0, ends.1, header, payload, trailer) {
                    return Ok((*h, seq));
                }
            }
        }
        Err(Error::KeyRejected)
    }
}

/// One source's window: the highest sequence number accepted, and which
/// of the [`WINDOW`] below it were (bit `i`: `top - i`).
#[derive(Debug, Clone, Copy)]
struct Window {
    top: u64,
    seen: u64,
    /// When it was last used ([`Replay`]'s clock), for eviction.
    used: u64,
}

impl Window {
    fn new(seq: u64) -> Window {
        Window {
            top: seq,
            seen: 1,
            used: 0,
        }
    }

    /// Accepts `seq` once: newer than the top, or within the window and
    /// not seen yet.
    fn accept(&mut self, seq: u64) -> bool {
        if seq > self.top {
            let shift = seq - self.top;
            self.seen = if shift >= WINDOW {
                0
            } else {
                self.seen << shift
            };
            self.seen |= 1;
            self.top = seq;
            return true;
        }
        let back = self.top - seq;
        if back >= WINDOW {
            return false;
        }
        let bit = 1u64 << back;
        if self.seen & bit != 0 {
            return false;
        }
        self.seen |= bit;
        true
    }
}

/// The anti-replay windows of one receiver, at most `cap` sources.
#[derive(Debug)]
pub struct Replay {
    windows: HashMap<SocketAddr, Window>,
    cap: usize,
    clock: u64,
}

impl Default for Replay {
    fn default() -> Replay {
        Replay::new(MAX_SOURCES)
    }
}

impl Replay {
    /// Windows for at most `cap` sources (at least one).
    pub fn new(cap: usize) -> Replay {
        Replay {
            windows: HashMap::new(),
            cap: cap.max(1),
            clock: 0,
        }
    }

    /// Whether a datagram from `src` with sequence number `seq`, whose
    /// MAC has verified, is new (true, and now seen) or a replay. A
    /// source heard for the first time (or again after it was evicted)
    /// starts a window at `seq`; with `cap` sources held, the one heard
    /// least recently is evicted first.
    pub fn accept(&mut self, src: SocketAddr, seq: u64) -> bool {
        self.clock += 1;
        let now = self.clock;
        if let Some(w) = self.windows.get_mut(&src) {
            w.used = now;
            return w.accept(seq);
        }
        if self.windows.len() >= self.cap {
            // Only key holders reach here (the MAC verified first), so
            // this scan runs at most once per new keyed source.
            let oldest = self
                .windows
                .iter()
                .min_by_key(|(_, w)| w.used)
                .map(|(a, _)| *a);
            if let Some(a) = oldest {
                self.windows.remove(&a);
            }
        }
        let mut w = Window::new(seq);
        w.used = now;
        self.windows.insert(src, w);
        true
    }

    /// Sources with a window now.
    pub fn sources(&self) -> usize {
        self.windows.len()
    }
}

/// The first sequence number of a sender opened now: the time since the
/// Unix epoch in nanoseconds. A sender counts up from it by one per
/// datagram and cannot send one per nanosecond, so a later endpoint at
/// the same address starts above every number its predecessor used, and
/// its peers' windows for that address take it at once.
pub fn first_seq() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX / 2))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn key(k: &[u8]) -> DgramKey {
        DgramKey::new(&AuthKey::new(k).unwrap()).unwrap()
    }

    fn src(s: &str) -> AddrBytes {
        addr_bytes(&s.parse().unwrap())
    }

    const DST: &str = "192.0.2.9:5000";

    #[test]
    fn addr_bytes_layout() {
        let (b, n) = src("192.0.2.1:4000");
        assert_eq!(&b[..n], &[4, 192, 0, 2, 1, 0x0f, 0xa0]);
        assert_eq!(src("[::ffff:192.0.2.1]:4000"), src("192.0.2.1:4000"));
        let (b, n) = src("[2001:db8::1]:1");
        assert_eq!(n, 19);
        assert_eq!(b[0], 6);
        assert_eq!(&b[17..19], &[0, 1]);
    }

    #[test]
    fn derived_key_is_hmac_of_the_label() {
        // The datagram MAC is HMAC-SHA256 keyed with HMAC-SHA256(key,
        // label), computed here step by step with the hmac crate.
        let raw = b"job-1";
        let mut d = Hmac::<Sha256>::new_from_slice(raw).unwrap();
        d.update(b"weft-udp-1 datagram mac key");
        let derived = d.finalize().into_bytes();
        let mut m = Hmac::<Sha256>::new_from_slice(&derived).unwrap();
        let s = src("192.0.2.1:4000");
        let d = src(DST);
        m.update(&s.0[..s.1]);
        m.update(&d.0[..d.1]);
        m.update(b"HDR");
        m.update(&7u64.to_le_bytes());
        m.update(b"payload");
        let want = m.finalize().into_bytes();
        let t = key(raw).seal(&s, &d, b"HDR", 7, [&b"pay"[..], b"load"]);
        assert_eq!(&t[..8], &7u64.to_le_bytes());
        assert_eq!(&t[8..], &want[..16]);
        // The raw key alone does not make it.
        let mut r = Hmac::<Sha256>::new_from_slice(raw).unwrap();
        r.update(&s.0[..s.1]);
        r.update(&d.0[..d.1]);
        r.update(b"HDR");
        r.update(&7u64.to_le_bytes());
        r.update(b"payload");
        assert_ne!(&r.finalize().into_bytes()[..16], &t[8..]);
    }

    #[test]
    fn a_trailer_proves_one_key_for_one_datagram_from_one_source() {
        let k = key(b"job-1");
        let s = src("192.0.2.1:4000");
        let d = src(DST);
        let t = k.seal(&s, &d, b"header", 42, [&b"data"[..]]);
        assert_eq!(k.open(&s, &d, b"header", b"data", &t), Ok(42));
        let other = key(b"job-2");
        assert_eq!(
            other.open(&s, &d, b"header", b"data", &t),
            Err(Error::KeyRejected)
        );
        for (s2, d2, h, p) in [
            (src("192.0.2.1:4001"), d, &b"header"[..], &b"data"[..]),
            (s, src("192.0.2.9:5001"), b"header", b"data"),
            (d, s, b"header", b"data"),
            (s, d, b"headeR", b"data"),
            (s, d, b"header", b"datA"),
            (s, d, b"header", b"dat"),
        ] {
            assert_eq!(k.open(&s2, &d2, h, p, &t), Err(Error::KeyRejected));
        }
        let mut seq = t;
        seq[0] ^= 1;
        assert_eq!(
            k.open(&s, &d, b"header", b"data", &seq),
            Err(Error::KeyRejected)
        );
        let mut mac = t;
        mac[TRAILER_LEN - 1] ^= 0x80;
        assert_eq!(
            k.open(&s, &d, b"header", b"data", &mac),
            Err(Error::KeyRejected)
        );
        for bad in [&t[..TRAILER_LEN - 1], &[][..]] {
            assert_eq!(
                k.open(&s, &d, b"header", b"data", bad),
                Err(Error::KeyRejected)
            );
        }
        let mut long = t.to_vec();
        long.push(0);
        assert_eq!(
            k.open(&s, &d, b"header", b"data", &long),
            Err(Error::KeyRejected)
        );
    }

    #[test]
    fn named_trailers_carry_the_identifier_under_the_mac() {
        let raw = b"job-1";
        let k = key(raw);
        let mut i = Hmac::<Sha256>::new_from_slice(raw).unwrap();
        i.update(b"weft-udp-1 key identifier");
        assert_eq!(&k.id()[..], &i.finalize().into_bytes()[..KEY_ID_LEN]);
        assert_ne!(k.id(), key(b"job-2").id());
        let (s, d) = (src("192.0.2.1:4000"), src(DST));
        let t = k.seal_with_id(&s, &d, b"H", 9, [&b"data"[..]]);
        assert_eq!(&t[..KEY_ID_LEN], &k.id());
        assert_eq!(DgramKey::named_id(&t), Some(k.id()));
        assert_eq!(k.open_with_id(&s, &d, b"H", b"data", &t), Ok(9));
        // Not the unnamed form, with or without the identifier cut off.
        assert_eq!(k.open(&s, &d, b"H", b"data", &t), Err(Error::KeyRejected));
        assert_eq!(
            k.open(&s, &d, b"H", b"data", &t[KEY_ID_LEN..]),
            Err(Error::KeyRejected),
            "the MAC covers the identifier"
        );
        let plain = k.seal(&s, &d, b"H", 9, [&b"data"[..]]);
        assert_eq!(
            k.open_with_id(&s, &d, b"H", b"data", &plain),
            Err(Error::KeyRejected)
        );
        // Another key's identifier in front of this key's MAC.
        let mut other = t;
        other[..KEY_ID_LEN].copy_from_slice(&key(b"job-2").id());
        assert_eq!(
            k.open_with_id(&s, &d, b"H", b"data", &other),
            Err(Error::KeyRejected)
        );
    }

    #[test]
    fn named_keys_find_the_key_by_its_identifier() {
        let keys: Vec<(FiAddr, AuthKey)> = (0..40u64)
            .map(|h| (h * 3, AuthKey::new(format!("job-{h}").as_bytes()).unwrap()))
            .collect();
        let set = NamedKeys::new(&keys).unwrap();
        assert!(!set.is_empty());
        assert!(set.get(1).is_none());
        assert_eq!(set.handles().count(), 40);
        let (s, d) = (src("192.0.2.1:4000"), src(DST));
        for (h, _) in &keys {
            let t = set
                .get(*h)
                .unwrap()
                .seal_with_id(&s, &d, b"H", *h, [&b"x"[..]]);
            assert_eq!(set.open((&s, &d), b"H", b"x", &t), Ok((*h, *h)));
            assert_eq!(set.open((&s, &d), b"H", b"y", &t), Err(Error::KeyRejected));
        }
        let stranger = key(b"job-x").seal_with_id(&s, &d, b"H", 1, [&b"x"[..]]);
        assert_eq!(
            set.open((&s, &d), b"H", b"x", &stranger),
            Err(Error::KeyRejected)
        );
        assert_eq!(
            set.open((&s, &d), b"H", b"x", &stranger[..TRAILER_LEN]),
            Err(Error::KeyRejected)
        );
        // The same key under two handles: either proves it.
        let k = AuthKey::new(b"twice").unwrap();
        let twin = NamedKeys::new(&[(5, k.clone()), (2, k)]).unwrap();
        let t = twin
            .get(5)
            .unwrap()
            .seal_with_id(&s, &d, b"H", 1, [&b"x"[..]]);
        assert!(twin.open((&s, &d), b"H", b"x", &t).is_ok());
    }

    #[test]
    fn the_window_takes_each_number_once() {
        let mut w = Window::new(100);
        assert!(!w.accept(100), "the first again");
        assert!(w.accept(102));
        assert!(w.accept(101), "late, within the window");
        assert!(!w.accept(101));
        assert!(!w.accept(102));
        assert!(w.accept(102 + 63 - 2), "new top");
        assert!(!w.accept(100), "now 63 behind and seen");
        assert!(w.accept(200));
        assert!(!w.accept(200 - 64), "past the window");
        assert!(w.accept(200 - 63), "the window's oldest");
        assert!(w.accept(u64::MAX));
        assert!(!w.accept(u64::MAX));
        assert!(!w.accept(0));
        // A jump of the window's width or more forgets everything below.
        let mut w = Window::new(0);
        assert!(w.accept(64));
        assert!(!w.accept(0));
        assert!(w.accept(1));
    }

    #[test]
    fn sources_are_bounded_and_independent() {
        let mut r = Replay::new(4);
        let a: SocketAddr = "192.0.2.1:1".parse().unwrap();
        let b: SocketAddr = "192.0.2.1:2".parse().unwrap();
        assert!(r.accept(a, 5));
        assert!(r.accept(b, 5), "another source's numbers are its own");
        assert!(!r.accept(a, 5));
        for port in 10..1000 {
            assert!(r.accept(SocketAddr::new(a.ip(), port), 1));
            assert!(r.sources() <= 4);
            // `a` is heard all along: never the one evicted.
            assert!(r.accept(a, 5 + u64::from(port)));
        }
        assert_eq!(r.sources(), 4);
        assert!(!r.accept(a, 5 + 999), "a's window survived");
    }

    #[test]
    fn first_sequence_numbers_grow() {
        let a = first_seq();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(first_seq() > a + 1_000_000);
    }
}
