//! Scalable endpoints (`fi_scalable_ep`); the public documentation is on
//! [`ScalableEndpoint`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use weft_core::attr::Info;
use weft_core::provider::{EpConfig, EpStats, ProviderEndpoint};
use weft_core::sync::lock;
use weft_core::{Error, Result};

use crate::av::AddressVector;
use crate::endpoint::{Endpoint, Role};
use crate::eq::EventQueue;
use crate::fabric::Domain;

/// A scalable endpoint (`fi_scalable_ep`): one address, several transmit
/// and receive contexts, each an [`Endpoint`] of its own for data
/// operations, bound to its own CQ and counters and enabled on its own.
///
/// The point is to let each thread (each Tokio worker) drive a context
/// of its own: posting on one context takes no lock another context
/// takes, and each context's completions arrive on its own queue. A
/// sender names a receive context with [`rx_addr`](crate::rx_addr)
/// (`fi_rx_addr`) on a handle from an AV opened with `rx_ctx_bits`.
///
/// ```
/// use bytes::{Bytes, BytesMut};
/// use weft::{AvAttr, BindFlags, Caps, CqAttr, EpType, Info};
///
/// # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
/// # async fn main() -> Result<(), weft::Error> {
/// const CTXS: usize = 2;
/// let mut hints = Info::default();
/// hints.ep_attr.ep_type = EpType::Rdm;
/// hints.caps = Caps::MSG | Caps::NAMED_RX_CTX;
/// hints.ep_attr.tx_ctx_cnt = CTXS;
/// hints.ep_attr.rx_ctx_cnt = CTXS;
/// let info = weft::getinfo(Some(&hints))?.remove(0);
/// let domain = weft::Fabric::open(&info)?.domain(&info)?;
/// let bits = 1; // enough for CTXS receive contexts
/// let av_attr = AvAttr { rx_ctx_bits: bits, ..AvAttr::default() };
///
/// // The receiving side: one scalable endpoint, a receive context per worker.
/// let server = domain.scalable_endpoint(&info)?;
/// server.bind_av(&domain.av(av_attr.clone())?)?;
/// server.enable()?;
/// let mut rx = Vec::new();
/// for i in 0..CTXS {
///     let ctx = server.rx_context(i)?;
///     ctx.bind_cq(&domain.cq(CqAttr::default())?, BindFlags::RECV)?;
///     ctx.enable()?;
///     rx.push(ctx);
/// }
///
/// // The sending side: a transmit context per worker, each with its CQ.
/// let client = domain.scalable_endpoint(&info)?;
/// let av = domain.av(av_attr)?;
/// client.bind_av(&av)?;
/// client.enable()?;
/// let peer = av.insert_sync(&[server.local_addr()?], Default::default())?.fi_addrs[0];
/// let mut workers = Vec::new();
/// for i in 0..CTXS {
///     let tx = client.tx_context(i)?;
///     tx.bind_cq(&domain.cq(CqAttr::default())?, BindFlags::TRANSMIT)?;
///     tx.enable()?;
///     let rx = rx[i].clone();
///     // Worker i sends to receive context i and receives there: no
///     // context is touched by two tasks.
///     let dest = weft::rx_addr(peer, i as u32, bits);
///     workers.push(tokio::spawn(async move {
///         let recv = rx.recv(BytesMut::zeroed(16));
///         let send = tx.send(dest, Bytes::from(vec![i as u8; 4]));
///         let (got, sent) = tokio::join!(recv, send);
///         sent.map_err(|e| e.err)?;
///         Ok::<_, weft::Error>(got.map_err(|e| e.err)?.into_bytes())
///     }));
/// }
/// for (i, w) in workers.into_iter().enumerate() {
///     let got = w.await.map_err(|_| weft::Error::Canceled)??;
///     assert_eq!(&got[..], &[i as u8; 4]);
/// }
/// # Ok(())
/// # }
/// ```
///
/// Rules (fi_endpoint(3)): `tx_ctx_cnt`/`rx_ctx_cnt` of the info (0 is 1)
/// up to the domain's `max_ep_tx_ctx`/`max_ep_rx_ctx`, else `Inval`; the
/// scalable endpoint takes an AV (and an EQ) and is enabled before its
/// contexts are (`OpBadState`); a context index beyond the count is
/// `Inval`, and an index opens once in the endpoint's life (`Busy` the
/// second time, closed or not, as libfabric's resource-in-use error); a
/// scalable endpoint with open contexts does not close (`Busy`).
/// Contexts run in `WaitMode::Interrupt` (their readers are the scalable
/// endpoint's) and take no shared context (`Inval`). They carry messages
/// and tagged messages (posted and `async` forms), and transmit contexts
/// RMA and atomics too (over the scalable endpoint's connections,
/// completing on the context's own queues); sends on a receive context
/// (receives on a transmit context) are `OpNotSupp`.
#[derive(Debug, Clone)]
pub struct ScalableEndpoint {
    inner: Arc<SepInner>,
}

#[derive(Debug)]
pub(crate) struct SepInner {
    ep: Endpoint,
    /// Which transmit / receive context indices were opened.
    opened: Mutex<(Vec<bool>, Vec<bool>)>,
    /// Contexts open now.
    live: AtomicUsize,
}

/// A context's hold on its scalable endpoint: released when the context
/// closes or goes away.
#[derive(Debug)]
pub(crate) struct CtxHold(Arc<SepInner>);

impl Drop for CtxHold {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::AcqRel);
    }
}

impl SepInner {
    /// The AV its contexts send and receive through.
    pub(crate) fn av_table(&self) -> Option<Arc<Mutex<weft_core::av::AvTable>>> {
        self.ep.av_table()
    }

