#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use super::*;

fn bytes<T: Elem>(v: &[T]) -> Vec<u8> {
    let mut b = vec![0u8; v.len() * T::SIZE];
    for (x, c) in v.iter().zip(b.chunks_exact_mut(T::SIZE)) {
        x.store(c);
    }
    b
}

fn vals<T: Elem>(b: &[u8]) -> Vec<T> {
    b.chunks_exact(T::SIZE).map(T::load).collect()
}

/// Applies `op` to `d` and checks both the new values and that the old
/// ones came back.
fn check<T: Elem + std::fmt::Debug>(
    op: AtomicOp,
    dt: Datatype,
    d: &[T],
    s: &[T],
    c: &[T],
    want: &[T],
) {
    let mut t = bytes(d);
    let old = apply(op, dt, &mut t, &bytes(s), &bytes(c)).unwrap();
    assert_eq!(old, bytes(d), "{op:?} on {dt:?}: old values");
    let got: Vec<T> = vals(&t);
    for (g, w) in got.iter().zip(want) {
        assert!(
            g.partial_cmp(w) == Some(std::cmp::Ordering::Equal),
            "{op:?} on {dt:?}: got {got:?}, want {want:?}"
        );
    }
}

macro_rules! int_suite {
    ($name:ident, $t:ty, $dt:expr) => {
        #[test]
        fn $name() {
            let dt = $dt;
            let (lo, hi) = (<$t>::MIN, <$t>::MAX);
            let d: [$t; 3] = [5, 0, hi];
            let s: [$t; 3] = [3, 7, 2];
            let none: [$t; 0] = [];
            check(AtomicOp::Min, dt, &d, &s, &none, &[3, 0, 2]);
            check(AtomicOp::Max, dt, &d, &s, &none, &[5, 7, hi]);
            // Wrap-around at the top (and, signed, past MIN).
            check(
                AtomicOp::Sum,
                dt,
                &d,
                &s,
                &none,
                &[8, 7, hi.wrapping_add(2)],
            );
            check(
                AtomicOp::Sum,
                dt,
                &[lo],
                &[lo],
                &none,
                &[lo.wrapping_add(lo)],
            );
            check(
                AtomicOp::Prod,
                dt,
                &d,
                &s,
                &none,
                &[15, 0, hi.wrapping_mul(2)],
            );
            check(AtomicOp::Lor, dt, &[0, 0, 4], &[0, 9, 0], &none, &[0, 1, 1]);
            check(
                AtomicOp::Land,
                dt,
                &[0, 3, 4],
                &[5, 0, 6],
                &none,
                &[0, 0, 1],
            );
            check(
                AtomicOp::Lxor,
                dt,
                &[0, 3, 4],
                &[0, 0, 6],
                &none,
                &[0, 1, 0],
            );
            check(
                AtomicOp::Bor,
                dt,
                &[0b1100, 1],
                &[0b1010, 2],
                &none,
                &[0b1110, 3],
            );
            check(
                AtomicOp::Band,
                dt,
                &[0b1100, 1],
                &[0b1010, 2],
                &none,
                &[0b1000, 0],
            );
            check(
                AtomicOp::Bxor,
                dt,
                &[0b1100, 1],
                &[0b1010, 3],
                &none,
                &[0b0110, 2],
            );
            check(AtomicOp::Read, dt, &d, &none, &none, &d);
            check(AtomicOp::Read, dt, &d, &s, &none, &d);
            check(AtomicOp::Write, dt, &d, &s, &none, &s);
            // Compare forms: element i swaps when `compare OP target`.
            let t: [$t; 3] = [4, 5, 6];
            let c: [$t; 3] = [5, 5, 5];
            let n: [$t; 3] = [9, 9, 9];
            check(AtomicOp::Cswap, dt, &t, &n, &c, &[4, 9, 6]);
            check(AtomicOp::CswapNe, dt, &t, &n, &c, &[9, 5, 9]);
            check(AtomicOp::CswapLe, dt, &t, &n, &c, &[4, 9, 9]);
            check(AtomicOp::CswapLt, dt, &t, &n, &c, &[4, 5, 9]);
            check(AtomicOp::CswapGe, dt, &t, &n, &c, &[9, 9, 6]);
            check(AtomicOp::CswapGt, dt, &t, &n, &c, &[9, 5, 6]);
            // MSWAP: bits under the mask from the operand, the rest kept.
            check(
                AtomicOp::Mswap,
                dt,
                &[0b1010_1010, 0],
                &[0b0101_0101, 0x7f],
                &[0b0000_1111, 0x0f],
                &[0b1010_0101, 0x0f],
            );
        }
    };
}

