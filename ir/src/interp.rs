//! A reference interpreter of `Program`, in plain Rust: the oracle that tests the lowering
//! without any backend, and that machine code must agree with bit for bit (the same
//! operations in the same order, FMAs fused).
//!
//! It is stricter than hardware: every memory access is checked against the bounds of the
//! A, B, C or scratch region it points into, reading a register that was never written is an
//! error, and so is overwriting a vector register that holds a mask.

use thiserror::Error;

use crate::element::Element;
use crate::program::{narrowed_ops, Addr, Gpr, Mask, Op, Program, Trips, VReg};

/// Most lanes of any target (f32 in 512 bits).
const MAX_LANES: usize = 16;

#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum InterpError {
    #[error("the program computes {program:?}, the buffers hold {buffers:?}")]
    DtypeMismatch {
        program: crate::Dtype,
        buffers: crate::Dtype,
    },
    #[error("the program takes {expected} run-time scalars, {given} were given")]
    ParamCount { expected: usize, given: usize },
    #[error("{op}: access of {bytes} bytes at offset {offset} is outside {region} ({len} bytes)")]
    OutOfBounds {
        op: String,
        region: &'static str,
        offset: i64,
        bytes: usize,
        len: usize,
    },
    #[error("{op}: offset {offset} in {region} is not a multiple of the element size")]
    Misaligned {
        op: String,
        region: &'static str,
        offset: i64,
    },
    #[error(
        "{op}: a streaming store at byte {offset} of {region}, which is not C at a multiple of \
         the vector width ({width} bytes)"
    )]
    StreamMisaligned {
        op: String,
        region: &'static str,
        offset: i64,
        width: usize,
    },
    #[error("{op}: {what} was read before it was written")]
    Undefined { op: String, what: String },
    #[error("{op}: {gpr} holds a count, not an address")]
    NotAnAddress { op: String, gpr: Gpr },
    #[error("{op}: overwrites v{} which holds a mask", .vreg.0)]
    MaskClobbered { op: String, vreg: VReg },
    #[error("{op}: the loop body changed its counter")]
    CounterChanged { op: String },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Region {
    A,
    B,
    C,
    Scratch,
    /// The arrays of pointers of a pointer-array batch (A's, B's, C's).
    Pointers(usize),
}

