//! Named (shared) address vectors: the file each one lives in, opening it
//! for a domain, and removing it. The log inside and the rules around it
//! are `weft_core::av::shared`'s; `docs/design.md` ("Named shared AVs")
//! has the layout and the commit protocol.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use weft_core::addr::{self, SOCKADDR_IN6_LEN};
use weft_core::av::shared::{self, Segment, SharedParams};
use weft_core::av::AvTable;
use weft_core::flags::{AvFlags, Caps};
use weft_core::sync::lock;
use weft_core::{Error, Result};

use crate::av::{AddressVector, AvAttr};
use crate::fabric::Domain;

/// Where segments live (the temporary directory stands in without it).
const SHM_DIR: &str = "/dev/shm";
/// Prefix of every segment's file name.
const FILE_PREFIX: &str = "weft-av-";
/// Opens raced by an unlink of the same name before giving up.
const OPEN_TRIES: usize = 4;

/// The file of the named AV `name`: `/dev/shm/weft-av-<name>`, or the same
/// name in the system's temporary directory on a node without
/// `/dev/shm`. `Inval` for a name [`validate_name`] refuses.
///
/// [`validate_name`]: weft_core::av::shared::validate_name
pub fn shared_av_path(name: &str) -> Result<PathBuf> {
    shared::validate_name(name)?;
    let dir = if Path::new(SHM_DIR).is_dir() {
        PathBuf::from(SHM_DIR)
    } else {
        std::env::temp_dir()
    };
    Ok(dir.join(format!("{FILE_PREFIX}{name}")))
}

/// Removes the named AV `name` from the node (like `shm_unlink`): later
/// opens start a new, empty AV. Processes that have it open keep using the
/// old one until they close it. `NoEnt` if there is none; `Inval` for a
/// bad name.
pub fn unlink_shared_av(name: &str) -> Result<()> {
    let path = shared_av_path(name)?;
    std::fs::remove_file(&path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => Error::NoEnt,
        _ => Error::from(e),
    })?;
    tracing::debug!(name, "named AV unlinked");
    Ok(())
}

/// A segment in a file: positional reads and writes, and `flock(2)` as the
/// writer lock, which the kernel drops with the last descriptor — a
/// writer killed mid-insert never leaves the AV locked.
#[derive(Debug)]
struct FileSegment {
    file: File,
}

fn io_err(e: io::Error) -> Error {
    match e.kind() {
        // A short read means a segment shorter than its own commit says.
        io::ErrorKind::UnexpectedEof => Error::Io,
        _ => Error::from(e),
    }
}

impl Segment for FileSegment {
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        self.file.read_exact_at(buf, off).map_err(io_err)
    }

    fn write_at(&self, buf: &[u8], off: u64) -> Result<()> {
        self.file.write_all_at(buf, off).map_err(io_err)
    }

    fn size(&self) -> Result<u64> {
        Ok(self.file.metadata().map_err(io_err)?.len())
    }

    fn set_len(&self, len: u64) -> Result<()> {
        self.file.set_len(len).map_err(io_err)
    }

    fn lock(&self, exclusive: bool) -> Result<()> {
        use rustix::fs::FlockOperation as Op;
        let op = if exclusive {
            Op::LockExclusive
        } else {
            Op::LockShared
        };
        flock(&self.file, op)
    }

    fn unlock(&self) -> Result<()> {
        flock(&self.file, rustix::fs::FlockOperation::Unlock)
    }
}

fn flock(file: &File, op: rustix::fs::FlockOperation) -> Result<()> {
    loop {
        match rustix::fs::flock(file, op) {
            Ok(()) => return Ok(()),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(io_err(e.into())),
        }
    }
}

/// Accepts what Weft's providers put in an AV: socket addresses.
fn validate(b: &[u8]) -> Result<()> {
    addr::decode_sockaddr(b).map(|_| ())
}

