//! The control conversation around a benchmark, carried over the fabric
//! link itself: the client dictates the parameters (so a server started
//! with defaults serves any client), the server agrees or explains why
//! not, and a final message tells the server the client is done, so
//! neither side tears down while the other still has data in flight.
//! With `--rma` the two sides also tell each other where their regions
//! are ([`Region`]) before each size.

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::args::{self, PerfArgs, Rma};
use crate::fail::{within, Failure, Res};
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

    /// Warm-up and timed iterations together. Both are bounded where they
    /// come in (arguments, [`Params::decode`]), so this cannot overflow;
    /// checked all the same, since a wrap would loop for ages.
    pub fn total(&self) -> Res<usize> {
        self.warmup
            .checked_add(self.iters)
            .ok_or_else(|| Failure::new("iterations", "warm-up plus -I overflows"))
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
        if n == 0 || n > args::MAX_SIZES {
            return Err(format!(
                "peer sent {n} sizes (1 to {} allowed)",
                args::MAX_SIZES
            ));
        }
        let mut sizes = Vec::with_capacity(n);
        for _ in 0..n {
            sizes.push(r.count()?);
        }
        if !r.0.is_empty() {
            return Err(format!("{} stray bytes after the parameters", r.0.len()));
        }
        let p = Params {
            kind,
            sizes,
            iters,
            warmup,
            window,
            verify,
            rma,
        };
        p.check_ranges()?;
        Ok(p)
    }

    /// What a weft client's own argument checks guarantee; a peer past
    /// them is not one, and would make the server loop or allocate
    /// without end.
    fn check_ranges(&self) -> Result<(), String> {
        let in_range = |what: &str, v: usize, max: usize| {
            if (1..=max).contains(&v) {
                Ok(())
            } else {
                Err(format!("peer sent {what} {v} (1 to {max} allowed)"))
            }
        };
        in_range("iterations", self.iters, args::MAX_ITERS)?;
        in_range("window", self.window, args::MAX_WINDOW)?;
        if self.warmup > args::MAX_ITERS {
            return Err(format!("peer sent warm-up {}", self.warmup));
        }
        for &s in &self.sizes {
            in_range("size", s, args::MAX_SIZE)?;
        }
        if self.kind == Kind::Bw {
            args::bw_in_flight(self.window, &self.sizes)?;
        }
        Ok(())
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

/// Client side: proposes `p` and waits for the server's answer, at most
/// `limit` for each.
pub async fn propose(link: &Link, p: &Params, limit: Duration) -> Res<()> {
    let enc = p.encode();
    if enc.len() > CTRL_CAP {
        return Err(Failure::new("send parameters", "too many sizes"));
    }
    within(limit, "send parameters", link.send_ctrl(enc)).await?;
    let answer = within(limit, "wait for the server's answer", link.recv_ctrl()).await?;
    if answer.as_ref() == OK {
        return Ok(());
    }
    let why = answer.strip_prefix(REFUSE).unwrap_or(&answer);
    Err(Failure::new(
        "server refused",
        String::from_utf8_lossy(why).into_owned(),
    ))
}

/// Why the server did not take a peer's parameters.
#[derive(Debug)]
pub enum Declined {
    /// Nothing a weft client would send: silence past the time limit, a
    /// broken link, bytes that are not a proposal. The server drops such a
    /// peer and waits for another.
    Stranger(Failure),
    /// A weft client asked for a run this server cannot do, and was told
    /// why; the server ends with the same error.
    Refused(Failure),
}

/// What the server's endpoint can do, for judging a client's request.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// `max_msg_size`.
    pub max: usize,
    /// RMA with remote CQ data (see `link::has_rma`).
    pub rma: bool,
    /// `--timeout`: how long the proposal may take to come.
    pub wait: Duration,
}

/// Server side: takes the client's parameters if they are for `kind`,
/// every size fits in one of this endpoint's messages (`lim.max`), and
/// RMA, if asked for, is what the endpoint does (`lim.rma`).
pub async fn agree(link: &Link, kind: Kind, lim: Limits) -> Result<Params, Declined> {
    let what = "wait for the client's parameters";
    let raw = within(lim.wait, what, link.recv_ctrl())
        .await
        .map_err(Declined::Stranger)?;
    let p = match Params::decode(&raw) {
        Ok(p) => p,
        Err(why) => {
            refuse(link, &why, lim.wait).await;
            return Err(Declined::Stranger(Failure::new(
                "bad client parameters",
                why,
            )));
        }
    };
    match judge(p, kind, lim.max, lim.rma) {
        Ok(p) => {
            let ok = link.send_ctrl(Bytes::from_static(OK));
            within(lim.wait, "accept the client's parameters", ok)
                .await
                .map_err(Declined::Stranger)?;
            Ok(p)
        }
        Err(why) => {
            refuse(link, &why, lim.wait).await;
            Err(Declined::Refused(Failure::new(
                "bad client parameters",
                why,
            )))
        }
    }
}

