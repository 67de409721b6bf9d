//! The control conversation around a benchmark, carried over the fabric
//! link itself: the client dictates the parameters (so a server started
//! with defaults serves any client), the server agrees or explains why
//! not, and a final message tells the server the client is done, so
//! neither side tears down while the other still has data in flight.
//! With `--rma` the two sides also tell each other where their regions
//! are ([`Region`]) before each size.

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::args::{PerfArgs, Rma};
use crate::fail::{Failure, Res};
use crate::link::{Link, CTRL_CAP};

const MAGIC: &[u8; 4] = b"WEFT";
/// 2: the parameters carry `--rma`.
const VERSION: u8 = 2;
const REGION: &[u8; 4] = b"RGN1";
const ELAPSED: &[u8; 4] = b"TIME";
const OK: &[u8] = b"ok";
const DONE: &[u8] = b"done";
const REFUSE: &[u8] = b"no:";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Pingpong = 1,
    Bw = 2,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Pingpong => "pingpong",
            Kind::Bw => "bw",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Params {
    pub kind: Kind,
    pub sizes: Vec<usize>,
    pub iters: usize,
    pub warmup: usize,
    pub window: usize,
    pub verify: bool,
    pub rma: Option<Rma>,
}

impl Params {
    pub fn from_args(kind: Kind, a: &PerfArgs) -> Params {
        Params {
            kind,
            sizes: a.sizes.clone(),
            iters: a.iters,
            // fi_pingpong-style untimed warm-up: 10% of the timed run. At
            // least one, so RDM's lazy connection setup is never timed.
            warmup: (a.iters / 10).max(1),
            window: a.window,
            verify: a.verify,
            rma: a.rma,
        }
    }

    /// Transfers per timed iteration, for the report's arithmetic: a
    /// ping-pong has two (the ping and the pong), so a row's usec/xfer is
    /// half a round trip; an RMA read is one transfer, its whole round
    /// trip (as ib_read_lat reports it); bw counts each message.
    pub fn xfers_per_iter(&self) -> usize {
        match (self.kind, self.rma) {
            (Kind::Pingpong, Some(Rma::Read)) | (Kind::Bw, _) => 1,
            (Kind::Pingpong, _) => 2,
        }
    }

    fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(64 + 8 * self.sizes.len());
        b.put_slice(MAGIC);
        b.put_u8(VERSION);
        b.put_u8(self.kind as u8);
        b.put_u8(u8::from(self.verify));
        b.put_u8(match self.rma {
            None => 0,
            Some(Rma::Write) => 1,
            Some(Rma::Read) => 2,
        });
        b.put_u64(self.iters as u64);
        b.put_u64(self.warmup as u64);
        b.put_u64(self.window as u64);
        b.put_u32(self.sizes.len() as u32);
        for &s in &self.sizes {
            b.put_u64(s as u64);
        }
        b.freeze()
    }

    fn decode(b: &[u8]) -> Result<Params, String> {
        let mut r = Reader(b);
        if r.take(4)? != MAGIC {
            return Err("not a weft benchmark peer".into());
        }
        let v = r.u8()?;
        if v != VERSION {
            return Err(format!(
                "peer speaks control version {v}, we speak {VERSION}"
            ));
        }
        let kind = match r.u8()? {
            1 => Kind::Pingpong,
            2 => Kind::Bw,
            k => return Err(format!("unknown benchmark kind {k}")),
        };
        let verify = r.u8()? != 0;
        let rma = match r.u8()? {
            0 => None,
            1 => Some(Rma::Write),
            2 => Some(Rma::Read),
            v => return Err(format!("unknown RMA operation {v}")),
        };
        let iters = r.count()?;
        let warmup = r.count()?;
        let window = r.count()?;
        let n = u32::from_be_bytes(r.array()?) as usize;
        let mut sizes = Vec::with_capacity(n.min(64));
        for _ in 0..n {
            sizes.push(r.count()?);
        }
        if iters == 0 || window == 0 || sizes.is_empty() || sizes.contains(&0) {
            return Err("peer sent empty parameters".into());
        }
        Ok(Params {
            kind,
            sizes,
            iters,
            warmup,
            window,
            verify,
            rma,
        })
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("truncated parameters".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.array::<1>()?[0])
    }

    fn count(&mut self) -> Result<usize, String> {
        usize::try_from(u64::from_be_bytes(self.array()?)).map_err(|e| e.to_string())
    }
}

