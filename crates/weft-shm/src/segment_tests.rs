//! Tests of `segment`: every access checked against the mapping, ring
//! shapes, opens by name.
#![allow(clippy::unwrap_used)]
use super::*;

/// A name's file identity, looked up without opening it, is the one
/// its open gives; nothing under the name is `NoEnt`, a name that is
/// no single file name `Inval` (as for the opens).
#[test]
fn a_names_identity_is_its_opens() {
    let name = format!("weft-test-id-{}", crate::name::unique());
    let path = format!("{}/{name}", crate::name::SHM_DIR);
    std::fs::write(&path, [0u8; 8]).unwrap();
    let by_name = Segment::id_by_name(&name);
    let by_open = Segment::open_fd(&name).and_then(FileId::of_fd);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(by_name.unwrap(), by_open.unwrap());
    assert_eq!(Segment::id_by_name(&name), Err(Error::NoEnt));
    assert_eq!(Segment::id_by_name("a/b"), Err(Error::Inval));
}

#[test]
fn accesses_outside_or_misaligned_are_refused() {
    let s = Segment::anonymous(&[0u8; 64]).unwrap();
    assert!(s.store64(56, 7, Ordering::Release));
    assert_eq!(s.load64(56, Ordering::Acquire), Some(7));
    assert_eq!(s.load64(60, Ordering::Acquire), None);
    assert_eq!(s.load64(64, Ordering::Acquire), None);
    assert_eq!(s.load32(usize::MAX - 3, Ordering::Acquire), None);
    assert_eq!(s.load32(2, Ordering::Acquire), None);
    let mut b = [0u8; 8];
    assert!(s.read(56, &mut b));
    assert!(!s.read(57, &mut b));
    assert!(!s.read(usize::MAX, &mut b));
    assert!(!s.write(usize::MAX - 2, &b));
    assert!(s.cas32(0, 0, 5));
    assert!(!s.cas32(0, 0, 6));
    assert_eq!(s.swap32(0, 1), Some(5));
    assert!(s.cas64(8, 0, u64::MAX));
    assert!(!s.cas64(8, 0, 1));
    assert_eq!(s.and64(8, 0xff << 32), Some(u64::MAX));
    assert_eq!(s.load64(8, Ordering::Acquire), Some(0xff << 32));
    assert!(!s.cas64(4, 0, 1), "misaligned");
    assert_eq!(s.and64(64, 0), None, "past the end");
}

#[test]
fn blocks_stay_inside_the_mapping() {
    let s = Segment::anonymous(&[0u8; 64]).unwrap();
    assert!(s.block::<32>(40).is_none(), "past the end");
    assert!(s.block::<8>(4).is_none(), "misaligned");
    assert!(s.block::<8>(usize::MAX - 7).is_none());
    let b = s.block::<32>(32).unwrap();
    assert!(b.store64(24, 9, Ordering::Release));
    assert_eq!(s.load64(56, Ordering::Acquire), Some(9));
    assert_eq!(b.load64(32, Ordering::Acquire), None, "past the block");
    assert_eq!(b.load32(30, Ordering::Acquire), None);
    assert_eq!(b.load32(2, Ordering::Acquire), None, "misaligned");
    assert!(s.store32(56, 7, Ordering::Release));
    assert_eq!(b.swap32(24, 4), Some(7));
    assert_eq!(b.load32(24, Ordering::Acquire), Some(4));
}

#[test]
fn rings_stay_inside_the_mapping() {
    let mut s = Segment::anonymous(&[0u8; 256]).unwrap();
    assert!(s.ring(0, 24).is_none(), "not a power of two");
    assert!(s.ring(4, 64).is_none(), "misaligned");
    assert!(s.ring(0, 4).is_none(), "smaller than a word pair");
    assert!(s.ring(224, 64).is_none(), "past the end");
    assert!(s.ring(usize::MAX - 7, 64).is_none());
    assert!(s.ring_of(0).is_none(), "none recorded");
    assert!(!s.set_rings(64, 4, 64), "past the end");
    assert!(!s.set_rings(64, usize::MAX, 64), "overflowing");
    assert!(!s.set_rings(60, 2, 64), "misaligned");
    assert!(!s.set_rings(64, 2, 48), "not a power of two");
    assert!(s.ring_of(0).is_none(), "nothing recorded by a refusal");
    assert!(s.set_rings(64, 3, 64));
    assert!(s.ring_of(3).is_none(), "past the rings");
    let r = s.ring_of(2).unwrap();
    assert_eq!((r.size(), r.seg_off(8)), (64, 200));
    // Any position is masked into the ring; only misaligned ones are
    // refused.
    assert!(r.store32(u64::MAX - 3, 7, Ordering::Release));
    assert_eq!(s.load32(252, Ordering::Acquire), Some(7));
    assert_eq!(r.load32(60 + 64 * 1000, Ordering::Acquire), Some(7));
    assert_eq!(r.load32(62, Ordering::Acquire), None, "misaligned");
    assert!(!r.store32(2, 1, Ordering::Release));
    let mut b = [0u8; 8];
    assert!(r.read(56, &mut b));
    assert!(!r.read(57, &mut b), "past the ring's end");
    assert!(!r.read(usize::MAX, &mut b));
    assert!(!r.write(60, &b));
    assert!(r.write(0, &[1u8; 64]));
    assert_eq!(
        s.load32(188, Ordering::Acquire),
        Some(0),
        "ring 1 untouched"
    );
    assert_eq!(
        s.ring(192, 64).unwrap().load32(4, Ordering::Acquire),
        Some(0x0101_0101)
    );
}

