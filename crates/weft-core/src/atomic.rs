//! The element arithmetic of fi_atomic(3), independent of any transport:
//! which operation is defined on which datatype in which form, and what
//! applying one to an array of elements does.
//!
//! Elements are in the host's byte order here, as they are in memory;
//! the wire carries them little-endian ([`to_wire`] / [`from_wire`]
//! convert, and do nothing on little-endian hosts).
//!
//! The complex and `long double` datatypes have numbers (so a peer naming
//! one is understood and refused) but no arithmetic: every query and
//! every operation on them is `OpNotSupp`.

use crate::{Error, Result};

/// An atomic operation (`enum fi_op`, with libfabric's numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AtomicOp {
    /// `FI_MIN`: `*addr = (*addr < *buf) ? *addr : *buf`.
    Min = 0,
    /// `FI_MAX`: `*addr = (*addr > *buf) ? *addr : *buf`.
    Max = 1,
    /// `FI_SUM`: `*addr += *buf` (integers wrap).
    Sum = 2,
    /// `FI_PROD`: `*addr *= *buf` (integers wrap).
    Prod = 3,
    /// `FI_LOR`: `*addr = *addr || *buf` (1 or 0).
    Lor = 4,
    /// `FI_LAND`: `*addr = *addr && *buf`.
    Land = 5,
    /// `FI_BOR`: `*addr |= *buf`.
    Bor = 6,
    /// `FI_BAND`: `*addr &= *buf`.
    Band = 7,
    /// `FI_LXOR`: `*addr = (*addr != 0) != (*buf != 0)`.
    Lxor = 8,
    /// `FI_BXOR`: `*addr ^= *buf`.
    Bxor = 9,
    /// `FI_ATOMIC_READ`: fetches `*addr`, changes nothing.
    Read = 10,
    /// `FI_ATOMIC_WRITE`: `*addr = *buf`.
    Write = 11,
    /// `FI_CSWAP`: `if (*compare == *addr) *addr = *buf`.
    Cswap = 12,
    /// `FI_CSWAP_NE`: `if (*compare != *addr) *addr = *buf`.
    CswapNe = 13,
    /// `FI_CSWAP_LE`: `if (*compare <= *addr) *addr = *buf`.
    CswapLe = 14,
    /// `FI_CSWAP_LT`: `if (*compare < *addr) *addr = *buf`.
    CswapLt = 15,
    /// `FI_CSWAP_GE`: `if (*compare >= *addr) *addr = *buf`.
    CswapGe = 16,
    /// `FI_CSWAP_GT`: `if (*compare > *addr) *addr = *buf`.
    CswapGt = 17,
    /// `FI_MSWAP`: `*addr = (*buf & *compare) | (*addr & !*compare)`.
    Mswap = 18,
}

impl AtomicOp {
    /// Every operation, in number order.
    pub const ALL: [AtomicOp; 19] = [
        AtomicOp::Min,
        AtomicOp::Max,
        AtomicOp::Sum,
        AtomicOp::Prod,
        AtomicOp::Lor,
        AtomicOp::Land,
        AtomicOp::Bor,
        AtomicOp::Band,
        AtomicOp::Lxor,
        AtomicOp::Bxor,
        AtomicOp::Read,
        AtomicOp::Write,
        AtomicOp::Cswap,
        AtomicOp::CswapNe,
        AtomicOp::CswapLe,
        AtomicOp::CswapLt,
        AtomicOp::CswapGe,
        AtomicOp::CswapGt,
        AtomicOp::Mswap,
    ];

    /// The operation numbered `v`, if any.
    pub fn from_u8(v: u8) -> Option<AtomicOp> {
        AtomicOp::ALL.get(usize::from(v)).copied()
    }

    /// Whether it may change the target (all but `FI_ATOMIC_READ`): the
    /// target needs `FI_REMOTE_WRITE` for it.
    pub const fn writes(self) -> bool {
        !matches!(self, AtomicOp::Read)
    }

    /// Whether it is one of the compare forms' operations (a compare
    /// operand, and only `fi_compare_atomic`).
    pub const fn is_compare(self) -> bool {
        (self as u8) >= AtomicOp::Cswap as u8
    }
}

