//! The keys of an `FI_AV_AUTH_KEY` AV that an endpoint holds from its
//! enabling until it closes: removing one meanwhile is `Busy`.

use std::sync::{Arc, Mutex};

use super::{AvTable, MAX_AV_AUTH_KEYS};
use crate::addr::FiAddr;
use crate::auth::AuthKey;
use crate::sync::lock;
use crate::{Error, Result};

/// Keys held in an AV, given back by [`release`](Self::release) or on drop.
#[derive(Debug, Default)]
pub struct KeyLease {
    av: Mutex<Option<Arc<Mutex<AvTable>>>>,
    handles: Vec<FiAddr>,
}

impl KeyLease {
    /// Holds every live key of `av`, returned with its handle in handle
    /// order. More than [`MAX_AV_AUTH_KEYS`] is `Inval`, holding nothing.
    pub fn take(av: &Arc<Mutex<AvTable>>) -> Result<(KeyLease, Vec<(FiAddr, AuthKey)>)> {
        let mut t = lock(av);
        let keys = t.keys().snapshot();
        if keys.len() > MAX_AV_AUTH_KEYS {
            return Err(Error::Inval);
        }
        let handles: Vec<FiAddr> = keys.iter().map(|(h, _)| *h).collect();
        t.keys_mut().acquire(&handles)?;
        let lease = KeyLease {
            av: Mutex::new(Some(av.clone())),
            handles,
        };
        Ok((lease, keys))
    }

    /// Gives the keys back (the endpoint closed); later calls do nothing.
    pub fn release(&self) {
        if let Some(av) = lock(&self.av).take() {
            lock(&av).keys_mut().release(&self.handles);
        }
    }
}

impl Drop for KeyLease {
    fn drop(&mut self) {
        self.release();
    }
}
