use super::*;

fn attr(av_type: AvType) -> AvAttr {
    AvAttr {
        av_type,
        ..AvAttr::default()
    }
}

fn open(av_type: AvType) -> AvTable {
    AvTable::open(&attr(av_type)).unwrap()
}

fn ok(_: &[u8]) -> Result<()> {
    Ok(())
}

/// Rejects addresses starting with 0xFF, like a decoder rejecting garbage.
fn no_ff(a: &[u8]) -> Result<()> {
    if a.first() == Some(&0xFF) {
        Err(Error::Inval)
    } else {
        Ok(())
    }
}

/// A distinct 6-byte address per `n`.
fn a(n: u32) -> Vec<u8> {
    let [b0, b1, b2, b3] = n.to_be_bytes();
    vec![2, 0, b0, b1, b2, b3]
}

fn insert1(av: &mut AvTable, addr: Vec<u8>) -> FiAddr {
    av.insert(&[addr], &ok).remove(0).unwrap()
}

const BOTH: [AvType; 2] = [AvType::Table, AvType::Map];

#[test]
fn open_validates_attr() {
    let t = open(AvType::Unspec);
    assert_eq!(t.av_type(), AvType::Table);
    assert_eq!(open(AvType::Map).av_type(), AvType::Map);
    for flags in [
        AvFlags::MORE,
        AvFlags::SYNC_ERR,
        AvFlags::from_bits_retain(1 << 3),
    ] {
        let e = AvTable::open(&AvAttr {
            flags,
            ..attr(AvType::Table)
        })
        .unwrap_err();
        assert_eq!(e, Error::BadFlags, "{flags:?}");
    }
    let flags = AvFlags::SYMMETRIC | AvFlags::EVENT | AvFlags::AV_USER_ID;
    let t = AvTable::open(&AvAttr {
        flags,
        rx_ctx_bits: 32,
        ..attr(AvType::Map)
    })
    .unwrap();
    assert_eq!((t.flags(), t.rx_ctx_bits()), (flags, 32));
    let e = AvTable::open(&AvAttr {
        rx_ctx_bits: 33,
        ..attr(AvType::Table)
    });
    assert_eq!(e.unwrap_err(), Error::Inval);
    let named = AvAttr {
        name: Some("shared".into()),
        ..attr(AvType::Table)
    };
    assert_eq!(AvTable::open(&named).unwrap_err(), Error::NoSys);
    let ro = AvAttr {
        flags: AvFlags::READ,
        ..named
    };
    assert_eq!(AvTable::open(&ro).unwrap_err(), Error::NoSys);
    let ro_unnamed = AvAttr {
        flags: AvFlags::READ,
        ..attr(AvType::Table)
    };
    assert_eq!(AvTable::open(&ro_unnamed).unwrap_err(), Error::Inval);
}

#[test]
fn open_any_count_and_grow_past_it() {
    for ty in BOTH {
        for shift in 0..=16 {
            let mut t = AvTable::open(&AvAttr {
                count: 1 << shift,
                ..attr(ty)
            })
            .unwrap();
            assert!(t.is_empty());
            if shift < 4 {
                let addrs: Vec<_> = (0..40).map(a).collect();
                assert!(t.insert(&addrs, &ok).iter().all(Result::is_ok));
                assert_eq!(t.len(), 40);
            }
        }
        let mut t = AvTable::open(&AvAttr {
            count: 0,
            ..attr(ty)
        })
        .unwrap();
        insert1(&mut t, a(1));
        assert!(AvTable::open(&AvAttr {
            count: usize::MAX,
            ..attr(ty)
        })
        .is_ok());
    }
}

#[test]
fn table_indices_sequential_across_calls() {
    let mut t = open(AvType::Table);
    let r1: Vec<_> = t
        .insert(&[a(0), a(1)], &ok)
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let r2: Vec<_> = t
        .insert(&[a(2)], &ok)
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!((r1, r2), (vec![0, 1], vec![2]));
    assert_eq!(t.reserve(3), vec![3, 4, 5]);
}

