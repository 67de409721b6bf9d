//! A message that arrived before any receive took it: buffered, charged
//! against the unexpected budget, possibly still arriving.

use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use weft_core::provider::RecvReq;
use weft_core::tagmatch::MsgInfo;
use weft_core::Error;

use crate::keys::Source;

/// A buffered unexpected message, possibly still arriving.
#[derive(Debug)]
pub struct Unexpected {
    pub st: Mutex<UnexpState>,
    /// Who sent it (for `FI_SOURCE_ERR` reports).
    pub from: Source,
    /// For a shared receive context: the endpoint it arrived at, whose
    /// queues its completion goes to.
    pub at: Option<Arc<crate::srx::SrxMember>>,
    /// Its share of the budget, given back when the message is freed.
    pub _charge: crate::admission::Charge,
}

impl Unexpected {
    /// A message of `len` bytes whose payload is still to arrive (a
    /// zero-length one is whole). The whole announced length is charged,
    /// and the share bounds it, so the buffer is sized once (pages of a
    /// large one are only touched as bytes arrive).
    pub fn arriving(
        len: usize,
        from: Source,
        at: Option<Arc<crate::srx::SrxMember>>,
        charge: crate::admission::Charge,
    ) -> Arc<Unexpected> {
        Unexpected::with(
            BytesMut::with_capacity(len),
            len,
            len == 0,
            from,
            at,
            charge,
        )
    }

    /// A whole message of `len` bytes (given back by a dropped receive
    /// future).
    pub fn whole(
        data: BytesMut,
        len: usize,
        from: Source,
        at: Option<Arc<crate::srx::SrxMember>>,
        charge: crate::admission::Charge,
    ) -> Arc<Unexpected> {
        Unexpected::with(data, len, true, from, at, charge)
    }

    fn with(
        data: BytesMut,
        len: usize,
        complete: bool,
        from: Source,
        at: Option<Arc<crate::srx::SrxMember>>,
        charge: crate::admission::Charge,
    ) -> Arc<Unexpected> {
        Arc::new(Unexpected {
            st: Mutex::new(UnexpState {
                data,
                len,
                complete,
                failed: None,
                waiter: None,
            }),
            from,
            at,
            _charge: charge,
        })
    }
}

#[derive(Debug)]
pub struct UnexpState {
    /// The bytes arrived so far.
    pub data: BytesMut,
    /// The announced length.
    pub len: usize,
    pub complete: bool,
    /// Its connection ended before the whole message arrived.
    pub failed: Option<Error>,
    /// A receive matched it before its payload was complete (boxed: most
    /// messages never have one, and every buffered message pays for the
    /// field's size).
    pub waiter: Option<Box<(RecvReq, MsgInfo)>>,
}
