//! Kernels as relocatable object files, for build systems that link pre-generated kernels
//! with no JIT at run time.
//!
//! Each kernel becomes one global function in `.text`. Kernels are position independent and
//! keep their constants after their own code, so an object needs no relocations and the same
//! writer serves every architecture and format.

use std::fmt;
use std::str::FromStr;

use object::write::{Object, StandardSection, Symbol, SymbolSection};
use object::{Architecture, BinaryFormat, Endianness, SymbolFlags, SymbolKind, SymbolScope};
use smallgemm_ir::{Dtype, Param};
use thiserror::Error;

/// An operating system and architecture to write objects for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ObjectTarget {
    X86_64Linux,
    X86_64Macos,
    X86_64Windows,
    Aarch64Linux,
    Aarch64Macos,
}

impl ObjectTarget {
    pub const ALL: [ObjectTarget; 5] = [
        ObjectTarget::X86_64Linux,
        ObjectTarget::X86_64Macos,
        ObjectTarget::X86_64Windows,
        ObjectTarget::Aarch64Linux,
        ObjectTarget::Aarch64Macos,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ObjectTarget::X86_64Linux => "x86_64-linux",
            ObjectTarget::X86_64Macos => "x86_64-macos",
            ObjectTarget::X86_64Windows => "x86_64-windows",
            ObjectTarget::Aarch64Linux => "aarch64-linux",
            ObjectTarget::Aarch64Macos => "aarch64-macos",
        }
    }

    /// True for x86-64 targets, false for AArch64.
    pub fn is_x86_64(self) -> bool {
        matches!(
            self,
            ObjectTarget::X86_64Linux | ObjectTarget::X86_64Macos | ObjectTarget::X86_64Windows
        )
    }

    /// True when functions follow the Microsoft x64 calling convention.
    pub fn is_windows(self) -> bool {
        self == ObjectTarget::X86_64Windows
    }

    fn format(self) -> (BinaryFormat, Architecture) {
        match self {
            ObjectTarget::X86_64Linux => (BinaryFormat::Elf, Architecture::X86_64),
            ObjectTarget::X86_64Macos => (BinaryFormat::MachO, Architecture::X86_64),
            ObjectTarget::X86_64Windows => (BinaryFormat::Coff, Architecture::X86_64),
            ObjectTarget::Aarch64Linux => (BinaryFormat::Elf, Architecture::Aarch64),
            ObjectTarget::Aarch64Macos => (BinaryFormat::MachO, Architecture::Aarch64),
        }
    }
}

impl FromStr for ObjectTarget {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        ObjectTarget::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = ObjectTarget::ALL.iter().map(|t| t.name()).collect();
                format!(
                    "unknown object target {s:?} (expected one of {})",
                    names.join(", ")
                )
            })
    }
}

impl fmt::Display for ObjectTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ObjectError {
    #[error("{0:?} is not a C identifier (letters, digits and _, not starting with a digit)")]
    BadName(String),
    #[error("the function name {0:?} appears twice")]
    DuplicateName(String),
    #[error("an object needs at least one function")]
    Empty,
    #[error("cannot write the object: {0}")]
    Write(String),
}

/// One function of an object: its symbol name and machine code (entry at offset 0).
#[derive(Clone, Copy, Debug)]
pub struct Function<'a> {
    pub name: &'a str,
    pub code: &'a [u8],
}

fn check_name(name: &str) -> Result<(), ObjectError> {
    let mut chars = name.chars();
    let ok = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(ObjectError::BadName(name.to_string()))
    }
}

