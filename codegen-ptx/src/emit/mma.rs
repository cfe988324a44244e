//! The tensor-core kernels' body: warps, their 16x8 tiles of C, fragment loads, `mma.sync`
//! and the epilogue.

use super::*;

/// A warp's place in a tensor-core kernel and its tiles of C.
pub(super) struct MmaWarp {
    lane: String,
    gid: String,
    tig: String,
    tiles: Vec<MmaTile>,
    /// Column tiles per group: consecutive tiles of one row tile that share A's fragments.
    group: usize,
    /// Row tiles each warp keeps for all its tiles (`GpuSchedule::row_tiles_per_warp`: A's
    /// fragments loaded once); 0 where the warps take tiles in turn. A group's tiles then
    /// come column by column, each column's `rows` row tiles together (sharing B's
    /// fragments).
    rows: usize,
    /// Where the slots' addresses point: "global", or "shared" with C staged flat.
    space: &'static str,
    /// Per lane, whether slot e of each tile holds accumulator e ^ 1 (first) and e ^ 2
    /// (second) instead of e: see [`epilogue_swap_table`]. None: not swapped.
    swaps: [Option<String>; 2],
    /// `GpuSchedule::column_sweep`: each group is every row tile of one column tile, row
    /// tile i its i-th tile; A's fragments of every row tile are loaded once.
    sweep: bool,
    /// Where the tiles' slots come in `mma_body`, before each epilogue (column sweep and
    /// `stream_a`, without the C prefetch): what they need.
    gen: Option<SlotGen>,
    /// C's padded copy in shared memory moved a tile at a time by `ldmatrix` and
    /// `stmatrix` (`CPad::matrix`; the tiles then have no slots): the copy's address and
    /// this lane's byte offset of the row it gives them (lane l: column l % 8, rows 8
    /// (l / 8 % 2) on, of the tile), and the copy's column stride in elements.
    matrix: Option<(String, String, usize)>,
}

/// The lane-dependent order in which a warp's lanes visit the four accumulators of a tile
/// in the epilogue through shared memory, as a table over the lane's column pair `tig`:
/// lane (gid, tig) takes accumulator `e ^ table[tig]` at its e-th access. Where C's copy
/// has columns `ld` halves apart with `ld` odd, the lanes' elements of one accumulator fall
/// into few banks (4 distinct words a bank where `ld` is 1 or 31 mod 32: 33, 97), so
/// lanes of different `tig` take different accumulators at once. The table is the one
/// with the fewest bank conflicts over the copy's possible alignments (then the fewest
/// swaps); all zeros (the plain order) unless another is strictly better.
pub(super) fn epilogue_swap_table(ld: usize) -> [usize; 4] {
    let cost = |table: [usize; 4]| -> usize { epilogue_degrees(ld, table).sum() };
    let swaps = |t: [usize; 4]| t.iter().fold(0, |bits, h| bits | h).count_ones();
    let mut best = [0; 4];
    let mut best_cost = cost(best);
    for code in 1..256usize {
        let table = std::array::from_fn(|t| (code >> (2 * t)) & 3);
        let c = cost(table);
        if c < best_cost || (c == best_cost && best != [0; 4] && swaps(table) < swaps(best)) {
            best = table;
            best_cost = c;
        }
    }
    best
}

/// The bank conflict degree of each of a warp's four epilogue accesses to C's copy
/// (columns `ld` halves apart) under `table` (see [`epilogue_swap_table`]), for each of the
/// copy's eight alignments (halves past a 16-byte boundary).
pub(super) fn epilogue_degrees(ld: usize, table: [usize; 4]) -> impl Iterator<Item = usize> {
    (0..8)
        .flat_map(|base| (0..4).map(move |e| (base, e)))
        .map(move |(base, e)| {
            bank_degree(32, 2, |lane| {
                let (gid, tig) = (lane / 4, lane % 4);
                let x = e ^ table[tig];
                2 * (base + ld * (2 * tig + (x & 1)) + gid + 8 * (x >> 1))
            })
        })
}

/// Tiles a warp computes together, at most the row's tiles: where the warps do not keep one
/// row of tiles each, `GpuSchedule::mma_group` consecutive column tiles of one row tile
/// that share each k step's A fragment; where they do, `GpuSchedule::row_group` of the
/// warp's own column tiles, their accumulator chains interleaved.
pub(super) fn mma_group(s: &GpuSchedule, p: &ColMajorProblem) -> usize {
    let shape = s.mma.unwrap_or(smallgemm_ir::MmaShape::M16N8K16);
    let nt = p.n.div_ceil(shape.n as usize);
    // Warps that keep their row tiles group their column tiles by `row_group`.
    let group = if s.row_tiles_per_warp(p).is_some() {
        s.row_group
    } else {
        s.mma_group
    };
    (group as usize).clamp(1, nt.max(1))
}

/// One 16x8 tile of C a warp computes: its row and column tile, whether it exists (the
/// last round of tiles may be short), and per accumulator c0..c3 the address in C, the
/// guard and (when prefetched) the old value.
struct MmaTile {
    tmr: String,
    tnr: String,
    /// The largest column tile `tnr` can be (in any warp).
    tn_max: usize,
    valid: Option<String>,
    /// Grouped tiles: whether this one lies past the last column tile (None: never).
    hangs: Option<String>,
    /// Per accumulator slot: its address, its guard, and C's old value where prefetched
    /// (empty where `MmaWarp::gen` makes them later).
    slots: Vec<Slot>,
}

/// A byte offset from a slot's base: an immediate, or (swapped slots,
/// [`epilogue_swap_table`]) a lane-dependent register.
#[derive(Clone)]
enum Offset {
    Imm(usize),
    Reg(String),
}

impl Offset {
    /// `self + other`: an immediate where both are, else a register (emitted here).
    fn add(&self, asm: &mut Asm, other: &Offset) -> Offset {
        let (x, y) = match (self, other) {
            (Offset::Imm(x), Offset::Imm(y)) => return Offset::Imm(x + y),
            (Offset::Reg(x), Offset::Imm(y)) | (Offset::Imm(y), Offset::Reg(x)) => {
                (x.clone(), y.to_string())
            }
            (Offset::Reg(x), Offset::Reg(y)) => (x.clone(), y.clone()),
        };
        let r = asm.reg(Kind::B32);
        asm.op(format!("add.u32 {r}, {x}, {y}"));
        Offset::Reg(r)
    }
}

/// A slot's address: a base register plus an offset; a register offset is added only at
/// the access, so that the tiles' addresses do not all hold registers through the k loop.
struct SlotAddr {
    base: String,
    offset: Offset,
}

impl SlotAddr {
    /// The address as an operand (emits the add of a register offset).
    fn operand(&self, asm: &mut Asm) -> String {
        match &self.offset {
            Offset::Imm(d) => format!("{}+{d}", self.base),
            Offset::Reg(r) => {
                let a = asm.reg(Kind::B32);
                asm.op(format!("add.u32 {a}, {}, {r}", self.base));
                a
            }
        }
    }
}