#[test]
fn good_bad_vector_fails_slot_one() {
    for ty in BOTH {
        let mut t = open(ty);
        let res = t.insert(&[a(1), vec![0xFF, 0]], &no_ff);
        assert!(res[0].is_ok());
        assert_eq!(res[1], Err(Error::Inval));
        assert_eq!(res.iter().filter(|r| r.is_ok()).count(), 1);
        assert_eq!(t.len(), 1);
        assert_eq!(sync_err_status(&res), vec![0, Error::Inval.code()]);
        // The failed address took no slot.
        if ty == AvType::Table {
            assert_eq!(insert1(&mut t, a(2)), 1);
        }
    }
}

#[test]
fn table_reuses_lowest_index_first() {
    let mut t = open(AvType::Table);
    let addrs: Vec<_> = (0..5).map(a).collect();
    t.insert(&addrs, &ok);
    t.remove(3).unwrap();
    t.remove(0).unwrap();
    t.remove(1).unwrap();
    assert_eq!(t.reserve(4), vec![0, 1, 3, 5]);
}

#[test]
fn remove_then_reinsert_same_address() {
    for ty in BOTH {
        let mut t = open(ty);
        let h = insert1(&mut t, a(7));
        insert1(&mut t, a(8));
        t.remove(h).unwrap();
        assert_eq!(t.find(&a(7)), None);
        assert_eq!(t.lookup(h), Err(Error::Inval));
        let h2 = insert1(&mut t, a(7));
        assert_eq!(t.find(&a(7)), Some(h2));
        assert_eq!(t.lookup(h2).unwrap(), &a(7)[..]);
        if ty == AvType::Table {
            assert_eq!(h2, h, "index 0 is reused");
        } else {
            assert_ne!(h2, h, "a MAP handle is never reissued");
            assert_eq!(t.lookup(h), Err(Error::Inval), "stale handle");
            assert_eq!(t.remove(h), Err(Error::Inval));
        }
    }
}

#[test]
fn invalid_handles_are_inval() {
    for ty in BOTH {
        let mut t = open(ty);
        assert_eq!(t.remove(0), Err(Error::Inval), "never inserted");
        assert_eq!(t.lookup(0), Err(Error::Inval));
        let h = insert1(&mut t, a(1));
        for bad in [
            h + 1,
            1 << 20,
            u64::from(u32::MAX),
            FI_ADDR_NOTAVAIL,
            1 << 40,
        ] {
            assert_eq!(t.remove(bad), Err(Error::Inval), "{ty:?} {bad:#x}");
            assert_eq!(t.lookup(bad), Err(Error::Inval));
            assert_eq!(t.reported_addr(bad), FI_ADDR_NOTAVAIL);
        }
        t.remove(h).unwrap();
        assert_eq!(t.remove(h), Err(Error::Inval), "double remove");
        assert_eq!(t.lookup(h), Err(Error::Inval));
        assert!(t.is_empty());
    }
}

#[test]
fn reserved_handles_until_filled() {
    for ty in BOTH {
        let mut t = open(ty);
        let hs = t.reserve(3);
        assert_eq!(hs.len(), 3);
        assert!(t.is_empty());
        assert_eq!(t.lookup(hs[0]), Err(Error::Inval));
        assert_eq!(t.remove(hs[0]), Err(Error::Inval));
        // Filling out of call order is how async resolution completes.
        t.fill(hs[2], a(2), None).unwrap();
        t.fill(hs[0], a(0), None).unwrap();
        assert_eq!(
            t.fill(hs[0], a(9), None),
            Err(Error::Inval),
            "already filled"
        );
        t.release(hs[1]);
        t.release(hs[0]); // not reserved: ignored
        assert_eq!(t.fill(hs[1], a(1), None), Err(Error::Inval), "released");
        assert_eq!(t.len(), 2);
        assert_eq!(t.lookup(hs[0]).unwrap(), &a(0)[..]);
        assert_eq!(t.find(&a(2)), Some(hs[2]));
        let again = t.reserve(1)[0];
        if ty == AvType::Table {
            assert_eq!(again, hs[1]);
        } else {
            assert_ne!(again, hs[1]);
        }
        let listed: Vec<_> = t.iter().map(|(h, b)| (h, b.to_vec())).collect();
        assert_eq!(listed, vec![(hs[0], a(0)), (hs[2], a(2))]);
    }
}