int_suite!(int8_every_op, i8, Datatype::I8);
int_suite!(uint8_every_op, u8, Datatype::U8);
int_suite!(int16_every_op, i16, Datatype::I16);
int_suite!(uint16_every_op, u16, Datatype::U16);
int_suite!(int32_every_op, i32, Datatype::I32);
int_suite!(uint32_every_op, u32, Datatype::U32);
int_suite!(int64_every_op, i64, Datatype::I64);
int_suite!(uint64_every_op, u64, Datatype::U64);

#[test]
fn signed_order_is_signed() {
    check(AtomicOp::Min, Datatype::I32, &[-5i32], &[3], &[], &[-5]);
    check(AtomicOp::Max, Datatype::I8, &[-1i8], &[1], &[], &[1]);
    // As unsigned, the same bits order the other way.
    check(AtomicOp::Min, Datatype::U8, &[0xffu8], &[1], &[], &[1]);
    check(
        AtomicOp::CswapGt,
        Datatype::I16,
        &[-3i16],
        &[7],
        &[-2],
        &[7],
    );
}

macro_rules! float_suite {
    ($name:ident, $t:ty, $dt:expr) => {
        #[test]
        fn $name() {
            let dt = $dt;
            let d: [$t; 3] = [1.5, -2.0, 0.0];
            let s: [$t; 3] = [2.5, -3.0, 4.0];
            let none: [$t; 0] = [];
            check(AtomicOp::Min, dt, &d, &s, &none, &[1.5, -3.0, 0.0]);
            check(AtomicOp::Max, dt, &d, &s, &none, &[2.5, -2.0, 4.0]);
            check(AtomicOp::Sum, dt, &d, &s, &none, &[4.0, -5.0, 4.0]);
            check(AtomicOp::Prod, dt, &d, &s, &none, &[3.75, 6.0, 0.0]);
            check(
                AtomicOp::Lor,
                dt,
                &[0.0, 0.0],
                &[0.0, 0.5],
                &none,
                &[0.0, 1.0],
            );
            check(
                AtomicOp::Land,
                dt,
                &[2.0, 0.0],
                &[0.5, 0.5],
                &none,
                &[1.0, 0.0],
            );
            check(
                AtomicOp::Lxor,
                dt,
                &[2.0, 0.0],
                &[0.5, 0.5],
                &none,
                &[0.0, 1.0],
            );
            check(AtomicOp::Read, dt, &d, &none, &none, &d);
            check(AtomicOp::Write, dt, &d, &s, &none, &s);
            let t: [$t; 3] = [4.0, 5.0, 6.0];
            let c: [$t; 3] = [5.0, 5.0, 5.0];
            let n: [$t; 3] = [9.5, 9.5, 9.5];
            check(AtomicOp::Cswap, dt, &t, &n, &c, &[4.0, 9.5, 6.0]);
            check(AtomicOp::CswapNe, dt, &t, &n, &c, &[9.5, 5.0, 9.5]);
            check(AtomicOp::CswapLe, dt, &t, &n, &c, &[4.0, 9.5, 9.5]);
            check(AtomicOp::CswapLt, dt, &t, &n, &c, &[4.0, 5.0, 9.5]);
            check(AtomicOp::CswapGe, dt, &t, &n, &c, &[9.5, 9.5, 6.0]);
            check(AtomicOp::CswapGt, dt, &t, &n, &c, &[9.5, 5.0, 6.0]);
            // Compared by value: -0.0 is 0.0.
            check::<$t>(AtomicOp::Cswap, dt, &[-0.0], &[1.0], &[0.0], &[1.0]);
            // MIN/MAX as fi_atomic(3) writes them: a NaN target is
            // replaced, a NaN operand taken.
            let mut t = bytes::<$t>(&[<$t>::NAN]);
            apply(AtomicOp::Min, dt, &mut t, &bytes::<$t>(&[1.0]), &[]).unwrap();
            assert_eq!(vals::<$t>(&t), vec![1.0]);
            apply(AtomicOp::Max, dt, &mut t, &bytes::<$t>(&[<$t>::NAN]), &[]).unwrap();
            assert!(vals::<$t>(&t)[0].is_nan());
            // No bitwise operations on floats, and nothing changes.
            for op in [
                AtomicOp::Bor,
                AtomicOp::Band,
                AtomicOp::Bxor,
                AtomicOp::Mswap,
            ] {
                let mut t = bytes(&d);
                let c = if op.is_compare() {
                    bytes(&s)
                } else {
                    Vec::new()
                };
                assert_eq!(apply(op, dt, &mut t, &bytes(&s), &c), Err(Error::OpNotSupp));
                assert_eq!(t, bytes(&d));
            }
        }
    };
}