/// The tiles of C of this thread's warp, with their addresses in C; with `prefetch`, the
/// old values of C (beta != 0) are loaded here, all before any is stored. When the warp
/// count is a multiple of the row tiles, a warp keeps one row of tiles (its A fragments are
/// loaded once). With `sc` (C staged in shared memory: this problem's copy starts at the
/// register, columns the given number of elements apart) the slots address that copy
/// instead of global C.
#[allow(clippy::too_many_arguments)]
pub(super) fn mma_warp(
    asm: &mut Asm,
    p: &ColMajorProblem,
    s: &GpuSchedule,
    lt: &str,
    problem: &ProblemRegs,
    epi: &Epilogue,
    prefetch: bool,
    sc: Option<(&str, usize)>,
    matrix: bool,
) -> MmaWarp {
    let shape = s.mma.unwrap_or(smallgemm_ir::MmaShape::M16N8K16);
    let w = s.warps as usize;
    let mt = p.m.div_ceil(shape.m as usize);
    let nt = p.n.div_ceil(shape.n as usize);
    let rows = s.row_tiles_per_warp(p);
    let warp = asm.reg(Kind::B32);
    asm.op(format!("shr.u32 {warp}, {lt}, 5"));
    let lane = asm.reg(Kind::B32);
    asm.op(format!("and.b32 {lane}, {lt}, 31"));
    let gid = asm.reg(Kind::B32);
    asm.op(format!("shr.u32 {gid}, {lane}, 2"));
    let tig = asm.reg(Kind::B32);
    asm.op(format!("and.b32 {tig}, {lane}, 3"));
    // Warps that keep their row tiles: this warp's first row tile, how many it keeps, and
    // how many warps share them (the stride of its column tiles; `mp` sets of row tiles).
    let fixed_row = rows.map(|rows| {
        let mp = mt.div_ceil(rows);
        let tmr = asm.reg(Kind::B32);
        asm.op(format!("rem.u32 {tmr}, {warp}, {mp}"));
        if rows > 1 {
            asm.op(format!("mul.lo.u32 {tmr}, {tmr}, {rows}"));
        }
        (tmr, rows, w / mp)
    });
    // This warp's row tiles, and (row tiles odd) whether the second of its pair exists.
    let warp_rows: Vec<String> = match &fixed_row {
        Some((tmr, rows, _)) => (0..*rows)
            .map(|r| {
                if r == 0 {
                    return tmr.clone();
                }
                let t = asm.reg(Kind::B32);
                asm.op(format!("add.u32 {t}, {tmr}, {r}"));
                t
            })
            .collect(),
        None => Vec::new(),
    };
    let second_inside = (warp_rows.len() > 1 && mt % warp_rows.len() != 0)
        .then(|| asm.lt(&warp_rows[1], &mt.to_string()));
    let ldc = match sc {
        Some((_, ld)) => ld,
        None => problem.ldc.max,
    };
    // Swapped accumulators (`GpuSchedule::epilogue_swaps`, C in shared memory): this
    // lane's slot e is accumulator e ^ h, h = table[tig]: row and column of slot 0 move by
    // 8 h1 and h0, slots 1..3 lie (1 - 2 h0) columns and (1 - 2 h1) * 8 rows from it
    // (`steps`, bytes).
    let table = match sc {
        Some(_) if s.epilogue_swaps_apply() => epilogue_swap_table(ldc),
        _ => [0; 4],
    };
    let mut swaps: [Option<String>; 2] = Default::default();
    let mut shifts: [Option<String>; 2] = Default::default();
    let mut steps = [Offset::Imm(0), Offset::Imm(2 * ldc), Offset::Imm(16)];
    if table != [0; 4] {
        let code: usize = table.iter().enumerate().map(|(t, h)| h << (2 * t)).sum();
        let h = asm.reg(Kind::B32);
        asm.op(format!("shl.b32 {h}, {tig}, 1"));
        asm.op(format!("shr.u32 {h}, {code}, {h}"));
        let used = table.iter().fold(0, |bits, h| bits | h);
        for (bit, (swap, shift)) in swaps.iter_mut().zip(&mut shifts).enumerate() {
            if used & (1 << bit) == 0 {
                continue;
            }
            // The bit, as a predicate and as the shift of slot 0 (1 column, 8 rows).
            let b = asm.reg(Kind::B32);
            asm.op(format!("bfe.u32 {b}, {h}, {bit}, 1"));
            let pr = asm.reg(Kind::Pred);
            asm.op(format!("setp.ne.u32 {pr}, {b}, 0"));
            let unit = [1, 8][bit];
            let sh = asm.reg(Kind::B32);
            asm.op(format!("mul.lo.u32 {sh}, {b}, {unit}"));
            // Bytes from slot 0 to the slot one step along this bit: +-(2 ldc) or +-16.
            let bytes = [2 * ldc, 16][bit];
            let st = asm.reg(Kind::B32);
            asm.op(format!("mul.lo.u32 {st}, {b}, {}", 2 * bytes));
            asm.op(format!("sub.u32 {st}, {bytes}, {st}"));
            steps[1 + bit] = Offset::Reg(st);
            *swap = Some(pr);
            *shift = Some(sh);
        }
    }
    // Slot 3: one step along each bit.
    let both = steps[1].add(asm, &steps[2]);
    let steps = [steps[0].clone(), steps[1].clone(), steps[2].clone(), both];
    let sweep = s.column_sweep_apply();
    let group = if sweep { mt } else { mma_group(s, p) };
    // Groups of `group` tiles of one row tile (consecutive column tiles) in turn: a
    // group's tiles share their A fragments (`mma_body`). Column sweep: every row tile of
    // column tiles warp, warp + w, ... (a group each, sharing its B fragments).
    let groups = mt * nt.div_ceil(group);
    let rounds = match (&fixed_row, sweep) {
        (_, true) => nt.div_ceil(w),
        (Some((_, _, step)), false) => nt.div_ceil(*step),
        (None, false) => groups.div_ceil(w),
    };
    let row_tiles: Vec<String> = if sweep {
        (0..mt).map(|i| asm.imm32(i as u64)).collect()
    } else {
        Vec::new()
    };
    let gen = SlotGen {
        gid: gid.clone(),
        tig: tig.clone(),
        shifts,
        steps,
        swaps: swaps.clone(),
        ldc,
        sc: sc.map(|(r, _)| r.to_string()),
        c: problem.c.clone(),
    };
    // Slots made just before each tile's epilogue, not held through the mma: column
    // sweep, and A's fragments loaded at each step (`stream_a`, for fewer registers); the
    // C prefetch needs them first.
    let deferred = (sweep || (s.stream_a_apply() && fixed_row.is_some())) && !prefetch;
    let matrix = sc.filter(|_| matrix).map(|(base, ldc)| {
        let (l7, l8, off) = (asm.reg(Kind::B32), asm.reg(Kind::B32), asm.reg(Kind::B32));
        asm.op(format!("and.b32 {l7}, {lane}, 7"));
        asm.op(format!("and.b32 {l8}, {lane}, 8"));
        asm.op(format!("mad.lo.u32 {off}, {l7}, {ldc}, {l8}"));
        asm.op(format!("shl.b32 {off}, {off}, 1"));
        (base.to_string(), off, ldc)
    });
    let mut out = Vec::new();
    for q in 0..rounds {
        let mut coords = Vec::new();
        match &fixed_row {
            _ if sweep => {
                let tnr = asm.reg(Kind::B32);
                asm.op(format!("add.u32 {tnr}, {warp}, {}", q * w));
                let valid = ((q + 1) * w > nt).then(|| asm.lt(&tnr, &nt.to_string()));
                for tmr in &row_tiles {
                    coords.push((
                        tmr.clone(),
                        tnr.clone(),
                        (q + 1) * w - 1,
                        valid.clone(),
                        None,
                    ));
                }
            }
            Some((_, rows, step)) => {
                // Row tiles from rows * (warp % mp), column tiles warp / mp + q * step.
                let step = *step;
                let tnr = asm.reg(Kind::B32);
                asm.op(format!("div.u32 {tnr}, {warp}, {}", mt.div_ceil(*rows)));
                if q > 0 {
                    asm.op(format!("add.u32 {tnr}, {tnr}, {}", q * step));
                }
                let valid = ((q + 1) * step > nt).then(|| asm.lt(&tnr, &nt.to_string()));
                // In groups (`row_group`), a tile past the last column tile after the
                // group's first is computed (on clamped B) and never stored.
                let hangs = if group > 1 { valid.clone() } else { None };
                for (r, tm) in warp_rows.iter().enumerate() {
                    // The last pair's second row tile where the row tiles are odd lies past
                    // m (past C's padded copy too): computed, never stored.
                    let hangs = match &second_inside {
                        Some(inside) if r > 0 => asm.and(hangs.clone(), Some(inside.clone())),
                        _ => hangs.clone(),
                    };
                    let at = (q + 1) * step - 1;
                    coords.push((tm.clone(), tnr.clone(), at, valid.clone(), hangs));
                }
            }
            None => {
                let t = asm.reg(Kind::B32);
                asm.op(format!("add.u32 {t}, {warp}, {}", q * w));
                let valid = ((q + 1) * w > groups).then(|| asm.lt(&t, &groups.to_string()));
                let tmr = asm.reg(Kind::B32);
                let tn0 = asm.reg(Kind::B32);
                asm.op(format!("rem.u32 {tmr}, {t}, {mt}"));
                asm.op(format!("div.u32 {tn0}, {t}, {mt}"));
                let tn0_max = ((q + 1) * w - 1) / mt;
                if group == 1 {
                    coords.push((tmr, tn0, tn0_max, valid, None));
                } else {
                    asm.op(format!("mul.lo.u32 {tn0}, {tn0}, {group}"));
                    for j in 0..group {
                        let tnr = asm.reg(Kind::B32);
                        asm.op(format!("add.u32 {tnr}, {tn0}, {j}"));
                        // The last group of a row may hang over the last column tile.
                        let inside =
                            (j > 0 && nt % group != 0).then(|| asm.lt(&tnr, &nt.to_string()));
                        let hangs = asm.and(valid.clone(), inside.clone());
                        let guard = inside.and(hangs.clone());
                        coords.push((tmr.clone(), tnr, tn0_max * group + j, hangs, guard));
                    }
                }
            }
        }
        for (tmr, tnr, tn_max, valid, hangs) in coords {
            // Column sweep: the slots of each tile come in `mma_body`, just before its
            // epilogue (fewer registers and predicates live through the mma).
            let slots = if deferred || matrix.is_some() {
                Vec::new()
            } else {
                gen.slots(asm, p, epi, &tmr, &tnr, &valid, &hangs, prefetch, None)
            };
            out.push(MmaTile {
                tmr,
                tnr,
                tn_max,
                valid,
                hangs,
                slots,
            });
        }
    }
    MmaWarp {
        lane,
        gid,
        tig,
        tiles: out,
        group,
        rows: rows.unwrap_or(0),
        space: if sc.is_some() { "shared" } else { "global" },
        swaps,
        sweep,
        gen: (deferred && matrix.is_none()).then_some(gen),
        matrix,
    }
}