/// Opens the table of the named AV `attr.name` for `domain`.
///
/// `OpNotSupp` on a domain whose info lacks `FI_SHARED_AV` (verbs offers
/// do not claim it, and addresses a provider must resolve in each process
/// could not be shared anyway).
pub(crate) fn open_table(domain: &Domain, attr: &AvAttr) -> Result<AvTable> {
    let name = attr.name.as_deref().ok_or(Error::Inval)?;
    let _span = tracing::debug_span!("named_av_open", name).entered();
    let info = &domain.inner.info;
    let resolves = domain
        .inner
        .prov
        .as_ref()
        .is_some_and(|p| p.addr_resolver().is_some());
    if !info.caps.contains(Caps::SHARED_AV) || resolves {
        tracing::warn!(
            name,
            "named AV refused: the domain does not offer FI_SHARED_AV (request it in the hints)"
        );
        return Err(Error::OpNotSupp);
    }
    let path = shared_av_path(name)?;
    let read_only = attr.flags.contains(AvFlags::READ);
    let params = SharedParams {
        addr_format: info.addr_format,
        max_addr_len: SOCKADDR_IN6_LEN as u32,
        domain: format!(
            "{}/{}",
            info.fabric_attr.prov_name.as_deref().unwrap_or(""),
            info.domain_attr.name.as_deref().unwrap_or("")
        ),
        validate,
    };
    for _ in 0..OPEN_TRIES {
        let file = open_file(&path, read_only)?;
        let identity = file.metadata().map_err(io_err)?;
        let seg = Arc::new(FileSegment { file });
        let table = match AvTable::open_shared(attr, seg.clone(), &params) {
            Ok(t) => t,
            Err(Error::Inval) => {
                explain_mismatch(&*seg, &params, attr, &path);
                return Err(Error::Inval);
            }
            Err(e) => return Err(e),
        };
        // An unlink between our open and our lock would leave us alone
        // with a file nobody else can find: only the file still at the
        // path is the AV.
        match std::fs::metadata(&path) {
            Ok(m) if m.dev() == identity.dev() && m.ino() == identity.ino() => {
                tracing::debug!(path = %path.display(), read_only, "named AV open");
                return Ok(table);
            }
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound && read_only => return Err(Error::NoEnt),
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err(e)),
        }
    }
    Err(Error::Again)
}

fn open_file(path: &Path, read_only: bool) -> Result<File> {
    let mut o = OpenOptions::new();
    if read_only {
        o.read(true);
    } else {
        // Only the owner: the segment decides where other processes send.
        o.read(true).write(true).create(true).mode(0o600);
    }
    o.open(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound if read_only => Error::NoEnt,
        _ => io_err(e),
    })
}

/// Says which attribute made an open `Inval`, when a segment exists.
fn explain_mismatch(seg: &dyn Segment, params: &SharedParams, attr: &AvAttr, path: &Path) {
    match shared::read_header(seg) {
        Ok(Some(found)) => {
            let why = params.mismatch(&found, attr).unwrap_or("attributes");
            tracing::warn!(
                path = %path.display(),
                mismatch = why,
                segment = ?found,
                "named AV refused: it was created with another {why}"
            );
        }
        Ok(None) => {}
        Err(e) => tracing::warn!(
            path = %path.display(),
            error = %e,
            "named AV refused: not a Weft AV of this layout version"
        ),
    }
}

impl AddressVector {
    /// The `map_addr` of a named MAP AV: the value its creator gave, or
    /// the one Weft chose when it gave 0 (fi_av(3) returns it through the
    /// attributes). Every process that opens the name gets the same
    /// handles whatever it passed; a nonzero value other than this one is
    /// refused at open. 0 for other AVs.
    pub fn map_addr(&self) -> u64 {
        lock(&self.inner.table).map_addr()
    }

    /// True for a named (shared) AV.
    pub fn is_shared(&self) -> bool {
        lock(&self.inner.table).is_shared()
    }
}
