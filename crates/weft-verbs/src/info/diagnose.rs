//! Why there is nothing to offer ([`no_device_reason`]) and whether the
//! locked-memory limit allows registration ([`memlock_warning`]).

use std::path::Path;

use weft_core::Error;

use crate::dev_nodes;
use crate::sys::{list_devices, Context, LinkLayer, PortState};

use super::attrs::MIN_MEMLOCK;
use super::describe::{link_layer_str, state_str};
use super::probe::{discover_cached, DeviceReport};

const SYS_INFINIBAND: &str = "/sys/class/infiniband";
const SYS_UVERBS: &str = "/sys/class/infiniband_verbs";
const DEV_INFINIBAND: &str = "/dev/infiniband";
const RXE_HINT: &str = "modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <if>";
/// `CAP_IPC_LOCK`: pinning beyond `RLIMIT_MEMLOCK` is allowed.
const CAP_IPC_LOCK: u32 = 14;

/// Why there is nothing to offer: `None` when at least one active port
/// exists, otherwise a message naming the cause and the fix (no RDMA in the
/// kernel, no device, missing user-space driver, a device node missing or
/// not accessible, ports not active), followed by a warning if the
/// locked-memory limit is too low for memory registration.
pub fn no_device_reason() -> Option<String> {
    let cached = discover_cached();
    if matches!(cached, Ok(r) if r.iter().any(DeviceReport::is_active)) {
        return None;
    }
    // `None` from a fresh diagnosis: usable now, but not when this process
    // probed (and cached) the devices.
    let mut msg = diagnose().unwrap_or_else(|| {
        "RDMA ports became active after this process probed the devices; \
         restart it to use them"
            .to_owned()
    });
    if let Some(w) = memlock_warning() {
        msg.push_str("\nalso: ");
        msg.push_str(&w);
    }
    Some(msg)
}

/// A fresh diagnosis (not cached): `None` if an active port exists.
fn diagnose() -> Option<String> {
    let sys = Path::new(SYS_INFINIBAND);
    if !sys.is_dir() {
        return Some(format!(
            "no RDMA device: {SYS_INFINIBAND} is missing (kernel without RDMA support, \
             or rdma_rxe not loaded: {RXE_HINT})"
        ));
    }
    let kernel_devs = dir_names(sys);
    if kernel_devs.is_empty() {
        return Some(format!(
            "no RDMA device: {SYS_INFINIBAND} is empty (no RDMA NIC, or no soft-RoCE \
             device yet: {RXE_HINT})"
        ));
    }
    let listed = match list_devices() {
        Ok(l) => l,
        Err(e) => {
            return Some(format!(
                "the kernel has RDMA devices ({}) but libibverbs cannot list them: {e}",
                kernel_devs.join(", ")
            ))
        }
    };
    if listed.is_empty() {
        let nodes = dev_nodes::scan(Path::new(SYS_UVERBS), Path::new(DEV_INFINIBAND));
        let node_problems: Vec<String> =
            nodes.iter().filter_map(dev_nodes::Node::problem).collect();
        if !nodes.is_empty() && node_problems.len() == nodes.len() {
            // Typical of a container given no device: sysfs shows the
            // host's devices, /dev does not have their nodes.
            let mut msg = format!(
                "no RDMA device node: the kernel has RDMA devices ({}) but none of their \
                 nodes in {DEV_INFINIBAND} is usable:",
                kernel_devs.join(", ")
            );
            for p in node_problems {
                msg.push_str("\n  - ");
                msg.push_str(&p);
            }
            return Some(msg);
        }
        let why = if Path::new(SYS_UVERBS).is_dir() {
            "their user-space drivers are missing (install rdma-core's \
             ibverbs-providers, e.g. librxe for rxe, mlx5 for ConnectX)"
                .to_owned()
        } else {
            format!("{SYS_UVERBS} is missing (ib_uverbs not loaded: modprobe ib_uverbs)")
        };
        return Some(format!(
            "the kernel has RDMA devices ({}) but libibverbs lists none: {why}",
            kernel_devs.join(", ")
        ));
    }

    let mut problems = Vec::new();
    for dev in &listed {
        let ctx = match Context::open(&dev.name) {
            Ok(c) => c,
            Err(e) => {
                problems.push(open_failure(&dev.name, e));
                continue;
            }
        };
        let attr = match ctx.query_device() {
            Ok(a) => a,
            Err(e) => {
                problems.push(format!("{}: ibv_query_device failed: {e}", dev.name));
                continue;
            }
        };
        if attr.phys_port_cnt == 0 {
            problems.push(format!("{}: the device has no ports", dev.name));
        }
        for port in 1..=attr.phys_port_cnt {
            match ctx.query_port(port) {
                Ok(p) if p.state == PortState::Active => return None,
                Ok(p) => problems.push(format!(
                    "{} port {port}: {} ({} link layer): not active ({})",
                    dev.name,
                    state_str(p.state),
                    link_layer_str(p.link_layer),
                    inactive_hint(p.link_layer)
                )),
                Err(e) => problems.push(format!(
                    "{} port {port}: ibv_query_port failed: {e}",
                    dev.name
                )),
            }
        }
    }
    let mut msg = format!("no active RDMA port ({} device(s) found):", listed.len());
    for p in problems {
        msg.push_str("\n  - ");
        msg.push_str(&p);
    }
    Some(msg)
}