#[test]
fn churn_with_growing_addresses_relocates_and_compacts() {
    for ty in BOTH {
        let mut t = open(ty);
        let mut live = Vec::new();
        for round in 0..20usize {
            let addrs: Vec<Vec<u8>> = (0..500u32)
                .map(|n| vec![round as u8; 1 + (n as usize + round) % 40])
                .collect();
            let addrs: Vec<Vec<u8>> = addrs
                .into_iter()
                .zip(0u32..)
                .map(|(mut v, n)| {
                    v.extend_from_slice(&n.to_le_bytes());
                    v
                })
                .collect();
            let hs: Vec<_> = t
                .insert(&addrs, &ok)
                .into_iter()
                .map(Result::unwrap)
                .collect();
            for (h, addr) in hs.iter().zip(&addrs) {
                assert_eq!(t.lookup(*h).unwrap(), &addr[..]);
            }
            // Keep every third entry of this round, drop the rest.
            for (i, (h, addr)) in hs.into_iter().zip(addrs).enumerate() {
                if i % 3 == 0 {
                    live.push((h, addr));
                } else {
                    t.remove(h).unwrap();
                }
            }
            assert_eq!(t.len(), live.len());
            for (h, addr) in &live {
                assert_eq!(t.lookup(*h).unwrap(), &addr[..]);
                assert_eq!(t.find(addr), Some(*h));
            }
        }
    }
}

#[test]
fn lookup_truncation_reports_full_length() {
    let mut t = open(AvType::Table);
    let h = insert1(&mut t, (1..=16).collect());
    let mut small = [0u8; 4];
    assert_eq!(copy_truncated(t.lookup(h).unwrap(), &mut small), 16);
    assert_eq!(small, [1, 2, 3, 4]);
    let mut big = [0u8; 32];
    assert_eq!(copy_truncated(t.lookup(h).unwrap(), &mut big), 16);
    assert_eq!(
        &big[..17],
        &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 0]
    );
    assert_eq!(copy_truncated(b"abc", &mut []), 3);
}

#[test]
fn straddr_truncation() {
    let s = "fi_sockaddr_in://127.0.0.1:4000";
    let mut buf = [0xAAu8; 8];
    assert_eq!(straddr_into(s, &mut buf), s.len() + 1);
    assert_eq!(&buf, b"fi_sock\0");
    let mut buf = [0xAAu8; 64];
    assert_eq!(straddr_into(s, &mut buf), s.len() + 1);
    assert_eq!(&buf[..=s.len()], format!("{s}\0").as_bytes());
    assert_eq!(buf[s.len() + 1], 0xAA);
    assert_eq!(straddr_into(s, &mut []), s.len() + 1);
    let mut one = [0xAAu8; 1];
    assert_eq!(straddr_into("", &mut one), 1);
    assert_eq!(one, [0]);
}

