//! The server: answers whoever reaches it, bounded against peers that fail or lie.

use super::*;

/// The side the server listens on: `--addr`, or the domain's IP (or
/// loopback) on [`DEFAULT_PORT`].
pub(crate) fn server_side(o: &Opts) -> Res<Side> {
    let info = find_info(o)?;
    let src = match &o.addr {
        Some(a) => parse_bind(a, DEFAULT_PORT)?,
        None => SocketAddr::new(
            info_ip(&info).unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            DEFAULT_PORT,
        ),
    };
    open_side(info, src)
}

pub(crate) async fn server(o: &Opts) -> Res<()> {
    let side = server_side(o)?;
    println!(
        "server: listening on {} ({})",
        side.local_str()?,
        side.describe()
    );
    serve(&side, o.count).await
}

/// Answers requests until `count` replies are delivered (or forever).
/// Nothing a peer sends or fails to do ends it.
pub(crate) async fn serve(side: &Side, count: Option<u64>) -> Res<()> {
    let mut svc = Service::new(side, MAX_CLIENTS)?;
    let cap = HEADER_ROOM + MAX_PAYLOAD;
    let post = || {
        side.ep
            .trecv(BytesMut::zeroed(cap), FI_ADDR_UNSPEC, REQUEST_TAG, 0)
    };
    // One receive stays posted across the loop: dropping it to see to a
    // finished reply could lose a request that had just matched.
    let recv = post();
    tokio::pin!(recv);
    while count.is_none_or(|n| svc.served < n) {
        tokio::select! {
            got = &mut recv => {
                recv.set(post());
                if let Some(pause) = svc.received(got) {
                    tokio::time::sleep(pause).await;
                }
            }
            Some(done) = svc.replies.next(), if !svc.replies.is_empty() => svc.replied(done),
        }
    }
    // Replies already on their way still count; each has its deadline.
    while let Some(done) = svc.replies.next().await {
        svc.replied(done);
    }
    println!(
        "server: served {} requests from {} client(s)",
        svc.served,
        svc.clients.len()
    );
    Ok(())
}

/// The server's state between requests.
#[derive(Debug)]
pub(crate) struct Service<'a> {
    pub(crate) side: &'a Side,
    /// Our own endpoint address: what a client's must look like.
    pub(crate) ours: Vec<u8>,
    pub(crate) clients: Lru<FiAddr>,
    pub(crate) replies: Replies,
    pub(crate) served: u64,
    /// Failed receives in a row that took no message in.
    pub(crate) failures: u32,
    pub(crate) trouble: Trouble,
}

/// Counts of each kind of trouble peers caused, for rate-limited reports.
#[derive(Debug, Default)]
pub(crate) struct Trouble {
    pub(crate) recv: Tally,
    pub(crate) malformed: Tally,
    pub(crate) unknown: Tally,
    pub(crate) bad_addr: Tally,
    pub(crate) evicted: Tally,
    pub(crate) busy: Tally,
    pub(crate) undelivered: Tally,
}