float_suite!(float_every_op, f32, Datatype::F32);
float_suite!(double_every_op, f64, Datatype::F64);

#[test]
fn the_table_is_libfabrics() {
    use AtomicKind::*;
    use AtomicOp::*;
    use Datatype::*;
    assert!(defined(Plain, Sum, U64) && defined(Fetch, Sum, U64));
    assert!(!defined(Compare, Sum, U64));
    assert!(!defined(Plain, Read, U8) && defined(Fetch, Read, U8));
    assert!(defined(Compare, Cswap, F64) && !defined(Fetch, Cswap, F64));
    assert!(!defined(Plain, Bor, F32) && !defined(Compare, Mswap, F64));
    assert!(defined(Compare, Mswap, I8));
    // Complex: arithmetic and equality, no order.
    assert!(defined(Plain, Sum, FloatComplex) && defined(Compare, CswapNe, DoubleComplex));
    assert!(!defined(Plain, Min, FloatComplex) && !defined(Compare, CswapLt, DoubleComplex));
    // Defined or not, none of them is computed here.
    for dt in [FloatComplex, DoubleComplex, LongDouble, LongDoubleComplex] {
        for op in AtomicOp::ALL {
            for k in [Plain, Fetch, Compare] {
                assert_eq!(supported(k, op, dt), Err(Error::OpNotSupp));
            }
        }
        let mut t = vec![0u8; dt.size()];
        assert_eq!(
            apply(Sum, dt, &mut t.clone(), &t.clone(), &[]),
            Err(Error::OpNotSupp)
        );
        assert_eq!(
            apply(Write, dt, &mut t, &[1; 32][..dt.size()], &[]),
            Err(Error::OpNotSupp)
        );
    }
    // Counted: how many real combinations exist per form.
    let count = |k| {
        AtomicOp::ALL
            .iter()
            .flat_map(|&op| Datatype::ALL.iter().map(move |&dt| (op, dt)))
            .filter(|&(op, dt)| supported(k, op, dt).is_ok())
            .count()
    };
    // Plain: 8 ops on all 10 types + 3 bitwise on 8 integers.
    assert_eq!(count(Plain), 8 * 10 + 3 * 8);
    assert_eq!(count(Fetch), 9 * 10 + 3 * 8);
    // Compare: 6 compares on 10 types, MSWAP on 8.
    assert_eq!(count(Compare), 6 * 10 + 8);
}

#[test]
fn numbers_round_trip() {
    for op in AtomicOp::ALL {
        assert_eq!(AtomicOp::from_u8(op as u8), Some(op));
    }
    assert_eq!(AtomicOp::from_u8(19), None);
    for dt in Datatype::ALL {
        assert_eq!(Datatype::from_u8(dt as u8), Some(dt));
    }
    assert_eq!(Datatype::from_u8(14), None);
    assert_eq!(AtomicKind::from_u8(3), None);
}

#[test]
fn bad_lengths_leave_the_target_alone() {
    let mut t = vec![1u8; 8];
    let before = t.clone();
    assert_eq!(
        apply(AtomicOp::Sum, Datatype::U32, &mut t, &[0; 4], &[]),
        Err(Error::Inval),
        "operand shorter"
    );
    assert_eq!(
        apply(AtomicOp::Sum, Datatype::U64, &mut t[..6], &[0; 6], &[]),
        Err(Error::Inval),
        "not whole elements"
    );
    assert_eq!(
        apply(AtomicOp::Cswap, Datatype::U32, &mut t, &[0; 8], &[]),
        Err(Error::Inval),
        "compare missing"
    );
    assert_eq!(
        apply(AtomicOp::Sum, Datatype::U32, &mut t, &[0; 8], &[0; 8]),
        Err(Error::Inval),
        "compare where none belongs"
    );
    assert_eq!(t, before);
}

#[test]
fn wire_order_is_little_endian() {
    let mut b = 0x0102_0304u32.to_ne_bytes();
    to_wire(Datatype::U32, &mut b);
    assert_eq!(b, [4, 3, 2, 1]);
    from_wire(Datatype::U32, &mut b);
    assert_eq!(u32::from_ne_bytes(b), 0x0102_0304);
}
