/**
 * A tiny assembler for the classic-BPF subset a seccomp filter needs: absolute 32-bit loads,
 * forward conditional jumps to named labels, and returns.
 */

/** Size in bytes of one `struct sock_filter`: u16 code, u8 jt, u8 jf, u32 k. */
export const BPF_INSTRUCTION_SIZE = 8;

/** The kernel refuses longer programs (BPF_MAXINSNS). */
export const BPF_MAX_INSTRUCTIONS = 4096;

/** Opcodes (class | size/op | mode/source), as in linux/bpf_common.h. */
export const BPF_OP = {
  /** BPF_LD | BPF_W | BPF_ABS: A = u32 at offset k of seccomp_data. */
  LD_W_ABS: 0x20,
  /** BPF_JMP | BPF_JEQ | BPF_K */
  JEQ_K: 0x15,
  /** BPF_JMP | BPF_JGE | BPF_K (unsigned) */
  JGE_K: 0x35,
  /** BPF_JMP | BPF_JSET | BPF_K: jump when A & k is not zero. */
  JSET_K: 0x45,
  /** BPF_RET | BPF_K */
  RET_K: 0x06,
} as const;

/** One decoded `struct sock_filter`. */
export interface BpfInstruction {
  code: number;
  jt: number;
  jf: number;
  k: number;
}

/** Where a conditional jump goes: a label defined later, or the next instruction. */
export type JumpTarget = string | typeof NEXT;

/** Jump target meaning "fall through to the following instruction". */
export const NEXT: unique symbol = Symbol('next');

type Pending = { code: number; k: number; jt: JumpTarget; jf: JumpTarget };

/**
 * Collects instructions and labels, then resolves every jump into the 8-bit relative offsets
 * classic BPF allows. Jumps only go forward, so a label must be defined after its users.
 */
export class BpfAssembler {
  private readonly instructions: Pending[] = [];
  private readonly labels = new Map<string, number>();

  /** A = the 32-bit word at `offset` in `struct seccomp_data`. */
  load(offset: number): this {
    return this.push(BPF_OP.LD_W_ABS, offset, NEXT, NEXT);
  }

  /** Jump to `jt` when A === k, else to `jf`. */
  jeq(k: number, jt: JumpTarget, jf: JumpTarget = NEXT): this {
    return this.push(BPF_OP.JEQ_K, k, jt, jf);
  }

  /** Jump to `jt` when A >= k (unsigned), else to `jf`. */
  jge(k: number, jt: JumpTarget, jf: JumpTarget = NEXT): this {
    return this.push(BPF_OP.JGE_K, k, jt, jf);
  }

  /** Jump to `jt` when (A & k) !== 0, else to `jf`. */
  jset(k: number, jt: JumpTarget, jf: JumpTarget = NEXT): this {
    return this.push(BPF_OP.JSET_K, k, jt, jf);
  }

  /** Return `k` (a SECCOMP_RET_* action) to the kernel. */
  ret(k: number): this {
    return this.push(BPF_OP.RET_K, k, NEXT, NEXT);
  }

  /** Name the position of the next instruction. */
  label(name: string): this {
    if (this.labels.has(name)) throw new Error(`BPF label "${name}" defined twice`);
    this.labels.set(name, this.instructions.length);
    return this;
  }

  /** Resolve labels; throws when a label is missing, behind its jump, or over 255 away. */
  assemble(): BpfInstruction[] {
    if (this.instructions.length > BPF_MAX_INSTRUCTIONS) {
      throw new Error(`BPF program has ${this.instructions.length} instructions`);
    }
    return this.instructions.map(({ code, k, jt, jf }, index) => ({
      code,
      k,
      jt: this.offset(index, jt),
      jf: this.offset(index, jf),
    }));
  }

  private offset(index: number, target: JumpTarget): number {
    if (target === NEXT) return 0;
    const position = this.labels.get(target);
    if (position === undefined) throw new Error(`BPF label "${target}" is not defined`);
    const offset = position - index - 1;
    if (offset < 0) throw new Error(`BPF label "${target}" is behind instruction ${index}`);
    if (offset > 255) throw new Error(`BPF jump to "${target}" is ${offset} > 255 instructions`);
    return offset;
  }

  private push(code: number, k: number, jt: JumpTarget, jf: JumpTarget): this {
    if (!Number.isInteger(k) || k < 0 || k > 0xffffffff) throw new Error(`BPF constant ${k}`);
    this.instructions.push({ code, k, jt, jf });
    return this;
  }
}

/** The raw `struct sock_filter` array, little-endian (x86_64 and arm64). */
export function encodeBpf(program: readonly BpfInstruction[]): Buffer {
  const buffer = Buffer.alloc(program.length * BPF_INSTRUCTION_SIZE);
  program.forEach(({ code, jt, jf, k }, index) => {
    const at = index * BPF_INSTRUCTION_SIZE;
    buffer.writeUInt16LE(code, at);
    buffer.writeUInt8(jt, at + 2);
    buffer.writeUInt8(jf, at + 3);
    buffer.writeUInt32LE(k, at + 4);
  });
  return buffer;
}

/** Inverse of {@link encodeBpf}. */
export function decodeBpf(bytes: Buffer): BpfInstruction[] {
  if (bytes.length % BPF_INSTRUCTION_SIZE !== 0) {
    throw new Error(`BPF program of ${bytes.length} bytes is not a whole number of instructions`);
  }
  const program: BpfInstruction[] = [];
  for (let at = 0; at < bytes.length; at += BPF_INSTRUCTION_SIZE) {
    program.push({
      code: bytes.readUInt16LE(at),
      jt: bytes.readUInt8(at + 2),
      jf: bytes.readUInt8(at + 3),
      k: bytes.readUInt32LE(at + 4),
    });
  }
  return program;
}
