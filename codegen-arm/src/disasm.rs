//! Disassembly of emitted kernels (yaxpeax-arm: pure Rust, and it decodes post-indexed and
//! lane forms of `ld1`/`st1` correctly).

use smallgemm_ir::MachineCode;
use yaxpeax_arch::{Decoder, U8Reader};
use yaxpeax_arm::armv8::a64::InstDecoder;

/// One line per instruction: offset, the instruction word, assembly. A word that does not
/// decode is shown as `.word`.
pub fn disassemble(bytes: &[u8]) -> String {
    let decoder = InstDecoder::default();
    let mut out = String::new();
    for (i, chunk) in bytes.chunks(4).enumerate() {
        let offset = 4 * i;
        if chunk.len() < 4 {
            let hex: Vec<String> = chunk.iter().map(|b| format!("{b:02x}")).collect();
            out.push_str(&format!("{offset:04x}  .byte {}\n", hex.join(" ")));
            continue;
        }
        let word = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        let mut reader = U8Reader::new(chunk);
        let text = match decoder.decode(&mut reader) {
            Ok(instruction) => instruction.to_string(),
            Err(e) => format!(".word {word:#010x} ; {e}"),
        };
        out.push_str(&format!("{offset:04x}  {word:08x}  {text}\n"));
    }
    out
}

/// The listing of a kernel (NEON kernels have no constants after the code).
pub fn listing(code: &MachineCode) -> String {
    disassemble(&code.bytes[..code.code_len.min(code.bytes.len())])
}