/// What the slots of a tile of C need: the lane's place, the epilogue swaps
/// ([`epilogue_swap_table`]: the shifts of slot 0, the steps to slots 1..3), and where C
/// (or its copy in shared memory, columns `ldc` apart) is.
struct SlotGen {
    gid: String,
    tig: String,
    shifts: [Option<String>; 2],
    steps: [Offset; 4],
    swaps: [Option<String>; 2],
    ldc: usize,
    sc: Option<String>,
    c: String,
}

impl SlotGen {
    /// A tile's four slots: address, guard and (`prefetch`) C's old value. `fixed`: the
    /// row tile and (where known) the column tile, known here (column sweep): the guards
    /// then only where the tile reaches past m or n, and a slot whose rows lie past m for
    /// every lane is dead (None).
    #[allow(clippy::too_many_arguments)]
    fn slots(
        &self,
        asm: &mut Asm,
        p: &ColMajorProblem,
        epi: &Epilogue,
        tmr: &str,
        tnr: &str,
        valid: &Option<String>,
        hangs: &Option<String>,
        prefetch: bool,
        fixed: Option<(usize, Option<usize>)>,
    ) -> Vec<Slot> {
        let (gid, tig, ldc) = (&self.gid, &self.tig, self.ldc);
        // c0, c1 at (row, col), (row, col + 1); c2, c3 eight rows down (slot 0 swapped
        // to accumulator h: `shifts`).
        let row = asm.reg(Kind::B32);
        asm.op(format!("mad.lo.u32 {row}, {tmr}, 16, {gid}"));
        let col = asm.reg(Kind::B32);
        asm.op(format!("shl.b32 {col}, {tig}, 1"));
        asm.op(format!("mad.lo.u32 {col}, {tnr}, 8, {col}"));
        if let Some(sh) = &self.shifts[0] {
            asm.op(format!("add.u32 {col}, {col}, {sh}"));
        }
        if let Some(sh) = &self.shifts[1] {
            asm.op(format!("add.u32 {row}, {row}, {sh}"));
        }
        let off = asm.reg(Kind::B32);
        asm.op(format!("mad.lo.u32 {off}, {col}, {ldc}, {row}"));
        let cbase = match &self.sc {
            Some(sc) => {
                let r = asm.reg(Kind::B32);
                asm.op(format!("mad.lo.u32 {r}, {off}, 2, {sc}"));
                r
            }
            None => {
                let off64 = asm.reg(Kind::B64);
                asm.op(format!("mul.wide.u32 {off64}, {off}, 2"));
                let cbase = asm.reg(Kind::B64);
                asm.op(format!("add.u64 {cbase}, {}, {off64}", self.c));
                cbase
            }
        };
        let (rows_needed, cols_needed) = match fixed {
            None => (p.m % 16 != 0, p.n % 8 != 0),
            Some((tm, tn)) => (
                16 * tm + 16 > p.m,
                tn.map_or(p.n % 8 != 0, |tn| 8 * tn + 8 > p.n),
            ),
        };
        let rp = swapped_below(asm, &row, 8, &self.swaps[1], p.m, rows_needed);
        let cp = swapped_below(asm, &col, 1, &self.swaps[0], p.n, cols_needed);
        let mut slots = Vec::new();
        // A grouped tile past the last column tile: computed (on clamped B), never stored.
        for i in 0..4 {
            // Rows 8 (i / 2) on, in every lane where rows are not swapped.
            let dead = fixed
                .is_some_and(|(tm, _)| self.swaps[1].is_none() && 16 * tm + 8 * (i / 2) >= p.m);
            if dead {
                slots.push(None);
                continue;
            }
            let pred = asm.and(rp[i / 2].clone(), cp[i % 2].clone());
            let pred = asm.and(pred, hangs.clone());
            let addr = SlotAddr {
                base: cbase.clone(),
                offset: self.steps[i].clone(),
            };
            let old = (prefetch && epi.beta != Scalar::Zero).then(|| {
                // A tile past the last one must not read: its address may lie outside C.
                let lp = asm.and(pred.clone(), valid.clone());
                let addr = addr.operand(asm);
                epi.load(asm, &addr, &lp, "global")
            });
            slots.push(Some((addr, pred, old)));
        }
        slots
    }
}

