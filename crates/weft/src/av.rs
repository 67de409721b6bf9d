//! Address vectors: synchronous inserts, and `FI_EVENT` inserts that are
//! futures and also produce the EQ events fi_av(3) requires.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::channel::oneshot;
use futures::future::BoxFuture;
use futures::FutureExt;
use weft_core::addr::{self, FiAddr, FI_ADDR_NOTAVAIL};
use weft_core::attr::AvType;
use weft_core::av::{self as core_av, AvTable, InsertEvent};
use weft_core::eventq::{EqErrEntry, EqEvent, EqEventKind, EqShared};
use weft_core::flags::AvFlags;
use weft_core::provider::AddrResolver;
use weft_core::sync::lock;
use weft_core::{Error, Result};

use crate::eq::EventQueue;
use crate::fabric::Domain;

pub use weft_core::av::AvAttr;

/// The outcome of one insert call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InsertReport {
    /// One handle per address, `FI_ADDR_NOTAVAIL` where it failed.
    pub fi_addrs: Vec<FiAddr>,
    /// Per-address result.
    pub results: Vec<Result<FiAddr>>,
    /// Number of addresses inserted (what `fi_av_insert` returns).
    pub count: usize,
    /// `FI_SYNC_ERR` status array (0 or a positive error code).
    pub status: Option<Vec<i32>>,
}

impl InsertReport {
    fn new(results: Vec<Result<FiAddr>>, sync_err: bool) -> InsertReport {
        InsertReport {
            fi_addrs: results
                .iter()
                .map(|r| *r.as_ref().unwrap_or(&FI_ADDR_NOTAVAIL))
                .collect(),
            count: results.iter().filter(|r| r.is_ok()).count(),
            status: sync_err.then(|| core_av::sync_err_status(&results)),
            results,
        }
    }
}

/// An insert in progress: a future of its report. Synchronous AVs give a
/// ready one.
#[derive(Debug)]
pub struct Insert {
    state: InsertState,
}

#[derive(Debug)]
enum InsertState {
    Ready(Option<InsertReport>),
    Pending(oneshot::Receiver<InsertReport>),
}

impl Insert {
    /// The report if the insert already finished (always for sync AVs).
    pub fn now(self) -> Option<InsertReport> {
        match self.state {
            InsertState::Ready(r) => r,
            InsertState::Pending(mut rx) => rx.try_recv().ok().flatten(),
        }
    }
}

impl Future for Insert {
    type Output = InsertReport;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<InsertReport> {
        match &mut self.state {
            InsertState::Ready(r) => match r.take() {
                Some(r) => Poll::Ready(r),
                None => Poll::Pending,
            },
            InsertState::Pending(rx) => Pin::new(rx)
                .poll(cx)
                .map(|r| r.unwrap_or_else(|_| InsertReport::new(Vec::new(), false))),
        }
    }
}

/// An address vector.
#[derive(Debug, Clone)]
pub struct AddressVector {
    pub(crate) inner: Arc<AvInner>,
}

#[derive(Debug)]
pub(crate) struct AvInner {
    pub(crate) fid: u64,
    pub(crate) domain: Domain,
    pub(crate) table: Arc<Mutex<AvTable>>,
    /// The bound EQ, and the binding that keeps it from being closed
    /// under the AV.
    eq: Mutex<Option<(Arc<EqShared>, weft_core::sync::Bound)>>,
    pub(crate) bound_eps: AtomicUsize,
    open_flags: AvFlags,
    /// The provider's address resolution (verbs DGRAM), if it needs one.
    resolver: Option<Arc<dyn AddrResolver>>,
}

