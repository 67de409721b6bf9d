//! Devices: listing, opening a [`Context`], querying device/port/GID
//! attributes, and finding the GID of a local IP address.

use std::ffi::CStr;
use std::fmt;
use std::mem::MaybeUninit;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};

use rdma_sys::{
    ibv_atomic_cap, ibv_close_device, ibv_context, ibv_device, ibv_device_attr,
    ibv_device_cap_flags, ibv_free_device_list, ibv_get_device_guid, ibv_get_device_list,
    ibv_get_device_name, ibv_gid, ibv_gid_entry, ibv_mtu, ibv_open_device, ibv_port_attr,
    ibv_port_state, ibv_query_device, ibv_query_gid, rdma_free_devices, rdma_get_devices,
};
use weft_core::Error;

use super::{check_ret, last_error_or};

extern "C" {
    // `ibv_query_gid_table` is a `static inline` wrapper around this
    // exported function (libibverbs >= 1.11, rdma-core 31); rdma-sys does
    // not bind names that start with an underscore.
    fn _ibv_query_gid_table(
        context: *mut ibv_context,
        entries: *mut ibv_gid_entry,
        max_entries: usize,
        flags: u32,
        entry_size: usize,
    ) -> isize;
}

/// `IBV_GID_TYPE_ROCE_V2`.
const GID_TYPE_ROCE_V2: u32 = 2;

/// A device as listed by `ibv_get_device_list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Kernel name, e.g. `rxe0`, `mlx5_0`.
    pub name: String,
    /// Node GUID in host order.
    pub node_guid: u64,
}

/// The device list, freed on drop.
struct DeviceList {
    list: NonNull<*mut ibv_device>,
    len: usize,
}

impl DeviceList {
    fn get() -> Result<Self, Error> {
        let mut n: i32 = 0;
        // SAFETY: `n` is a valid out-pointer; the returned array (or NULL)
        // is owned by us and freed in Drop.
        let list = unsafe { ibv_get_device_list(&mut n) };
        let list = NonNull::new(list).ok_or_else(|| last_error_or(Error::NoDev))?;
        Ok(DeviceList {
            list,
            len: usize::try_from(n).unwrap_or(0),
        })
    }

    fn devices(&self) -> impl Iterator<Item = *mut ibv_device> + '_ {
        // SAFETY: the array has `len` valid entries (then a NULL) for as
        // long as the list is not freed, which `&self` guarantees.
        (0..self.len).map(move |i| unsafe { *self.list.as_ptr().add(i) })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed once.
        unsafe { ibv_free_device_list(self.list.as_ptr()) }
    }
}

/// The name of a device.
///
/// # Safety
/// `dev` must be a valid `ibv_device` pointer.
pub(super) unsafe fn device_name(dev: *mut ibv_device) -> String {
    // SAFETY: the caller guarantees `dev` is valid; the name is a
    // NUL-terminated string owned by the device.
    let name = unsafe { ibv_get_device_name(dev) };
    if name.is_null() {
        return String::new();
    }
    // SAFETY: non-NULL, NUL-terminated, valid while the device is.
    unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned()
}

/// Lists the RDMA devices of this host. An error (usually `NoSys` or
/// `NoDev`) means the kernel has no RDMA support at all.
pub fn list_devices() -> Result<Vec<DeviceInfo>, Error> {
    let list = DeviceList::get()?;
    Ok(list
        .devices()
        .map(|dev| DeviceInfo {
            // SAFETY: `dev` is an entry of the live device list.
            name: unsafe { device_name(dev) },
            // SAFETY: as above.
            node_guid: u64::from_be(unsafe { ibv_get_device_guid(dev) }),
        })
        .collect())
}

enum Owner {
    /// Opened with `ibv_open_device`; closed on drop.
    Opened,
    /// Owned by librdmacm; kept open by the reference the
    /// `rdma_get_devices` list holds, released on drop.
    RdmaCm(NonNull<*mut ibv_context>),
}

/// An open device (`ibv_context`).
pub struct Context {
    ctx: NonNull<ibv_context>,
    owner: Owner,
    name: String,
    /// The device's attributes, queried once (they do not change while
    /// the device is open).
    attr: OnceLock<DeviceAttr>,
}

