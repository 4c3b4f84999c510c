"""The WGSL generator unrolls the loops over an invocation's sub-block (attngen/backends/wgsl/unroll.py)."""

import re

import attngen
from attngen.backends.wgsl.unroll import unroll_loops


SRC = """const ROWS: u32 = 3u;
const KEYS: u32 = 2u;
const TILE_KV: u32 = 64u;
fn f() {
    var acc: array<array<f32, KEYS>, ROWS>;
    for (var i = 0u; i < ROWS; i++) {  // each row
        let r = i * 2u;
        for (var u = 0u; u < KEYS; u++) {
            acc[i][u] += f32(r + u);
        }
    }
    for (var j = 0u; j < TILE_KV; j++) {
        acc[0][0] += 1.0;
    }
    for (var i = 0u; i < ROWS; i++) {
        if (i == 1u) {
            continue;
        }
        acc[i][0] = 0.0;
    }
}
"""


def test_sub_block_loops_become_blocks_with_constant_counters():
    out = unroll_loops(SRC)
    assert out.count("const i = ") == 3 and out.count("const u = ") == 6  # nested: 3 x 2
    assert [int(n) for n in re.findall(r"const i = (\d+)u;", out)] == [0, 1, 2]
    assert "// for i < ROWS (3), unrolled: one block per i  // each row" in out
    # a loop over keys of the tile (not a sub-block constant) and one with `continue` stay loops
    assert "for (var j = 0u; j < TILE_KV; j++) {" in out
    assert out.count("for (var i = 0u; i < ROWS; i++) {") == 1 and "continue;" in out
    assert out.count("{") == out.count("}")


def test_the_kernel_indexes_its_arrays_with_constants():
    spec = attngen.parse("attention t {\n head_dim 128\n dtype f16\n}\n")[0]
    src = attngen.emit(spec, target="wgsl", profile="wgpu-vulkan-nvidia").source
    for bound in ("ROWS", "KEYS", "COL_GROUPS", "ACC_GROUPS"):
        assert not re.search(rf"for \(var \w+ = 0u; \w+ < {bound};", src), bound
    assert "const i = 3u;" in src and "const u = 3u;" in src  # 4 rows x 4 keys per invocation
    assert attngen.emit(spec, target="wgsl", profile="wgpu-vulkan-nvidia").source == src  # deterministic
