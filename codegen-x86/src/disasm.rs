//! Disassembly of emitted kernels to Intel syntax (iced-x86's formatter).

use iced_x86::{Decoder, DecoderOptions, Formatter, Instruction, IntelFormatter};

use smallgemm_ir::MachineCode;

/// One line per instruction: offset, encoded bytes, Intel syntax.
pub fn disassemble(bytes: &[u8]) -> String {
    let mut decoder = Decoder::with_ip(64, bytes, 0, DecoderOptions::NONE);
    let mut formatter = IntelFormatter::new();
    formatter.options_mut().set_hex_prefix("0x");
    formatter.options_mut().set_hex_suffix("");
    formatter.options_mut().set_uppercase_hex(false);
    // Every number in hex, branch targets as short as the offsets in the first column: by
    // default iced writes -9..9 in decimal and targets with 16 digits ("jne 9" beside
    // "je 0x00000000000008a3").
    formatter
        .options_mut()
        .set_small_hex_numbers_in_decimal(false);
    formatter.options_mut().set_branch_leading_zeros(false);
    formatter
        .options_mut()
        .set_space_after_operand_separator(true);
    formatter.options_mut().set_first_operand_char_index(12);
    let mut out = String::new();
    let mut text = String::new();
    let mut instruction = Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut instruction);
        text.clear();
        formatter.format(&instruction, &mut text);
        let start = instruction.ip() as usize;
        let hex: Vec<String> = bytes[start..start + instruction.len()]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        out.push_str(&format!("{start:04x}  {:<30} {text}\n", hex.join(" ")));
    }
    out
}

/// The listing of a kernel: its instructions, then its constants as 32-byte rows.
pub fn listing(code: &MachineCode) -> String {
    let mut out = disassemble(&code.bytes[..code.code_len]);
    for (row, chunk) in code.bytes[code.code_len..].chunks(32).enumerate() {
        let hex: Vec<String> = chunk.iter().map(|b| format!("{b:02x}")).collect();
        out.push_str(&format!(
            "{:04x}  .data {}\n",
            code.code_len + row * 32,
            hex.join(" ")
        ));
    }
    out
}