// SAFETY: libibverbs is thread-safe: every verb may be called on a context
// (and the objects created from it) from any thread, concurrently.
unsafe impl Send for Context {}
// SAFETY: see `Send`; `&Context` only allows thread-safe verbs.
unsafe impl Sync for Context {}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context").field("name", &self.name).finish()
    }
}

impl Context {
    /// Opens the device called `name`. `NoDev` if there is none.
    pub fn open(name: &str) -> Result<Arc<Context>, Error> {
        let list = DeviceList::get()?;
        for dev in list.devices() {
            // SAFETY: `dev` is an entry of the live device list.
            if unsafe { device_name(dev) } != name {
                continue;
            }
            // SAFETY: `dev` is valid; the context stays valid after the
            // list is freed (documented by ibv_get_device_list(3)).
            let ctx = unsafe { ibv_open_device(dev) };
            let ctx = NonNull::new(ctx).ok_or_else(|| last_error_or(Error::NoDev))?;
            return Ok(Arc::new(Context {
                ctx,
                owner: Owner::Opened,
                name: name.to_owned(),
                attr: OnceLock::new(),
            }));
        }
        Err(Error::NoDev)
    }

    /// Wraps a context that librdmacm opened (`rdma_cm_id::verbs`). The
    /// pointer is only used after checking that it is one of librdmacm's
    /// live contexts; the `rdma_get_devices` reference keeps it open.
    pub(crate) fn from_rdma_cm(verbs: *mut ibv_context) -> Result<Arc<Context>, Error> {
        if verbs.is_null() {
            return Err(Error::NoDev);
        }
        let mut n: i32 = 0;
        // SAFETY: `n` is a valid out-pointer. The list takes a reference on
        // every device until rdma_free_devices.
        let list = unsafe { rdma_get_devices(&mut n) };
        let list = NonNull::new(list).ok_or_else(|| last_error_or(Error::NoDev))?;
        let len = usize::try_from(n).unwrap_or(0);
        // SAFETY: the list has `len` entries followed by NULL.
        let found = (0..len).any(|i| unsafe { *list.as_ptr().add(i) } == verbs);
        if !found {
            // SAFETY: the list came from rdma_get_devices, freed once.
            unsafe { rdma_free_devices(list.as_ptr()) };
            return Err(Error::NoDev);
        }
        // SAFETY: `verbs` is a live librdmacm context (checked above), so
        // its device pointer is valid.
        let name = unsafe { device_name((*verbs).device) };
        Ok(Arc::new(Context {
            // SAFETY: checked non-null above.
            ctx: unsafe { NonNull::new_unchecked(verbs) },
            owner: Owner::RdmaCm(list),
            name,
            attr: OnceLock::new(),
        }))
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_context {
        self.ctx.as_ptr()
    }

    /// The device name, e.g. `rxe0`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True if both wrap the same `ibv_context` (objects of one can be
    /// used with the other).
    pub fn same_context(&self, other: &Context) -> bool {
        self.ctx == other.ctx
    }

    /// The device's attributes: [`query_device`](Self::query_device) the
    /// first time, the same answer after that.
    pub fn device_attr(&self) -> Result<&DeviceAttr, Error> {
        if let Some(a) = self.attr.get() {
            return Ok(a);
        }
        let a = self.query_device()?;
        Ok(self.attr.get_or_init(|| a))
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> Result<DeviceAttr, Error> {
        let mut attr = MaybeUninit::<ibv_device_attr>::zeroed();
        // SAFETY: the context is open; `attr` is a valid out-pointer.
        check_ret(unsafe { ibv_query_device(self.as_ptr(), attr.as_mut_ptr()) })?;
        // SAFETY: zero-initialised POD, filled in by a successful query.
        let a = unsafe { attr.assume_init() };
        let u = |v: i32| u32::try_from(v).unwrap_or(0);
        let fw: Vec<u8> = a
            .fw_ver
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        Ok(DeviceAttr {
            fw_ver: String::from_utf8_lossy(&fw).into_owned(),
            node_guid: u64::from_be(a.node_guid),
            sys_image_guid: u64::from_be(a.sys_image_guid),
            max_mr_size: a.max_mr_size,
            page_size_cap: a.page_size_cap,
            vendor_id: a.vendor_id,
            vendor_part_id: a.vendor_part_id,
            hw_ver: a.hw_ver,
            max_qp: u(a.max_qp),
            max_qp_wr: u(a.max_qp_wr),
            device_cap_flags: a.device_cap_flags,
            max_sge: u(a.max_sge),
            max_sge_rd: u(a.max_sge_rd),
            max_cq: u(a.max_cq),
            max_cqe: u(a.max_cqe),
            max_mr: u(a.max_mr),
            max_pd: u(a.max_pd),
            max_qp_rd_atom: u(a.max_qp_rd_atom),
            max_qp_init_rd_atom: u(a.max_qp_init_rd_atom),
            max_res_rd_atom: u(a.max_res_rd_atom),
            atomic_cap: AtomicCap::from_raw(a.atomic_cap),
            max_mw: u(a.max_mw),
            max_ah: u(a.max_ah),
            max_srq: u(a.max_srq),
            max_srq_wr: u(a.max_srq_wr),
            max_srq_sge: u(a.max_srq_sge),
            max_pkeys: a.max_pkeys,
            local_ca_ack_delay: a.local_ca_ack_delay,
            phys_port_cnt: a.phys_port_cnt,
        })
    }

    /// `ibv_query_port` (ports are numbered from 1).
    pub fn query_port(&self, port: u8) -> Result<PortAttr, Error> {
        let mut attr = MaybeUninit::<ibv_port_attr>::zeroed();
        // SAFETY: the context is open; `attr` is a valid out-pointer of the
        // size the call passes to the provider. `___ibv_query_port` is
        // rdma-sys's port of verbs.h's inline `ibv_query_port`.
        check_ret(unsafe { rdma_sys::___ibv_query_port(self.as_ptr(), port, attr.as_mut_ptr()) })?;
        // SAFETY: zero-initialised POD, filled in by a successful query.
        let a = unsafe { attr.assume_init() };
        Ok(PortAttr {
            state: PortState::from_raw(a.state),
            max_mtu: Mtu::from_raw(a.max_mtu).unwrap_or(Mtu::Mtu256),
            active_mtu: Mtu::from_raw(a.active_mtu).unwrap_or(Mtu::Mtu256),
            gid_tbl_len: u32::try_from(a.gid_tbl_len).unwrap_or(0),
            port_cap_flags: a.port_cap_flags,
            max_msg_sz: a.max_msg_sz,
            pkey_tbl_len: a.pkey_tbl_len,
            lid: a.lid,
            link_layer: LinkLayer::from_raw(a.link_layer),
            active_width: a.active_width,
            active_speed: a.active_speed,
        })
    }

    /// `ibv_query_gid`: the GID at `index` of `port`.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Gid, Error> {
        let index = i32::try_from(index).map_err(|_| Error::Inval)?;
        let mut gid = ibv_gid { raw: [0; 16] };
        // SAFETY: the context is open; `gid` is a valid out-pointer.
        check_ret(unsafe { ibv_query_gid(self.as_ptr(), port, index, &mut gid) })?;
        // SAFETY: every variant of the union is plain bytes.
        Ok(Gid(unsafe { gid.raw }))
    }

    /// All valid GID table entries of all ports (`ibv_query_gid_table`).
    pub fn gid_table(&self) -> Result<Vec<GidEntry>, Error> {
        let dev = self.query_device()?;
        let mut max = 0usize;
        for port in 1..=dev.phys_port_cnt {
            max += self.query_port(port)?.gid_tbl_len as usize;
        }
        if max == 0 {
            return Ok(Vec::new());
        }
        let mut entries: Vec<ibv_gid_entry> = Vec::with_capacity(max);
        // SAFETY: the buffer has room for `max` entries of the size passed;
        // the call initialises the first `n` it returns.
        let n = unsafe {
            _ibv_query_gid_table(
                self.as_ptr(),
                entries.as_mut_ptr(),
                max,
                0,
                std::mem::size_of::<ibv_gid_entry>(),
            )
        };
        if n < 0 {
            let errno = i32::try_from(n.saturating_neg()).unwrap_or(libc::EIO);
            return Err(super::errno_error(errno));
        }
        let n = usize::try_from(n).unwrap_or(0).min(max);
        // SAFETY: the call initialised the first `n <= capacity` entries.
        unsafe { entries.set_len(n) };
        Ok(entries
            .iter()
            .map(|e| GidEntry {
                // SAFETY: every variant of the union is plain bytes.
                gid: Gid(unsafe { e.gid.raw }),
                index: e.gid_index,
                port: u8::try_from(e.port_num).unwrap_or(0),
                roce_v2: e.gid_type == GID_TYPE_ROCE_V2,
                ndev_ifindex: e.ndev_ifindex,
            })
            .collect())
    }

    /// The largest `max_inline_data` a QP of this device accepts, found by
    /// creating throw-away RC QPs (see [`super::qp::probe_max_inline_data`]).
    pub fn probe_max_inline_data(self: &Arc<Self>) -> Result<u32, Error> {
        super::qp::probe_max_inline_data(self)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        match self.owner {
            Owner::Opened => {
                // SAFETY: opened by ibv_open_device, closed once; every
                // child holds an Arc of this context, so none is left.
                let ret = unsafe { ibv_close_device(self.ctx.as_ptr()) };
                if ret != 0 {
                    tracing::warn!(device = %self.name, ret, "ibv_close_device failed");
                }
            }
            Owner::RdmaCm(list) => {
                // SAFETY: the list came from rdma_get_devices, freed once.
                unsafe { rdma_free_devices(list.as_ptr()) }
            }
        }
    }
}

/// A GID table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidEntry {
    /// The GID.
    pub gid: Gid,
    /// Its index in the port's table.
    pub index: u32,
    /// The port.
    pub port: u8,
    /// RoCE v2 (UDP-encapsulated) rather than IB / RoCE v1.
    pub roce_v2: bool,
    /// The netdev it belongs to (0 for IB).
    pub ndev_ifindex: u32,
}