/// A slot of a tile of C: its address, its guard and C's old value where prefetched; None
/// where no lane stores it.
type Slot = Option<(SlotAddr, Option<String>, Option<String>)>;

/// `base + d < limit` and `base + delta < limit` with d = 0 (as predicates; None where
/// not `needed`), in the other order where `swapped` holds: `base` is then already
/// `delta` further on, and the other lies `delta` back.
fn swapped_below(
    asm: &mut Asm,
    base: &str,
    delta: u32,
    swapped: &Option<String>,
    limit: usize,
    needed: bool,
) -> [Option<String>; 2] {
    let Some(sw) = swapped else {
        return asm.offsets_below(base, [0, delta], limit, needed);
    };
    if !needed {
        return [None, None];
    }
    let other = asm.reg(Kind::B32);
    let back = asm.reg(Kind::B32);
    asm.op(format!("sub.u32 {back}, {base}, {delta}"));
    asm.op(format!("add.u32 {other}, {base}, {delta}"));
    asm.op(format!("selp.b32 {other}, {back}, {other}, {sw}"));
    [
        Some(asm.lt(base, &limit.to_string())),
        Some(asm.lt(&other, &limit.to_string())),
    ]
}

/// Whether a tensor-core kernel runs its last k step as `mma.m16n8k8`: where that step
/// holds at most 8 of k, with fragments read from verbatim copies (`verbatim`: their
/// loads of the padding are predicated off anyway) always, else unless the schedule asks
/// for the full step (`full_last_k_step`). The k padding past k rounded up to 8 is then
/// never read.
pub(super) fn narrow_last_k_step(s: &GpuSchedule, p: &ColMajorProblem, verbatim: bool) -> bool {
    (1..=8).contains(&(p.k % 16)) && (verbatim || !s.full_last_k_step_apply())
}

