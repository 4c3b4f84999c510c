"""`attngen check DIR` and `attngen build DIR -o OUT`: every *.attn file of a directory."""

from __future__ import annotations

import glob
import json
import os

import pytest

import attngen
from attngen.cli import main

from conftest import ROOT

EXAMPLES = os.path.join(ROOT, "examples")
GOOD = "attention ok_{n} {{\n    head_dim 64\n    dtype f16\n}}\n"
BAD = "attention bad {\n    head_dm 64\n    dtype f16\n}\n"


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def example_kernels() -> list[str]:
    return [s.name for p in sorted(glob.glob(os.path.join(EXAMPLES, "*.attn")))
            for s in attngen.parse(open(p).read(), p)]


def test_check_a_directory(capsys):
    code, out, err = run(capsys, "check", EXAMPLES, "--target", "cuda")
    assert code == 0, err
    for path in sorted(glob.glob(os.path.join(EXAMPLES, "*.attn"))):
        assert path in out
    names = example_kernels()
    assert len(names) >= 12 and all(f"\n{n}\n" in out for n in names)
    assert out.count("cuda (cuda-sm80): ok") == len(names)


def test_check_a_directory_trailing_slash_reports_every_failure(capsys, tmp_path):
    (tmp_path / "b_bad.attn").write_text(BAD)
    (tmp_path / "a_good.attn").write_text(GOOD.format(n=1))
    (tmp_path / "c_bad.attn").write_text(BAD.replace("head_dm", "head_dim").replace("dtype f16", "dtype f17"))
    (tmp_path / "notes.txt").write_text("not a spec")
    code, out, err = run(capsys, "check", str(tmp_path) + os.sep, "--target", "cuda")
    assert code == 1
    assert "ok_1" in out and "cuda (cuda-sm80): ok" in out
    assert f"b_bad.attn:2:" in err and "did you mean 'head_dim'" in err
    assert f"c_bad.attn:3:" in err
    assert out.index("a_good.attn") < out.index("ok_1")


def test_check_an_empty_directory_is_a_usage_error(capsys, tmp_path):
    code, _, err = run(capsys, "check", str(tmp_path))
    assert code == 2 and "no *.attn files" in err and str(tmp_path) in err


EXT = {("source", "cuda"): "cu", ("source", "wgsl"): "wgsl", ("manifest", "cuda"): "json",
       ("manifest", "wgsl"): "json", ("ir", "cuda"): "ir", ("ir", "wgsl"): "ir"}


@pytest.mark.parametrize("emit, target", sorted(EXT))
def test_build_a_directory(capsys, tmp_path, emit, target):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "one.attn").write_text(GOOD.format(n=1))
    (specs / "two.attn").write_text(GOOD.format(n=2) + GOOD.format(n=3))
    out_dir = tmp_path / "out"
    code, out, err = run(capsys, "build", str(specs), "--target", target, "--emit", emit, "-o", str(out_dir))
    assert code == 0, err
    ext = EXT[emit, target]
    assert sorted(os.listdir(out_dir)) == [f"ok_{n}.{ext}" for n in (1, 2, 3)]
    text = (out_dir / f"ok_2.{ext}").read_text()
    if emit == "manifest":
        assert json.loads(text)["entry_point"] == "attngen_ok_2"
    elif emit == "ir":
        assert attngen.parse(text)[0].name == "ok_2"
    else:
        assert "attngen_ok_2" in text
    assert all(str(out_dir / f"ok_{n}.{ext}") in out for n in (1, 2, 3))


def test_build_the_examples_directory(capsys, tmp_path):
    code, _, err = run(capsys, "build", EXAMPLES, "--target", "cuda", "-o", str(tmp_path / "k"))
    assert code == 0, err
    assert sorted(os.listdir(tmp_path / "k")) == sorted(f"{n}.cu" for n in example_kernels())


@pytest.mark.parametrize("extra, message", [
    ([], "-o DIR"),
    (["-o", "-"], "-o DIR"),
    (["--kernel", "nope", "-o", "OUT"], "nope"),
])
def test_build_a_directory_usage_errors(capsys, tmp_path, extra, message):
    (tmp_path / "one.attn").write_text(GOOD.format(n=1))
    extra = [str(tmp_path / "out") if a == "OUT" else a for a in extra]
    code, _, err = run(capsys, "build", str(tmp_path), "--target", "cuda", *extra)
    assert code == 2 and message in err


def test_build_a_directory_into_a_file_is_a_usage_error(capsys, tmp_path):
    (tmp_path / "one.attn").write_text(GOOD.format(n=1))
    target = tmp_path / "file.cu"
    target.write_text("")
    code, _, err = run(capsys, "build", str(tmp_path), "--target", "cuda", "-o", str(target))
    assert code == 2 and "not a directory" in err