impl AddressVector {
    pub(crate) fn open(domain: Domain, attr: AvAttr) -> Result<AddressVector> {
        let table = match attr.name {
            // Keys and their entries live in each process's table and
            // would not be shared: a named AV could not keep them in step.
            Some(_) if domain.info().domain_attr.av_auth_key => return Err(Error::OpNotSupp),
            Some(_) => crate::shared_av::open_table(&domain, &attr)?,
            None => AvTable::open(&attr)?,
        };
        let resolver = domain.inner.prov.as_ref().and_then(|p| p.addr_resolver());
        Ok(AddressVector {
            inner: Arc::new(AvInner {
                fid: crate::fabric::next_fid(),
                domain,
                table: Arc::new(Mutex::new(table)),
                eq: Mutex::new(None),
                bound_eps: AtomicUsize::new(0),
                open_flags: attr.flags,
                resolver,
            }),
        })
    }

    /// The object id.
    pub fn fid(&self) -> u64 {
        self.inner.fid
    }

    /// The AV type in use (never `Unspec`).
    pub fn av_type(&self) -> AvType {
        lock(&self.inner.table).av_type()
    }

    /// Binds the EQ for `FI_EVENT` inserts (flags must be empty).
    pub fn bind_eq(&self, eq: &EventQueue, flags: u64) -> Result<()> {
        if flags != 0 {
            return Err(Error::BadFlags);
        }
        *lock(&self.inner.eq) = Some((eq.shared.clone(), eq.shared.bound.hold()));
        Ok(())
    }

    /// Checks an insert's flags and returns the EQ its events go to, if
    /// it is an `FI_EVENT` insert (`NoEq` when none is bound).
    fn event_eq(&self, flags: AvFlags) -> Result<Option<Arc<EqShared>>> {
        lock(&self.inner.table).check_writable()?;
        let opened = self.inner.open_flags;
        core_av::check_insert_flags(flags, opened.contains(AvFlags::AV_USER_ID), true)?;
        if !(flags | opened).contains(AvFlags::EVENT) {
            return Ok(None);
        }
        lock(&self.inner.eq)
            .as_ref()
            .map(|(eq, _)| Some(eq.clone()))
            .ok_or(Error::NoEq)
    }

    /// The addresses as the provider takes them: on a string-format
    /// domain parsed from their strings (one that does not parse stays
    /// as it is, so that its slot fails validation alone: `Inval`,
    /// FI_ADDR_NOTAVAIL).
    fn raw_addrs(&self, addrs: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let info = &self.inner.domain.inner.info;
        if !crate::addrfmt::is_str(info) {
            return addrs.to_vec();
        }
        addrs
            .iter()
            .map(|a| crate::addrfmt::to_raw(info, a).unwrap_or_else(|_| a.clone()))
            .collect()
    }

    /// Whether every address is resolved already or refused outright:
    /// an insert of them needs no waiting.
    fn ready(r: &dyn AddrResolver, addrs: &[Vec<u8>]) -> bool {
        addrs
            .iter()
            .all(|a| r.validate(a).is_err() || r.resolved(a))
    }

    fn validate(b: &[u8]) -> Result<()> {
        addr::decode_sockaddr(b).map(|_| ())
    }

    /// `fi_av_insert`. On an AV opened with `FI_EVENT` (or with
    /// `FI_EVENT` in `flags`) the insert returns at once, its events go to
    /// the bound EQ (one error per failed address, then one completion
    /// whose data is the success count), and the returned future resolves
    /// with the same results. Otherwise the returned insert is ready —
    /// except on a domain whose addresses need resolving (verbs
    /// `FI_EP_DGRAM`), where every insert is a pending future: await it
    /// (without `FI_EVENT` it posts no events).
    ///
    /// `FI_AV_USER_ID` in `flags` needs the ids:
    /// [`insert_with_user_ids`](Self::insert_with_user_ids); here it is
    /// `Inval`.
    pub fn insert(&self, addrs: &[Vec<u8>], flags: AvFlags, context: u64) -> Result<Insert> {
        if flags.contains(AvFlags::AV_USER_ID) {
            return Err(Error::Inval);
        }
        self.insert_inner(addrs, None, flags, context)
    }