/// Tensor-core kernels: `warps` warps per problem; warp w takes 16x8 tiles of C in turn
/// (`MmaWarp`) and runs `mma.sync.m16n8k16` over the k padded to 16, `m16n8k8` in the last
/// step where it holds at most 8 of k (the padding is zeros
/// in shared memory; in the verbatim copies of `flat`, A and B under `flat_fragments`,
/// the loads of the padding are predicated off, their registers zero).
#[allow(clippy::too_many_arguments)]
pub(super) fn mma_body(
    asm: &mut Asm,
    p: &ColMajorProblem,
    s: &GpuSchedule,
    layout: &SharedLayout,
    [sa, sb]: [&str; 2],
    flat: [bool; 2],
    epi: &Epilogue,
    mw: &MmaWarp,
    after_a: Option<&mut dyn FnMut(&mut Asm)>,
) {
    let shape = s.mma.unwrap_or(smallgemm_ir::MmaShape::M16N8K16);
    let w = s.warps as usize;
    let mt = p.m.div_ceil(shape.m as usize);
    let ks = p.k.div_ceil(shape.k as usize);
    let reuse = mw.rows > 0;
    // Row tiles per group (the tiles of a column that share its B fragments), and whether
    // the warp holds their A fragments for all k steps (else each group loads them at each
    // step, `GpuSchedule::stream_a`).
    let rows = mw.rows.max(1);
    let hold_a = reuse && !s.stream_a_apply();
    let (lane, gid, tig) = (&mw.lane, &mw.gid, &mw.tig);
    // Verbatim copies (`flat`): per operand, the order in which each lane loads the two
    // halves of a fragment word (`fragment_swap_table`: against bank conflicts where k
    // pairs are not adjacent), as a bit per lane, the byte offsets of the two loads and
    // the `prmt` selector that puts the halves in k order.
    let k_steps = [layout.a_col, layout.b_row];
    let tables: [[usize; 4]; 2] = std::array::from_fn(|op| {
        let (row, rows) = [(layout.a_row, &[0, 8][..]), (layout.b_col, &[0][..])][op];
        if flat[op] {
            fragment_swap_table(row, k_steps[op], rows)
        } else {
            [0; 4]
        }
    });
    let swap_bits: [Option<String>; 2] = std::array::from_fn(|op| {
        let table = tables[op];
        (table != [0; 4]).then(|| {
            let code: usize = table.iter().enumerate().map(|(t, h)| h << t).sum();
            let x = asm.reg(Kind::B32);
            asm.op(format!("shr.u32 {x}, {code}, {tig}"));
            asm.op(format!("and.b32 {x}, {x}, 1"));
            x
        })
    });
    let sels: [Option<String>; 2] = std::array::from_fn(|op| {
        swap_bits[op].as_ref().map(|x| {
            // k first: bytes 0, 1 of the first load, then of the second (0x5410); k + 1
            // first: the other way round (0x1054).
            let sel = asm.reg(Kind::B32);
            asm.op(format!("mul.lo.u32 {sel}, {x}, {}", 0x5410 ^ 0x1054));
            asm.op(format!("xor.b32 {sel}, {sel}, {}", 0x5410));
            sel
        })
    });
    // The k padding of a verbatim copy (`flat`): in the last k step, for each operand, the
    // first and the second eight halves of k (h) and each of a fragment word's two loads
    // (j: the half k = 2 tig + 8 h + (j ^ table[tig])), which lanes load it: a prefix of
    // the tigs (`Lanes::Some`: 2 tig below a limit), all or none.
    let mut padding: [[[Lanes; 2]; 2]; 2] = Default::default();
    if flat.contains(&true) && p.k % 16 != 0 {
        let tig2 = asm.reg(Kind::B32);
        asm.op(format!("shl.b32 {tig2}, {tig}, 1"));
        let last_k = 16 * (ks - 1);
        let mut preds: Vec<(usize, String)> = Vec::new();
        for (table, per_op) in tables.iter().zip(padding.iter_mut()) {
            for (h, per_half) in per_op.iter_mut().enumerate() {
                for (j, lanes) in per_half.iter_mut().enumerate() {
                    let limit = p.k.saturating_sub(last_k + 8 * h);
                    // Lane t loads half 2 t + (0 or 1): the live lanes are a prefix.
                    let live = (0..4).filter(|&t| 2 * t + (j ^ table[t]) < limit).count();
                    *lanes = match live {
                        0 => Lanes::None,
                        4 => Lanes::All,
                        _ => {
                            let pred = match preds.iter().find(|(l, _)| *l == live) {
                                Some((_, pred)) => pred.clone(),
                                None => {
                                    let pred = asm.lt(&tig2, &(2 * live).to_string());
                                    preds.push((live, pred.clone()));
                                    pred
                                }
                            };
                            Lanes::Some(pred)
                        }
                    };
                }
            }
        }
    }
    // The two loads of a word of operand `op` at k step k, half h of k, under the guard
    // `edge` (the word's row of A or column of B inside m or n; None: everywhere).
    let halves_at = |asm: &mut Asm, op: usize, k: usize, h: usize, edge: &Lanes| {
        let edge = match edge {
            Lanes::None => return [HalfLoad::Zero, HalfLoad::Zero],
            Lanes::All => None,
            Lanes::Some(pred) => Some(pred.clone()),
        };
        let kpad = if flat[op] && k + 1 == ks {
            padding[op][h].clone()
        } else {
            [Lanes::All, Lanes::All]
        };
        kpad.map(|lanes| match lanes {
            Lanes::None => HalfLoad::Zero,
            Lanes::All => HalfLoad::Load {
                pred: edge.clone(),
                zero: false,
            },
            Lanes::Some(pred) => HalfLoad::Load {
                pred: asm.and(Some(pred), edge.clone()),
                zero: true,
            },
        })
    };
    // A fragment word holds two halves adjacent in k: one 32-bit load where k is the
    // contiguous direction in shared memory, else two 16-bit loads packed. A verbatim copy
    // (`flat`) may leave the pair unaligned: two 16-bit loads (`halves`: each under its
    // guard, or zero past k), the first from `bases[0]`, the second from `bases[1]` (in
    // the order of the lane's `sel` where it has one: [`fragment_swap_table`]).
    let pair = |asm: &mut Asm,
                bases: &[String; 2],
                off: usize,
                step: usize,
                flat: bool,
                halves: [HalfLoad; 2],
                sel: &Option<String>|
     -> String {
        let r = asm.reg(Kind::B32);
        if step == 1 && !flat {
            asm.op(format!("ld.shared.b32 {r}, [{}+{off}]", bases[0]));
        } else if halves.iter().all(|h| matches!(h, HalfLoad::Zero)) {
            asm.op(format!("mov.b32 {r}, 0"));
        } else {
            let (kind, ty) = match sel {
                Some(_) => (Kind::B32, "u16"),
                None => (Kind::B16, "b16"),
            };
            let x = [asm.reg(kind), asm.reg(kind)];
            let mov = match sel {
                Some(_) => "mov.b32",
                None => "mov.b16",
            };
            for (i, (x, half)) in x.iter().zip(&halves).enumerate() {
                match half {
                    HalfLoad::Zero => asm.op(format!("{mov} {x}, 0")),
                    HalfLoad::Load { pred, zero } => {
                        if *zero {
                            asm.op(format!("{mov} {x}, 0"));
                        }
                        asm.op(format!(
                            "{}ld.shared.{ty} {x}, [{}+{}]",
                            guard(pred),
                            bases[i],
                            off + 2 * step * i
                        ));
                    }
                }
            }
            match sel {
                Some(sel) => asm.op(format!("prmt.b32 {r}, {}, {}, {sel}", x[0], x[1])),
                None => asm.op(format!("mov.b32 {r}, {{{}, {}}}", x[0], x[1])),
            }
        }
        r
    };
    // Lane offsets in bytes: A at (row gid, k 2 tig), B at (k 2 tig, column gid).
    let lane_off = |asm: &mut Asm, row_stride: usize, k_stride: usize| -> String {
        let r = asm.reg(Kind::B32);
        asm.op(format!("mul.lo.u32 {r}, {tig}, {}", 4 * k_stride));
        asm.op(format!("mad.lo.u32 {r}, {gid}, {}, {r}", 2 * row_stride));
        r
    };
    let (a_row, a_col, b_row, b_col) = (layout.a_row, layout.a_col, layout.b_row, layout.b_col);
    let ldm = s.ldmatrix;
    let (a_lane, b_lane) = if ldm {
        // ldmatrix: lane l gives the address of row l % 8 of 8x8 matrix l / 8, a row being
        // 8 halves contiguous in shared memory (16-byte aligned: the padded leading
        // dimensions are multiples of 8 halves, tiles start at multiples of 8). A's four
        // matrices are (rows, k) = (0, 0), (8, 0), (0, 8), (8, 8); B's two are k = 0, 8.
        // Stored with rows contiguous (A not transposed, B transposed) the matrices are
        // read with `.trans`, which hands each lane the same elements as the mma layout.
        let a_step = if a_row == 1 { a_col } else { a_row };
        let b_step = if b_row == 1 { b_col } else { b_row };
        let r = asm.reg(Kind::B32);
        asm.op(format!("and.b32 {r}, {lane}, 7"));
        let j0 = asm.reg(Kind::B32);
        asm.op(format!("bfe.u32 {j0}, {lane}, 3, 1"));
        let j1 = asm.reg(Kind::B32);
        asm.op(format!("bfe.u32 {j1}, {lane}, 4, 1"));
        let a = asm.reg(Kind::B32);
        asm.op(format!("mul.lo.u32 {a}, {r}, {}", 2 * a_step));
        asm.op(format!("mad.lo.u32 {a}, {j0}, {}, {a}", 16 * a_row));
        asm.op(format!("mad.lo.u32 {a}, {j1}, {}, {a}", 16 * a_col));
        let b = asm.reg(Kind::B32);
        asm.op(format!("mul.lo.u32 {b}, {r}, {}", 2 * b_step));
        asm.op(format!("mad.lo.u32 {b}, {j0}, {}, {b}", 16 * b_row));
        (a, b)
    } else {
        (
            lane_off(asm, layout.a_row, layout.a_col),
            lane_off(asm, layout.b_col, layout.b_row),
        )
    };
    // A lane's offsets for the first and the second load of a word: with its halves in
    // the other order (`swap_bits`), k + 1 first and k second.
    let lane_pair = |asm: &mut Asm, lane: String, op: usize| -> [String; 2] {
        match &swap_bits[op] {
            None => [lane.clone(), lane],
            Some(x) => {
                let d = 2 * k_steps[op];
                let first = asm.reg(Kind::B32);
                asm.op(format!("mad.lo.u32 {first}, {x}, {d}, {lane}"));
                let second = asm.reg(Kind::B32);
                asm.op(format!("mul.lo.u32 {second}, {x}, {d}"));
                asm.op(format!("sub.u32 {second}, {lane}, {second}"));
                [first, second]
            }
        }
    };
    let a_lanes = lane_pair(asm, a_lane, 0);
    let b_lanes = lane_pair(asm, b_lane, 1);
    let a_trans = if a_row == 1 { ".trans" } else { "" };
    let b_trans = if b_row == 1 { "" } else { ".trans" };
    // Rows of A past m (columns of B past n) in a verbatim copy: not loaded (what they
    // would give reaches only rows (columns) of the product that are never stored). A:
    // where the words of row tile `tm` (its least, where the warp's row tile is not known
    // here) rows 8 r on lie past m; B: the lanes of a column tile that may reach past n.
    let a_edge = |tm: usize| -> [Lanes; 2] {
        std::array::from_fn(|r| {
            if flat[0] && 16 * tm + 8 * r >= p.m {
                Lanes::None
            } else {
                Lanes::All
            }
        })
    };
    let b_edge = |asm: &mut Asm, tile: &MmaTile| -> Lanes {
        if !flat[1] || 8 * (tile.tn_max + 1) <= p.n {
            return Lanes::All;
        }
        let col = asm.reg(Kind::B32);
        asm.op(format!("mad.lo.u32 {col}, {}, 8, {gid}", tile.tnr));
        Lanes::Some(asm.lt(&col, &p.n.to_string()))
    };
    // A last k step of at most 8: `mma.m16n8k8`, the fragments' first halves of k alone
    // (with `ldmatrix`, A's matrices (0, 0) and (8, 0) and B's k = 0: the lanes' addresses
    // of the first two, one matrix are those of the wider loads).
    let narrow = |k: usize| k + 1 == ks && narrow_last_k_step(s, p, flat.contains(&true));
    // `count` 8x8 matrices at `addr` (one register each).
    let ldmatrix = |asm: &mut Asm, count: usize, trans: &str, addr: String| -> Vec<String> {
        let r: Vec<String> = (0..count).map(|_| asm.reg(Kind::B32)).collect();
        asm.op(format!(
            "ldmatrix.sync.aligned.m8n8.x{count}{trans}.shared.b16 {{{}}}, [{addr}]",
            r.join(", ")
        ));
        r
    };
    let load_a = |asm: &mut Asm, abase: &[String; 2], edge: &[Lanes; 2], k: usize| -> Vec<String> {
        let kb = k * 16 * a_col * 2;
        if ldm {
            let count = if narrow(k) { 2 } else { 4 };
            return ldmatrix(asm, count, a_trans, format!("{}+{kb}", abase[0]));
        }
        // {a0 a1}: (gid, 2tig), {a2 a3}: row + 8, {a4 a5}: k + 8, {a6 a7}: both.
        let offs = [
            (kb, 0, 0),
            (kb + 8 * a_row * 2, 1, 0),
            (kb + 8 * a_col * 2, 0, 1),
            (kb + 8 * a_row * 2 + 8 * a_col * 2, 1, 1),
        ];
        let words = if narrow(k) { &offs[..2] } else { &offs[..] };
        words
            .iter()
            .map(|&(o, r, h)| {
                let halves = halves_at(asm, 0, k, h, &edge[r]);
                pair(asm, abase, o, a_col, flat[0], halves, &sels[0])
            })
            .collect()
    };
    let load_b = |asm: &mut Asm, bbase: &[String; 2], edge: &Lanes, k: usize| -> Vec<String> {
        let kb = k * 16 * b_row * 2;
        if ldm {
            let count = if narrow(k) { 1 } else { 2 };
            return ldmatrix(asm, count, b_trans, format!("{}+{kb}", bbase[0]));
        }
        // {b0 b1}: (2tig, gid), {b2 b3}: k + 8.
        let words = if narrow(k) { 1 } else { 2 };
        [(kb, 0), (kb + 8 * b_row * 2, 1)][..words]
            .iter()
            .map(|&(o, h)| {
                let halves = halves_at(asm, 1, k, h, edge);
                pair(asm, bbase, o, b_row, flat[1], halves, &sels[1])
            })
            .collect()
    };
    let tile_base =
        |asm: &mut Asm, base: &str, t: &str, bytes: usize, lanes: &[String; 2]| -> [String; 2] {
            let r = asm.reg(Kind::B32);
            asm.op(format!("mad.lo.u32 {r}, {t}, {bytes}, {base}"));
            if lanes[0] == lanes[1] {
                asm.op(format!("add.u32 {r}, {r}, {}", lanes[0]));
                return [r.clone(), r];
            }
            let second = asm.reg(Kind::B32);
            asm.op(format!("add.u32 {second}, {r}, {}", lanes[1]));
            asm.op(format!("add.u32 {r}, {r}, {}", lanes[0]));
            [r, second]
        };
    // The A base of row tile r of a warp's (or a group's) tiles, from its first tile.
    let a_base = |asm: &mut Asm, tiles: &[MmaTile], r: usize| -> ([String; 2], [Lanes; 2]) {
        let tmr = &tiles[r].tmr;
        let base = if r > 0 && mt % rows != 0 {
            // The last pair's second row tile lies past m: the last one's A.
            let t = asm.reg(Kind::B32);
            asm.op(format!("min.u32 {t}, {tmr}, {}", mt - 1));
            tile_base(asm, sa, &t, 16 * a_row * 2, &a_lanes)
        } else {
            tile_base(asm, sa, tmr, 16 * a_row * 2, &a_lanes)
        };
        (base, a_edge(r))
    };
    // Warps that hold their row tiles' A: each one's fragments for every k step, by row.
    let fixed_a: Option<Vec<Vec<Vec<String>>>> = hold_a.then(|| {
        (0..rows)
            .map(|r| {
                let (base, edge) = a_base(asm, &mw.tiles, r);
                (0..ks).map(|k| load_a(asm, &base, &edge, k)).collect()
            })
            .collect()
    });
    // Column sweep: the A fragments of every row tile (tile i of the first group is row
    // tile i), all loaded before any tile.
    let rows_a: Vec<Vec<Vec<String>>> = if mw.sweep {
        mw.tiles[..mt]
            .iter()
            .enumerate()
            .map(|(i, tile)| {
                let abase = tile_base(asm, sa, &tile.tmr, 16 * a_row * 2, &a_lanes);
                let edge = a_edge(i);
                (0..ks).map(|k| load_a(asm, &abase, &edge, k)).collect()
            })
            .collect()
    } else {
        Vec::new()
    };
    // (`c_over_a`: only with every warp's A fragments in registers.)
    assert!(after_a.is_none() || hold_a || mw.sweep);
    if let Some(f) = after_a {
        f(asm);
    }
    let nt = p.n.div_ceil(shape.n as usize);
    for (q, tiles) in mw.tiles.chunks(mw.group * rows).enumerate() {
        asm.comment(&format!("tile {q} of this warp"));
        let skip = asm.label();
        if let Some(v) = &tiles[0].valid {
            // Warp-uniform: every lane of the warp has the same tiles.
            asm.op(format!("@!{v} bra.uni {skip}"));
        }
        // B's bases: one per column tile (the first of its `rows` tiles), or one for the
        // whole group (column sweep).
        let b_tiles = if mw.sweep { &tiles[..1] } else { tiles };
        let bbases: Vec<([String; 2], Lanes)> = b_tiles
            .iter()
            .step_by(rows)
            .enumerate()
            .map(|(j, tile)| {
                // A tile after the group's first may lie past the last column tile: in
                // `mma_group`'s groups (consecutive column tiles) where they do not divide
                // the row, in `row_group`'s (each warp's own row) where the tile has a
                // validity guard.
                let may_hang = if reuse {
                    tile.valid.is_some()
                } else {
                    nt % mw.group != 0
                };
                let base = if j > 0 && may_hang {
                    // Past the last column tile: B clamped inside its copy (never stored).
                    let t = asm.reg(Kind::B32);
                    asm.op(format!("min.u32 {t}, {}, {}", tile.tnr, nt - 1));
                    tile_base(asm, sb, &t, 8 * b_col * 2, &b_lanes)
                } else {
                    tile_base(asm, sb, &tile.tnr, 8 * b_col * 2, &b_lanes)
                };
                (base, b_edge(asm, tile))
            })
            .collect();
        // A loaded at each k step: the group's row tiles (`stream_a`), or its one row tile
        // where the warps take tiles in turn.
        let abases: Option<Vec<_>> =
            (!hold_a && !mw.sweep).then(|| (0..rows).map(|r| a_base(asm, tiles, r)).collect());
        let accs: Vec<[String; 4]> = tiles
            .iter()
            .map(|_| std::array::from_fn(|_| asm.reg(Kind::F32)))
            .collect();
        for r in accs.iter().flatten() {
            asm.op(format!("mov.f32 {r}, 0f00000000"));
        }
        let mma = |asm: &mut Asm, acc: &[String; 4], a: &[String], b: &[String]| {
            let d = acc.join(", ");
            let kk = 8 * b.len();
            asm.op(format!(
                "mma.sync.aligned.m16n8k{kk}.row.col.f32.f16.f16.f32 {{{d}}}, {{{}}}, {{{}}}, {{{d}}}",
                a.join(", "),
                b.join(", ")
            ));
        };
        for k in 0..ks {
            if mw.sweep {
                let (bbase, edge) = &bbases[0];
                let b = load_b(asm, bbase, edge, k);
                for (acc, a) in accs.iter().zip(&rows_a) {
                    mma(asm, acc, &a[k], &b);
                }
                continue;
            }
            let a: Vec<Vec<String>> = match (&abases, &fixed_a) {
                (Some(bases), _) => bases
                    .iter()
                    .map(|(base, edge)| load_a(asm, base, edge, k))
                    .collect(),
                (None, Some(frags)) => frags.iter().map(|row| row[k].clone()).collect(),
                (None, None) => unreachable!("A's fragments: loaded per tile or per warp"),
            };
            // Tiles column by column, each column's row tiles on one B fragment.
            for (column, (bbase, edge)) in accs.chunks(rows).zip(&bbases) {
                let b = load_b(asm, bbase, edge, k);
                for (acc, a) in column.iter().zip(&a) {
                    mma(asm, acc, a, &b);
                }
            }
        }
        // `epilogue_loads_first`: C's old values loaded before the results are stored
        // (ptxas does not move a load above a store it cannot tell apart). Moot where
        // beta = 0: nothing is loaded.
        let first = s.epilogue_loads_first_apply() && epi.beta != Scalar::Zero;
        if let Some((base, off, ldc)) = &mw.matrix {
            // Tiles moved whole: every `ldmatrix` of the group before its first
            // `stmatrix`.
            let mut olds = Vec::new();
            for (acc, tile) in accs.iter().zip(tiles) {
                let old = matrix_load(asm, epi, tile, base, off, *ldc);
                if first {
                    olds.push(old);
                } else {
                    matrix_store(asm, epi, acc, tile, old);
                }
            }
            for ((acc, tile), old) in accs.iter().zip(tiles).zip(olds) {
                matrix_store(asm, epi, acc, tile, old);
            }
        } else {
            for (i, (acc, tile)) in accs.iter().zip(tiles).enumerate() {
                let late;
                let slots = match &mw.gen {
                    // Column sweep: row tile i, column tile q where one warp takes them all.
                    Some(gen) => {
                        let tn = (w == 1).then_some(q);
                        let fixed = mw.sweep.then_some((i, tn));
                        let (tmr, tnr) = (&tile.tmr, &tile.tnr);
                        late = gen.slots(
                            asm,
                            p,
                            epi,
                            tmr,
                            tnr,
                            &tile.valid,
                            &tile.hangs,
                            false,
                            fixed,
                        );
                        &late
                    }
                    None => &tile.slots,
                };
                let acc = swapped(asm, acc, &mw.swaps);
                // Elements moved one by one (`first`): the tile's four loads before its
                // stores, not the whole group's: on an H200 that spilled or cost occupancy
                // at most sizes with groups (docs/gpu-notes.md, version 32).
                let mut stores = Vec::new();
                for (v, slot) in acc.iter().zip(slots) {
                    let Some((addr, pred, old)) = slot else {
                        continue;
                    };
                    let addr = addr.operand(asm);
                    if !first {
                        epi.store(asm, v, &addr, pred, old.as_deref(), mw.space);
                        continue;
                    }
                    let old = match old {
                        Some(old) => old.clone(),
                        None => epi.load(asm, &addr, pred, mw.space),
                    };
                    stores.push((v, addr, pred, old));
                }
                for (v, addr, pred, old) in stores {
                    epi.store(asm, v, &addr, pred, Some(&old), mw.space);
                }
            }
        }
        if tiles[0].valid.is_some() {
            asm.place(&skip);
        }
    }
}

