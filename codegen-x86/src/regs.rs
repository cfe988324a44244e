//! Register mapping: the Program's numbered registers onto x86-64 registers.

use iced_x86::Register;
use smallgemm_ir::Gpr;

use crate::EmitError;

/// AVX-512 opmask register for mask number `i` (k0 means "no mask", so masks start at k1).
pub(crate) fn opmask(i: u8) -> Result<Register, EmitError> {
    if i >= 7 {
        return Err(EmitError::TooManyMasks(i as usize + 1));
    }
    Ok(nth(Register::K1, i as usize))
}

/// The general register `g` is allocated to, per the calling convention's table.
pub(crate) fn general(table: &[Register], declared: usize, g: Gpr) -> Result<Register, EmitError> {
    if g == Gpr::SCRATCH {
        return Ok(Register::RSP);
    }
    // A register past the program's count is one the prologue did not save.
    if g.0 as usize >= declared {
        return Err(EmitError::UndeclaredGeneralRegister(g.0));
    }
    table
        .get(g.0 as usize)
        .copied()
        .ok_or(EmitError::TooManyGeneralRegisters {
            needed: g.0 as usize + 1,
            available: table.len(),
        })
}

fn nth(first: Register, i: usize) -> Register {
    Register::try_from(first as usize + i).expect("register numbers are checked against the target")
}
