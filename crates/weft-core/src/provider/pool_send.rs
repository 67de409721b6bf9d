//! A send's payload that is a buffer of a registered pool, carried as the
//! buffer itself: the provider reads it where it is, finds the pool's
//! registration on it (no lookup by address), and the buffer goes back to
//! its pool when the provider drops the payload — when the send ends. No
//! allocation: a `Bytes` that gives the buffer back when dropped needs a
//! boxed owner per send.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

/// The pool a [`PoolSend`] comes from (the API's buffer pool), as the
/// provider sees it.
pub trait PoolHome: Send + Sync {
    /// Takes back the buffer whose send ended: the one element of `buf`,
    /// whose `Vec` travels with it (the pool's posted receives go in it).
    fn put_back(&self, buf: Vec<BytesMut>);
    /// What the provider returned from `pool_alloc` to keep the pool's
    /// memory registered (`PoolMemory::keep`); the pool keeps it until
    /// every buffer is back.
    fn registration(&self) -> &(dyn Any + Send + Sync);
}

/// A pool buffer a send reads from (the whole buffer is the message). It
/// goes back to its pool when dropped, so a provider holds it until the
/// device or peer no longer reads it.
pub struct PoolSend {
    /// The buffer, alone in the `Vec` the pool keeps with it: one `Vec`
    /// here rather than a buffer and a spare list (a smaller request,
    /// and a smaller in-flight entry in the provider).
    buf: Vec<BytesMut>,
    home: Arc<dyn PoolHome>,
}

impl PoolSend {
    /// `buf`, a buffer of the pool `home`, carried in `spare` (the
    /// empty `Vec` the pool keeps with it; it allocates only if that has
    /// no room yet).
    #[inline]
    pub fn new(buf: BytesMut, mut spare: Vec<BytesMut>, home: Arc<dyn PoolHome>) -> PoolSend {
        spare.clear();
        spare.push(buf);
        PoolSend { buf: spare, home }
    }

    /// The message bytes.
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        self.buf.first().map_or(&[], |b| &b[..])
    }

    /// Message length.
    #[inline]
    pub fn len(&self) -> usize {
        self.bytes().len()
    }

    /// True for an empty message.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The provider's registration of the pool ([`PoolHome::registration`]).
    #[inline]
    pub fn registration(&self) -> &(dyn Any + Send + Sync) {
        self.home.registration()
    }

    /// The payload as `Bytes` that give the buffer back when the last
    /// clone is dropped (one allocation: the owner is boxed), for a
    /// provider that moves `Bytes`.
    pub fn into_bytes(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for PoolSend {
    fn as_ref(&self) -> &[u8] {
        self.bytes()
    }
}

impl fmt::Debug for PoolSend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolSend")
            .field("len", &self.len())
            .finish()
    }
}

impl Drop for PoolSend {
    fn drop(&mut self) {
        self.home.put_back(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A pool that records what comes back.
    struct Home {
        back: Mutex<Vec<Vec<BytesMut>>>,
        reg: u32,
    }

    impl PoolHome for Home {
        fn put_back(&self, buf: Vec<BytesMut>) {
            self.back.lock().unwrap().push(buf);
        }
        fn registration(&self) -> &(dyn Any + Send + Sync) {
            &self.reg
        }
    }

    fn home() -> Arc<Home> {
        Arc::new(Home {
            back: Mutex::new(Vec::new()),
            reg: 7,
        })
    }

    #[test]
    fn the_buffer_goes_back_in_its_spare_list_when_dropped() {
        let h = home();
        let spare: Vec<BytesMut> = Vec::with_capacity(1);
        let send = PoolSend::new(BytesMut::from(&b"hello"[..]), spare, h.clone());
        assert_eq!(
            (send.bytes(), send.len(), send.is_empty()),
            (&b"hello"[..], 5, false)
        );
        assert_eq!(send.registration().downcast_ref::<u32>(), Some(&7));
        assert!(h.back.lock().unwrap().is_empty());
        drop(send);
        let back = h.back.lock().unwrap().pop().unwrap();
        assert_eq!(back.len(), 1);
        assert_eq!(&back[0][..], b"hello");
        assert_eq!(back.capacity(), 1, "the spare list itself, no new one");
    }

    #[test]
    fn as_bytes_it_goes_back_when_the_last_clone_drops() {
        let h = home();
        let bytes = PoolSend::new(BytesMut::from(&b"abc"[..]), Vec::new(), h.clone()).into_bytes();
        let clone = bytes.clone();
        drop(bytes);
        assert!(h.back.lock().unwrap().is_empty());
        assert_eq!(&clone[..], b"abc");
        drop(clone);
        assert_eq!(h.back.lock().unwrap().len(), 1);
    }
}
