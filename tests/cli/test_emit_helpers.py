"""attngen build --emit block-mask: the block-mask builder a foreign runtime runs before a mask
custom kernel (docs/web.md); other kernels and targets have none, which is a usage error."""

from __future__ import annotations

import json

from attngen.cli import main


def test_the_builder_of_a_custom_mask_kernel(tmp_path, capsys):
    spec = tmp_path / "c.attn"
    spec.write_text("attention c {\n head_dim 32\n dtype f32\n mask custom\n}\n")
    assert main(["build", str(spec), "--target", "wgsl", "--emit", "block-mask"]) == 0
    src = capsys.readouterr().out
    assert "fn block_mask_classify(" in src and "fn block_mask_compact(" in src
    assert main(["build", str(spec), "--target", "wgsl", "--emit", "manifest"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert [e["entry_point"] for e in m["block_mask"]["entry_points"]] == ["block_mask_classify", "block_mask_compact"]
    assert m["block_mask"]["fill_word"] == 0xFFFFFFFF


def test_no_builder_is_a_usage_error(tmp_path, capsys):
    plain = tmp_path / "p.attn"
    plain.write_text("attention p {\n head_dim 32\n dtype f32\n mask causal\n}\n")
    assert main(["build", str(plain), "--target", "wgsl", "--emit", "block-mask"]) == 2
    assert "emits no block-mask for kernel 'p'" in capsys.readouterr().err
    custom = tmp_path / "c.attn"
    custom.write_text("attention c {\n head_dim 32\n dtype f32\n mask custom\n}\n")
    assert main(["build", str(custom), "--target", "cuda", "--emit", "block-mask"]) == 2
    assert "target cuda emits no block-mask" in capsys.readouterr().err


def test_the_builder_of_a_mask_over_inputs(tmp_path, capsys):
    """wgsl: the expression's builder (block_mask_fill, then the two entry points above) for the tiles
    of the same spec with `mask custom`; an index-only expression has none."""
    import attngen
    from attngen.plan.mask_inputs import custom_spec
    spec = tmp_path / "d.attn"
    spec.write_text("attention d {\n head_dim 64\n dtype f16\n input doc[b, q] i32\n"
                    " mask k <= q && doc[b, q] == doc[b, k]\n}\n")
    assert main(["build", str(spec), "--target", "wgsl", "--emit", "block-mask"]) == 0
    src = capsys.readouterr().out
    assert "fn block_mask_fill(" in src and "fn in_doc(" in src and "fn block_mask_compact(" in src
    plan = attngen.lower(custom_spec(attngen.load(str(spec))), "wgsl")
    assert f"const TILE_Q: u32 = {plan.tile_q}u;" in src and f"const TILE_KV: u32 = {plan.tile_kv}u;" in src
    spec.write_text("attention e {\n head_dim 64\n dtype f16\n mask k <= q && q - k < 8\n}\n")
    assert main(["build", str(spec), "--target", "wgsl", "--emit", "block-mask"]) == 2
    assert "emits no block-mask for kernel 'e'" in capsys.readouterr().err