/// The first half of a tile's epilogue on C's padded copy in shared memory
/// (`MmaWarp::matrix`): its old values (beta != 0) come in one `ldmatrix .trans` (two 8x8
/// matrices, rows 0-7 and 8-15 of the tile's 8 columns: lane (g, t) gets (g, 2t) and
/// (g, 2t + 1), and the same 8 rows down, its accumulators' places), where the 16-bit
/// loads take four; [`matrix_store`] writes the results back. Rows past m and columns past
/// n (up to the tile's) lie in the copy's padding, never copied out; a tile that hangs past
/// the last column tile neither reads nor writes.
fn matrix_load(
    asm: &mut Asm,
    epi: &Epilogue,
    tile: &MmaTile,
    base: &str,
    lane_off: &str,
    ldc: usize,
) -> TileOld {
    let addr = asm.reg(Kind::B32);
    asm.op(format!(
        "mad.lo.u32 {addr}, {}, {}, {base}",
        tile.tnr,
        16 * ldc
    ));
    asm.op(format!("mad.lo.u32 {addr}, {}, 32, {addr}", tile.tmr));
    asm.op(format!("add.u32 {addr}, {addr}, {lane_off}"));
    let g = guard(&tile.hangs);
    let words = (epi.beta != Scalar::Zero).then(|| {
        let w: [String; 2] = std::array::from_fn(|_| asm.reg(Kind::B32));
        if tile.hangs.is_some() {
            // Defined in the lanes of a tile that does not read.
            for x in &w {
                asm.op(format!("mov.b32 {x}, 0"));
            }
        }
        asm.op(format!(
            "{g}ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {{{}}}, [{addr}]",
            w.join(", ")
        ));
        w
    });
    TileOld { addr, words }
}