/// Tells the client why not. A courtesy: our own error is what matters,
/// so a peer that does not take it is not waited for.
async fn refuse(link: &Link, why: &str, limit: Duration) {
    let mut msg = REFUSE.to_vec();
    msg.extend_from_slice(why.as_bytes());
    msg.truncate(CTRL_CAP);
    let _ = tokio::time::timeout(limit, link.send_ctrl(Bytes::from(msg))).await;
}

/// Whether this server can run well-formed parameters `p`.
fn judge(p: Params, kind: Kind, max_size: usize, has_rma: bool) -> Result<Params, String> {
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
}

pub async fn send_done(link: &Link) -> Res<()> {
    link.send_ctrl(Bytes::from_static(DONE)).await
}

/// The client says it is done right after its last transfer, which is
/// also this side's last: a peer silent for `limit` past that is gone.
pub async fn wait_done(link: &Link, limit: Duration) -> Res<()> {
    let m = within(limit, "wait for client to finish", link.recv_ctrl()).await?;
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

/// Writes the pattern of `iter` over `buf` in place (a pool buffer is
/// sent where it is: no `Bytes` to build).
pub fn fill(buf: &mut [u8], iter: u64) {
    for (j, b) in buf.iter_mut().enumerate() {
        *b = pattern_byte(iter, j);
    }
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

    fn sample() -> Params {
        Params {
            kind: Kind::Bw,
            sizes: vec![64],
            iters: 10,
            warmup: 1,
            window: 8,
            verify: false,
            rma: None,
        }
    }

    /// Parameters no weft client sends are refused before anything is
    /// allocated or looped over.
    #[test]
    fn out_of_range_parameters_are_refused() {
        let cases = [
            (
                Params {
                    iters: usize::MAX,
                    ..sample()
                },
                "peer sent iterations 18446744073709551615 (1 to 1000000000 allowed)",
            ),
            (
                Params {
                    warmup: usize::MAX,
                    ..sample()
                },
                "peer sent warm-up 18446744073709551615",
            ),
            (
                Params {
                    window: 1 << 20,
                    ..sample()
                },
                "peer sent window 1048576 (1 to 65536 allowed)",
            ),
            (
                Params {
                    sizes: vec![64, (1 << 30) + 1],
                    ..sample()
                },
                "peer sent size 1073741825 (1 to 1073741824 allowed)",
            ),
            (
                Params {
                    sizes: vec![1 << 30],
                    window: 2,
                    ..sample()
                },
                "-W 2 with -S 1073741824: bw would keep more than 1g in flight; \
                 use -W 1 or less at that size",
            ),
            (
                Params {
                    sizes: vec![1; 65],
                    ..sample()
                },
                "peer sent 65 sizes (1 to 64 allowed)",
            ),
        ];
        for (p, why) in cases {
            assert_eq!(Params::decode(&p.encode()), Err(why.to_string()));
        }
        // A pingpong has no window in flight: 1 GiB with any window is fine.
        let pp = Params {
            kind: Kind::Pingpong,
            sizes: vec![1 << 30],
            window: 64,
            ..sample()
        };
        assert_eq!(Params::decode(&pp.encode()), Ok(pp.clone()));
        let mut stray = pp.encode().to_vec();
        stray.push(0);
        assert_eq!(
            Params::decode(&stray),
            Err("1 stray bytes after the parameters".into())
        );
        let mut truncated = pp.encode().to_vec();
        truncated.pop();
        assert_eq!(
            Params::decode(&truncated),
            Err("truncated parameters".into())
        );
    }

    #[test]
    fn total_is_checked() {
        assert_eq!(sample().total().ok(), Some(11));
        let p = Params {
            iters: usize::MAX,
            warmup: 1,
            ..sample()
        };
        assert_eq!(
            p.total().err().map(|e| e.to_string()),
            Some("iterations: warm-up plus -I overflows".into())
        );
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
        // In place, over whatever was there: the same bytes.
        fill(&mut bad, 3);
        assert_eq!(bad, p.to_vec());
    }
}