/// An element type (`enum fi_datatype`, with libfabric's numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Datatype {
    /// `FI_INT8`.
    I8 = 0,
    /// `FI_UINT8`.
    U8 = 1,
    /// `FI_INT16`.
    I16 = 2,
    /// `FI_UINT16`.
    U16 = 3,
    /// `FI_INT32`.
    I32 = 4,
    /// `FI_UINT32`.
    U32 = 5,
    /// `FI_INT64`.
    I64 = 6,
    /// `FI_UINT64`.
    U64 = 7,
    /// `FI_FLOAT` (IEEE 754 binary32).
    F32 = 8,
    /// `FI_DOUBLE` (IEEE 754 binary64).
    F64 = 9,
    /// `FI_FLOAT_COMPLEX`: not supported.
    FloatComplex = 10,
    /// `FI_DOUBLE_COMPLEX`: not supported.
    DoubleComplex = 11,
    /// `FI_LONG_DOUBLE`: not supported.
    LongDouble = 12,
    /// `FI_LONG_DOUBLE_COMPLEX`: not supported.
    LongDoubleComplex = 13,
}

impl Datatype {
    /// Every datatype, in number order.
    pub const ALL: [Datatype; 14] = [
        Datatype::I8,
        Datatype::U8,
        Datatype::I16,
        Datatype::U16,
        Datatype::I32,
        Datatype::U32,
        Datatype::I64,
        Datatype::U64,
        Datatype::F32,
        Datatype::F64,
        Datatype::FloatComplex,
        Datatype::DoubleComplex,
        Datatype::LongDouble,
        Datatype::LongDoubleComplex,
    ];

    /// The datatype numbered `v`, if any.
    pub fn from_u8(v: u8) -> Option<Datatype> {
        Datatype::ALL.get(usize::from(v)).copied()
    }

    /// Bytes of one element. The `long double` types count as x86-64's
    /// 16 (and 32 for the complex one): only so a frame naming them has a
    /// definite length, since nothing computes with them.
    pub const fn size(self) -> usize {
        match self {
            Datatype::I8 | Datatype::U8 => 1,
            Datatype::I16 | Datatype::U16 => 2,
            Datatype::I32 | Datatype::U32 | Datatype::F32 => 4,
            Datatype::I64 | Datatype::U64 | Datatype::F64 | Datatype::FloatComplex => 8,
            Datatype::DoubleComplex | Datatype::LongDouble => 16,
            Datatype::LongDoubleComplex => 32,
        }
    }

    /// The eight integer types.
    pub const fn is_integer(self) -> bool {
        (self as u8) <= Datatype::U64 as u8
    }

    /// Integers, `FLOAT` and `DOUBLE`: the types this module computes on.
    pub const fn is_real(self) -> bool {
        (self as u8) <= Datatype::F64 as u8
    }
}

/// Which call an atomic is: `fi_atomic`, `fi_fetch_atomic` or
/// `fi_compare_atomic` (and the matching `*atomicvalid` query).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AtomicKind {
    /// `fi_atomic`: updates, returns nothing.
    Plain = 0,
    /// `fi_fetch_atomic`: updates (or reads) and returns the values before.
    Fetch = 1,
    /// `fi_compare_atomic`: compares, swaps, returns the values before.
    Compare = 2,
}

impl AtomicKind {
    /// The kind numbered `v`, if any.
    pub fn from_u8(v: u8) -> Option<AtomicKind> {
        match v {
            0 => Some(AtomicKind::Plain),
            1 => Some(AtomicKind::Fetch),
            2 => Some(AtomicKind::Compare),
            _ => None,
        }
    }

    /// Whether the initiator gets the old values back.
    pub const fn fetches(self) -> bool {
        !matches!(self, AtomicKind::Plain)
    }
}

/// Whether libfabric defines `op` on `dt` in form `kind` (its util
/// atomics' dispatch tables): the bitwise operations and `MSWAP` on
/// integers only, `MIN`, `MAX` and the ordered compares not on complex
/// types, `ATOMIC_READ` only fetching, the compare operations only in
/// the compare form.
pub fn defined(kind: AtomicKind, op: AtomicOp, dt: Datatype) -> bool {
    let form = match kind {
        AtomicKind::Plain => !op.is_compare() && op != AtomicOp::Read,
        AtomicKind::Fetch => !op.is_compare(),
        AtomicKind::Compare => op.is_compare(),
    };
    let complex = matches!(
        dt,
        Datatype::FloatComplex | Datatype::DoubleComplex | Datatype::LongDoubleComplex
    );
    let types = match op {
        AtomicOp::Bor | AtomicOp::Band | AtomicOp::Bxor | AtomicOp::Mswap => dt.is_integer(),
        AtomicOp::Min
        | AtomicOp::Max
        | AtomicOp::CswapLe
        | AtomicOp::CswapLt
        | AtomicOp::CswapGe
        | AtomicOp::CswapGt => !complex,
        _ => true,
    };
    form && types
}

