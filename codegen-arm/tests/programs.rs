//! Hand-written Programs for the corners the lowering rarely reaches: offsets beyond every
//! immediate form (scaled, unscaled, negative), pointer steps beyond 24 bits, constant loop
//! counts beyond 16 bits. Each runs in the emulator and in the interpreter.

mod common;

use common::run_emulated;
use smallgemm_ir::{interpret, Addr, Dtype, Gpr, Op, Program, Trips, VReg};

fn program(ops: Vec<Op>) -> Program {
    Program {
        dtype: Dtype::F64,
        lanes: 2,
        params: vec![],
        scratch_bytes: 0,
        vregs: 3,
        gprs: 6,
        masks: vec![],
        ops: vec![Op::Loop {
            counter: Gpr::BATCH,
            trips: Trips::Register,
            body: ops,
        }],
    }
}

#[test]
fn far_and_negative_offsets_and_wide_steps() {
    let (v0, v1, v2) = (VReg(0), VReg(1), VReg(2));
    let g = Gpr(4);
    let counter = Gpr(5);
    let ops = vec![
        // Far past ldr q's 65520 and not a multiple of 16.
        Op::Load {
            dst: v0,
            addr: Addr::new(Gpr::A, 70_008),
            mask: None,
        },
        Op::Copy {
            dst: g,
            src: Gpr::A,
        },
        Op::AddImm { dst: g, imm: 4096 },
        // Negative: unscaled (-256..255) and beyond it.
        Op::Load {
            dst: v1,
            addr: Addr::new(g, -200),
            mask: None,
        },
        Op::Load {
            dst: v2,
            addr: Addr::new(g, -4000),
            mask: None,
        },
        Op::Add {
            dst: v0,
            a: v0,
            b: v1,
        },
        Op::Add {
            dst: v0,
            a: v0,
            b: v2,
        },
        // A step that needs movz/movk, there and back.
        Op::AddImm {
            dst: g,
            imm: 0x0123_4568,
        },
        Op::AddImm {
            dst: g,
            imm: -0x0123_4568,
        },
        Op::Load {
            dst: v1,
            addr: Addr::new(g, 8),
            mask: None,
        },
        Op::Add {
            dst: v0,
            a: v0,
            b: v1,
        },
        // A constant loop of 70000 trips (movz + movk) around an FMA by lane.
        Op::Loop {
            counter,
            trips: Trips::Const(70_000),
            body: vec![Op::FmaLane {
                acc: v0,
                a: v1,
                b: v2,
                lane: 1,
                negate: true,
            }],
        },
        Op::Store {
            addr: Addr::new(Gpr::C, 40_000),
            src: v0,
            mask: None,
        },
        Op::AddImm {
            dst: Gpr::C,
            imm: 16,
        },
    ];
    let p = program(ops);
    let code = smallgemm_codegen_arm::emit(&p).unwrap();
    let a: Vec<f64> = (0..9000).map(|i| 1.0 + (i % 97) as f64 / 128.0).collect();
    let mut c = vec![0.5f64; 5004];
    let mut expected = c.clone();
    run_emulated(&code.bytes, &a, &[0.0], &mut c, None, 2, &[]).unwrap_or_else(|e| {
        panic!("{e}\n{}", smallgemm_codegen_arm::listing(&code));
    });
    interpret(&p, &a, &[0.0], &mut expected, 2, &[]).unwrap();
    assert_eq!(c, expected);
    assert_ne!(c[5000], 0.5, "the kernel stored nothing");
}

/// A general register past the program's count is one the prologue does not save: emitting
/// a program that uses it is an error, not code that clobbers the caller's register.
#[test]
fn undeclared_general_registers_are_an_error() {
    let copy = |dst| {
        vec![Op::Copy {
            dst: Gpr(dst),
            src: Gpr::A,
        }]
    };
    assert!(smallgemm_codegen_arm::emit(&program(copy(5))).is_ok());
    assert!(matches!(
        smallgemm_codegen_arm::emit(&program(copy(6))),
        Err(smallgemm_codegen_arm::EmitError::UndeclaredGeneralRegister(
            6
        ))
    ));
}
