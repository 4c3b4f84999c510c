"""Which kernel family, and so which main-loop template, each namespace of a CUDA kernel gets
(attngen/backends/cuda/family.py), shown here for a handful of the examples' and the golden
variants' kernels on both CUDA profiles, so that a contributor sees the mapping; that every
family template renders; and that no template is over 600 lines. Checked without a GPU."""

from __future__ import annotations

import os
import re

import pytest

import attngen
from attngen.api import emit_plan, parse
from attngen.backends import get as get_backend
from attngen.backends.cuda.family import FAMILIES, family_line, family_name

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# (file, kernel, profile) -> (main namespace's family, the _varlen entry's or None)
EXPECTED = {
    ("examples/llama3_8b.attn", "llama3_8b_prefill", "cuda-sm80"): ("plain", "plain"),
    ("examples/llama3_8b.attn", "llama3_8b_prefill", "cuda-sm90"): ("producer", "producer"),
    ("examples/packed_documents.attn", "llama3_8b_packed_documents", "cuda-sm80"): ("plain", None),
    ("examples/packed_documents.attn", "llama3_8b_packed_documents", "cuda-sm90"): ("producer", "overlap"),
    ("examples/large_head_dims.attn", "head_dim_512", "cuda-sm90"): ("stored_p", "plain"),
    ("examples/large_head_dims.attn", "head_dim_1024", "cuda-sm90"): ("plain", None),
    ("examples/vit_b16.attn", "vit_b16", "cuda-sm80"): ("plain", None),
    ("examples/llama3_8b_decode.attn", "llama3_8b_decode", "cuda-sm90"): ("plain", None),
    ("tests/golden/variants.attn", "softcap_window_f16", "cuda-sm90"): ("producer", "plain"),
    ("tests/golden/variants.attn", "custom_two_pass", "cuda-sm80"): ("plain", None),
    ("tests/golden/variants.attn", "gqa7_f16_acc", "cuda-sm90"): ("plain", "plain"),
}

# target options that give the Hopper family without a producer (main namespace: cuda-sm90)
OPTIONS = {
    "producer=off stages=2": "plain",   # wgmma, two stages: the plain loop
    "producer=off stages=3": "overlap",  # FlashAttention-3's order without a producer
}


def _spec(path, name):
    with open(os.path.join(ROOT, path)) as f:
        return next(s for s in parse(f.read(), os.path.basename(path)) if s.name == name)


def _option_spec(options):
    text = f"attention t {{\n head_dim 128\n heads q=8 kv=8\n dtype f16\n target cuda {{ {options} }}\n}}\n"
    return parse(text, "options.attn")[0]


def _families(plan):
    c = plan.config
    return family_name(c), (family_name(c.varlen) if c.varlen is not None else None)


@pytest.mark.parametrize("case", sorted(EXPECTED), ids=lambda k: f"{k[1]}-{k[2]}")
def test_each_namespace_gets_its_family_and_template(case):
    path, name, profile = case
    plan = attngen.lower(_spec(path, name), "cuda", profile)
    assert _families(plan) == EXPECTED[case]
    lines = get_backend("cuda").describe(plan)
    configs = [plan.config] + ([plan.config.varlen] if plan.config.varlen is not None else [])
    for c in configs:
        # attngen check names the family and its template, one line per namespace
        assert sum(family_line(c) in line for line in lines) >= 1
        assert f"templates/{FAMILIES[family_name(c)][0]}" in family_line(c)


@pytest.mark.parametrize("options", sorted(OPTIONS))
def test_the_hopper_family_without_a_producer(options):
    plan = attngen.lower(_option_spec(options), "cuda", "cuda-sm90")
    assert plan.config.math == "wgmma"
    assert family_name(plan.config) == OPTIONS[options]