/// Whether this module computes `op` on `dt` in form `kind`: what
/// libfabric defines, less the complex and `long double` types.
/// `OpNotSupp` otherwise.
pub fn supported(kind: AtomicKind, op: AtomicOp, dt: Datatype) -> Result<()> {
    if defined(kind, op, dt) && dt.is_real() {
        Ok(())
    } else {
        Err(Error::OpNotSupp)
    }
}

/// One element type's arithmetic.
trait Elem: Copy + PartialOrd {
    const SIZE: usize;
    fn load(b: &[u8]) -> Self;
    fn store(self, b: &mut [u8]);
    fn sum(self, o: Self) -> Self;
    fn prod(self, o: Self) -> Self;
    fn truthy(self) -> bool;
    fn from_bool(v: bool) -> Self;
    /// `BOR`, `BAND`, `BXOR` and `MSWAP` (with mask `c`); `None` on the
    /// floating types, which have no bitwise operations.
    fn bits(self, op: AtomicOp, s: Self, c: Self) -> Option<Self>;
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn load(b: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(&b[..Self::SIZE]);
                <$t>::from_ne_bytes(a)
            }
            fn store(self, b: &mut [u8]) {
                b[..Self::SIZE].copy_from_slice(&self.to_ne_bytes());
            }
            fn sum(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            fn prod(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            fn truthy(self) -> bool {
                self != 0
            }
            fn from_bool(v: bool) -> Self {
                <$t>::from(v)
            }
            fn bits(self, op: AtomicOp, s: Self, c: Self) -> Option<Self> {
                match op {
                    AtomicOp::Bor => Some(self | s),
                    AtomicOp::Band => Some(self & s),
                    AtomicOp::Bxor => Some(self ^ s),
                    AtomicOp::Mswap => Some((s & c) | (self & !c)),
                    _ => None,
                }
            }
        }
    )*};
}

int_elem!(i8, u8, i16, u16, i32, u32, i64, u64);

macro_rules! float_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn load(b: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(&b[..Self::SIZE]);
                <$t>::from_ne_bytes(a)
            }
            fn store(self, b: &mut [u8]) {
                b[..Self::SIZE].copy_from_slice(&self.to_ne_bytes());
            }
            fn sum(self, o: Self) -> Self {
                self + o
            }
            fn prod(self, o: Self) -> Self {
                self * o
            }
            fn truthy(self) -> bool {
                self != 0.0
            }
            fn from_bool(v: bool) -> Self {
                if v { 1.0 } else { 0.0 }
            }
            fn bits(self, _op: AtomicOp, _s: Self, _c: Self) -> Option<Self> {
                None
            }
        }
    )*};
}

float_elem!(f32, f64);

/// The new value of one element `d` under `op` with operand `s` and
/// compare value `c`. Comparisons are by value (a float `-0.0` equals
/// `0.0`, a NaN equals nothing), as fi_atomic(3) writes them.
#[allow(clippy::float_cmp)]
fn element<T: Elem>(op: AtomicOp, d: T, s: T, c: T) -> Result<T> {
    Ok(match op {
        AtomicOp::Min => {
            if d < s {
                d
            } else {
                s
            }
        }
        AtomicOp::Max => {
            if d > s {
                d
            } else {
                s
            }
        }
        AtomicOp::Sum => d.sum(s),
        AtomicOp::Prod => d.prod(s),
        AtomicOp::Lor => T::from_bool(d.truthy() || s.truthy()),
        AtomicOp::Land => T::from_bool(d.truthy() && s.truthy()),
        AtomicOp::Lxor => T::from_bool(d.truthy() != s.truthy()),
        AtomicOp::Bor | AtomicOp::Band | AtomicOp::Bxor | AtomicOp::Mswap => {
            d.bits(op, s, c).ok_or(Error::OpNotSupp)?
        }
        AtomicOp::Read => d,
        AtomicOp::Write => s,
        AtomicOp::Cswap => pick(c == d, s, d),
        AtomicOp::CswapNe => pick(c != d, s, d),
        AtomicOp::CswapLe => pick(c <= d, s, d),
        AtomicOp::CswapLt => pick(c < d, s, d),
        AtomicOp::CswapGe => pick(c >= d, s, d),
        AtomicOp::CswapGt => pick(c > d, s, d),
    })
}

