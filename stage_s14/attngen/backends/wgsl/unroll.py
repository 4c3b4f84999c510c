"""Loops over an invocation's sub-block, unrolled in the WGSL source (issue 13).

The register-tiled kernel keeps each invocation's rows, keys and column groups in small arrays
(acc, s, part, m_i, l_i, ...) that loops index by their counters (templates/wgsl). A driver
that does not unroll such a loop must keep the array in memory rather than registers, and then
every multiply-add of the products costs loads and stores (benchmarks/probes/probe_wgsl_arrays.py
measures the two forms). WGSL has no unroll attribute, so the generator unrolls them itself:
a loop

    for (var i = 0u; i < ROWS; i++) {
        body
    }

whose bound is one of the sub-block's constants (ROWS, KEYS, COL_GROUPS, ACC_GROUPS, the
4 lanes of a vec4, the head-dim chunk counts D_TILES_QK / D_TILES_V when small, and the
prefetched tiles' register counts Q_ITEMS / K_ITEMS / V_ITEMS; the decode kernel's CHUNKS_K /
CHUNKS_V / GROUPS / Q_GROUPS, with its ROWS, KEYS and ACC_GROUPS) becomes
one block per value of the counter, each declaring the counter as a `const`, so that every
index into those arrays is a constant expression:

    // for i < ROWS (4), unrolled: one block per i
    {
        const i = 0u;
        body
    }
    ...

Loops nest (inner ones are unrolled first). A loop whose body holds `continue` or `break`, or
whose unrolled form would pass UNROLL_MAX_LINES lines, is left as written. The pass reads the
constants' values from the source's own `const NAME: u32 = Nu;` lines; it changes no
computation and no order of floating-point operations.
"""

from __future__ import annotations

import re

# Loop bounds that are unrolled: (constant name, largest value unrolled)
UNROLL_BOUNDS = {"ROWS": 16, "KEYS": 16, "COL_GROUPS": 16, "ACC_GROUPS": 32, "4u": 4, "D_TILES_QK": 4,
                 "D_TILES_V": 4, "Q_ITEMS": 16, "K_ITEMS": 16, "V_ITEMS": 16,
                 # the decode kernel's (templates/wgsl/decode.wgsl.j2): items per key row and invocation,
                 # vec4 groups per item, and the q vec4 per row
                 "CHUNKS_K": 16, "CHUNKS_V": 16, "GROUPS": 4, "Q_GROUPS": 32}
UNROLL_MAX_LINES = 4000  # the unrolled form of one loop, in lines

_CONST = re.compile(r"^const (\w+): u32 = (\d+)u;", re.M)
_FOR = re.compile(r"^(\s*)for \(var (\w+) = 0u; \2 < (\w+); \2\+\+\) \{\s*(//.*)?$")
_JUMP = re.compile(r"\b(continue|break)\s*;")


def _braces(line: str) -> int:
    code = line.split("//", 1)[0]
    return code.count("{") - code.count("}")


def _process(lines: list[str], values: dict[str, int]) -> list[str]:
    out: list[str] = []
    n = 0
    while n < len(lines):
        line = lines[n]
        m = _FOR.match(line)
        if not m:
            out.append(line)
            n += 1
            continue
        # the loop's closing line: where the brace depth returns to zero
        depth, end = _braces(line), n + 1
        while end < len(lines) and depth + _braces(lines[end]) > 0:
            depth += _braces(lines[end])
            end += 1
        if end >= len(lines) or lines[end].strip() != "}":
            out.append(line)  # not a plain loop (or unbalanced): leave it
            n += 1
            continue
        indent, var, bound, comment = m.group(1), m.group(2), m.group(3), m.group(4)
        body = _process(lines[n + 1:end], values)
        count = 4 if bound == "4u" else values.get(bound)
        limit = UNROLL_BOUNDS.get(bound)
        if (count is None or limit is None or count > limit or any(_JUMP.search(b.split("//", 1)[0]) for b in body)
                or count * (len(body) + 3) > UNROLL_MAX_LINES):
            out.append(line)
            out.extend(body)
            out.append(lines[end])
        else:
            what = bound if bound == "4u" else f"{bound} ({count})"
            note = f"  {comment}" if comment else ""
            out.append(f"{indent}// for {var} < {what}, unrolled: one block per {var}{note}")
            for k in range(count):
                out.append(f"{indent}{{")
                out.append(f"{indent}    const {var} = {k}u;")
                out.extend(body)
                out.append(f"{indent}}}")
        n = end + 1
    return out


def unroll_loops(source: str) -> str:
    """The WGSL `source` with its sub-block loops unrolled (see the module docstring)."""
    values = {name: int(v) for name, v in _CONST.findall(source)}
    lines = source.split("\n")
    return "\n".join(_process(lines, values))