    /// `fi_av_insert` with `FI_AV_USER_ID`: `user_ids[i]` is what
    /// completions report as the source of messages from `addrs[i]`
    /// (`FI_SOURCE`), in place of its handle. `Inval` when the lengths
    /// differ, and on an AV opened with `FI_AV_USER_ID` (whose ids are
    /// set with [`set_user_id`](Self::set_user_id)).
    pub fn insert_with_user_ids(
        &self,
        addrs: &[Vec<u8>],
        user_ids: &[u64],
        flags: AvFlags,
        context: u64,
    ) -> Result<Insert> {
        if user_ids.len() != addrs.len() {
            return Err(Error::Inval);
        }
        self.insert_inner(addrs, Some(user_ids), flags | AvFlags::AV_USER_ID, context)
    }

    fn insert_inner(
        &self,
        addrs: &[Vec<u8>],
        user_ids: Option<&[u64]>,
        flags: AvFlags,
        context: u64,
    ) -> Result<Insert> {
        let eq = self.event_eq(flags)?;
        let info = &self.inner.domain.inner.info;
        if user_ids.is_some() && info.domain_attr.av_auth_key {
            // fi_av(3): such domains take ids through `set_user_id`.
            return Err(Error::Inval);
        }
        let converted = self.raw_addrs(addrs);
        let addrs = &converted[..];
        // An insert whose addresses the provider has ready (a named shm
        // peer that exists), or refuses, completes now.
        let resolver = self
            .inner
            .resolver
            .as_ref()
            .filter(|r| !Self::ready(r.as_ref(), addrs));
        if let Some(r) = resolver {
            let lookups = addrs
                .iter()
                .map(|a| {
                    let a = a.clone();
                    let r = r.clone();
                    async move {
                        r.validate(&a)?;
                        r.resolve(a.clone()).await.map(|()| a)
                    }
                    .boxed()
                })
                .collect();
            let ids = user_ids.map(<[u64]>::to_vec);
            return Ok(self.fill_later(lookups, ids, flags, eq, context));
        }
        let check = |b: &[u8]| match &self.inner.resolver {
            Some(r) => r.validate(b),
            None => Self::validate(b),
        };
        let results = match user_ids {
            Some(ids) => lock(&self.inner.table).insert_with_user_ids(addrs, ids, &check),
            None => lock(&self.inner.table).insert(addrs, &check),
        };
        let report = InsertReport::new(results, flags.contains(AvFlags::SYNC_ERR));
        if let Some(eq) = eq {
            self.post_events(&eq, &report, context);
        }
        Ok(Insert {
            state: InsertState::Ready(Some(report)),
        })
    }

    /// Synchronous insert returning the report directly. `Again` on a
    /// domain whose addresses need resolving (verbs `FI_EP_DGRAM`): await
    /// [`insert`](Self::insert) there.
    pub fn insert_sync(&self, addrs: &[Vec<u8>], flags: AvFlags) -> Result<InsertReport> {
        if let Some(r) = &self.inner.resolver {
            if !Self::ready(r.as_ref(), &self.raw_addrs(addrs)) {
                return Err(Error::Again);
            }
        }
        self.insert(addrs, flags, 0)?.now().ok_or(Error::Again)
    }

    fn post_events(&self, eq: &EqShared, report: &InsertReport, context: u64) {
        let fid = self.inner.fid;
        let evs = core_av::insert_events(&report.results)
            .into_iter()
            .map(|e| match e {
                InsertEvent::Error { index, err } => Err(EqErrEntry {
                    fid,
                    context,
                    data: index as u64,
                    err,
                    prov_errno: err.code(),
                    err_data: Vec::new(),
                    peer_addr: None,
                }),
                InsertEvent::Complete { count } => Ok(EqEvent::new(
                    EqEventKind::AvComplete,
                    fid,
                    context,
                    count as u64,
                )),
            });
        eq.push_all(evs);
    }

    /// `fi_av_insertsvc`: `node` may be a host name (resolved
    /// asynchronously) or a numeric address; `service` a port.
    pub fn insert_svc(
        &self,
        node: &str,
        service: &str,
        flags: AvFlags,
        context: u64,
    ) -> Result<Insert> {
        self.insert_names(
            vec![(node.to_string(), service.to_string())],
            flags,
            context,
        )
    }