/// Where a local IP address lives: device, port and GID index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidLocation {
    /// Device name.
    pub device: String,
    /// Port number.
    pub port: u8,
    /// GID index (use it as `sgid_index`).
    pub gid_index: u32,
    /// The GID.
    pub gid: Gid,
    /// RoCE v2 GID.
    pub roce_v2: bool,
}

/// Finds the device, port and GID index whose GID is `ip` (IPv4 addresses
/// as `::ffff:a.b.c.d`), preferring RoCE v2 entries. `AddrNotAvail` if no
/// device has it.
pub fn find_gid_for_ip(ip: IpAddr) -> Result<GidLocation, Error> {
    let want = Gid::from_ip(ip);
    let mut best: Option<GidLocation> = None;
    for dev in list_devices()? {
        let Ok(ctx) = Context::open(&dev.name) else {
            continue;
        };
        let Ok(table) = ctx.gid_table() else {
            continue;
        };
        for e in table.into_iter().filter(|e| e.gid == want) {
            let loc = GidLocation {
                device: dev.name.clone(),
                port: e.port,
                gid_index: e.index,
                gid: e.gid,
                roce_v2: e.roce_v2,
            };
            if loc.roce_v2 {
                return Ok(loc);
            }
            best.get_or_insert(loc);
        }
    }
    best.ok_or(Error::AddrNotAvail)
}

