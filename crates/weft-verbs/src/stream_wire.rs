//! The verbs `FI_EP_SOCK_STREAM`'s message format and buffer accounting
//! (`msg::stream` moves the bytes; `docs/wire.md` 13.3). Pure logic:
//! it builds and is unit-tested without the RDMA stack too.

use std::io::IoSlice;

/// Bytes per stream buffer, send and receive.
pub const BUF: usize = 64 * 1024;
/// Receive buffers posted for data (the peer's data credits).
pub const RX_BUFS: usize = 16;
/// Receive buffers posted for credit-only messages.
pub const CTL_BUFS: usize = 4;
/// Send buffers: data messages in flight.
pub const TX_BUFS: usize = 8;
/// Data buffers read before a credit-only message returns them (when
/// no data goes the other way). At most [`RX_BUFS`], or a writer that
/// filled every buffer would wait for ever.
pub const RETURN_AT: u32 = 4;

/// The immediate data of a stream message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Imm {
    /// The sender ends its writing (no payload).
    pub fin: bool,
    /// A credit-only message (no payload): it took one of the receiver's
    /// credit-only buffers.
    pub ctl: bool,
    /// Credit-only buffers returned.
    pub ctl_ret: u8,
    /// Data buffers returned.
    pub data_ret: u16,
}

impl Imm {
    const FIN: u32 = 1 << 31;
    const CTL: u32 = 1 << 30;

    /// The 32-bit immediate (host order; verbs sends it big-endian).
    pub fn encode(self) -> u32 {
        let mut v = u32::from(self.data_ret) | (u32::from(self.ctl_ret) << 16);
        if self.fin {
            v |= Self::FIN;
        }
        if self.ctl {
            v |= Self::CTL;
        }
        v
    }

    /// Reads an immediate; `None` for bits this version does not define.
    pub fn decode(v: u32) -> Option<Imm> {
        if v & 0x3f00_0000 != 0 || (v & Self::FIN != 0 && v & Self::CTL != 0) {
            return None;
        }
        Some(Imm {
            fin: v & Self::FIN != 0,
            ctl: v & Self::CTL != 0,
            ctl_ret: ((v >> 16) & 0xff) as u8,
            data_ret: (v & 0xffff) as u16,
        })
    }
}

/// Both directions' buffer accounting, apart from the device (the
/// decisions the completions and the application's calls make).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credits {
    /// Data messages we may still send.
    pub data: u32,
    /// Credit-only messages we may still send.
    pub ctl: u32,
    /// Data buffers read and posted again, not yet returned.
    pub ret_data: u32,
    /// Credit-only buffers posted again, not yet returned.
    pub ret_ctl: u32,
}

impl Default for Credits {
    fn default() -> Credits {
        Credits {
            data: RX_BUFS as u32,
            ctl: CTL_BUFS as u32,
            ret_data: 0,
            ret_ctl: 0,
        }
    }
}

impl Credits {
    /// What the next message returns (all that is due), counted as sent.
    pub fn take_returns(&mut self) -> (u16, u8) {
        // Never more than the buffers posted, which fit the fields.
        let d = self.ret_data.min(u32::from(u16::MAX));
        let c = self.ret_ctl.min(u32::from(u8::MAX));
        self.ret_data -= d;
        self.ret_ctl -= c;
        (d as u16, c as u8)
    }

    /// A message arrived returning these. Never more than the peer
    /// posts: a peer returning buffers it never had would only make us
    /// send into its empty queue (and, unbounded, overflow the count).
    pub fn returned(&mut self, imm: &Imm) {
        self.data = (self.data + u32::from(imm.data_ret)).min(RX_BUFS as u32);
        self.ctl = (self.ctl + u32::from(imm.ctl_ret)).min(CTL_BUFS as u32);
    }

    /// Whether to send a credit-only message now.
    pub fn wants_ctl(&self) -> bool {
        self.ret_data >= RETURN_AT && self.ctl > 0
    }
}

/// The `len` bytes of `bufs` from `skip` on, as slices.
pub fn window<'a>(bufs: &'a [IoSlice<'_>], mut skip: usize, mut len: usize) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    for b in bufs {
        if len == 0 {
            break;
        }
        if skip >= b.len() {
            skip -= b.len();
            continue;
        }
        let n = (b.len() - skip).min(len);
        out.push(&b[skip..skip + n]);
        len -= n;
        skip = 0;
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn immediates_round_trip_and_unknown_bits_are_refused() {
        for imm in [
            Imm::default(),
            Imm {
                fin: true,
                ctl_ret: 3,
                data_ret: 16,
                ..Imm::default()
            },
            Imm {
                ctl: true,
                ctl_ret: 255,
                data_ret: u16::MAX,
                ..Imm::default()
            },
        ] {
            assert_eq!(Imm::decode(imm.encode()), Some(imm));
        }
        assert_eq!(Imm::decode(1 << 24), None);
        assert_eq!(Imm::decode(Imm::FIN | Imm::CTL), None);
    }

    /// A reader that read everything returns it even when no data goes
    /// back; credit-only returns only ride along.
    #[test]
    fn returns_go_back_by_threshold_and_ride_along() {
        let mut c = Credits {
            ret_ctl: 2,
            ..Credits::default()
        };
        assert!(!c.wants_ctl(), "credit-only returns alone send nothing");
        c.ret_data = RETURN_AT - 1;
        assert!(!c.wants_ctl());
        c.ret_data = RETURN_AT;
        assert!(c.wants_ctl());
        assert_eq!(c.take_returns(), (RETURN_AT as u16, 2));
        assert_eq!((c.ret_data, c.ret_ctl), (0, 0));
        c.ret_data = RETURN_AT;
        c.ctl = 0;
        assert!(!c.wants_ctl(), "no credit-only buffer at the peer");
        c.returned(&Imm {
            ctl_ret: 1,
            data_ret: 5,
            ..Imm::default()
        });
        assert_eq!(
            (c.data, c.ctl),
            (RX_BUFS as u32, 1),
            "at most what the peer posts"
        );
        assert!(c.wants_ctl());
        c.data = 3;
        c.returned(&Imm {
            data_ret: 5,
            ..Imm::default()
        });
        assert_eq!(c.data, 8);
        c.returned(&Imm {
            ctl_ret: u8::MAX,
            data_ret: u16::MAX,
            ..Imm::default()
        });
        assert_eq!((c.data, c.ctl), (RX_BUFS as u32, CTL_BUFS as u32));
    }

    /// A writer that filled every buffer of a reader that then read
    /// them all gets them back: the reader's returns reach the
    /// threshold.
    #[test]
    fn a_full_ring_read_to_its_end_is_returned() {
        assert!(RETURN_AT as usize <= RX_BUFS);
        let mut reader = Credits {
            ret_data: RX_BUFS as u32,
            ..Credits::default()
        };
        assert!(reader.wants_ctl());
        let (d, _) = reader.take_returns();
        assert_eq!(usize::from(d), RX_BUFS);
    }

    #[test]
    fn windows_cut_across_slices() {
        let a = [1u8, 2, 3];
        let b = [4u8, 5];
        let bufs = [IoSlice::new(&a), IoSlice::new(&[]), IoSlice::new(&b)];
        let w: Vec<u8> = window(&bufs, 2, 2).concat();
        assert_eq!(w, [3, 4]);
        assert_eq!(window(&bufs, 0, 5).concat(), [1, 2, 3, 4, 5]);
        assert!(window(&bufs, 5, 0).is_empty());
    }
}