def test_build_a_directory_with_an_invalid_spec_writes_nothing(capsys, tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "a.attn").write_text(GOOD.format(n=1))
    (specs / "b.attn").write_text(BAD)
    code, _, err = run(capsys, "build", str(specs), "--target", "cuda", "-o", str(tmp_path / "out"))
    assert code == 1 and "did you mean 'head_dim'" in err
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []


def test_build_a_directory_with_a_kernel_name_twice(capsys, tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "a.attn").write_text(GOOD.format(n=1))
    (specs / "b.attn").write_text(GOOD.format(n=1))
    code, _, err = run(capsys, "build", str(specs), "--target", "cuda", "-o", str(tmp_path / "out"))
    assert code == 2 and "ok_1" in err and "a.attn" in err and "b.attn" in err


def test_build_one_kernel_of_a_directory(capsys, tmp_path):
    code, _, err = run(capsys, "build", EXAMPLES, "--target", "wgsl", "--kernel", "vit_b16",
                       "-o", str(tmp_path))
    assert code == 0, err
    assert os.listdir(tmp_path) == ["vit_b16.wgsl"]


def test_help_documents_directories(capsys):
    for command in ("build", "check"):
        code, out, _ = run(capsys, command, "--help")
        assert code == 0 and "directory" in out


# ---- found by a second new-user review (2026-11-27); each failed before its fix -----------------

def test_check_of_the_examples_on_every_target_passes(capsys):
    """`attngen check examples` exited 1: the bf16 examples on wgsl. Without --target a target
    that never stores the dtype is `n/a`, not a failure; --target wgsl still refuses them."""
    code, out, err = run(capsys, "check", EXAMPLES)
    assert code == 0, err
    assert "wgsl (webgpu-core): n/a (dtype bf16; it stores f16, f32)" in out and "error" not in out
    gemma = os.path.join(EXAMPLES, "gemma2_9b.attn")
    assert run(capsys, "check", gemma, "--target", "wgsl")[0] == 1


def test_block_mask_builders_of_a_directory_are_named_apart(tmp_path, capsys):
    """`build DIR -o OUT --emit block-mask` wrote the builder over OUT/<kernel>.wgsl, the kernel's
    source, and stopped at the first kernel without a block mask."""
    specs = tmp_path / "specs"
    specs.mkdir()
    for name in ("packed_documents.attn", "vit_b16.attn"):
        (specs / name).write_text(open(os.path.join(EXAMPLES, name)).read())
    out_dir = tmp_path / "out"
    assert run(capsys, "build", str(specs), "--target", "wgsl", "-o", str(out_dir))[0] == 0
    code, out, _ = run(capsys, "build", str(specs), "--target", "wgsl", "-o", str(out_dir), "--emit", "block-mask")
    assert code == 0 and "skipped vit_b16: no block-mask" in out
    assert sorted(os.listdir(out_dir)) == ["llama3_8b_packed_documents.block-mask.wgsl",
                                            "llama3_8b_packed_documents.wgsl", "vit_b16.wgsl"]
    assert (out_dir / "llama3_8b_packed_documents.wgsl").read_text() != \
        (out_dir / "llama3_8b_packed_documents.block-mask.wgsl").read_text()
    (specs / "packed_documents.attn").unlink()
    code, _, err = run(capsys, "build", str(specs), "--target", "wgsl", "-o", str(out_dir), "--emit", "block-mask")
    assert code == 2 and "no kernel of" in err


def test_serve_demo_refuses_a_mask_custom_kernel(tmp_path, capsys):
    """It wrote a page that fails in the browser (no block-mask builder, no mask) and exited 0."""
    code, _, err = run(capsys, "serve-demo", os.path.join(EXAMPLES, "packed_documents.attn"), "--target", "wgsl",
                       "--dir", str(tmp_path / "d"), "--no-serve")
    assert code == 2 and "has mask custom" in err and not (tmp_path / "d").exists()
    # a target without a web runtime says that first (the block-mask advice is for wgsl)
    code, _, err = run(capsys, "serve-demo", os.path.join(EXAMPLES, "packed_documents.attn"), "--target", "cuda",
                       "--no-serve")
    assert code == 2 and "needs a target with a web runtime" in err


@pytest.mark.parametrize("argv, message", [
    (["precompile", os.path.join(EXAMPLES, "llama3_8b.attn"), "--target", "cuda", "--kernel", "nope"],
     "llama3_8b.attn defines no kernel named 'nope' (kernels: llama3_8b_prefill)"),
    (["precompile", os.path.join(EXAMPLES, "llama3_8b.attn"), "--target", "cuda", "--device", "sm_80,"],
     "an empty item"),
])
def test_precompile_usage_messages(argv, message, capsys):
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in err