/// A 16-byte GID in network byte order.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The RoCE GID of an IP address (IPv4 as an IPv4-mapped IPv6 address).
    pub fn from_ip(ip: IpAddr) -> Gid {
        match ip {
            IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }

    /// The IP address of a RoCE GID (IPv4-mapped GIDs as IPv4); `None` for
    /// the zero GID.
    pub fn to_ip(&self) -> Option<IpAddr> {
        if self.is_zero() {
            return None;
        }
        let v6 = Ipv6Addr::from(self.0);
        Some(match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        })
    }

    /// All zero (an empty table slot).
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    pub(crate) fn to_raw(self) -> ibv_gid {
        ibv_gid { raw: self.0 }
    }

    pub(crate) fn from_raw(gid: &ibv_gid) -> Gid {
        // SAFETY: every variant of the union is plain bytes.
        Gid(unsafe { gid.raw })
    }
}

impl From<Ipv4Addr> for Gid {
    fn from(ip: Ipv4Addr) -> Gid {
        Gid::from_ip(IpAddr::V4(ip))
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, pair) in self.0.chunks(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", pair[0], pair[1])?;
        }
        Ok(())
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// Device attributes the provider reports (from `ibv_device_attr`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct DeviceAttr {
    pub fw_ver: String,
    /// Host order.
    pub node_guid: u64,
    /// Host order.
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub device_cap_flags: u32,
    pub max_sge: u32,
    pub max_sge_rd: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    pub max_qp_rd_atom: u32,
    pub max_qp_init_rd_atom: u32,
    pub max_res_rd_atom: u32,
    pub atomic_cap: AtomicCap,
    pub max_mw: u32,
    pub max_ah: u32,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_srq_sge: u32,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

impl DeviceAttr {
    /// `device_cap_flags` bit: type 2B memory windows.
    pub const MEM_WINDOW_TYPE_2B: u32 = ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B.0;
    /// `device_cap_flags` bit: memory management extensions (binds and
    /// invalidations posted as work requests).
    pub const MEM_MGT_EXTENSIONS: u32 = ibv_device_cap_flags::IBV_DEVICE_MEM_MGT_EXTENSIONS.0;