#[test]
fn rx_addr_round_trip() {
    for bits in 0..=8u32 {
        for ty in BOTH {
            let mut t = AvTable::open(&AvAttr {
                rx_ctx_bits: bits,
                ..attr(ty)
            })
            .unwrap();
            let addrs: Vec<_> = (0..3).map(a).collect();
            let hs: Vec<_> = t
                .insert(&addrs, &ok)
                .into_iter()
                .map(Result::unwrap)
                .collect();
            for (h, addr) in hs.iter().zip(&addrs) {
                assert_eq!(h >> (63 - bits.min(63)) >> 1, 0, "top bits free");
                for rx in 0..(1u32 << bits).min(16) {
                    let x = rx_addr(*h, rx, bits);
                    assert_eq!(split_rx_addr(x, bits), (*h, rx));
                    assert_eq!(t.lookup(x).unwrap(), &addr[..], "rx bits ignored");
                }
                let top = (1u32 << bits) - 1;
                assert_eq!(split_rx_addr(rx_addr(*h, top, bits), bits), (*h, top));
            }
        }
    }
    assert_eq!(rx_addr(5, 3, 8), (3 << 56) | 5);
    assert_eq!(
        rx_addr(rx_addr(5, 3, 8), 1, 8),
        (1 << 56) | 5,
        "replaces, not ORs"
    );
    assert_eq!(
        rx_addr(5, 0x1FF, 8),
        (0xFF << 56) | 5,
        "index truncated to the bits"
    );
    assert_eq!(rx_addr(5, 7, 0), 5);
    assert_eq!(
        split_rx_addr(rx_addr(FI_ADDR_NOTAVAIL, 2, 4), 4),
        (FI_ADDR_NOTAVAIL, 2)
    );
    assert_eq!(split_rx_addr(rx_addr(9, u32::MAX, 32), 32), (9, u32::MAX));
}

#[test]
fn map_handles_leave_rx_bits_free_and_differ_from_notavail() {
    for bits in [0, 1, 8, 16, 24, 31, 32] {
        let mut t = AvTable::open(&AvAttr {
            rx_ctx_bits: bits,
            ..attr(AvType::Map)
        })
        .unwrap();
        for round in 0..300u32 {
            let h = insert1(&mut t, a(round));
            assert_ne!(h, FI_ADDR_NOTAVAIL);
            assert_eq!(split_rx_addr(h, bits), (h, 0), "bits={bits} h={h:#x}");
            t.remove(h).unwrap();
            assert_eq!(t.lookup(h), Err(Error::Inval));
        }
    }
}

#[test]
fn map_retires_slot_when_generations_run_out() {
    // 32 rx bits leave 8 generation bits: slot 0 is retired after 254 reuses
    // and never hands out an old handle again.
    let mut t = AvTable::open(&AvAttr {
        rx_ctx_bits: 32,
        ..attr(AvType::Map)
    })
    .unwrap();
    let mut seen = std::collections::HashSet::new();
    for n in 0..600 {
        let h = t.reserve(1)[0];
        assert!(seen.insert(h), "handle {h:#x} reissued at {n}");
        t.release(h);
    }
}

#[test]
fn find_returns_lowest_live_duplicate() {
    for ty in BOTH {
        let mut t = open(ty);
        let h0 = insert1(&mut t, a(1));
        let h1 = insert1(&mut t, a(2));
        let h2 = insert1(&mut t, a(1));
        let h3 = insert1(&mut t, a(1));
        assert_eq!(t.find(&a(1)), Some(h0.min(h2).min(h3)));
        assert_eq!(t.find(&a(2)), Some(h1));
        assert_eq!(t.find(&a(3)), None);
        t.remove(h0).unwrap();
        assert_eq!(t.find(&a(1)), Some(h2.min(h3)));
        t.remove(h2).unwrap();
        assert_eq!(t.find(&a(1)), Some(h3));
        t.remove(h3).unwrap();
        assert_eq!(t.find(&a(1)), None);
        assert_eq!(t.len(), 1);
    }
}