    /// `fi_av_insertsym`: `nodecnt` x `svccnt` addresses from a base name
    /// with a numeric suffix (or a numeric IP) and a base port.
    pub fn insert_sym(
        &self,
        node: &str,
        nodecnt: usize,
        service: &str,
        svccnt: usize,
        flags: AvFlags,
        context: u64,
    ) -> Result<Insert> {
        let pairs = core_av::expand_insertsym(node, nodecnt, service, svccnt)?;
        self.insert_names(pairs, flags, context)
    }

    /// Resolves names concurrently, keeping the slot order of the call:
    /// handles are reserved now, filled as names resolve.
    fn insert_names(
        &self,
        pairs: Vec<(String, String)>,
        flags: AvFlags,
        context: u64,
    ) -> Result<Insert> {
        let eq = self.event_eq(flags)?;
        let numeric: Option<Vec<Vec<u8>>> = pairs
            .iter()
            .map(|(n, s)| {
                addr::parse_numeric(n, s)
                    .ok()
                    .map(|a| addr::encode_sockaddr(&a))
            })
            .collect();
        if let Some(addrs) = numeric {
            return self.insert(&addrs, flags, context);
        }
        let resolver = self.inner.resolver.clone();
        let lookups = pairs
            .into_iter()
            .map(|(n, s)| {
                let resolver = resolver.clone();
                async move {
                    let port: u16 = s.parse().map_err(|_| Error::Inval)?;
                    let mut it = tokio::net::lookup_host((n.as_str(), port))
                        .await
                        .map_err(|_| Error::NoData)?;
                    let bytes = it
                        .next()
                        .map(|a| addr::encode_sockaddr(&a))
                        .ok_or(Error::NoData)?;
                    if let Some(r) = resolver {
                        r.resolve(bytes.clone()).await?;
                    }
                    Ok(bytes)
                }
                .boxed()
            })
            .collect();
        Ok(self.fill_later(lookups, None, flags, eq, context))
    }

    /// Reserves one handle per lookup now, in call order, and fills them
    /// as the lookups (all running at once) end.
    fn fill_later(
        &self,
        lookups: Vec<BoxFuture<'static, Result<Vec<u8>>>>,
        user_ids: Option<Vec<u64>>,
        flags: AvFlags,
        eq: Option<Arc<EqShared>>,
        context: u64,
    ) -> Insert {
        let handles = lock(&self.inner.table).reserve(lookups.len());
        let (tx, rx) = oneshot::channel();
        let av = self.clone();
        let sync_err = flags.contains(AvFlags::SYNC_ERR);
        self.inner.domain.rt().spawn(async move {
            let resolved = futures::future::join_all(lookups).await;
            let results: Vec<Result<FiAddr>> = {
                let mut t = lock(&av.inner.table);
                handles
                    .iter()
                    .zip(resolved)
                    .enumerate()
                    .map(|(i, (&h, r))| match r {
                        Ok(bytes) => {
                            let id = user_ids.as_ref().and_then(|v| v.get(i).copied());
                            t.fill(h, bytes, id).map(|_| h)
                        }
                        Err(e) => {
                            t.release(h);
                            Err(e)
                        }
                    })
                    .collect()
            };
            let report = InsertReport::new(results, sync_err);
            if let Some(eq) = &eq {
                av.post_events(eq, &report, context);
            }
            let _ = tx.send(report);
        });
        Insert {
            state: InsertState::Pending(rx),
        }
    }

    /// Whether the domain keeps its authorization keys in AVs
    /// (`FI_AV_AUTH_KEY`); `Inval` otherwise.
    fn check_av_keys(&self) -> Result<()> {
        if self.is_shared() {
            return Err(Error::OpNotSupp);
        }
        if self.inner.domain.inner.info.domain_attr.av_auth_key {
            Ok(())
        } else {
            Err(Error::Inval)
        }
    }