fn inactive_hint(ll: LinkLayer) -> &'static str {
    match ll {
        LinkLayer::Ethernet => {
            "RoCE: bring the netdev up (ip link set <if> up) and check its carrier; \
             `rdma link` shows which netdev it is"
        }
        _ => "InfiniBand: check the cable and that a subnet manager (opensm) runs on the fabric",
    }
}

/// Explains why `ibv_open_device` failed, naming the device node.
fn open_failure(dev: &str, e: Error) -> String {
    let node = dev_nodes::node_of(Path::new(SYS_UVERBS), Path::new(DEV_INFINIBAND), dev);
    if let Some(p) = node.as_ref().and_then(dev_nodes::Node::problem) {
        return format!("{dev}: cannot be opened ({e}): {p}");
    }
    let Some(node) = node.map(|n| n.name) else {
        return format!(
            "{dev}: cannot be opened ({e}), and no {SYS_UVERBS}/uverbs* entry belongs to it \
             (ib_uverbs not loaded? modprobe ib_uverbs)"
        );
    };
    // The node is there and is the right device (checked above).
    let path = Path::new(DEV_INFINIBAND).join(&node);
    let shown = path.display();
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
    {
        Err(io) if io.kind() == std::io::ErrorKind::PermissionDenied => format!(
            "{dev}: cannot be opened ({e}): no permission to open {shown} read-write \
             (check its owner/mode, e.g. the rdma group or udev rules)"
        ),
        Err(io) => format!("{dev}: cannot be opened ({e}): opening {shown} fails: {io}"),
        Ok(_) => format!(
            "{dev}: cannot be opened ({e}) although {shown} can be (driver or firmware \
             problem? see dmesg)"
        ),
    }
}

fn dir_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// The soft `RLIMIT_MEMLOCK` from `/proc/self/limits`: `Some(None)` for
/// unlimited, `None` if it cannot be read.
pub fn memlock_limit() -> Option<Option<u64>> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_memlock(&text)
}

pub(super) fn parse_memlock(limits: &str) -> Option<Option<u64>> {
    let line = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max locked memory"))?;
    let soft = line.split_whitespace().next()?;
    if soft == "unlimited" {
        return Some(None);
    }
    soft.parse().ok().map(Some)
}

/// Whether `CapEff` in `/proc/self/status` has `CAP_IPC_LOCK`.
fn has_cap_ipc_lock() -> bool {
    // Bytes, not a string: the `Name:` line holds the command name,
    // which may be any bytes, and a name that is not UTF-8 would make
    // the whole file unreadable as a string (the capability then
    // reported absent).
    std::fs::read("/proc/self/status").is_ok_and(|s| parse_cap_ipc_lock(&s))
}

pub(super) fn parse_cap_ipc_lock(status: &[u8]) -> bool {
    status
        .split(|&b| b == b'\n')
        .find_map(|l| l.strip_prefix(b"CapEff:"))
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// A warning when the locked-memory limit (`ulimit -l`) is below
/// [`MIN_MEMLOCK`]: memory registration pins pages and fails beyond it.
pub fn memlock_warning() -> Option<String> {
    memlock_message(memlock_limit()?, has_cap_ipc_lock())
}

pub(super) fn memlock_message(limit: Option<u64>, cap_ipc_lock: bool) -> Option<String> {
    let limit = limit?;
    if limit >= MIN_MEMLOCK {
        return None;
    }
    let mut msg = format!(
        "the locked-memory limit (RLIMIT_MEMLOCK, 'Max locked memory' in /proc/self/limits) \
         is {}, below {}: registering larger buffers will fail with ENOMEM; raise it with \
         `ulimit -l unlimited` (or memlock in /etc/security/limits.conf, LimitMEMLOCK= for \
         systemd units; containers: `docker run --ulimit memlock=-1`)",
        bytes_str(limit),
        bytes_str(MIN_MEMLOCK)
    );
    if cap_ipc_lock {
        msg.push_str(
            "; this process has CAP_IPC_LOCK, which lifts the limit unless it runs in a \
             user namespace (rootless container)",
        );
    }
    Some(msg)
}

fn bytes_str(b: u64) -> String {
    if b >= 1 << 20 && b % (1 << 20) == 0 {
        format!("{} MiB", b >> 20)
    } else if b >= 1 << 10 && b % (1 << 10) == 0 {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} bytes")
    }
}