/// A name outside every prefix a sweep looks at.
fn test_name() -> String {
    format!("weft-segment-test-{}", crate::name::unique())
}

/// `map_file` maps what the file holds, never a caller's length: a
/// file shorter than needed is refused, not mapped past its end.
#[test]
fn map_file_takes_the_size_from_the_file() {
    let path = std::path::Path::new(crate::name::SHM_DIR).join(test_name());
    std::fs::write(&path, [0u8; 4096]).unwrap();
    let f = std::fs::File::options()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(Segment::map_file(&f, 4097).unwrap_err(), Error::Inval);
    let s = Segment::map_file(&f, 4096).unwrap();
    assert_eq!(s.size(), 4096);
    f.set_len(8192).unwrap();
    assert_eq!(Segment::map_file(&f, 1).unwrap().size(), 8192);
    f.set_len(0).unwrap();
    assert_eq!(Segment::map_file(&f, 0).unwrap_err(), Error::Inval);
}

/// `map_file` checks the descriptor as `open` does (`map_regular`):
/// what is not a regular file is not mapped, whatever its size says.
#[test]
fn map_file_refuses_what_is_not_a_regular_file() {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = std::path::Path::new(crate::name::SHM_DIR);
    let fifo = crate::test_fifo::Fifo::make(dir.join(test_name()));
    // Read and write, without waiting: a FIFO opened so never blocks.
    let f = std::fs::File::options()
        .read(true)
        .write(true)
        .custom_flags(OFlags::NONBLOCK.bits() as i32)
        .open(fifo.path())
        .unwrap();
    assert_eq!(Segment::map_file(&f, 0).unwrap_err(), Error::Inval);
    let d = std::fs::File::open(dir).unwrap();
    assert_eq!(Segment::map_file(&d, 0).unwrap_err(), Error::Inval);
}

/// A FIFO, a symbolic link or a directory under a segment's name is
/// not a segment: refused at once, not waited on (a FIFO) nor
/// followed.
#[test]
fn open_refuses_what_is_not_a_regular_file() {
    let dir = std::path::Path::new(crate::name::SHM_DIR);
    let (fifo, link, file, sub) = (test_name(), test_name(), test_name(), test_name());
    let _fifo = crate::test_fifo::Fifo::make(dir.join(&fifo));
    std::fs::create_dir(dir.join(&sub)).unwrap();
    std::fs::write(dir.join(&file), [0u8; 4096]).unwrap();
    std::os::unix::fs::symlink(dir.join(&file), dir.join(&link)).unwrap();
    assert_eq!(Segment::open(&fifo, 0, 1 << 20).unwrap_err(), Error::Inval);
    assert_eq!(Segment::open(&link, 0, 1 << 20).unwrap_err(), Error::Inval);
    assert_eq!(Segment::open(&sub, 0, 1 << 20).unwrap_err(), Error::Inval);
    std::fs::remove_dir(dir.join(&sub)).unwrap();
    assert_eq!(Segment::open(&file, 0, 1 << 20).unwrap().size(), 4096);
    let slashed = format!("/{file}");
    assert_eq!(Segment::open(&slashed, 0, 1 << 20).unwrap().size(), 4096);
    assert_eq!(
        Segment::open(&file, 4097, 1 << 20).unwrap_err(),
        Error::Inval
    );
    assert_eq!(Segment::open(&test_name(), 0, 1).unwrap_err(), Error::NoEnt);
    assert_eq!(Segment::open("a/b", 0, 1).unwrap_err(), Error::Inval);
    for n in [link, file] {
        std::fs::remove_file(dir.join(n)).unwrap();
    }
}