/// A relocatable object for `target` holding `functions` as global symbols (Mach-O adds
/// its leading underscore itself).
pub fn write_object(
    target: ObjectTarget,
    functions: &[Function<'_>],
) -> Result<Vec<u8>, ObjectError> {
    if functions.is_empty() {
        return Err(ObjectError::Empty);
    }
    for (i, f) in functions.iter().enumerate() {
        check_name(f.name)?;
        if functions[..i].iter().any(|g| g.name == f.name) {
            return Err(ObjectError::DuplicateName(f.name.to_string()));
        }
    }
    let (format, arch) = target.format();
    let mut obj = Object::new(format, arch, Endianness::Little);
    if format == BinaryFormat::Elf {
        // Without it, linkers assume the object needs an executable stack.
        obj.add_section(
            Vec::new(),
            b".note.GNU-stack".to_vec(),
            object::SectionKind::Other,
        );
    }
    let text = obj.section_id(StandardSection::Text);
    for f in functions {
        // 64-byte alignment keeps each kernel's loop heads and constants cache-line aligned.
        let offset = obj.append_section_data(text, f.code, 64);
        obj.add_symbol(Symbol {
            name: f.name.as_bytes().to_vec(),
            value: offset,
            size: f.code.len() as u64,
            kind: SymbolKind::Text,
            scope: SymbolScope::Dynamic,
            weak: false,
            section: SymbolSection::Section(text),
            flags: SymbolFlags::None,
        });
    }
    obj.write().map_err(|e| ObjectError::Write(e.to_string()))
}

/// The C prototype of an emitted kernel: `void NAME(const T *a, const T *b, T *c,
/// size_t batch[, T alpha][, T beta]);` with the run-time scalars the kernel takes.
pub fn c_prototype(name: &str, dtype: Dtype, params: &[Param]) -> String {
    let t = match dtype {
        Dtype::F64 => "double",
        Dtype::F32 => "float",
        Dtype::F16 => "_Float16",
    };
    let mut args = format!("const {t} *a, const {t} *b, {t} *c, size_t batch");
    for p in params {
        args.push_str(&format!(
            ", {t} {}",
            match p {
                Param::Alpha => "alpha",
                Param::Beta => "beta",
            }
        ));
    }
    format!("void {name}({args});")
}

/// A C header declaring `prototypes`, with an include guard derived from `guard`.
pub fn c_header(guard: &str, prototypes: &[String]) -> String {
    let guard: String = guard
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    let mut h = format!(
        "/* Generated by smallgemm emit. Column-major kernels: C = alpha op(A) op(B) + beta C\n \
         * for `batch` matrices packed back to back (see the emit command for the spec). */\n\
         #ifndef {guard}_H\n#define {guard}_H\n\n#include <stddef.h>\n\n\
         #ifdef __cplusplus\nextern \"C\" {{\n#endif\n\n"
    );
    for p in prototypes {
        h.push_str(p);
        h.push('\n');
    }
    h.push_str("\n#ifdef __cplusplus\n}\n#endif\n\n#endif\n");
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::{Object as _, ObjectSection, ObjectSymbol};

    #[test]
    fn every_target_writes_readable_objects_with_global_functions() {
        let code = [0xc3u8, 0x90, 0x90, 0x90];
        for target in ObjectTarget::ALL {
            let bytes = write_object(
                target,
                &[
                    Function {
                        name: "k1",
                        code: &code,
                    },
                    Function {
                        name: "k2",
                        code: &code[..1],
                    },
                ],
            )
            .unwrap();
            let file = object::File::parse(&*bytes).unwrap();
            let (format, arch) = target.format();
            assert_eq!((file.format(), file.architecture()), (format, arch));
            let names: Vec<String> = file
                .symbols()
                .filter(|s| s.is_global() && s.kind() == SymbolKind::Text)
                .map(|s| s.name().unwrap().trim_start_matches('_').to_string())
                .collect();
            assert_eq!(names, ["k1", "k2"], "{target}");
            let relocations: usize = file.sections().map(|s| s.relocations().count()).sum();
            assert_eq!(relocations, 0, "{target}");
        }
    }

    #[test]
    fn bad_input_is_an_error() {
        let f = |name| Function {
            name,
            code: &[0xc3],
        };
        assert_eq!(
            write_object(ObjectTarget::X86_64Linux, &[f("1abc")]),
            Err(ObjectError::BadName("1abc".into()))
        );
        assert_eq!(
            write_object(ObjectTarget::X86_64Linux, &[f("a-b")]),
            Err(ObjectError::BadName("a-b".into()))
        );
        assert_eq!(
            write_object(ObjectTarget::X86_64Linux, &[f("k"), f("k")]),
            Err(ObjectError::DuplicateName("k".into()))
        );
        assert_eq!(
            write_object(ObjectTarget::X86_64Linux, &[]),
            Err(ObjectError::Empty)
        );
        assert!("x86_64-plan9".parse::<ObjectTarget>().is_err());
    }

    #[test]
    fn prototypes_follow_the_scalars() {
        assert_eq!(
            c_prototype("k", Dtype::F64, &[]),
            "void k(const double *a, const double *b, double *c, size_t batch);"
        );
        assert_eq!(
            c_prototype("k", Dtype::F32, &[Param::Beta]),
            "void k(const float *a, const float *b, float *c, size_t batch, float beta);"
        );
        let h = c_header("my-kernels", &[c_prototype("k", Dtype::F32, &[])]);
        assert!(h.contains("#ifndef MY_KERNELS_H") && h.contains("void k("));
    }
}