fn pick<T>(swap: bool, s: T, d: T) -> T {
    if swap {
        s
    } else {
        d
    }
}

/// The new values of `target` in `out` (same length): checked first,
/// then computed, so a failure leaves `out` as it was.
fn compute<T: Elem>(
    op: AtomicOp,
    target: &[u8],
    operand: &[u8],
    compare: &[u8],
    out: &mut [u8],
) -> Result<()> {
    for (i, o) in out.chunks_exact_mut(T::SIZE).enumerate() {
        let at = i * T::SIZE;
        let d = T::load(&target[at..]);
        let s = if operand.is_empty() {
            d
        } else {
            T::load(&operand[at..])
        };
        let c = if compare.is_empty() {
            d
        } else {
            T::load(&compare[at..])
        };
        element(op, d, s, c)?.store(o);
    }
    Ok(())
}

/// Applies `op` element by element to `target` (an array of `dt`, host
/// byte order) with `operand` (same length; empty for `FI_ATOMIC_READ`)
/// and `compare` (same length for the compare operations, else empty),
/// and returns the values before. `OpNotSupp` for an operation undefined
/// on `dt` in any form or a type without arithmetic here; `Inval` for
/// lengths that do not fit. On error `target` is untouched.
pub fn apply(
    op: AtomicOp,
    dt: Datatype,
    target: &mut [u8],
    operand: &[u8],
    compare: &[u8],
) -> Result<Vec<u8>> {
    let kind = if op.is_compare() {
        AtomicKind::Compare
    } else {
        AtomicKind::Fetch
    };
    supported(kind, op, dt)?;
    let n = target.len();
    let operand_ok = if op == AtomicOp::Read {
        operand.is_empty() || operand.len() == n
    } else {
        operand.len() == n
    };
    let compare_ok = if op.is_compare() {
        compare.len() == n
    } else {
        compare.is_empty()
    };
    if n % dt.size() != 0 || !operand_ok || !compare_ok {
        return Err(Error::Inval);
    }
    let mut new = vec![0u8; n];
    match dt {
        Datatype::I8 => compute::<i8>(op, target, operand, compare, &mut new)?,
        Datatype::U8 => compute::<u8>(op, target, operand, compare, &mut new)?,
        Datatype::I16 => compute::<i16>(op, target, operand, compare, &mut new)?,
        Datatype::U16 => compute::<u16>(op, target, operand, compare, &mut new)?,
        Datatype::I32 => compute::<i32>(op, target, operand, compare, &mut new)?,
        Datatype::U32 => compute::<u32>(op, target, operand, compare, &mut new)?,
        Datatype::I64 => compute::<i64>(op, target, operand, compare, &mut new)?,
        Datatype::U64 => compute::<u64>(op, target, operand, compare, &mut new)?,
        Datatype::F32 => compute::<f32>(op, target, operand, compare, &mut new)?,
        Datatype::F64 => compute::<f64>(op, target, operand, compare, &mut new)?,
        Datatype::FloatComplex
        | Datatype::DoubleComplex
        | Datatype::LongDouble
        | Datatype::LongDoubleComplex => return Err(Error::OpNotSupp),
    }
    let old = target.to_vec();
    target.copy_from_slice(&new);
    Ok(old)
}

/// Host order to the wire's little-endian order, element by element
/// (nothing to do on a little-endian host).
pub fn to_wire(dt: Datatype, b: &mut [u8]) {
    if cfg!(target_endian = "big") {
        for e in b.chunks_exact_mut(dt.size()) {
            e.reverse();
        }
    }
}

/// The wire's little-endian order to host order.
pub fn from_wire(dt: Datatype, b: &mut [u8]) {
    to_wire(dt, b);
}

#[cfg(test)]
#[path = "atomic_tests.rs"]
mod tests;