/// Client side: proposes `p` and waits for the server's answer.
pub async fn propose(link: &Link, p: &Params) -> Res<()> {
    let enc = p.encode();
    if enc.len() > CTRL_CAP {
        return Err(Failure::new("send parameters", "too many sizes"));
    }
    link.send_ctrl(enc).await?;
    let answer = link.recv_ctrl().await?;
    if answer.as_ref() == OK {
        return Ok(());
    }
    let why = answer.strip_prefix(REFUSE).unwrap_or(&answer);
    Err(Failure::new(
        "server refused",
        String::from_utf8_lossy(why).into_owned(),
    ))
}

/// Server side: takes the client's parameters if they are for `kind`,
/// every size fits in one of this endpoint's messages (`max_size`), and
/// RMA, if asked for, is what the endpoint does (`has_rma`).
pub async fn agree(link: &Link, kind: Kind, max_size: usize, has_rma: bool) -> Res<Params> {
    let raw = link.recv_ctrl().await?;
    let verdict = Params::decode(&raw).and_then(|p| {
        if p.kind != kind {
            Err(format!(
                "server runs {}, client asked for {}",
                kind.name(),
                p.kind.name()
            ))
        } else if p.rma.is_some() && kind != Kind::Pingpong {
            Err("--rma is a pingpong option".into())
        } else if let Some(op) = p.rma.filter(|_| !has_rma) {
            Err(format!(
                "client asked for --rma {}, but this server's endpoint has no RMA \
                 (FI_RMA; with -p verbs: -e msg or rdm)",
                op.name()
            ))
        } else if let Some(s) = p.sizes.iter().find(|&&s| s > max_size) {
            Err(format!(
                "size {s} is larger than the server endpoint's largest message \
                 ({max_size} bytes, max_msg_size)"
            ))
        } else {
            Ok(p)
        }
    });
    match verdict {
        Ok(p) => {
            link.send_ctrl(Bytes::from_static(OK)).await?;
            Ok(p)
        }
        Err(why) => {
            let mut msg = REFUSE.to_vec();
            msg.extend_from_slice(why.as_bytes());
            // The refusal is a courtesy; our own error is what matters.
            let _ = link.send_ctrl(Bytes::from(msg)).await;
            Err(Failure::new("bad client parameters", why))
        }
    }
}

pub async fn send_done(link: &Link) -> Res<()> {
    link.send_ctrl(Bytes::from_static(DONE)).await
}

pub async fn wait_done(link: &Link) -> Res<()> {
    let m = link.recv_ctrl().await?;
    if m.as_ref() == DONE {
        Ok(())
    } else {
        Err(Failure::new(
            "wait for client to finish",
            "unexpected message",
        ))
    }
}

/// Where a side's region is: what the peer's RMA names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub addr: u64,
    pub key: u64,
    pub len: usize,
}

impl Region {
    fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(28);
        b.put_slice(REGION);
        b.put_u64(self.addr);
        b.put_u64(self.key);
        b.put_u64(self.len as u64);
        b.freeze()
    }

    fn decode(b: &[u8]) -> Result<Region, String> {
        let mut r = Reader(b);
        if r.take(4)? != REGION {
            return Err("expected the peer's region".into());
        }
        let addr = u64::from_be_bytes(r.array()?);
        let key = u64::from_be_bytes(r.array()?);
        let len = r.count()?;
        Ok(Region { addr, key, len })
    }
}

/// Tells the peer where this side's region is (`None`: it has none).
pub async fn send_region(link: &Link, mine: Option<Region>) -> Res<()> {
    let none = Region {
        addr: 0,
        key: 0,
        len: 0,
    };
    link.send_ctrl(mine.unwrap_or(none).encode()).await
}

/// Where the peer's region is; it must hold at least `need` bytes (0 for
/// a peer that has none to offer).
pub async fn recv_region(link: &Link, need: usize) -> Res<Region> {
    let what = "exchange RMA regions";
    let raw = link.recv_ctrl().await?;
    let peer = Region::decode(&raw).map_err(|e| Failure::new(what, e))?;
    if peer.len < need {
        return Err(Failure::new(
            what,
            format!("the peer's region holds {} bytes, not {need}", peer.len),
        ));
    }
    Ok(peer)
}