/// A tile's place in C's padded copy and, where beta needs them, its old values as
/// `ldmatrix` gave them (two words of two halves: the accumulators' order).
struct TileOld {
    addr: String,
    words: Option<[String; 2]>,
}

/// The second half of a tile's epilogue ([`matrix_load`]): alpha * acc + beta * old, the
/// pairs packed by `cvt.rn.f16x2.f32`, stored back in one `stmatrix .trans` (where the
/// 16-bit stores take four).
fn matrix_store(asm: &mut Asm, epi: &Epilogue, acc: &[String; 4], tile: &MmaTile, old: TileOld) {
    let olds: Option<Vec<String>> = old.words.map(|w| {
        w.iter()
            .flat_map(|x| {
                let h = [asm.reg(Kind::B16), asm.reg(Kind::B16)];
                asm.op(format!("mov.b32 {{{}, {}}}, {x}", h[0], h[1]));
                h.map(|h| {
                    let f = asm.reg(Kind::F32);
                    asm.op(format!("cvt.f32.f16 {f}, {h}"));
                    f
                })
            })
            .collect()
    });
    let results: Vec<String> = acc
        .iter()
        .enumerate()
        .map(|(e, v)| {
            // (Asked for only where beta needs it: `olds` is there then.)
            epi.combine(asm, v, |_| {
                olds.as_ref().map(|o| o[e].clone()).unwrap_or_default()
            })
        })
        .collect();
    let words: Vec<String> = results
        .chunks(2)
        .map(|pair| {
            let d = asm.reg(Kind::B32);
            // The first of the pair (lower column) in the low half.
            asm.op(format!("cvt.rn.f16x2.f32 {d}, {}, {}", pair[1], pair[0]));
            d
        })
        .collect();
    asm.op(format!(
        "{}stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [{}], {{{}}}",
        guard(&tile.hangs),
        old.addr,
        words.join(", ")
    ));
}