    /// Opens context `index` in the provider: `OpBadState` until the
    /// scalable endpoint is enabled.
    pub(crate) fn open_ctx(
        &self,
        tx: bool,
        index: usize,
        cfg: EpConfig,
    ) -> Result<Arc<dyn ProviderEndpoint>> {
        let prov = self.ep.prov()?;
        if tx {
            prov.tx_context(index, cfg)
        } else {
            prov.rx_context(index, cfg)
        }
    }
}

impl Domain {
    /// `fi_scalable_ep`: a scalable endpoint with `info.ep_attr.tx_ctx_cnt`
    /// transmit and `rx_ctx_cnt` receive contexts (0 is 1). More than the
    /// domain's `max_ep_tx_ctx`/`max_ep_rx_ctx` is `Inval`; providers
    /// without scalable endpoints (those maxima 1: udp, shm, verbs MSG) are
    /// `NoSys`. See [`ScalableEndpoint`].
    pub fn scalable_endpoint(&self, info: &Info) -> Result<ScalableEndpoint> {
        let d = &self.info().domain_attr;
        if d.max_ep_tx_ctx <= 1 && d.max_ep_rx_ctx <= 1 {
            return Err(Error::NoSys);
        }
        let mut info = info.clone();
        let a = &mut info.ep_attr;
        a.tx_ctx_cnt = a.tx_ctx_cnt.max(1);
        a.rx_ctx_cnt = a.rx_ctx_cnt.max(1);
        // `FI_SHARED_CONTEXT` is not a count: it is far above any maximum.
        if a.tx_ctx_cnt > d.max_ep_tx_ctx || a.rx_ctx_cnt > d.max_ep_rx_ctx {
            return Err(Error::Inval);
        }
        let opened = (vec![false; a.tx_ctx_cnt], vec![false; a.rx_ctx_cnt]);
        let ep = Endpoint::with_role(self.clone(), info, None, Role::Scalable)?;
        Ok(ScalableEndpoint {
            inner: Arc::new(SepInner {
                ep,
                opened: Mutex::new(opened),
                live: AtomicUsize::new(0),
            }),
        })
    }
}

impl ScalableEndpoint {
    /// The object id.
    pub fn fid(&self) -> u64 {
        self.inner.ep.fid()
    }

    /// Its attributes (with the context counts it has).
    pub fn info(&self) -> &Info {
        self.inner.ep.info()
    }

    /// `fi_scalable_ep_bind` with an AV (before enable): its contexts send
    /// and receive through it. Open it with `rx_ctx_bits` for senders to
    /// name receive contexts. `Inval` for a second AV.
    pub fn bind_av(&self, av: &AddressVector) -> Result<()> {
        self.inner.ep.bind_av(av)
    }

    /// Binds an EQ (before enable): where messages for a receive context
    /// it does not have are reported (see [`stats`](Self::stats)).
    pub fn bind_eq(&self, eq: &EventQueue) -> Result<()> {
        self.inner.ep.bind_eq(eq)
    }

    /// `fi_enable`: takes its address. `NoAv` without an AV.
    pub fn enable(&self) -> Result<()> {
        self.inner.ep.enable()
    }

    /// Its one address (after enable), which every context shares.
    pub fn local_addr(&self) -> Result<Vec<u8>> {
        self.inner.ep.local_addr()
    }

    /// What it holds for its peers (after enable); `rx_bad_ctx` counts
    /// the messages dropped for naming a receive context it does not
    /// have, or one not enabled yet (each also an `AddrNotAvail` error
    /// on the bound EQ, naming the sender; a delivery-complete sender's
    /// send fails with `AddrNotAvail`).
    pub fn stats(&self) -> Result<EpStats> {
        self.inner.ep.stats()
    }

    /// `fi_tx_context`: transmit context `index`, disabled: bind a CQ
    /// (`TRANSMIT`) or a send counter, then `enable` it (once the
    /// scalable endpoint is enabled). `Inval` beyond `tx_ctx_cnt`, `Busy`
    /// for an index opened before.
    pub fn tx_context(&self, index: usize) -> Result<Endpoint> {
        self.context(true, index)
    }

    /// `fi_rx_context`: receive context `index`, disabled: bind a CQ
    /// (`RECV`) or a receive counter, then `enable` it. Messages for it
    /// that arrive before then are dropped (counted in
    /// [`stats`](Self::stats)): enable receive contexts before peers
    /// learn the address. Errors as [`tx_context`](Self::tx_context).
    pub fn rx_context(&self, index: usize) -> Result<Endpoint> {
        self.context(false, index)
    }

    fn context(&self, tx: bool, index: usize) -> Result<Endpoint> {
        let mut info = self.info().clone();
        {
            let mut o = lock(&self.inner.opened);
            let slots = if tx { &mut o.0 } else { &mut o.1 };
            let slot = slots.get_mut(index).ok_or(Error::Inval)?;
            if *slot {
                return Err(Error::Busy);
            }
            *slot = true;
        }
        info.ep_attr.tx_ctx_cnt = 1;
        info.ep_attr.rx_ctx_cnt = 1;
        let role = Role::Ctx {
            sep: self.inner.clone(),
            tx,
            index,
        };
        let ep = Endpoint::with_role(self.inner.ep.domain(), info, None, role)?;
        self.inner.live.fetch_add(1, Ordering::AcqRel);
        ep.set_sep_hold(CtxHold(self.inner.clone()));
        Ok(ep)
    }

    /// `fi_close`: `Busy` while any of its contexts is open.
    pub fn close(&self) -> Result<()> {
        if self.inner.live.load(Ordering::Acquire) > 0 {
            return Err(Error::Busy);
        }
        self.inner.ep.close()
    }
}
