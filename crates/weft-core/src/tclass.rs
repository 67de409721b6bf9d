//! Traffic classes (`tx_attr.tclass`, fi_endpoint(3)): a DSCP value set
//! with [`dscp_set`], or one of the `FI_TC_*` labels, which each provider
//! maps onto what its transport has (IP DSCP for sockets, the traffic
//! class of an RDMA address handle).

use crate::error::{Error, Result};

/// `FI_TC_UNSPEC`: the provider's default.
pub const UNSPEC: u32 = 0;
/// `FI_TC_DSCP`: the low 8 bits hold a DSCP value.
pub const DSCP: u32 = 0x100;
/// `FI_TC_LABEL`: the first of the labels.
pub const LABEL: u32 = 0x200;
/// `FI_TC_BEST_EFFORT`.
pub const BEST_EFFORT: u32 = LABEL;
/// `FI_TC_LOW_LATENCY`.
pub const LOW_LATENCY: u32 = LABEL + 1;
/// `FI_TC_DEDICATED_ACCESS`.
pub const DEDICATED_ACCESS: u32 = LABEL + 2;
/// `FI_TC_BULK_DATA`.
pub const BULK_DATA: u32 = LABEL + 3;
/// `FI_TC_SCAVENGER`.
pub const SCAVENGER: u32 = LABEL + 4;
/// `FI_TC_NETWORK_CTRL`.
pub const NETWORK_CTRL: u32 = LABEL + 5;

/// `fi_tc_dscp_set`: the traffic class carrying `dscp`.
pub fn dscp_set(dscp: u8) -> u32 {
    DSCP | u32::from(dscp)
}

/// `fi_tc_dscp_get`: the DSCP value of a `dscp_set` class, else 0.
pub fn dscp_get(tclass: u32) -> u8 {
    if tclass & DSCP != 0 {
        (tclass & 0xff) as u8
    } else {
        0
    }
}

/// The DSCP value an IP transport marks its packets with for `tclass`
/// (`None`: leave the system default). Labels map onto the code points
/// RFC 4594 gives their kind of traffic: low latency to EF (46),
/// dedicated access to AF41 (34), bulk data to AF11 (10), scavenger to
/// CS1 (8), network control to CS6 (48), best effort to 0. A DSCP value
/// over 63, or an unknown class, is `Inval`.
pub fn to_dscp(tclass: u32) -> Result<Option<u8>> {
    match tclass {
        UNSPEC => Ok(None),
        t if t & !0xff == DSCP => {
            let d = (t & 0xff) as u8;
            if d > 63 {
                Err(Error::Inval)
            } else {
                Ok(Some(d))
            }
        }
        BEST_EFFORT => Ok(Some(0)),
        LOW_LATENCY => Ok(Some(46)),
        DEDICATED_ACCESS => Ok(Some(34)),
        BULK_DATA => Ok(Some(10)),
        SCAVENGER => Ok(Some(8)),
        NETWORK_CTRL => Ok(Some(48)),
        _ => Err(Error::Inval),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn dscp_round_trips_and_labels_map() {
        assert_eq!(dscp_get(dscp_set(46)), 46);
        assert_eq!(dscp_get(LOW_LATENCY), 0);
        assert_eq!(to_dscp(UNSPEC).unwrap(), None);
        assert_eq!(to_dscp(dscp_set(26)).unwrap(), Some(26));
        assert_eq!(to_dscp(LOW_LATENCY).unwrap(), Some(46));
        assert_eq!(to_dscp(BULK_DATA).unwrap(), Some(10));
        assert_eq!(to_dscp(dscp_set(64)).unwrap_err(), Error::Inval);
        assert_eq!(to_dscp(LABEL + 6).unwrap_err(), Error::Inval);
        assert_eq!(to_dscp(7).unwrap_err(), Error::Inval);
    }
}