/// Client side of a one-sided run: hands the server the time it measured,
/// so that both print the same row.
pub async fn send_elapsed(link: &Link, t: Duration) -> Res<()> {
    let mut b = BytesMut::with_capacity(12);
    b.put_slice(ELAPSED);
    b.put_u64(u64::try_from(t.as_nanos()).unwrap_or(u64::MAX));
    link.send_ctrl(b.freeze()).await
}

/// Server side of [`send_elapsed`].
pub async fn recv_elapsed(link: &Link) -> Res<Duration> {
    let m = link.recv_ctrl().await?;
    match m.strip_prefix(ELAPSED.as_slice()) {
        Some(mut rest) if rest.len() == 8 => Ok(Duration::from_nanos(rest.get_u64())),
        _ => Err(Failure::new(
            "wait for the client's time",
            "unexpected message",
        )),
    }
}

/// The payload of message `iter`: it changes with the iteration so that
/// a stale buffer (an old message delivered again, or a receive that was
/// never written) is caught, and with the offset in a way that does not
/// repeat every 256 bytes, so a misplaced chunk is caught too.
fn pattern_byte(iter: u64, j: usize) -> u8 {
    let j = j as u64;
    (j.wrapping_add((j >> 8).wrapping_mul(3)))
        .wrapping_mul(7)
        .wrapping_add(iter.wrapping_mul(13))
        .wrapping_add(1) as u8
}

pub fn pattern(size: usize, iter: u64) -> Bytes {
    (0..size).map(|j| pattern_byte(iter, j)).collect()
}

/// Checks a received payload; the error says where it first differs.
pub fn check(got: &[u8], size: usize, iter: u64) -> Res<()> {
    check_as(got, size, iter, &format!("iteration {iter}"))
}

/// Checks `got` against the pattern of `seed`; `which` names the
/// transfer in the error.
pub fn check_as(got: &[u8], size: usize, seed: u64, which: &str) -> Res<()> {
    if got.len() != size {
        return Err(Failure::new(
            "verify",
            format!("{which}: got {} bytes, expected {size}", got.len()),
        ));
    }
    match got
        .iter()
        .enumerate()
        .find(|&(j, &b)| b != pattern_byte(seed, j))
    {
        None => Ok(()),
        Some((j, &b)) => Err(Failure::new(
            "verify",
            format!(
                "{which}, size {size}: byte {j} is {b:#04x}, expected {:#04x}",
                pattern_byte(seed, j)
            ),
        )),
    }
}

/// Without `--verify` only the length is checked.
pub fn check_len(got: usize, size: usize, iter: u64) -> Res<()> {
    if got == size {
        Ok(())
    } else {
        Err(Failure::new(
            "receive",
            format!("iteration {iter}: got {got} bytes, expected {size}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_roundtrip() {
        let p = Params {
            kind: Kind::Bw,
            sizes: vec![64, 1 << 20],
            iters: 10,
            warmup: 1,
            window: 8,
            verify: true,
            rma: None,
        };
        assert_eq!(Params::decode(&p.encode()).unwrap(), p);
        let r = Params {
            kind: Kind::Pingpong,
            rma: Some(Rma::Read),
            ..p.clone()
        };
        assert_eq!(Params::decode(&r.encode()).unwrap(), r);
        assert_eq!((r.xfers_per_iter(), p.xfers_per_iter()), (1, 1));
        let w = Params {
            rma: Some(Rma::Write),
            ..r.clone()
        };
        assert_eq!(w.xfers_per_iter(), 2);
        let mut bad = w.encode().to_vec();
        bad[7] = 9;
        assert!(Params::decode(&bad).unwrap_err().contains("RMA"));
        let reg = Region {
            addr: 0x7f00_dead_b000,
            key: 0x1234,
            len: 4096,
        };
        assert_eq!(Region::decode(&reg.encode()).unwrap(), reg);
        assert!(Region::decode(b"RGN1short").is_err());
        assert!(Region::decode(&p.encode()).is_err());
        assert!(Params::decode(b"WEFT").is_err());
        assert!(Params::decode(b"nope-and-more-bytes").is_err());
    }

    #[test]
    fn pattern_checks() {
        let p = pattern(1000, 3);
        assert!(check(&p, 1000, 3).is_ok());
        assert!(check(&p, 1000, 4).is_err());
        assert!(check(&p[..999], 1000, 3).is_err());
        let mut bad = p.to_vec();
        bad[700] ^= 1;
        assert!(check(&bad, 1000, 3).is_err());
    }
}
