//! Opening an RDM endpoint's state: its listener, CQ, key lanes and
//! drivers.

use super::*;

/// [`super::open()`]'s endpoint state; `scalable`: a scalable endpoint's, with
/// room for its contexts.
pub(crate) fn open_shared(cfg: EpConfig, rt: Handle, scalable: bool) -> Result<Arc<RdmShared>> {
    let want = cfg
        .src_addr
        .as_deref()
        .or(cfg.info.src_addr.as_deref())
        .ok_or(Error::AddrNotAvail)
        .and_then(decode_sockaddr)?;
    let tos = crate::tos_of(&cfg.info)?;
    let keys = keys::RdmKeys::for_endpoint(&cfg.info, cfg.av.as_ref())?;
    let gate = crate::keyproof::Gate::with_keys(
        keys.gate_keys(),
        weft_core::auth::ConnKind::Rdm,
        cfg.limits.handshake_timeout,
    )?;
    let cm = CmChannel::open(&rt)?;
    let listener = CmId::new(&cm.ch, PortSpace::Tcp)?;
    if let Some(t) = tos {
        listener.set_tos(t)?;
    }
    listener.bind_addr(want)?;
    listener.listen(LISTEN_BACKLOG)?;
    let local = listener.local_addr().ok_or(Error::AddrNotAvail)?;
    let ctx = listener.context()?;
    let chan = CompChannel::new(&ctx)?;
    // Every connection under a key, and the receive queue those share,
    // live in that key's protection domain: a lane per key.
    let lanes = lanes::Lanes::new(ctx.clone(), keys.lanes());
    // A write with remote CQ data is two work requests on one credit.
    let cq_depth = (2 * EP_SEND_WR + lanes.recv_depth() + 64) as u32;
    let cq = Cq::new(&ctx, cq_depth, Some(&chan))?;
    let res = Res { chan, cq, lanes };
    let (mut tx, rx) = (cfg.info.tx_attr.size, cfg.info.rx_attr.size);
    let ctxs = scalable.then(|| Arc::new(scalable::Contexts::new(&cfg)));
    if scalable {
        // Its transmit contexts post through it (see `scalable`).
        tx = tx.saturating_mul(cfg.info.ep_attr.tx_ctx_cnt.max(1));
    }
    let rx_bits = cfg.av.as_ref().map_or(0, |av| lock(av).rx_ctx_bits());
    let ctx = srx::RdmSrx::of(&cfg.srx)?;
    let side = ctx
        .as_ref()
        .map_or_else(|| srx::Side::new(rx, usize::MAX), |c| c.side.clone());
    let shared = Arc::new_cyclic(|me| RdmShared {
        me: me.clone(),
        local_raw: encode_sockaddr(&local),
        nonce: incarnation(&local),
        local,
        cm,
        listener: Arc::new(listener),
        tos,
        gate: Arc::new(gate),
        keys: Arc::new(keys),
        source_err: cfg.info.caps.contains(weft_core::flags::Caps::SOURCE_ERR),
        peers: Arc::new(Mutex::new(fast_map())),
        by_qp: Arc::new(Mutex::new(fast_map())),
        side,
        srx: ctx,
        arriving: Mutex::new(Vec::new()),
        inflight: Arc::new(Mutex::new(fast_map())),
        rndv: Arc::new(Mutex::new(fast_map())),
        res: Arc::new(res),
        poller: cq_poller::new_slot(),
        ep_sq: Arc::new(Credits::new(EP_SEND_WR)),
        backlogged: Arc::new(AtomicUsize::new(0)),
        next_wr: Arc::new(AtomicU64::new(1)),
        tx: Arc::new(Credits::new(tx)),
        closed: Arc::new(AtomicBool::new(false)),
        tasks: Arc::new(Mutex::new(Tasks::default())),
        conn_count: Arc::new(AtomicUsize::new(0)),
        key_rejected: Arc::new(AtomicU64::new(0)),
        tx_windowed: Arc::new(AtomicU64::new(0)),
        ctxs,
        rxc_closed: None,
        rx_bits,
        rt,
        cfg,
    });
    // One key (or none): its lane now. Keys of the AV: each when a
    // connection first needs it.
    if shared.keys.lanes() == 1 {
        shared.lane(0)?;
    }
    if let Some(c) = &shared.srx {
        c.join(shared.me.clone());
    }
    let t = cq_poller::start(
        &shared.rt,
        shared.cfg.wait,
        (shared.res.cq.clone(), shared.res.chan.clone()),
        &shared,
        &shared.poller,
    )?;
    if let Some(h) = t {
        lock(&shared.tasks).push(h);
    }
    peers::listen(&shared);
    shared.start_probe();
    tracing::debug!(local = %shared.local, "verbs rdm endpoint open");
    Ok(shared)
}

/// A value that differs between endpoints opened at the same address
/// (time, process and a counter; uniqueness, not secrecy, is the point).
fn incarnation(local: &SocketAddr) -> u64 {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    t ^ (u64::from(std::process::id()) << 40) ^ n.rotate_left(20) ^ u64::from(local.port())
}
