//! Randomized comparison against a naive reference that scans everything
//! linearly, so ordering bugs in the indexes show up as diverging results.

use super::super::*;

const RAWS: u32 = 6;

fn handle_of(raw: u32) -> FiAddr {
    100 + u64::from(raw)
}

/// The reference's own phrasing of the matching rule, written differently
/// from the matcher's so that a shared mistake is less likely.
fn accepts(spec: &RecvSpec, info: &MsgInfo) -> bool {
    let keep = !spec.ignore;
    spec.tagged == info.tagged
        && (!spec.tagged || spec.tag & keep == info.tag & keep)
        && (spec.src == FI_ADDR_UNSPEC || spec.src == info.src)
}

struct RefMsg {
    raw: u32,
    info: MsgInfo,
    payload: u64,
    claimed: Option<u64>,
}

#[derive(Default)]
struct Reference {
    posted: Vec<(RecvSpec, u64)>,
    unexp: Vec<RefMsg>,
}

impl Reference {
    fn arrival(&mut self, info: &MsgInfo) -> Option<(RecvSpec, u64)> {
        let i = self.posted.iter().position(|(s, _)| accepts(s, info))?;
        Some(self.posted.remove(i))
    }

    fn find(&self, spec: &RecvSpec, av: &[Option<FiAddr>]) -> Option<(usize, MsgInfo)> {
        self.unexp.iter().enumerate().find_map(|(i, m)| {
            if m.claimed.is_some() {
                return None;
            }
            let mut info = m.info;
            if info.src == FI_ADDR_NOTAVAIL {
                info.src = av[m.raw as usize].unwrap_or(FI_ADDR_NOTAVAIL);
            }
            accepts(spec, &info).then_some((i, info))
        })
    }

    fn post(&mut self, spec: RecvSpec, r: u64, av: &[Option<FiAddr>]) -> Option<(MsgInfo, u64)> {
        match self.find(&spec, av) {
            Some((i, info)) => Some((info, self.unexp.remove(i).payload)),
            None => {
                self.posted.push((spec, r));
                None
            }
        }
    }

    fn peek(&mut self, spec: &RecvSpec, flags: OpFlags, av: &[Option<FiAddr>]) -> Result<MsgInfo> {
        let claim = flags.contains(OpFlags::CLAIM);
        let discard = flags.contains(OpFlags::DISCARD);
        if !flags.contains(OpFlags::PEEK) || (claim && discard) {
            return Err(Error::Inval);
        }
        let (i, info) = self.find(spec, av).ok_or(Error::NoMsg)?;
        if discard {
            self.unexp.remove(i);
        } else if claim {
            self.unexp[i].claimed = Some(spec.context);
            self.unexp[i].info = info;
        }
        Ok(info)
    }

    fn claim(&mut self, context: u64, discard: bool) -> Result<(MsgInfo, Option<u64>)> {
        let i = self
            .unexp
            .iter()
            .position(|m| m.claimed == Some(context))
            .ok_or(Error::NoMsg)?;
        let m = self.unexp.remove(i);
        Ok((m.info, (!discard).then_some(m.payload)))
    }

    fn cancel(&mut self, context: u64) -> Option<(RecvSpec, u64)> {
        let i = self.posted.iter().position(|(s, _)| s.context == context)?;
        Some(self.posted.remove(i))
    }

    fn bytes(&self) -> usize {
        self.unexp.iter().map(|m| m.info.len).sum()
    }
}

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn random_spec(rng: &mut XorShift, context: u64) -> RecvSpec {
    const IGNORES: [u64; 8] = [0, 0, 0, 0, 1, 3, 0xF0, u64::MAX];
    let src = if rng.below(5) < 3 {
        FI_ADDR_UNSPEC
    } else {
        handle_of(rng.below(u64::from(RAWS)) as u32)
    };
    RecvSpec {
        by_key: false,
        src,
        tagged: rng.below(4) != 0,
        tag: rng.below(6),
        ignore: IGNORES[rng.below(IGNORES.len() as u64) as usize],
        context,
    }
}

#[derive(Default)]
struct Seen {
    arrival_matched: usize,
    post_matched: usize,
    peek_ok: usize,
    claim_ok: usize,
    cancel_ok: usize,
    /// Times the posted receives outgrew the scanned list, and times
    /// they came back to it (emptied from the indexes).
    to_indexes: usize,
    to_list: usize,
}

