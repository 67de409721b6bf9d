//! The client: sends requests and checks every reply.

use super::*;

/// A finished reply.
#[derive(Debug)]
pub(crate) struct Done {
    pub(crate) client: u64,
    pub(crate) seq: u64,
    pub(crate) outcome: Result<(), String>,
}

/// Replies on their way, each a task of its own, bounded in number
/// overall and per client.
#[derive(Debug, Default)]
pub(crate) struct Replies {
    pub(crate) tasks: JoinSet<Result<(), String>>,
    /// Whose reply each task carries.
    pub(crate) owner: HashMap<Id, (u64, u64)>,
    pub(crate) per_client: HashMap<u64, usize>,
}

impl Replies {
    pub(crate) fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Whether one more reply to `client` may go out now.
    pub(crate) fn room(&self, client: u64) -> Result<(), String> {
        if self.tasks.len() >= MAX_REPLIES_IN_FLIGHT {
            return Err(format!(
                "{MAX_REPLIES_IN_FLIGHT} replies already on their way"
            ));
        }
        if self.per_client.get(&client).copied().unwrap_or(0) >= MAX_REPLIES_PER_CLIENT {
            return Err(format!(
                "{MAX_REPLIES_PER_CLIENT} replies to it already on their way"
            ));
        }
        Ok(())
    }

    pub(crate) fn spawn(
        &mut self,
        client: u64,
        seq: u64,
        reply: impl Future<Output = Result<(), String>> + Send + 'static,
    ) {
        let id = self.tasks.spawn(reply).id();
        self.owner.insert(id, (client, seq));
        *self.per_client.entry(client).or_insert(0) += 1;
    }

    /// The next reply to finish; `None` when none is on its way.
    pub(crate) async fn next(&mut self) -> Option<Done> {
        let joined = self.tasks.join_next_with_id().await?;
        Some(self.finished(joined))
    }

    pub(crate) fn finished(&mut self, joined: Result<(Id, Result<(), String>), JoinError>) -> Done {
        let (id, outcome) = match joined {
            Ok((id, r)) => (id, r),
            Err(e) => (e.id(), Err(format!("reply task failed: {e}"))),
        };
        let (client, seq) = self.owner.remove(&id).unwrap_or_default();
        if let Some(n) = self.per_client.get_mut(&client) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_client.remove(&client);
            }
        }
        Done {
            client,
            seq,
            outcome,
        }
    }
}

// -------------------------------------------------------------- client

/// Why one request did not get its reply.
#[derive(Debug)]
pub(crate) enum Failed {
    /// The request could not be sent (the server may not be up yet).
    Send(String),
    /// The receive of the reply failed.
    Recv(String),
    /// Nothing within the time limit.
    Timeout { sent: bool },
}

/// Sends `req` and waits for one reply. The reply's receive is posted
/// before the request goes out (it is polled first), so the reply never
/// has to wait as an unexpected message.
pub(crate) async fn round_trip(
    ep: &Endpoint,
    server: FiAddr,
    req: Bytes,
    limit: Duration,
) -> Result<CqEntry, Failed> {
    let recv = ep.trecv(
        BytesMut::zeroed(HEADER_ROOM + MAX_PAYLOAD),
        FI_ADDR_UNSPEC,
        REPLY_TAG,
        0,
    );
    let send = ep.tsend(server, req, REQUEST_TAG);
    let deadline = tokio::time::sleep(limit);
    tokio::pin!(recv, send, deadline);
    let mut reply = None;
    let mut sent = false;
    while reply.is_none() || !sent {
        tokio::select! {
            biased;
            r = &mut recv, if reply.is_none() => match r {
                Ok(e) => reply = Some(e),
                Err(e) => return Err(Failed::Recv(e.err.to_string())),
            },
            s = &mut send, if !sent => match s {
                Ok(_) => sent = true,
                // Returning drops the receive, which withdraws it.
                Err(e) => return Err(Failed::Send(e.err.to_string())),
            },
            () = &mut deadline => return Err(Failed::Timeout { sent }),
        }
    }
    reply.ok_or(Failed::Timeout { sent })
}

/// Checks a reply against the request it answers.
pub(crate) fn check_reply(e: CqEntry, seq: u64, payload: &[u8]) -> Result<(), String> {
    if e.tag != REPLY_TAG {
        return Err(format!("reply has tag {:#x}, not {REPLY_TAG:#x}", e.tag));
    }
    let mut b = received(e);
    let want = 4 + 8 + payload.len();
    if b.len() != want {
        return Err(format!("reply is {} bytes, expected {want}", b.len()));
    }
    if take(&mut b, 4, "magic")?[..] != REPLY_MAGIC[..] {
        return Err("reply has a bad magic".into());
    }
    let got_seq = be_u64(&take(&mut b, 8, "sequence number")?);
    if got_seq != seq {
        return Err(format!("reply is for request {got_seq}"));
    }
    if let Some(i) = b
        .iter()
        .zip(payload)
        .position(|(&got, &sent)| got != sent ^ REPLY_XOR)
    {
        return Err(format!("reply payload differs at byte {i}"));
    }
    Ok(())
}

/// A per-process id the server tells clients apart by.
pub(crate) fn client_id() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish()
}

pub(crate) async fn client(o: &Opts) -> Res<()> {
    let server_sa = o.server.ok_or("--server is required")?;
    let info = find_info(o)?;
    let src = match &o.addr {
        Some(a) => parse_bind(a, 0)?,
        None => SocketAddr::new(
            info_ip(&info)
                .or_else(|| routed_ip(server_sa))
                .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            0,
        ),
    };
    let side = open_side(info, src)?;
    let me = side.ep.local_addr()?;
    let server = side.insert(&weft::encode_sockaddr(&server_sa))?;
    let id = client_id();
    let count = o.count.unwrap_or(10);
    println!(
        "client {id:016x}: {} -> {server_sa} ({}), {count} requests of {} bytes",
        side.local_str()?,
        side.describe(),
        o.size
    );

    let started = Instant::now();
    let patience = started + o.wait;
    let mut verified = 0u64;
    let mut seq = 0u64;
    let mut retrying = false;
    while seq < count {
        let payload = pattern(id, seq, o.size);
        // The first request introduces us; the server answers nothing else
        // before it has seen it.
        let addr: &[u8] = if verified == 0 { &me } else { &[] };
        let req = encode_request(seq, id, addr, &payload)?;
        let fail = |why: String| -> Box<dyn Error> {
            format!("request {seq}: {why} ({verified} of {count} replies verified)").into()
        };
        match round_trip(&side.ep, server, req, o.timeout).await {
            Ok(reply) => {
                check_reply(reply, seq, &payload).map_err(fail)?;
                verified += 1;
                seq += 1;
            }
            // The server may not be listening yet: retry the introduction.
            Err(Failed::Send(e)) if verified == 0 && Instant::now() < patience => {
                if !retrying {
                    eprintln!(
                        "client: server not reachable yet ({e}); retrying for up to {}s",
                        o.wait.as_secs()
                    );
                    retrying = true;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(Failed::Send(e)) => return Err(fail(format!("send failed: {e}"))),
            Err(Failed::Recv(e)) => return Err(fail(format!("receive failed: {e}"))),
            Err(Failed::Timeout { sent }) => {
                let what = if sent {
                    "no reply"
                } else {
                    "the send did not complete"
                };
                return Err(fail(format!("{what} within {}s", o.timeout.as_secs())));
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "client: {verified} of {count} replies verified in {secs:.3}s ({:.1} us per request)",
        secs * 1e6 / count as f64
    );
    Ok(())
}