impl Region {
    fn name(self) -> &'static str {
        match self {
            Region::A => "A",
            Region::B => "B",
            Region::C => "C",
            Region::Scratch => "scratch",
            Region::Pointers(0) => "the array of A pointers",
            Region::Pointers(1) => "the array of B pointers",
            Region::Pointers(_) => "the array of C pointers",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Value {
    Address { region: Region, offset: i64 },
    Count(i64),
}

struct Machine<'a, T: Element> {
    program: &'a Program,
    a: &'a [T],
    b: &'a [T],
    c: &'a mut [T],
    scratch: Vec<Option<T>>,
    params: &'a [T],
    /// Pointer-array batches: element offsets into a, b, c, one per matrix.
    pointers: Option<[&'a [usize]; 3]>,
    vregs: Vec<Option<[T; MAX_LANES]>>,
    gprs: Vec<Option<Value>>,
    masks: Vec<Option<usize>>,
    /// Lanes of the operation after an `Op::Narrow` prefix.
    narrow: Option<usize>,
}

/// Runs `program` on `batch` matrices of the given slices (element 0 of each slice is where
/// the kernel's A, B and C pointers point). `params` are the run-time scalars in
/// `program.params` order.
pub fn interpret<T: Element>(
    program: &Program,
    a: &[T],
    b: &[T],
    c: &mut [T],
    batch: usize,
    params: &[T],
) -> Result<(), InterpError> {
    run(program, a, b, c, None, batch, params)
}

/// Runs a pointer-array `program`: matrix i of A starts at `a[offsets[0][i]]`, and likewise
/// for B and C; the kernel's first three arguments are these arrays.
pub fn interpret_pointer_arrays<T: Element>(
    program: &Program,
    a: &[T],
    b: &[T],
    c: &mut [T],
    offsets: [&[usize]; 3],
    batch: usize,
    params: &[T],
) -> Result<(), InterpError> {
    run(program, a, b, c, Some(offsets), batch, params)
}

fn run<T: Element>(
    program: &Program,
    a: &[T],
    b: &[T],
    c: &mut [T],
    pointers: Option<[&[usize]; 3]>,
    batch: usize,
    params: &[T],
) -> Result<(), InterpError> {
    if program.dtype != T::DTYPE {
        return Err(InterpError::DtypeMismatch {
            program: program.dtype,
            buffers: T::DTYPE,
        });
    }
    if params.len() != program.params.len() {
        return Err(InterpError::ParamCount {
            expected: program.params.len(),
            given: params.len(),
        });
    }
    let elt = T::DTYPE.size();
    let mut gprs = vec![None; program.gprs.max(Gpr::FIRST_FREE as usize)];
    let at = |region| Some(Value::Address { region, offset: 0 });
    let regions = match pointers {
        None => [Region::A, Region::B, Region::C],
        Some(_) => [
            Region::Pointers(0),
            Region::Pointers(1),
            Region::Pointers(2),
        ],
    };
    gprs[Gpr::A.0 as usize] = at(regions[0]);
    gprs[Gpr::B.0 as usize] = at(regions[1]);
    gprs[Gpr::C.0 as usize] = at(regions[2]);
    gprs[Gpr::BATCH.0 as usize] = Some(Value::Count(batch as i64));
    let mut machine = Machine {
        program,
        a,
        b,
        c,
        scratch: vec![None; program.scratch_bytes as usize / elt],
        params,
        pointers,
        vregs: vec![None; program.vregs],
        gprs,
        masks: vec![None; program.masks.len()],
        narrow: None,
    };
    machine.run(&program.ops)
}

impl<T: Element> Machine<'_, T> {
    fn lanes(&self) -> usize {
        self.program.lanes
    }

    /// Lanes the arithmetic computes: all, or those of a `Narrow` prefix.
    fn active_lanes(&self) -> usize {
        self.narrow.unwrap_or(self.program.lanes)
    }

    /// `v` with the lanes above the arithmetic's width undefined (NaN, so that a store of
    /// them shows in C).
    fn poison_upper(&self, mut v: [T; MAX_LANES]) -> [T; MAX_LANES] {
        for lane in v.iter_mut().skip(self.active_lanes()) {
            *lane = T::from_f64(f64::NAN);
        }
        v
    }

    fn run(&mut self, ops: &[Op]) -> Result<(), InterpError> {
        for unit in narrowed_ops(ops) {
            let (bytes, op) = unit.map_err(|prefix| {
                self.bad_narrowing(prefix, "no operation after the prefix in its body".into())
            })?;
            let Some(bytes) = bytes else {
                self.exec(op)?;
                continue;
            };
            let width = bytes as usize / std::mem::size_of::<T>();
            if width == 0 || width > self.lanes() {
                let what = format!("{width} of {} lanes", self.lanes());
                return Err(self.bad_narrowing(op, what));
            }
            self.narrow = Some(width);
            let result = self.exec(op);
            self.narrow = None;
            result?;
        }
        Ok(())
    }

    /// A narrowing the interpreter cannot run: `what` says why.
    fn bad_narrowing(&self, op: &Op, what: String) -> InterpError {
        InterpError::Undefined {
            op: format!("{op:?}"),
            what,
        }
    }

    fn exec(&mut self, op: &Op) -> Result<(), InterpError> {
        let lanes = self.lanes();
        match op {
            Op::Zero { dst } => self.set(op, *dst, [T::default(); MAX_LANES])?,
            Op::Load { dst, addr, mask } => {
                let n = self.active(op, *mask)?;
                let mut v = [T::default(); MAX_LANES];
                for (i, lane) in v.iter_mut().enumerate().take(n) {
                    *lane = self.read(op, *addr, i)?;
                }
                self.set(op, *dst, v)?;
            }
            Op::Store { addr, src, mask } => {
                let n = self.active(op, *mask)?;
                let v = self.get(op, *src)?;
                for (i, &lane) in v.iter().enumerate().take(n) {
                    self.write(op, *addr, i, lane)?;
                }
            }
            Op::StorePieces {
                addr,
                src,
                lanes: n,
            } => {
                let n = *n as usize;
                if n == 0 || n >= self.active_lanes() {
                    return Err(InterpError::Undefined {
                        op: format!("{op:?}"),
                        what: format!("{n} of {} lanes in pieces", self.active_lanes()),
                    });
                }
                let v = self.get(op, *src)?;
                for (i, &lane) in v.iter().enumerate().take(n) {
                    self.write(op, *addr, i, lane)?;
                }
                // The moves clobber src: a later read of it is a lowering bug.
                self.vregs[src.0 as usize] = None;
            }
            Op::StoreStream { addr, src } => {
                // The caller aligns C to the vector width; so must the store's offset be.
                let width = self.program.vector_bytes();
                let at = self.address(op, *addr)?;
                if at.0 != Region::C || at.1 % width as i64 != 0 || self.narrow.is_some() {
                    return Err(InterpError::StreamMisaligned {
                        op: format!("{op:?}"),
                        region: at.0.name(),
                        offset: at.1,
                        width,
                    });
                }
                let v = self.get(op, *src)?;
                for (i, &lane) in v.iter().enumerate().take(lanes) {
                    self.write(op, *addr, i, lane)?;
                }
            }
            Op::Broadcast { dst, addr } => {
                let x = self.read(op, *addr, 0)?;
                self.set(op, *dst, [x; MAX_LANES])?;
            }
            Op::BroadcastGroup {
                dst,
                addr,
                lanes: group,
            } => {
                let group = *group as usize;
                if group == 0 || lanes % group != 0 {
                    return Err(InterpError::Undefined {
                        op: format!("{op:?}"),
                        what: format!("groups of {group} lanes in a {lanes}-lane vector"),
                    });
                }
                let mut v = [T::default(); MAX_LANES];
                for (i, lane) in v.iter_mut().enumerate().take(lanes) {
                    *lane = self.read(op, *addr, i % group)?;
                }
                self.set(op, *dst, v)?;
            }
            Op::Permute { dst, src, select } => {
                if lanes % 4 != 0 || select.iter().any(|&t| t >= 4) {
                    return Err(InterpError::Undefined {
                        op: format!("{op:?}"),
                        what: format!("groups of four lanes in a {lanes}-lane vector"),
                    });
                }
                let x = self.get(op, *src)?;
                let mut v = [T::default(); MAX_LANES];
                for (i, lane) in v.iter_mut().enumerate().take(lanes) {
                    *lane = x[i / 4 * 4 + select[i % 4] as usize];
                }
                self.set(op, *dst, v)?;
            }
            Op::Indices { dst, indices } => {
                let mut v = [T::default(); MAX_LANES];
                for (lane, &i) in v.iter_mut().zip(indices).take(lanes) {
                    *lane = T::from_f64(i as f64);
                }
                self.set(op, *dst, v)?;
            }
            Op::PermuteVar { dst, index, src } => {
                let (index, x) = (self.get(op, *index)?, self.get(op, *src)?);
                let mut v = [T::default(); MAX_LANES];
                for (lane, i) in v.iter_mut().zip(index).take(lanes) {
                    let i = i.to_f64() as usize;
                    if i >= lanes {
                        return Err(InterpError::Undefined {
                            op: format!("{op:?}"),
                            what: format!("lane {i} of a {lanes}-lane vector"),
                        });
                    }
                    *lane = x[i];
                }
                self.set(op, *dst, v)?;
            }
            Op::InsertGroup {
                dst,
                addr,
                group,
                lanes: width,
            } => {
                let width = *width as usize;
                let first = width * *group as usize;
                if width == 0 || lanes % width != 0 || first + width > lanes {
                    return Err(InterpError::Undefined {
                        op: format!("{op:?}"),
                        what: format!("group {group} of {width} lanes in a {lanes}-lane vector"),
                    });
                }
                let mut v = self.get(op, *dst)?;
                for i in 0..width {
                    v[first + i] = self.read(op, *addr, i)?;
                }
                self.set(op, *dst, v)?;
            }
            Op::LoadScalar { dst, addr } => {
                let mut v = [T::default(); MAX_LANES];
                v[0] = self.read(op, *addr, 0)?;
                self.set(op, *dst, v)?;
            }
            Op::StoreScalar { addr, src } => {
                let x = self.get(op, *src)?[0];
                self.write(op, *addr, 0, x)?;
            }
            Op::Fma { acc, a, b, negate } => {
                let bv = self.get(op, *b)?;
                self.fma(op, *acc, *a, |i| bv[i], *negate)?;
            }
            Op::FmaBroadcast { acc, a, b, negate } => {
                let x = self.read(op, *b, 0)?;
                self.fma(op, *acc, *a, |_| x, *negate)?;
            }
            Op::FmaLane {
                acc,
                a,
                b,
                lane,
                negate,
            } => {
                let bv = self.get(op, *b)?;
                let x = *bv
                    .get(*lane as usize)
                    .filter(|_| (*lane as usize) < lanes)
                    .ok_or_else(|| InterpError::Undefined {
                        op: format!("{op:?}"),
                        what: format!("lane {lane} of a {lanes}-lane vector"),
                    })?;
                self.fma(op, *acc, *a, |_| x, *negate)?;
            }
            Op::TransposeAdd {
                dst,
                a,
                b,
                tmp,
                width,
            } => {
                let elt = std::mem::size_of::<T>();
                let operands = [*dst, *a, *b, *tmp];
                let shuffles =
                    crate::program::transpose_add_operands(elt, lanes * elt, operands, *width)
                        .filter(|_| self.narrow.is_none());
                let Some([lo, hi]) = shuffles else {
                    return Err(InterpError::Undefined {
                        op: format!("{op:?}"),
                        what: format!(
                            "chunks of {width} in a {lanes}-lane vector, a temporary apart"
                        ),
                    });
                };
                let sources = [self.get(op, *a)?, self.get(op, *b)?];
                let pick = |s: crate::program::Shuffle, lane: usize| {
                    let (from_b, l) = s.source(elt, lane);
                    sources[from_b as usize][l]
                };
                let (mut sum, mut upper) = ([T::default(); MAX_LANES], [T::default(); MAX_LANES]);
                for lane in 0..lanes {
                    upper[lane] = pick(hi, lane);
                    sum[lane] = pick(lo, lane) + upper[lane];
                }
                self.set(op, *tmp, upper)?;
                self.set(op, *dst, sum)?;
            }
            Op::Add { dst, a, b } => self.binary(op, *dst, *a, *b, |x, y| x + y)?,
            Op::Sub { dst, a, b } => self.binary(op, *dst, *a, *b, |x, y| x - y)?,
            Op::Mul { dst, a, b } => self.binary(op, *dst, *a, *b, |x, y| x * y)?,
            Op::SetMask { mask, lanes: n } => {
                self.masks[mask.0 as usize] = Some((*n as usize).min(lanes));
            }
            Op::StoreParam { param, addr } => {
                let index = self
                    .program
                    .params
                    .iter()
                    .position(|p| p == param)
                    .ok_or_else(|| InterpError::Undefined {
                        op: format!("{op:?}"),
                        what: format!("{param:?} (not a parameter of the program)"),
                    })?;
                let x = self.params[index];
                self.write(op, *addr, 0, x)?;
            }
            Op::StoreConst { value, addr } => self.write(op, *addr, 0, T::from_f64(*value))?,
            // A hint: nothing to compute, and its address may lie past the batch.
            Op::Prefetch { .. } => {}
            Op::LoadAddress { dst, addr } => {
                let (region, offset) = self.address(op, *addr)?;
                let (Region::Pointers(which), Some(arrays)) = (region, self.pointers) else {
                    return Err(InterpError::OutOfBounds {
                        op: format!("{op:?} (not an array of pointers)"),
                        region: region.name(),
                        offset,
                        bytes: 8,
                        len: 0,
                    });
                };
                let array = arrays[which];
                if offset < 0 || offset % 8 != 0 || offset as usize / 8 >= array.len() {
                    return Err(InterpError::OutOfBounds {
                        op: format!("{op:?}"),
                        region: region.name(),
                        offset,
                        bytes: 8,
                        len: array.len() * 8,
                    });
                }
                let target = [Region::A, Region::B, Region::C][which];
                let elements = array[offset as usize / 8] as i64;
                self.gprs[dst.0 as usize] = Some(Value::Address {
                    region: target,
                    offset: elements * T::DTYPE.size() as i64,
                });
            }
            Op::Copy { dst, src } => {
                let v = self.gpr(op, *src)?;
                self.gprs[dst.0 as usize] = Some(v);
            }
            Op::AddImm { dst, imm } => {
                let v = match self.gpr(op, *dst)? {
                    Value::Address { region, offset } => Value::Address {
                        region,
                        offset: offset + *imm as i64,
                    },
                    Value::Count(n) => Value::Count(n + *imm as i64),
                };
                self.gprs[dst.0 as usize] = Some(v);
            }
            // `run` applies a prefix to the operation after it.
            Op::Narrow { .. } => {
                return Err(self.bad_narrowing(op, "a prefix run on its own".into()))
            }
            Op::Loop {
                counter,
                trips,
                body,
            } => {
                let count = || match self.gpr(op, *counter)? {
                    Value::Count(n) => Ok(n),
                    Value::Address { .. } => Err(InterpError::Undefined {
                        op: "loop".into(),
                        what: format!("a count in {counter}"),
                    }),
                };
                let (n, step) = match trips {
                    Trips::Const(n) => (*n as i64, 1),
                    Trips::Register => (count()?, 1),
                    Trips::RegisterBy(step) => (count()? / *step as i64, *step as i64),
                };
                let rest = match trips {
                    Trips::RegisterBy(step) => count()? % *step as i64,
                    _ => 0,
                };
                for trip in (1..=n).rev() {
                    let left = rest + trip * step;
                    self.gprs[counter.0 as usize] = Some(Value::Count(left));
                    self.run(body)?;
                    if self.gprs[counter.0 as usize] != Some(Value::Count(left)) {
                        return Err(InterpError::CounterChanged {
                            op: format!("loop {counter}"),
                        });
                    }
                }
                self.gprs[counter.0 as usize] = Some(Value::Count(rest));
            }
        }
        Ok(())
    }

    fn active(&self, op: &Op, mask: Option<Mask>) -> Result<usize, InterpError> {
        match mask {
            // After a Narrow prefix, a load reads only its low lanes and clears the rest.
            None => Ok(self.active_lanes()),
            Some(m) => self
                .masks
                .get(m.0 as usize)
                .copied()
                .flatten()
                .ok_or_else(|| InterpError::Undefined {
                    op: format!("{op:?}"),
                    what: format!("mask m{}", m.0),
                }),
        }
    }

    fn fma(
        &mut self,
        op: &Op,
        acc: VReg,
        a: VReg,
        b: impl Fn(usize) -> T,
        negate: bool,
    ) -> Result<(), InterpError> {
        let (mut c, av) = (self.get(op, acc)?, self.get(op, a)?);
        for (i, lane) in c.iter_mut().enumerate().take(self.active_lanes()) {
            let x = if negate { T::default() - av[i] } else { av[i] };
            *lane = x.mul_add(b(i), *lane);
        }
        let c = self.poison_upper(c);
        self.set(op, acc, c)
    }

    fn binary(
        &mut self,
        op: &Op,
        dst: VReg,
        a: VReg,
        b: VReg,
        f: impl Fn(T, T) -> T,
    ) -> Result<(), InterpError> {
        let (x, y) = (self.get(op, a)?, self.get(op, b)?);
        let mut r = [T::default(); MAX_LANES];
        for (i, lane) in r.iter_mut().enumerate() {
            *lane = f(x[i], y[i]);
        }
        let r = self.poison_upper(r);
        self.set(op, dst, r)
    }

    fn get(&self, op: &Op, r: VReg) -> Result<[T; MAX_LANES], InterpError> {
        self.vregs
            .get(r.0 as usize)
            .copied()
            .flatten()
            .ok_or_else(|| InterpError::Undefined {
                op: format!("{op:?}"),
                what: format!("v{}", r.0),
            })
    }

    fn set(&mut self, op: &Op, r: VReg, v: [T; MAX_LANES]) -> Result<(), InterpError> {
        if let Some(decl) = self.program.masks.iter().find(|d| d.vreg == Some(r)) {
            if self.masks[decl.mask.0 as usize].is_some() {
                return Err(InterpError::MaskClobbered {
                    op: format!("{op:?}"),
                    vreg: r,
                });
            }
        }
        let slot = self
            .vregs
            .get_mut(r.0 as usize)
            .ok_or_else(|| InterpError::Undefined {
                op: format!("{op:?}"),
                what: format!(
                    "v{} (beyond the program's {} registers)",
                    r.0, self.program.vregs
                ),
            })?;
        *slot = Some(v);
        Ok(())
    }

    fn gpr(&self, op: &Op, g: Gpr) -> Result<Value, InterpError> {
        if g == Gpr::SCRATCH {
            return Ok(Value::Address {
                region: Region::Scratch,
                offset: 0,
            });
        }
        self.gprs
            .get(g.0 as usize)
            .copied()
            .flatten()
            .ok_or_else(|| InterpError::Undefined {
                op: format!("{op:?}"),
                what: g.to_string(),
            })
    }

    /// The region `addr` points into and its byte offset there (unchecked).
    fn address(&self, op: &Op, addr: Addr) -> Result<(Region, i64), InterpError> {
        match self.gpr(op, addr.base)? {
            Value::Address { region, offset } => Ok((region, offset + addr.offset as i64)),
            Value::Count(_) => Err(InterpError::NotAnAddress {
                op: format!("{op:?}"),
                gpr: addr.base,
            }),
        }
    }

    /// The element index `lane` elements past `addr`, checked against its region.
    fn locate(&self, op: &Op, addr: Addr, lane: usize) -> Result<(Region, usize), InterpError> {
        let elt = T::DTYPE.size();
        let (region, base) = self.address(op, addr)?;
        let offset = base + (lane * elt) as i64;
        if offset % elt as i64 != 0 {
            return Err(InterpError::Misaligned {
                op: format!("{op:?}"),
                region: region.name(),
                offset,
            });
        }
        let len = match region {
            Region::A => self.a.len(),
            Region::B => self.b.len(),
            Region::C => self.c.len(),
            Region::Scratch => self.scratch.len(),
            // Only LoadAddress reads the pointer arrays.
            Region::Pointers(_) => 0,
        };
        if offset < 0 || offset as usize / elt >= len {
            return Err(InterpError::OutOfBounds {
                op: format!("{op:?}"),
                region: region.name(),
                offset,
                bytes: elt,
                len: len * elt,
            });
        }
        Ok((region, offset as usize / elt))
    }

    fn read(&self, op: &Op, addr: Addr, lane: usize) -> Result<T, InterpError> {
        let (region, i) = self.locate(op, addr, lane)?;
        match region {
            Region::A => Ok(self.a[i]),
            Region::B => Ok(self.b[i]),
            Region::C => Ok(self.c[i]),
            Region::Scratch => self.scratch[i].ok_or_else(|| InterpError::Undefined {
                op: format!("{op:?}"),
                what: format!("scratch element {i}"),
            }),
            Region::Pointers(_) => Err(InterpError::OutOfBounds {
                op: format!("{op:?} (reads an array of pointers as data)"),
                region: region.name(),
                offset: i as i64,
                bytes: T::DTYPE.size(),
                len: 0,
            }),
        }
    }

    fn write(&mut self, op: &Op, addr: Addr, lane: usize, x: T) -> Result<(), InterpError> {
        match self.locate(op, addr, lane)? {
            (Region::C, i) => self.c[i] = x,
            (Region::Scratch, i) => self.scratch[i] = Some(x),
            (region, _) => {
                return Err(InterpError::OutOfBounds {
                    op: format!("{op:?} (a write)"),
                    region: region.name(),
                    offset: 0,
                    bytes: 0,
                    len: 0,
                })
            }
        }
        Ok(())
    }
}
