//! The `/dev/infiniband/uverbsN` character devices, checked against what
//! the kernel says they should be.
//!
//! sysfs lists every RDMA device of the host even inside a container,
//! while `/dev/infiniband` holds only the nodes the container was given.
//! libibverbs then lists nothing, or fails to open a device, and its errno
//! does not say which node is missing or was mapped under the wrong name.
//! These checks do, so the diagnosis can name the node and the flag.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// One `uverbsN` entry of sysfs and the state of its node in `/dev`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// `uverbsN`.
    pub name: String,
    /// The RDMA device it belongs to (`ibdev`).
    pub ibdev: String,
    /// The node's path.
    pub path: PathBuf,
    pub state: NodeState,
}

/// What was found at a node's path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeState {
    /// A character device with the number sysfs gives (or sysfs gives none).
    Present,
    /// Nothing at the path.
    Missing,
    /// Something that is not a character device.
    NotCharDevice,
    /// A character device of another number: some other device's node
    /// under this name.
    Mismatch { want: (u32, u32), found: (u32, u32) },
}

impl Node {
    /// What is wrong with the node, as a sentence naming it and the fix;
    /// `None` when it is present.
    pub fn problem(&self) -> Option<String> {
        let (dev, path, name) = (&self.ibdev, self.path.display(), &self.name);
        let dir = self
            .path
            .parent()
            .map_or_else(String::new, |p| p.display().to_string());
        match &self.state {
            NodeState::Present => None,
            NodeState::Missing if !Path::new(&dir).is_dir() => Some(format!(
                "{dev}: its device node {path} is missing, and so is {dir} (a container \
                 started without RDMA devices: pass --device {path} --device {dir}/rdma_cm)"
            )),
            NodeState::Missing => Some(format!(
                "{dev}: its device node {path} is missing (in a container pass it in: \
                 --device {path})"
            )),
            NodeState::NotCharDevice => Some(format!(
                "{dev}: {path} is not a character device (a file or directory mounted over \
                 the device node?)"
            )),
            NodeState::Mismatch { want, found } => Some(format!(
                "{dev}: {path} is character device {}:{}, but {dev}'s node {name} is {}:{}; \
                 the node of another device was put under this name (e.g. --device \
                 HOST:CONTAINER with different names); pass each device's own node under \
                 its own name",
                found.0, found.1, want.0, want.1
            )),
        }
    }
}

/// Every `uverbsN` under `sys` (normally `/sys/class/infiniband_verbs`)
/// with its node under `dev` (normally `/dev/infiniband`), sorted by name.
pub fn scan(sys: &Path, dev: &Path) -> Vec<Node> {
    let mut names: Vec<String> = std::fs::read_dir(sys)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("uverbs"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let entry = sys.join(&name);
            let ibdev = std::fs::read_to_string(entry.join("ibdev"))
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|_| "?".to_owned());
            let want = std::fs::read_to_string(entry.join("dev"))
                .ok()
                .and_then(|s| parse_dev(&s));
            let path = dev.join(&name);
            let state = node_state(&path, want);
            Node {
                name,
                ibdev,
                path,
                state,
            }
        })
        .collect()
}

/// The node of RDMA device `ibdev`, if sysfs has one.
pub fn node_of(sys: &Path, dev: &Path, ibdev: &str) -> Option<Node> {
    scan(sys, dev).into_iter().find(|n| n.ibdev == ibdev)
}

fn node_state(path: &Path, want: Option<(u32, u32)>) -> NodeState {
    let Ok(meta) = std::fs::metadata(path) else {
        return NodeState::Missing;
    };
    if !meta.file_type().is_char_device() {
        return NodeState::NotCharDevice;
    }
    let found = split_dev(meta.rdev());
    match want {
        Some(want) if want != found => NodeState::Mismatch { want, found },
        _ => NodeState::Present,
    }
}