def test_every_family_template_renders():
    """Each family's template, from the cases above: the source has its main loop and epilogue."""
    seen = {}
    specs = [(_spec(p, n), prof) for p, n, prof in EXPECTED] + [(_option_spec(o), "cuda-sm90") for o in OPTIONS]
    for spec, profile in specs:
        plan = attngen.lower(spec, "cuda", profile)
        fams = [f for f in _families(plan) if f is not None]
        if set(fams) <= set(seen):
            continue
        source = emit_plan(plan).source
        assert "// ---- section: main loop over K/V tiles ----" in source
        assert "// ---- section: epilogue: normalise and store ----" in source
        for f in fams:
            seen.setdefault(f, spec.name)
    assert set(seen) == set(FAMILIES), f"families rendered: {seen}"
    for template, _ in FAMILIES.values():
        assert os.path.isfile(os.path.join(ROOT, "templates", template)), template


def test_no_template_is_over_600_lines():
    long = {}
    for folder, _, files in os.walk(os.path.join(ROOT, "templates")):
        for name in files:
            if name.endswith(".j2"):
                path = os.path.join(folder, name)
                with open(path) as f:
                    n = sum(1 for _ in f)
                if n > 600:
                    long[os.path.relpath(path, ROOT)] = n
    assert not long, long


def test_the_cuda_templates_take_no_decision_with_set():
    """A `{% set %}` in templates/cuda only formats text from one field; a choice over several
    configuration fields is a KernelShape field (family.py)."""
    found = []
    for name in sorted(os.listdir(os.path.join(ROOT, "templates", "cuda"))):
        with open(os.path.join(ROOT, "templates", "cuda", name)) as f:
            for n, line in enumerate(f, 1):
                m = re.search(r"\{%-?\s*set\s+\w+\s*=(.*?)-?%\}", line)
                if m and re.search(r"\b(and|or|not)\b", m.group(1)):
                    found.append(f"{name}:{n}: {line.strip()}")
    assert not found, found


def test_emit_ir_prints_every_namespaces_template_fields(capsys):
    """`attngen build --emit ir` shows each namespace's KernelShape: the choices its template
    tests, by the names the templates use (f.fold_scale, ...), as emit hands them over."""
    from attngen.backends.cuda.emit import namespace_shapes
    from attngen.cli import main

    spec = attngen.load(os.path.join(ROOT, "examples", "llama3_8b.attn"), "llama3_8b_prefill")
    plan = attngen.lower(spec, "cuda", "cuda-sm90")
    shapes = dict(namespace_shapes(plan))
    assert set(shapes) == {"padded", "varlen"}
    assert main(["build", os.path.join(ROOT, "examples", "llama3_8b.attn"), "--kernel", "llama3_8b_prefill",
                 "--target", "cuda", "--profile", "cuda-sm90", "--emit", "ir"]) == 0
    out = capsys.readouterr().out
    for name, shape in shapes.items():
        line = next(ln for ln in out.splitlines() if ln.startswith(f"#   template fields ({name}): "))
        flags = line.split(": ", 1)[1].split(";")[0].split(", ")
        assert flags == [k for k, v in vars(shape).items() if v is True]
    assert shapes["padded"].fold_scale and shapes["padded"].tma_cleans and not shapes["varlen"].tma_cleans


def test_check_shows_no_register_estimate_beside_ok_and_ir_shows_it(capsys):
    """(issue 40, a first-hour friction) `attngen check` printed "about 272 registers" next to "ok"
    for a plan whose cap is 255, which reads as a problem: check says what the compiler gets, and
    the planner's rough estimate, which only ranks tile choices, is in --emit ir."""
    from attngen.cli import main

    path = os.path.join(ROOT, "examples", "llama3_8b.attn")
    spec = attngen.load(path, "llama3_8b_prefill")
    c = attngen.lower(spec, "cuda", "cuda-sm80").config
    assert c.registers_estimate > c.registers_cap  # the case the friction was seen with
    assert main(["check", path, "--target", "cuda"]) == 0
    out = capsys.readouterr().out
    assert f"at most {c.registers_cap} per thread" in out and str(c.registers_estimate) not in out
    assert main(["build", path, "--kernel", "llama3_8b_prefill", "--target", "cuda", "--emit", "ir"]) == 0
    assert f"register estimate: about {c.registers_estimate} per thread" in capsys.readouterr().out