impl<'a> Service<'a> {
    /// Remembering at most `max_clients` clients.
    pub(crate) fn new(side: &'a Side, max_clients: usize) -> Res<Service<'a>> {
        Ok(Service {
            side,
            ours: side.ep.local_addr()?,
            clients: Lru::new(max_clients),
            replies: Replies::default(),
            served: 0,
            failures: 0,
            trouble: Trouble::default(),
        })
    }

    /// Takes what a receive gave; returns how long to pause before the
    /// next one.
    pub(crate) fn received(&mut self, got: Result<CqEntry, CqErrEntry>) -> Option<Duration> {
        let e = match got {
            Ok(e) => {
                self.failures = 0;
                self.request(received(e));
                return None;
            }
            Err(e) => e,
        };
        if let Some(n) = self.trouble.recv.note() {
            eprintln!("server: receive failed: {} ({n} so far)", e.err);
        }
        // One that took a message in (too large, say) is its sender's
        // doing, not the endpoint failing, and pausing for it would let any
        // peer slow the server down.
        if e.len > 0 || e.olen > 0 {
            self.failures = 0;
            return None;
        }
        self.failures = self.failures.saturating_add(1);
        recv_backoff(self.failures)
    }

    /// Takes one request: decodes it, finds (or admits) its client, and
    /// sends the reply off on its own.
    pub(crate) fn request(&mut self, msg: Bytes) {
        let req = match decode_request(msg) {
            Ok(r) => r,
            Err(why) => {
                if let Some(n) = self.trouble.malformed.note() {
                    eprintln!("server: dropped a message: {why} ({n} so far)");
                }
                return;
            }
        };
        let Some(dest) = self.admit(&req) else {
            return;
        };
        if let Err(why) = self.replies.room(req.client) {
            if let Some(n) = self.trouble.busy.note() {
                eprintln!(
                    "server: request {} from client {:016x} dropped: {why} ({n} so far)",
                    req.seq, req.client
                );
            }
            return;
        }
        let reply = encode_reply(req.seq, &req.payload);
        let ep = self.side.ep.clone();
        self.replies
            .spawn(req.client, req.seq, deliver(ep, dest, reply));
    }

    /// The AV handle of `req`'s client; a new client must name a valid
    /// address, and may push the least recent one out.
    pub(crate) fn admit(&mut self, req: &Request) -> Option<FiAddr> {
        if let Some(fi) = self.clients.get(req.client) {
            return Some(fi);
        }
        let checked = if req.addr.is_empty() {
            Err("no address".to_string())
        } else {
            check_reply_addr(&req.addr, &self.ours)
        };
        let inserted =
            checked.and_then(|()| self.side.insert(&req.addr).map_err(|e| e.to_string()));
        let fi = match inserted {
            Ok(fi) => fi,
            Err(why) => {
                let t = if req.addr.is_empty() {
                    &mut self.trouble.unknown
                } else {
                    &mut self.trouble.bad_addr
                };
                if let Some(n) = t.note() {
                    eprintln!(
                        "server: request {} from unknown client {:016x} dropped: {why} ({n} so far)",
                        req.seq, req.client
                    );
                }
                return None;
            }
        };
        println!(
            "server: client {:016x} at {}",
            req.client,
            self.side.av.straddr(&req.addr)
        );
        if let Some((old, old_fi)) = self.clients.insert(req.client, fi) {
            self.forget(old, old_fi);
        }
        Some(fi)
    }

    /// Removes a client pushed out of the table from the AV too.
    pub(crate) fn forget(&mut self, client: u64, fi: FiAddr) {
        let removed = self.side.av.remove(&[fi]);
        if let Some(n) = self.trouble.evicted.note() {
            let how = match removed {
                Ok(()) => String::new(),
                Err(e) => format!("; removing its address failed: {e}"),
            };
            eprintln!(
                "server: forgot client {client:016x}, heard from least recently{how} ({n} so far)"
            );
        }
    }

    pub(crate) fn replied(&mut self, done: Done) {
        match done.outcome {
            Ok(()) => self.served += 1,
            Err(why) => {
                if let Some(n) = self.trouble.undelivered.note() {
                    eprintln!(
                        "server: reply {} to client {:016x} dropped: {why} ({n} so far)",
                        done.seq, done.client
                    );
                }
            }
        }
    }
}

/// Sends one reply, giving up after [`REPLY_DEADLINE`].
pub(crate) async fn deliver(ep: Endpoint, dest: FiAddr, reply: Bytes) -> Result<(), String> {
    match tokio::time::timeout(REPLY_DEADLINE, ep.tsend(dest, reply, REPLY_TAG)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.err.to_string()),
        Err(_) => Err(format!(
            "not delivered within {} s",
            REPLY_DEADLINE.as_secs()
        )),
    }
}

/// The pause before the next receive after `failures` failed in a row:
/// none for the first few (one bad peer), then doubling, so an error that
/// persists costs no CPU.
pub(crate) fn recv_backoff(failures: u32) -> Option<Duration> {
    let past = failures.checked_sub(RECV_FAILURES_BEFORE_BACKOFF + 1)?;
    let pause = FIRST_RECV_BACKOFF.saturating_mul(1 << past.min(16));
    Some(pause.min(MAX_RECV_BACKOFF))
}

/// A client's address must be a socket address of the family of our own
/// (with a host and a port) to be worth inserting: anything else is a
/// lie, or would send the reply nowhere. A provider whose addresses are
/// not socket addresses gets a length check only.
pub(crate) fn check_reply_addr(theirs: &[u8], ours: &[u8]) -> Result<(), String> {
    let Ok(own) = weft::decode_sockaddr(ours) else {
        if theirs.len() == ours.len() {
            return Ok(());
        }
        return Err(format!(
            "a {}-byte address, not {} as ours",
            theirs.len(),
            ours.len()
        ));
    };
    let a = weft::decode_sockaddr(theirs)
        .map_err(|_| format!("{} bytes that are not a socket address", theirs.len()))?;
    if a.is_ipv4() != own.is_ipv4() {
        return Err(format!("address {a} is not of our family ({own})"));
    }
    let ip = a.ip();
    let broadcast = matches!(ip, IpAddr::V4(v4) if v4.is_broadcast());
    if ip.is_unspecified() || ip.is_multicast() || broadcast || a.port() == 0 {
        return Err(format!("address {a} names no endpoint"));
    }
    Ok(())
}

/// Counts one kind of event and says when to report it: each of the first
/// [`REPORT_EACH`], then at powers of two.
#[derive(Debug, Default)]
pub(crate) struct Tally(pub(crate) u64);

impl Tally {
    /// The count so far, when this one is to be reported.
    pub(crate) fn note(&mut self) -> Option<u64> {
        self.0 = self.0.saturating_add(1);
        (self.0 <= REPORT_EACH || self.0.is_power_of_two()).then_some(self.0)
    }
}