/// sysfs `dev` files read `MAJOR:MINOR`.
fn parse_dev(s: &str) -> Option<(u32, u32)> {
    let (ma, mi) = s.trim().split_once(':')?;
    Some((ma.parse().ok()?, mi.parse().ok()?))
}

/// Linux's `dev_t` layout (glibc `gnu_dev_major`/`gnu_dev_minor`).
fn split_dev(d: u64) -> (u32, u32) {
    let major = ((d >> 8) & 0xfff) | ((d >> 32) & 0xffff_f000);
    let minor = (d & 0xff) | ((d >> 12) & 0xffff_ff00);
    // Both are masked to 32 bits above.
    (
        u32::try_from(major).unwrap_or(u32::MAX),
        u32::try_from(minor).unwrap_or(u32::MAX),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn dev_numbers() {
        assert_eq!(parse_dev("231:193\n"), Some((231, 193)));
        assert_eq!(parse_dev("231"), None);
        assert_eq!(parse_dev("a:1"), None);
        // glibc's makedev, to check the split against.
        let make = |ma: u64, mi: u64| {
            (mi & 0xff) | ((ma & 0xfff) << 8) | ((mi & !0xff) << 12) | ((ma & !0xfff) << 32)
        };
        assert_eq!(split_dev(make(231, 193)), (231, 193));
        assert_eq!(split_dev(make(0x1234, 0x78956)), (0x1234, 0x78956));
    }

    fn fake_sys(root: &Path, name: &str, ibdev: &str, dev: &str) {
        let e = root.join("sys").join(name);
        std::fs::create_dir_all(&e).unwrap();
        std::fs::write(e.join("ibdev"), format!("{ibdev}\n")).unwrap();
        std::fs::write(e.join("dev"), format!("{dev}\n")).unwrap();
    }

    #[test]
    fn missing_and_wrong_nodes_are_named() {
        let root = std::env::temp_dir().join(format!("weft-nodes-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        fake_sys(&root, "uverbs1", "rxe1", "231:193");
        fake_sys(&root, "uverbs2", "rxe2", "231:194");
        let (sys, dev) = (root.join("sys"), root.join("dev"));

        // No /dev/infiniband at all: both missing, the message says so.
        let nodes = scan(&sys, &dev);
        assert_eq!(nodes.len(), 2);
        assert!(nodes.iter().all(|n| n.state == NodeState::Missing));
        let p = nodes[0].problem().unwrap();
        assert!(
            p.contains("rxe1") && p.contains("uverbs1") && p.contains("--device"),
            "{p}"
        );
        assert!(p.contains("and so is"), "{p}");

        // A regular file in place of a node.
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("uverbs2"), b"").unwrap();
        let n = node_of(&sys, &dev, "rxe2").unwrap();
        assert_eq!(n.state, NodeState::NotCharDevice);
        assert!(n.problem().unwrap().contains("not a character device"));
        let n = node_of(&sys, &dev, "rxe1").unwrap();
        assert_eq!(n.state, NodeState::Missing);
        assert!(!n.problem().unwrap().contains("and so is"));
        assert!(node_of(&sys, &dev, "mlx5_0").is_none());

        // A character device of another number (/dev/null is 1:3).
        assert_eq!(
            node_state(Path::new("/dev/null"), Some((231, 193))),
            NodeState::Mismatch {
                want: (231, 193),
                found: (1, 3)
            }
        );
        assert_eq!(
            node_state(Path::new("/dev/null"), Some((1, 3))),
            NodeState::Present
        );
        let m = Node {
            name: "uverbs2".into(),
            ibdev: "rxe2".into(),
            path: "/dev/infiniband/uverbs2".into(),
            state: NodeState::Mismatch {
                want: (231, 194),
                found: (231, 193),
            },
        };
        let p = m.problem().unwrap();
        assert!(
            p.contains("231:193") && p.contains("231:194") && p.contains("own name"),
            "{p}"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