/// Which lanes of a warp load one half of a fragment word in the last k step: those of
/// `tig` below a limit (the predicate), all, or none (the half is past k for every lane).
#[derive(Clone, Default)]
enum Lanes {
    #[default]
    All,
    Some(String),
    None,
}

/// One of the two 16-bit loads of a fragment word from a verbatim copy: zero (past k in
/// every lane), or a load under `pred`, zero first where `zero` (past k in some lanes).
enum HalfLoad {
    Zero,
    Load { pred: Option<String>, zero: bool },
}

/// The order in which lane (gid, tig) loads the two halves of each fragment word from a
/// verbatim copy (`flat_fragments`) whose k pairs lie `step` halves apart and whose rows
/// (A) or columns (B) lie `row` halves apart, at the row offsets `rows` (A: 0 and 8; B:
/// 0): with `table[tig]` 1, k + 1 first. Where the pairs are not adjacent (A not
/// transposed: `step` = m) the lanes of one load fall into few banks: m = 17, 4 tigs' k
/// 34 halves (17 words) apart, two words a bank, where tigs 1 and 2 taking k + 1 first
/// spread them over distinct banks. The table with the fewest bank conflicts over the
/// copy's eight alignments (tig 0 in the plain order: the reverse of a table conflicts
/// alike); all zeros unless another is strictly better.
fn fragment_swap_table(row: usize, step: usize, rows: &[usize]) -> [usize; 4] {
    let cost = |table: [usize; 4]| -> usize { fragment_degrees(row, step, rows, table).sum() };
    let mut best = [0; 4];
    let mut best_cost = cost(best);
    for code in 1..8usize {
        let table = [0, code & 1, (code >> 1) & 1, code >> 2];
        let c = cost(table);
        if c < best_cost {
            best = table;
            best_cost = c;
        }
    }
    best
}

/// The bank conflict degree of each 16-bit fragment load of a full k step (rows `rows`,
/// the two halves of k, both loads of a word) under `table` ([`fragment_swap_table`]),
/// for each of the verbatim copy's eight alignments.
fn fragment_degrees<'a>(
    row: usize,
    step: usize,
    rows: &'a [usize],
    table: [usize; 4],
) -> impl Iterator<Item = usize> + 'a {
    (0..8).flat_map(move |base| {
        rows.iter().flat_map(move |&r| {
            (0..4).map(move |hj| {
                let (h, j) = (hj >> 1, hj & 1);
                bank_degree(32, 2, |lane| {
                    let (gid, tig) = (lane / 4, lane % 4);
                    let k = 2 * tig + 8 * h + (j ^ table[tig]);
                    2 * (base + row * (gid + r) + step * k)
                })
            })
        })
    })
}

/// A tile's accumulators in this lane's slot order ([`MmaWarp::swaps`]): slot e holds
/// accumulator e ^ h, by conditional swaps (columns, then rows).
pub(super) fn swapped(
    asm: &mut Asm,
    acc: &[String; 4],
    swaps: &[Option<String>; 2],
) -> [String; 4] {
    let mut v = acc.clone();
    for (bit, swap) in swaps.iter().enumerate() {
        let Some(p) = swap else { continue };
        let d = 1 << bit;
        let prev = v.clone();
        for (e, slot) in v.iter_mut().enumerate() {
            let r = asm.reg(Kind::F32);
            asm.op(format!("selp.f32 {r}, {}, {}, {p}", prev[e ^ d], prev[e]));
            *slot = r;
        }
    }
    v
}
