//! Registered buffer pools at the provider boundary (`fi_mr_desc`
//! semantics): memory a domain registers once and cuts into equal
//! buffers, which the application fills and hands to operations again and
//! again without any registration per operation.
//!
//! A pool's memory is one allocation: `count` buffers of `size` bytes,
//! followed by one byte that nobody hands out (the *keeper*). The buffers
//! are [`BytesMut`]s split off that allocation, so the allocation stays
//! alive as long as any of them (or the keeper) does, whoever holds them —
//! the application, or a provider that has them in flight. A provider
//! that registers the memory ([`crate::provider::ProviderDomain::pool_alloc`])
//! keeps the keeper with its registration, so memory it registered is
//! never freed while registered, and deregisters only when the last
//! buffer and the pool are gone.

use std::any::Any;
use std::fmt;

use bytes::BytesMut;

use crate::error::{Error, Result};

/// Most bytes one pool may hold (its buffers together): 1 GiB.
pub const MAX_POOL_BYTES: usize = 1 << 30;

/// The memory of a pool, as a provider's domain makes it.
pub struct PoolMemory {
    /// The buffers, `size` bytes each (`len()` and capacity), in address
    /// order.
    pub bufs: Vec<BytesMut>,
    /// The local descriptor of the memory (`fi_mr_desc`): the local key
    /// of its registration on verbs, 0 where nothing is registered.
    pub desc: u64,
    /// What keeps the registration (and, through the keeper, the memory
    /// under it) alive; dropped with the pool. For plain memory, the
    /// keeper alone.
    pub keep: Box<dyn Any + Send + Sync>,
}

impl fmt::Debug for PoolMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolMemory")
            .field("bufs", &self.bufs.len())
            .field("desc", &self.desc)
            .finish()
    }
}

impl PoolMemory {
    /// `count` buffers of `size` bytes of plain memory (providers that
    /// register nothing: tcp, udp).
    pub fn plain(count: usize, size: usize) -> Result<PoolMemory> {
        let carved = Carved::new(count, size)?;
        Ok(PoolMemory {
            bufs: carved.bufs,
            desc: 0,
            keep: Box::new(carved.keeper),
        })
    }
}

/// One zeroed allocation cut into buffers, before anything registered it.
#[derive(Debug)]
pub struct Carved {
    /// `count` buffers of `size` bytes, in address order.
    pub bufs: Vec<BytesMut>,
    /// The last byte of the allocation, handed out to nobody: whoever
    /// holds it holds the whole allocation.
    pub keeper: BytesMut,
    /// Bytes the buffers span (`count * size`), from the first one's
    /// address.
    pub span: usize,
}

/// Bytes `count` buffers of `size` take together: `Inval` for no
/// buffers or empty ones, `NoMem` past [`MAX_POOL_BYTES`].
pub fn span(count: usize, size: usize) -> Result<usize> {
    if count == 0 || size == 0 {
        return Err(Error::Inval);
    }
    count
        .checked_mul(size)
        .filter(|&s| s <= MAX_POOL_BYTES)
        .ok_or(Error::NoMem)
}

impl Carved {
    /// `count` buffers of `size` bytes. `Inval` for no buffers or empty
    /// ones, `NoMem` past [`MAX_POOL_BYTES`].
    pub fn new(count: usize, size: usize) -> Result<Carved> {
        let span = span(count, size)?;
        let mut all = BytesMut::zeroed(span + 1);
        let mut bufs = Vec::with_capacity(count);
        for _ in 0..count {
            // Splitting moves no memory: each part is a view of `all`'s
            // allocation, which lives while any view does.
            bufs.push(all.split_to(size));
        }
        Ok(Carved {
            bufs,
            keeper: all,
            span,
        })
    }
}

/// Which buffers belong to a pool: `count` slots of `size` bytes from
/// address `base`. Used to accept back only the pool's own buffers (an
/// operation hands back the buffer it was given; anything else is not a
/// slot and must not enter the pool).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slots {
    base: usize,
    size: usize,
    count: usize,
}

impl Slots {
    /// The slots of `bufs` (a pool's buffers in address order, as
    /// [`Carved`] or a provider made them). `Inval` when they are not
    /// `size`-byte buffers laid end to end.
    pub fn of(bufs: &[BytesMut], size: usize) -> Result<Slots> {
        let base = bufs.first().ok_or(Error::Inval)?.as_ptr() as usize;
        for (i, b) in bufs.iter().enumerate() {
            if b.len() != size || b.as_ptr() as usize != base + i * size {
                return Err(Error::Inval);
            }
        }
        Ok(Slots {
            base,
            size,
            count: bufs.len(),
        })
    }

    /// The slot index of `buf` if it is one of the pool's buffers: it
    /// starts at a slot and has the slot's capacity (its length may have
    /// been cut by a receive).
    pub fn index(&self, buf: &BytesMut) -> Option<usize> {
        let off = (buf.as_ptr() as usize).checked_sub(self.base)?;
        let i = off / self.size;
        (off % self.size == 0 && i < self.count && buf.capacity() == self.size).then_some(i)
    }

    /// Whether `addr..addr + len` lies inside the pool's buffers.
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        let end = self.base + self.size * self.count;
        addr >= self.base && addr.checked_add(len).is_some_and(|e| e <= end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carved_buffers_are_adjacent_slots() {
        let c = Carved::new(4, 100).unwrap();
        assert_eq!(c.bufs.len(), 4);
        assert_eq!(c.span, 400);
        assert_eq!(c.keeper.len(), 1);
        let s = Slots::of(&c.bufs, 100).unwrap();
        for (i, b) in c.bufs.iter().enumerate() {
            assert_eq!(b.len(), 100);
            assert_eq!(s.index(b), Some(i));
        }
        assert_eq!(s.index(&c.keeper), None);
        assert_eq!(s.index(&BytesMut::zeroed(100)), None);
        let base = c.bufs[0].as_ptr() as usize;
        assert!(s.contains(base, 400));
        assert!(s.contains(base + 150, 10));
        assert!(!s.contains(base + 350, 51));
        assert!(!s.contains(base.wrapping_sub(1), 2));
    }

    #[test]
    fn a_cut_buffer_is_still_its_slot_but_a_split_part_is_not() {
        let mut c = Carved::new(2, 64).unwrap();
        let s = Slots::of(&c.bufs, 64).unwrap();
        let mut b = c.bufs.pop().unwrap();
        b.truncate(3);
        assert_eq!(s.index(&b), Some(1));
        let tail = b.split_off(1);
        assert_eq!(s.index(&b), None, "capacity 1 is not a slot");
        assert_eq!(s.index(&tail), None);
    }

    #[test]
    fn bad_shapes_are_refused() {
        assert_eq!(Carved::new(0, 8).unwrap_err(), Error::Inval);
        assert_eq!(Carved::new(8, 0).unwrap_err(), Error::Inval);
        assert_eq!(Carved::new(usize::MAX, 2).unwrap_err(), Error::NoMem);
        assert_eq!(Carved::new(1025, 1 << 20).unwrap_err(), Error::NoMem);
        let p = PoolMemory::plain(3, 16).unwrap();
        assert_eq!((p.bufs.len(), p.desc), (3, 0));
        let mut shuffled = p.bufs;
        shuffled.swap(0, 1);
        assert_eq!(Slots::of(&shuffled, 16).unwrap_err(), Error::Inval);
    }
}