    /// `fi_av_insert_auth_key`: stores an authorization key (1 ..= 64
    /// bytes, else `Inval`) and returns its key handle, for
    /// [`insert_with_auth_key`](Self::insert_with_auth_key), directed
    /// receives and memory regions (`docs/design.md`, "Authorization
    /// keys"). Endpoints enabled later hold every key present then. Only
    /// on a domain opened with `domain_attr.av_auth_key`, else `Inval`;
    /// `NoSpc` after [`MAX_AV_AUTH_KEYS`](weft_core::av::MAX_AV_AUTH_KEYS)
    /// keys.
    pub fn insert_auth_key(&self, key: &[u8]) -> Result<FiAddr> {
        self.check_av_keys()?;
        lock(&self.inner.table).keys_mut().insert(key)
    }

    /// `fi_av_lookup_auth_key`: the key of a key handle (`flags` =
    /// `AUTH_KEY`) or of the key an address entry was inserted under
    /// (`flags` empty; `NoKey` for an entry inserted under none).
    /// Unknown handles are `Inval`, other flags `BadFlags`.
    pub fn lookup_auth_key(&self, fi_addr: FiAddr, flags: AvFlags) -> Result<Vec<u8>> {
        self.check_av_keys()?;
        let t = lock(&self.inner.table);
        let handle = if flags == AvFlags::AUTH_KEY {
            fi_addr
        } else if flags.is_empty() {
            t.entry_key(fi_addr)?.ok_or(Error::NoKey)?
        } else {
            return Err(Error::BadFlags);
        };
        Ok(t.keys().get(handle)?.as_bytes().to_vec())
    }

    /// [`lookup_auth_key`](Self::lookup_auth_key) into `buf`: returns the
    /// key's full size (larger than `buf.len()` means truncated).
    pub fn lookup_auth_key_into(
        &self,
        fi_addr: FiAddr,
        flags: AvFlags,
        buf: &mut [u8],
    ) -> Result<usize> {
        let k = self.lookup_auth_key(fi_addr, flags)?;
        Ok(core_av::copy_truncated(&k, buf))
    }

    /// `fi_av_insert` with `FI_AUTH_KEY`: the addresses are reachable, and
    /// known as sources, only through connections that proved the key of
    /// handle `key`. Flags and events as for [`insert`](Self::insert);
    /// per-insert user ids are `Inval` on these domains (fi_av(3)), as is
    /// a `key` that is not a live key handle.
    pub fn insert_with_auth_key(
        &self,
        addrs: &[Vec<u8>],
        key: FiAddr,
        flags: AvFlags,
        context: u64,
    ) -> Result<Insert> {
        self.check_av_keys()?;
        if flags.contains(AvFlags::AV_USER_ID) {
            return Err(Error::Inval);
        }
        lock(&self.inner.table).keys().get(key)?;
        let flags = flags - AvFlags::AUTH_KEY;
        let insert = self.insert_inner(addrs, None, flags, context)?;
        let Some(mut report) = insert.now() else {
            // Only name resolution defers an insert, and the domains
            // that resolve (verbs DGRAM) take no keys.
            return Err(Error::OpNotSupp);
        };
        let mut t = lock(&self.inner.table);
        for r in &mut report.results {
            if let Ok(h) = *r {
                if let Err(e) = t.associate(h, key) {
                    // The key went away between the two locks: the entry
                    // must not stay reachable under no key.
                    let _ = t.remove(h);
                    *r = Err(e);
                }
            }
        }
        drop(t);
        Ok(Insert {
            state: InsertState::Ready(Some(InsertReport::new(
                report.results,
                report.status.is_some(),
            ))),
        })
    }

    /// `fi_av_remove` with `FI_AUTH_KEY`: removes keys. `Busy` while an
    /// enabled endpoint or a memory region holds one (nothing after it is
    /// removed), `Inval` for a handle that is not a live key.
    pub fn remove_auth_keys(&self, keys: &[FiAddr]) -> Result<()> {
        self.check_av_keys()?;
        let mut t = lock(&self.inner.table);
        for &k in keys {
            t.keys_mut().remove(k)?;
        }
        Ok(())
    }

