"""Static check of a compiled Hopper kernel: may an instruction overwrite the registers of a
register-operand wgmma still in flight?

A wgmma whose left operand sits in registers (SASS ``HGMMA ... R24, R116, gdesc[...]``) reads
those registers asynchronously, until a ``WARPGROUP.DEPBAR.LE gsb0, N`` retires it; PTX leaves
writing them before then undefined. Triton keeps such wgmmas in flight across loop steps
(triton-lang/triton#9433), and in the SASS of the int4 frag kernel the next step may write
registers a pending wgmma still reads: under Triton 3.7 and 3.8 with their own ptxas, 3.6 with
each ptxas tried (12.8, 13.0, 13.4), and 3.9 with any but its own (CUDA 13.4) (docs/kernels.md,
"int4_w4a16"; int4.mma_wait). The writes are fixed at compile time: this walks the SASS in order
(forward branches not taken, each backward branch around a wgmma taken twice, so the main loop
runs three times), tracks the wgmma groups in flight (each group closed by the wgmma that carries
``gsb0``, retired oldest first by ``DEPBAR.LE``), and reports every register write into a pending
wgmma's operand or accumulator (fp32 accumulators).

Needs the ``cuobjdump`` that Triton's NVIDIA backend ships (no GPU).
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field

import triton

_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_HGMMA = re.compile(r"HGMMA\.64x(\d+)x\d+\.\S+\s+R(\d+),\s*(R(\d+)|gdesc\[[^\]]*\])")
_DEPBAR = re.compile(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x([0-9a-f]+)")
_DEST = re.compile(r"^(?:@!?U?P[T\d]\s+)?([A-Z0-9_]+)((?:\.[A-Za-z0-9_]+)*)\s+(R\d+)\b")
_BRANCH = re.compile(r"^(?:@!?U?P[T\d]\s+)?BRA\s+(?:`\(\S+\)\s*)?0x([0-9a-f]+)")


def cuobjdump() -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def sass(cubin: bytes) -> list[tuple[int, str]]:
    """(address, instruction) of every instruction of the cubin's kernel."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([cuobjdump(), "-sass", f.name], capture_output=True, text=True,
                             check=True).stdout
    return [(int(m.group(1), 16), m.group(2)) for line in out.splitlines()
            for m in [_INSTR.search(line)] if m]


def _width(opcode: str, mods: str) -> int:
    """Registers an instruction's destination spans."""
    m = set(mods.split("."))
    if "128" in m or "x4" in m:
        return 4
    if "64" in m or "x2" in m or "WIDE" in m or (opcode.startswith(("D", "F2F")) and "F64" in m):
        return 2
    return 1


@dataclass
class _Group:
    operands: set[int] = field(default_factory=set)      # registers of register operands
    accumulators: set[int] = field(default_factory=set)
    at: list[int] = field(default_factory=list)          # addresses of its wgmmas


def _trace(ins: list[tuple[int, str]], steps: int) -> list[tuple[int, str]]:
    """The instructions in order with each backward branch whose body holds a wgmma taken
    `steps` times (nested loops included), forward branches not taken."""
    addr = {a: i for i, (a, _) in enumerate(ins)}
    taken: dict[int, int] = {}
    out, i = [], 0
    while i < len(ins):
        a, text = ins[i]
        out.append((a, text))
        m = _BRANCH.match(text)
        if m and int(m.group(1), 16) < a and int(m.group(1), 16) in addr:
            j = addr[int(m.group(1), 16)]
            if any("HGMMA" in t for _, t in ins[j:i]) and taken.get(i, 0) < steps - 1:
                taken[i] = taken.get(i, 0) + 1
                i = j
                continue
        if text.startswith(("EXIT", "BRA")) and not m:
            break
        i += 1
    return out


def hazards(ins: list[tuple[int, str]], steps: int = 3) -> list[str]:
    """Every write into a register a pending wgmma reads or accumulates into, as text."""
    found: list[str] = []
    pending: list[_Group] = []
    open_group = _Group()
    for a, text in _trace(ins, steps):
        h = _HGMMA.search(text)
        if h:
            n, acc = int(h.group(1)), int(h.group(2))
            if h.group(4) is not None:
                open_group.operands.update(range(int(h.group(4)), int(h.group(4)) + 4))
            open_group.accumulators.update(range(acc, acc + n // 2))
            open_group.at.append(a)
            if "gsb0" in text:
                pending.append(open_group)
                open_group = _Group()
            continue
        d = _DEPBAR.search(text)
        if d:
            keep = int(d.group(1), 16)
            pending = pending[len(pending) - keep:] if keep else []
            continue
        m = _DEST.match(text)
        if not m or m.group(1).startswith(("ST", "RED", "BAR", "WARPGROUP", "HGMMA")):
            continue
        first = int(m.group(3)[1:])
        written = set(range(first, first + _width(m.group(1), m.group(2))))
        for g in pending + ([open_group] if open_group.at else []):
            if written & g.operands:
                found.append(f"{a:#06x} {text}: overwrites operand R{min(written & g.operands)} "
                             f"of the wgmma at {g.at[0]:#06x}, in flight")
            elif written & g.accumulators:
                found.append(f"{a:#06x} {text}: writes accumulator R{min(written & g.accumulators)} "
                             f"of the wgmma at {g.at[0]:#06x}, in flight")
    return sorted(set(found))


def register_operand_wgmmas(ins: list[tuple[int, str]]) -> int:
    return sum(1 for _, t in ins if (h := _HGMMA.search(t)) and h.group(4) is not None)


def check_cubin(cubin: bytes) -> tuple[int, list[str]]:
    """(register-operand wgmmas in the kernel, hazards found)."""
    ins = sass(cubin)
    return register_operand_wgmmas(ins), hazards(ins)