#[test]
fn randomized_against_reference() {
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let mut m: Matcher<u64, u64, u32> = Matcher::new();
    let mut r = Reference::default();
    let mut av: [Option<FiAddr>; RAWS as usize] = [None; RAWS as usize];
    let mut next_id = 0u64;
    let mut claim_contexts: Vec<u64> = Vec::new();
    let mut seen = Seen::default();
    let mut was_indexed = false;

    for step in 0..20_000u32 {
        next_id += 1;
        // Contexts sometimes repeat, to exercise "first with that context".
        let context = if rng.below(10) == 0 {
            rng.below(8)
        } else {
            next_id
        };
        let snapshot = av;
        let resolve = |raw: &u32| snapshot[*raw as usize].unwrap_or(FI_ADDR_NOTAVAIL);
        match rng.below(100) {
            0..=34 => {
                let raw = rng.below(u64::from(RAWS)) as u32;
                let info = MsgInfo {
                    key: None,
                    src: av[raw as usize].unwrap_or(FI_ADDR_NOTAVAIL),
                    tagged: rng.below(4) != 0,
                    tag: rng.below(6),
                    len: rng.below(100) as usize,
                    data: (rng.below(2) == 0).then_some(next_id),
                };
                let got = m.match_arrival(&info);
                assert_eq!(got, r.arrival(&info), "step {step}: arrival {info:?}");
                if got.is_some() {
                    seen.arrival_matched += 1;
                } else {
                    m.push_unexpected(raw, info, next_id);
                    r.unexp.push(RefMsg {
                        raw,
                        info,
                        payload: next_id,
                        claimed: None,
                    });
                }
            }
            35..=69 => {
                let spec = random_spec(&mut rng, context);
                let want = r.post(spec, next_id, &av);
                match m.post(spec, next_id, &resolve) {
                    PostOutcome::Queued => assert_eq!(want, None, "step {step}: post {spec:?}"),
                    PostOutcome::Matched {
                        recv,
                        spec: s,
                        info,
                        payload,
                    } => {
                        assert_eq!((recv, s), (next_id, spec), "step {step}");
                        assert_eq!(Some((info, payload)), want, "step {step}: post {spec:?}");
                        seen.post_matched += 1;
                    }
                }
            }
            70..=81 => {
                const FLAGS: [u64; 6] = [1, 1, 2, 3, 4, 5];
                let flags = match FLAGS[rng.below(6) as usize] {
                    1 => OpFlags::PEEK,
                    2 => OpFlags::PEEK | OpFlags::CLAIM,
                    3 => OpFlags::PEEK | OpFlags::DISCARD,
                    4 => OpFlags::PEEK | OpFlags::CLAIM | OpFlags::DISCARD,
                    _ => OpFlags::CLAIM,
                };
                let spec = random_spec(&mut rng, context);
                let got = m.peek(&spec, flags, &resolve);
                assert_eq!(
                    got,
                    r.peek(&spec, flags, &av),
                    "step {step}: peek {flags:?}"
                );
                if got.is_ok() {
                    seen.peek_ok += 1;
                    if flags.contains(OpFlags::CLAIM) {
                        claim_contexts.push(context);
                    }
                }
            }
            82..=87 => {
                let context = if claim_contexts.is_empty() || rng.below(4) == 0 {
                    rng.below(next_id + 1)
                } else {
                    claim_contexts.swap_remove(rng.below(claim_contexts.len() as u64) as usize)
                };
                let discard = rng.below(2) == 0;
                let got = m.claim(context, discard);
                assert_eq!(
                    got,
                    r.claim(context, discard),
                    "step {step}: claim {context}"
                );
                seen.claim_ok += usize::from(got.is_ok());
            }
            88..=94 => {
                let context = if rng.below(2) == 0 {
                    rng.below(8)
                } else {
                    rng.below(next_id + 1)
                };
                let got = m.cancel(context);
                assert_eq!(got, r.cancel(context), "step {step}: cancel {context}");
                seen.cancel_ok += usize::from(got.is_some());
            }
            95..=98 => {
                // The AV changes; removals show that nothing caches a
                // resolved source for unclaimed messages.
                let raw = rng.below(u64::from(RAWS)) as usize;
                av[raw] = if rng.below(4) == 0 {
                    None
                } else {
                    Some(handle_of(raw as u32))
                };
            }
            _ => {
                if rng.below(10) == 0 {
                    assert_eq!(
                        m.drain_posted(),
                        std::mem::take(&mut r.posted),
                        "step {step}"
                    );
                }
            }
        }
        assert_eq!(m.posted_len(), r.posted.len(), "step {step}");
        if m.posted_len() > posted::LIST_MAX && !was_indexed {
            was_indexed = true;
            seen.to_indexes += 1;
        } else if m.posted_len() == 0 && was_indexed {
            was_indexed = false;
            seen.to_list += 1;
        }
        assert_eq!(m.unexpected_len(), r.unexp.len(), "step {step}");
        assert_eq!(m.unexpected_bytes(), r.bytes(), "step {step}");
    }

    // The run must have exercised every path, not just agreed on "nothing".
    assert!(
        seen.arrival_matched > 500,
        "arrival matches {}",
        seen.arrival_matched
    );
    assert!(
        seen.post_matched > 500,
        "post matches {}",
        seen.post_matched
    );
    assert!(seen.peek_ok > 100, "peeks {}", seen.peek_ok);
    assert!(seen.claim_ok > 20, "claims {}", seen.claim_ok);
    assert!(seen.cancel_ok > 20, "cancels {}", seen.cancel_ok);
    // Both forms of the posted queue, and the moves between them.
    assert!(seen.to_indexes > 5, "to the indexes {}", seen.to_indexes);
    assert!(seen.to_list > 5, "back to the list {}", seen.to_list);
}