    /// `fi_av_set_user_id` with `FI_AUTH_KEY`: what `FI_EADDRNOTAVAIL`
    /// errors (`FI_SOURCE_ERR`) report for a source that proved this key
    /// but is not in the AV, on an AV opened with `FI_AV_USER_ID`.
    pub fn set_auth_key_user_id(&self, key: FiAddr, user_id: u64) -> Result<()> {
        self.check_av_keys()?;
        if !self.inner.open_flags.contains(AvFlags::AV_USER_ID) {
            return Err(Error::Inval);
        }
        lock(&self.inner.table).keys_mut().set_user_id(key, user_id)
    }

    /// `fi_av_remove`: every handle must be live (else `Inval`, and
    /// nothing after the bad one is removed).
    pub fn remove(&self, fi_addrs: &[FiAddr]) -> Result<()> {
        let mut t = lock(&self.inner.table);
        for &a in fi_addrs {
            let bytes = match &self.inner.resolver {
                Some(_) => Some(t.lookup(a)?.to_vec()),
                None => None,
            };
            t.remove(a)?;
            if let (Some(r), Some(b)) = (&self.inner.resolver, bytes) {
                if t.find(&b).is_none() {
                    r.forget(&b);
                }
            }
        }
        Ok(())
    }

    /// `fi_av_lookup` into `buf`: returns the full address length (larger
    /// than `buf.len()` means truncated).
    pub fn lookup_into(&self, fi_addr: FiAddr, buf: &mut [u8]) -> Result<usize> {
        let a = self.lookup(fi_addr)?;
        Ok(core_av::copy_truncated(&a, buf))
    }

    /// `fi_av_lookup` returning the bytes (the string form on an
    /// `FI_ADDR_STR` domain).
    pub fn lookup(&self, fi_addr: FiAddr) -> Result<Vec<u8>> {
        let raw = {
            let mut t = lock(&self.inner.table);
            t.sync_shared()?;
            t.lookup(fi_addr).map(|a| a.to_vec())?
        };
        Ok(crate::addrfmt::to_user(&self.inner.domain.inner.info, raw))
    }

    /// `fi_av_straddr`: the printable form of address bytes (on an
    /// `FI_ADDR_STR` domain they are that form already).
    pub fn straddr(&self, addr_bytes: &[u8]) -> String {
        let info = &self.inner.domain.inner.info;
        if crate::addrfmt::is_str(info) {
            if let Ok(raw) = crate::addrfmt::to_raw(info, addr_bytes) {
                return String::from_utf8_lossy(&crate::addrfmt::to_user(info, raw)).into_owned();
            }
        }
        match addr::decode_sockaddr(addr_bytes) {
            Ok(a) => addr::sockaddr_to_str(&a),
            Err(_) => addr_bytes.iter().map(|b| format!("{b:02x}")).collect(),
        }
    }

    /// `fi_av_straddr` into a buffer, NUL-terminated and truncated; returns
    /// the full length including the NUL.
    pub fn straddr_into(&self, addr_bytes: &[u8], buf: &mut [u8]) -> usize {
        core_av::straddr_into(&self.straddr(addr_bytes), buf)
    }

    /// `fi_rx_addr`.
    pub fn rx_addr(&self, fi_addr: FiAddr, rx_index: u32) -> FiAddr {
        core_av::rx_addr(fi_addr, rx_index, lock(&self.inner.table).rx_ctx_bits())
    }

    /// `fi_av_set_user_id`.
    pub fn set_user_id(&self, fi_addr: FiAddr, user_id: u64) -> Result<()> {
        lock(&self.inner.table).set_user_id(fi_addr, user_id)
    }

    /// Number of live entries.
    pub fn len(&self) -> usize {
        core_av::shared::lock_synced(&self.inner.table).len()
    }

    /// True when no address is inserted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `fi_close`: `Busy` while endpoints are bound to it.
    pub fn close(self) -> Result<()> {
        if self.inner.bound_eps.load(Ordering::Acquire) > 0 {
            return Err(Error::Busy);
        }
        // The EQ may close once its AV has.
        lock(&self.inner.eq).take();
        Ok(())
    }
}