#[test]
fn user_id_notavail_until_set() {
    for ty in BOTH {
        let flags = AvFlags::AV_USER_ID;
        let mut t = AvTable::open(&AvAttr { flags, ..attr(ty) }).unwrap();
        let h = insert1(&mut t, a(1));
        assert_eq!(t.reported_addr(h), FI_ADDR_NOTAVAIL);
        assert_eq!(t.source_addr(&a(1)), FI_ADDR_NOTAVAIL);
        t.set_user_id(h, 42).unwrap();
        assert_eq!(t.reported_addr(h), 42);
        assert_eq!(t.reported_addr(rx_addr(h, 1, 0)), 42);
        assert_eq!(t.source_addr(&a(1)), 42);
        assert_eq!(t.set_user_id(h + 1, 1), Err(Error::Inval));
        // Per-insert ids are for AVs opened without AV_USER_ID.
        let hs = t.reserve(1);
        assert_eq!(t.fill(hs[0], a(2), Some(7)), Err(Error::Inval));
        t.fill(hs[0], a(2), None).unwrap();
        assert_eq!(
            t.insert_with_user_ids(&[a(3)], &[3], &ok),
            vec![Err(Error::Inval)]
        );
        t.remove(h).unwrap();
        assert_eq!(t.set_user_id(h, 1), Err(Error::Inval));
        assert_eq!(t.reported_addr(h), FI_ADDR_NOTAVAIL);
    }
}

#[test]
fn per_insert_user_ids_and_default_reporting() {
    for ty in BOTH {
        let mut t = open(ty);
        let h = insert1(&mut t, a(1));
        assert_eq!(t.reported_addr(h), h);
        assert_eq!(t.source_addr(&a(1)), h);
        assert_eq!(t.source_addr(&a(9)), FI_ADDR_NOTAVAIL);
        assert_eq!(
            t.set_user_id(h, 5),
            Err(Error::Inval),
            "not opened with AV_USER_ID"
        );
        let res = t.insert_with_user_ids(&[a(2), vec![0xFF], a(3)], &[100, 101], &no_ff);
        assert_eq!(res[1], Err(Error::Inval));
        assert_eq!(res[2], Err(Error::Inval), "no id for it");
        let h2 = *res[0].as_ref().unwrap();
        assert_eq!(t.reported_addr(h2), 100);
        assert_eq!(t.source_addr(&a(2)), 100);
        let hs = t.reserve(1);
        t.fill(hs[0], a(4), Some(200)).unwrap();
        assert_eq!(t.reported_addr(hs[0]), 200);
        assert_eq!(t.len(), 3);
    }
}

#[test]
fn debug_is_a_summary() {
    let mut t = open(AvType::Map);
    insert1(&mut t, a(1));
    let s = format!("{t:?}");
    assert!(s.contains("len: 1") && s.contains("Map"), "{s}");
}

/// Inserts, finds and looks up a million addresses: correctness at scale.
/// Speed is measured by `cargo bench -p weft-core --bench av`, never here.
fn million(ty: AvType) {
    const N: u32 = 1_000_000;
    let mut t = open(ty);
    let addrs: Vec<Vec<u8>> = (0..N).map(a).collect();
    let res = t.insert(&addrs, &ok);
    assert_eq!(t.len(), N as usize);
    for (i, (r, addr)) in res.iter().zip(&addrs).enumerate() {
        let h = *r.as_ref().unwrap();
        if ty == AvType::Table {
            assert_eq!(h, i as u64);
        }
        assert_eq!(t.find(addr), Some(h));
        assert_eq!(t.lookup(h).unwrap(), &addr[..]);
    }
    assert_eq!(t.find(&a(N)), None);
}

#[test]
fn million_addresses_table() {
    million(AvType::Table);
}

#[test]
fn million_addresses_map() {
    million(AvType::Map);
}

#[test]
fn version_watch_follows_every_change_without_the_lock() {
    let mut t = open(AvType::Table);
    let w = t
        .version_watch()
        .expect("a private table publishes its version");
    assert_eq!(w.get(), t.version());
    let h = t.insert(&[vec![1]], &ok)[0].unwrap();
    assert_eq!(w.get(), t.version());
    let v = w.get();
    t.remove(h).unwrap();
    assert_ne!(w.get(), v, "a removal moves the watched version");
    assert_eq!(w.get(), t.version());
    // A clone counts on its own: its changes leave the original's watch.
    let mut c = t.clone();
    let before = w.get();
    c.insert(&[vec![2]], &ok);
    assert_eq!(w.get(), before);
    assert_ne!(c.version(), before);
}