    /// Whether the device binds type 2 windows through its send queues
    /// and takes sends with invalidate.
    pub fn has_windows(&self) -> bool {
        let need = Self::MEM_WINDOW_TYPE_2B | Self::MEM_MGT_EXTENSIONS;
        self.device_cap_flags & need == need && self.max_mw > 0
    }
}

/// Atomic operation support.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicCap {
    /// No atomics.
    None,
    /// Atomic between QPs of this device only.
    Hca,
    /// Atomic with respect to all memory accesses (CPU included).
    Glob,
}

impl AtomicCap {
    fn from_raw(v: ibv_atomic_cap::Type) -> AtomicCap {
        match v {
            ibv_atomic_cap::IBV_ATOMIC_HCA => AtomicCap::Hca,
            ibv_atomic_cap::IBV_ATOMIC_GLOB => AtomicCap::Glob,
            _ => AtomicCap::None,
        }
    }
}

/// Port attributes (from `ibv_port_attr`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct PortAttr {
    pub state: PortState,
    /// Unknown values read as `Mtu256`.
    pub max_mtu: Mtu,
    /// Unknown values read as `Mtu256`.
    pub active_mtu: Mtu,
    pub gid_tbl_len: u32,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub link_layer: LinkLayer,
    pub active_width: u8,
    pub active_speed: u8,
}

/// Logical port state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum PortState {
    Nop,
    Down,
    Init,
    Armed,
    Active,
    ActiveDefer,
    Unknown(u32),
}

impl PortState {
    fn from_raw(v: ibv_port_state::Type) -> PortState {
        match v {
            ibv_port_state::IBV_PORT_NOP => PortState::Nop,
            ibv_port_state::IBV_PORT_DOWN => PortState::Down,
            ibv_port_state::IBV_PORT_INIT => PortState::Init,
            ibv_port_state::IBV_PORT_ARMED => PortState::Armed,
            ibv_port_state::IBV_PORT_ACTIVE => PortState::Active,
            ibv_port_state::IBV_PORT_ACTIVE_DEFER => PortState::ActiveDefer,
            other => PortState::Unknown(other),
        }
    }
}

/// Link layer of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    /// Not reported (old kernels: InfiniBand).
    Unspecified,
    /// InfiniBand.
    InfiniBand,
    /// Ethernet (RoCE, iWARP).
    Ethernet,
}

impl LinkLayer {
    fn from_raw(v: u8) -> LinkLayer {
        match v {
            1 => LinkLayer::InfiniBand,
            2 => LinkLayer::Ethernet,
            _ => LinkLayer::Unspecified,
        }
    }
}

/// Path MTU (`enum ibv_mtu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[allow(missing_docs)]
pub enum Mtu {
    Mtu256 = 1,
    Mtu512 = 2,
    Mtu1024 = 3,
    Mtu2048 = 4,
    Mtu4096 = 5,
}

impl Mtu {
    /// From the `enum ibv_mtu` value.
    pub fn from_raw(v: u32) -> Option<Mtu> {
        Some(match v {
            ibv_mtu::IBV_MTU_256 => Mtu::Mtu256,
            ibv_mtu::IBV_MTU_512 => Mtu::Mtu512,
            ibv_mtu::IBV_MTU_1024 => Mtu::Mtu1024,
            ibv_mtu::IBV_MTU_2048 => Mtu::Mtu2048,
            ibv_mtu::IBV_MTU_4096 => Mtu::Mtu4096,
            _ => return None,
        })
    }

    /// The `enum ibv_mtu` value.
    pub fn to_raw(self) -> u32 {
        self as u32
    }

    /// The MTU in bytes.
    pub fn bytes(self) -> u32 {
        128 << (self as u32)
    }
}
