"""Syntax tree -> AttentionSpec: the vocabulary of the language, checked with positions.

Every key has one reader below. Readers report into a shared list of diagnostics instead of
raising, so a file with many mistakes gets all of them at once. `input` lines declare tensors;
the `mask` and `score` expressions are typed once the block's inputs are known
(attngen.lang.expr_check), reporting into the same list. Checks that need a target
(tile sizes, dtypes a target lacks, memory) live in attngen.plan.check, not here. The
options of `target NAME { ... }` blocks come from the registered targets
(attngen.lang.options), not from this module.
"""

from __future__ import annotations

import dataclasses
import math

from ..errors import NUMBER_QUOTED, Diagnostic, Source, Span, SpecError, clip, closest, did_you_mean
from ..limits import INT32_MAX, MAX_HEADS
from .options import target_schema, target_schemas
from .source import decode_source
from .expr import (CALL_KEYWORDS, EXPR_TYPES, FUNCTIONS, INDEX_NAMES, INPUT_DTYPE_ALIASES, INPUT_DTYPES, VARS,
                   Input, inputs_read)
from .expr_check import Checker
from .spec import (AttentionSpec, KVCache, Mask, Schedule, Tile, ACC_DTYPES, DEFAULT_FP8_OUT, DTYPES, FP8_DTYPES,
                   KV_DTYPES, OUT_DTYPES, format_spec, typed_key)
from .syntax import MAX_NAME_LENGTH, Binary, Block, Call, Index, Number, Pair, Setting, Unary, Word, parse_blocks

MAX_INT = INT32_MAX  # (attngen.limits: the reasons of every limit)
MAX_HEAD_DIM = 1024
# scale and softcap become f32 constants in the kernels (scale * log2(e), scale / softcap,
# softcap * log2(e)); within this range every one of them is a finite, normal f32.
MIN_REAL, MAX_REAL = 1e-12, 1e12
MAX_F16_SCALE = 1.0  # with accumulate qk=f16 (see cross_checks)

USAGE = {
    "head_dim": "head_dim N  or  head_dim qk=N v=M  (multiples of 8, 8..1024)",
    "heads": "heads q=N kv=M  (or heads q=N, heads N, heads any)",
    "dtype": "dtype f16 | bf16 | f32  or  dtype e4m3 | e5m2 [out=bf16 | f16]  (FP8 prefill: docs/language.md)",
    "accumulate": "accumulate qk=f32|f16 pv=f32|f16  (or accumulate f32)",
    "mask": "mask none | causal | causal(bottom_right) | window(left=N) | window(left=N, right=M) | custom"
            "  or  mask EXPR  (a boolean, e.g. k <= q || k < prefix[b])",
    "score": "score EXPR  (a real expression of s, the scaled score, e.g. s - slopes[h] * abs(q - k))",
    "input": "input NAME[AXES] DTYPE [grad]  (axes: b, h, hkv, q, k or sizes; DTYPE f32 | f16 | bf16 | i32 "
             "| u8 | bool)",
    "softcap": "softcap C  (a positive number) or softcap none",
    "scale": "scale auto  or  scale X  (a positive number)",
    "tile": "tile q=N kv=M [d=K]  (each a number or auto)",
    "schedule": "schedule fused | split_kv(N) | split_kv(auto) | two_pass",
    "kv_cache": "kv_cache contiguous | paged(page=N)",
    "kv_dtype": "kv_dtype e4m3 | e5m2 | i8  (K and V stored quantized, with scales: docs/language.md)",
    "target": "target NAME { OPTION=VALUE ... }",  # the registered targets' own forms: target_usage()
}
REQUIRED = ("head_dim", "dtype")
DTYPE_ALIASES = {
    "fp16": "f16", "float16": "f16", "half": "f16", "bfloat16": "bf16", "fp32": "f32",
    "float32": "f32", "float": "f32", "single": "f32",
}

# (dtype only: `accumulate` takes no FP8)
FP8_ALIASES = {"fp8": "e4m3", "fp8_e4m3": "e4m3", "float8_e4m3fn": "e4m3", "float8_e4m3": "e4m3",
               "fp8_e5m2": "e5m2", "float8_e5m2": "e5m2"}

KV_DTYPE_ALIASES = {"fp8": "e4m3", "fp8_e4m3": "e4m3", "float8_e4m3fn": "e4m3", "fp8_e5m2": "e5m2",
                    "float8_e5m2": "e5m2", "int8": "i8", "q8_0": "i8"}


def target_usage() -> str:
    """How to write a target block, for each registered target."""
    return "  or  ".join(t.usage for t in target_schemas()) or USAGE["target"]


def _both(names) -> str:
    """'a', 'a and b', 'a, b and c'."""
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1] if names else ""


def _either(names) -> str:
    """'a', 'a or b', 'a, b or c'."""
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1] if names else ""


class _Reader:
    """Reads one attention block into keyword arguments for AttentionSpec."""

    def __init__(self, block: Block, diags: list):
        self.block = block
        self.diags = diags
        self.fields: dict = {}
        self.targets: dict = {}
        self.spans: dict = {"name": block.name_span}
        self.USAGE = dict(USAGE, target=target_usage())
        self.inputs: dict = {}  # name -> Input, in the order declared
        self.bad_inputs: set = set()  # inputs declared with an error (reported once, not again where read)
        self.exprs: dict = {}  # "mask" / "score" -> the syntax tree of its expression

    # -- reporting ---------------------------------------------------------------------
    def error(self, message, span, hint=None):
        self.diags.append(Diagnostic(message, span, hint))

    def usage(self, key, node, what="bad value"):
        self.error(f"{what} for '{key}'", node.span, f"write: {self.USAGE[key]}")

    # -- value helpers -----------------------------------------------------------------
    def integer(self, key, node, lo=1, hi=MAX_INT, multiple_of=None, allow_auto=False):
        """An integer in [lo, hi]; `auto` gives None where allowed. Reports and returns False."""
        if allow_auto and isinstance(node, Word) and node.text == "auto":
            return None
        if not isinstance(node, Number) or not isinstance(node.value, int):
            shown = _shown(node)
            usage = self.USAGE.get(key.split(".")[0], self.USAGE["mask"])
            self.error(f"'{key}' must be {'an integer or auto' if allow_auto else 'an integer'}, "
                       f"not '{shown}'", node.span, f"write: {usage}")
            return False
        v = node.value
        shown = _short(node.text)
        if v < lo:
            self.error(f"'{key}' must be at least {lo}, not {shown}", node.span)
            return False
        if v > hi:
            self.error(f"'{key}' = {shown} is too large (at most {hi})", node.span)
            return False
        if multiple_of and v % multiple_of:
            lower = v - v % multiple_of
            near = [x for x in (lower, lower + multiple_of) if lo <= x <= hi]
            hint = f"try {' or '.join(map(str, near))}" if near else None
            self.error(f"'{key}' must be a multiple of {multiple_of}, not {v}", node.span, hint)
            return False
        return v

    def positive_float(self, key, node):
        if isinstance(node, Number):
            v = float(node.value)
            if math.isfinite(v) and v > 0:
                if MIN_REAL <= v <= MAX_REAL:
                    return v
                self.error(f"'{key}' = {_short(node.text)} is out of range ({MIN_REAL:g} to {MAX_REAL:g}: "
                           "the kernels hold it in f32)", node.span)
                return False
            self.error(f"'{key}' must be a positive finite number, not {_short(node.text)}", node.span)
        else:
            self.error(f"'{key}' must be a positive finite number, not '{_shown(node)}'", node.span,
                       f"write: {self.USAGE[key]}")
        return False

    def choice(self, key, node, choices, aliases=None, what=None):
        if isinstance(node, Word) and node.text in choices:
            return node.text
        word = node.text if isinstance(node, Word) else node.show()
        hint = did_you_mean(word, choices, aliases) or f"write: {self.USAGE[key]}"
        self.error(f"unknown {what or key} '{clip(word)}' (expected {', '.join(choices)})", node.span, hint)
        return False

    def pairs(self, key, nodes, allowed, required=(), at=None):
        """Values that must all be key=value pairs with known, distinct keys.

        `at` is the span to point at when a required pair is missing and there are no values.
        """
        out, ok = {}, True
        for node in nodes:
            if not isinstance(node, Pair):
                self.usage(key, node, f"unexpected '{_shown(node)}'")
                ok = False
                continue
            if node.key not in allowed:
                hint = did_you_mean(node.key, allowed) or f"write: {self.USAGE[key]}"
                self.error(f"unknown option '{clip(node.key)}' for '{key}' (expected {', '.join(allowed)})",
                           node.key_span, hint)
                ok = False
            elif node.key in out:
                self.error(f"'{key}' option '{node.key}' given twice", node.key_span)
                ok = False
            else:
                out[node.key] = node
        for name in required:
            if ok and name not in out:
                self.error(f"'{key}' needs {name}=", nodes[0].span if nodes else at,
                           f"write: {self.USAGE[key]}")
                ok = False
        return out if ok else None

    def single(self, s: Setting):
        if len(s.values) != 1:
            span = s.values[1].span if len(s.values) > 1 else s.key_span
            what = "too many values" if len(s.values) > 1 else "missing value"
            self.usage(s.key, _At(span), what)
            return None
        return s.values[0]

    # -- keys --------------------------------------------------------------------------
    def read(self) -> dict | None:
        seen: dict = {}
        typos: set = set()  # the keys that unknown keys are close to (did you mean ...?)
        n_before = len(self.diags)
        for s in self.block.settings:
            key = s.key
            if key == "target":
                self.read_target(s, seen)
                continue
            if key not in self.USAGE:
                close = closest(key, list(self.USAGE))
                hint = f"did you mean '{close}'?" if close else "known keys: " + ", ".join(self.USAGE)
                self.error(f"unknown key '{clip(key)}'", s.key_span, hint)
                typos.add(close)
                continue
            if key in seen and key != "input":  # a block declares any number of inputs
                self.error(f"duplicate key '{key}' (first set on line {seen[key].line})",
                           s.key_span, "remove one of them")
                continue
            seen.setdefault(key, s.key_span)
            if key != "input":
                self.spans[key] = s.span
            stray = next((v for v in s.values if isinstance(v, Word) and v.text in self.USAGE), None)
            if stray is not None:
                self.error(f"'{stray.text}' starts another setting on the line of '{key}'", stray.span,
                           "put one setting per line")
                continue
            if s.options is not None:
                self.error(f"'{key}' takes no {{ }} block", s.span, f"write: {self.USAGE[key]}")
                continue
            getattr(self, "key_" + key)(s)
        for key in REQUIRED:
            # `head_dm 64`: one error (the unknown key, with its did-you-mean), not two
            if key not in seen and key not in typos:
                self.error(f"attention '{clip(self.block.name)}' has no '{key}' (it is required)",
                           self.block.name_span, f"add a line: {self.USAGE[key]}")
        self.check_expressions()
        self.cross_checks()
        if len(self.diags) > n_before:
            return None
        return dict(self.fields, targets=self.targets, inputs=tuple(self.inputs.values()), spans=self.spans)

    def key_head_dim(self, s):
        vals = s.values
        if not vals:
            self.usage("head_dim", _At(s.key_span), "missing value")
            return
        if len(vals) == 1 and not isinstance(vals[0], Pair):
            d = self.integer("head_dim", vals[0], 8, MAX_HEAD_DIM, 8)
            if d is not False:
                self.fields.update(head_dim_qk=d, head_dim_v=d)
            return
        p = self.pairs("head_dim", vals, ("qk", "v"), ("qk", "v"))
        if p is None:
            return
        qk = self.integer("head_dim.qk", p["qk"].value, 8, MAX_HEAD_DIM, 8)
        v = self.integer("head_dim.v", p["v"].value, 8, MAX_HEAD_DIM, 8)
        if qk is not False and v is not False:
            self.fields.update(head_dim_qk=qk, head_dim_v=v)

    def key_heads(self, s):
        vals = s.values
        if not vals:
            self.usage("heads", _At(s.key_span), "missing value")
            return
        if len(vals) == 1 and isinstance(vals[0], Word) and vals[0].text == "any":
            return
        if len(vals) == 1 and isinstance(vals[0], Number):
            n = self.integer("heads", vals[0], 1, MAX_HEADS)
            if n is not False:
                self.fields.update(heads_q=n, heads_kv=n)
            return
        p = self.pairs("heads", vals, ("q", "kv"), ("q",))
        if p is None:
            return
        q = self.integer("heads.q", p["q"].value, 1, MAX_HEADS)
        kv = self.integer("heads.kv", p["kv"].value, 1, MAX_HEADS) if "kv" in p else q
        if q is False or kv is False:
            return
        if q % kv:
            divisors = [d for d in range(1, q + 1) if q % d == 0]
            near = sorted(divisors, key=lambda d: abs(d - kv))[:2]
            self.error(f"heads q={q} is not a multiple of kv={kv} (each KV head serves a whole "
                       "group of query heads)", p["kv"].span,
                       f"kv must divide {q}, e.g. {' or '.join(map(str, sorted(near)))}")
            return
        self.fields.update(heads_q=q, heads_kv=kv)

    def key_dtype(self, s):
        vals = s.values
        if not vals:
            self.usage("dtype", _At(s.key_span), "missing value")
            return
        if len(vals) > 2 or (len(vals) == 2 and not isinstance(vals[1], Pair)):
            self.usage("dtype", vals[1] if len(vals) == 2 else vals[2], "too many values")
            return
        d = self.choice("dtype", vals[0], DTYPES, {**DTYPE_ALIASES, **FP8_ALIASES})
        out = None
        if len(vals) == 2:
            p = self.pairs("dtype", vals[1:], ("out",))
            if p is None:
                return
            out = self.choice("dtype", p["out"].value, OUT_DTYPES, DTYPE_ALIASES, what="output dtype")
            if out is False:
                return
            if d and d not in FP8_DTYPES:
                self.error(f"out= chooses the output dtype of an FP8 kernel (dtype e4m3 or e5m2); dtype {d} "
                           f"stores its output in {d}", p["out"].key_span, f"write: dtype {d}")
                return
        if d:
            self.fields["dtype"] = d
            if d in FP8_DTYPES:
                self.fields["out_dtype"] = out or DEFAULT_FP8_OUT

    def key_accumulate(self, s):
        vals = s.values
        if len(vals) == 1 and isinstance(vals[0], Word):
            a = self.choice("accumulate", vals[0], ACC_DTYPES, DTYPE_ALIASES)
            if a:
                self.fields.update(acc_qk=a, acc_pv=a)
            return
        p = self.pairs("accumulate", vals, ("qk", "pv"))
        if not p:
            if p is not None:
                self.usage("accumulate", _At(s.key_span), "missing value")
            return
        for name, node in p.items():
            a = self.choice("accumulate", node.value, ACC_DTYPES, DTYPE_ALIASES)
            if a:
                self.fields["acc_" + name] = a

    def key_mask(self, s):
        node = self.single(s)
        if node is None:
            return
        if isinstance(node, (Unary, Binary, Index)) or (isinstance(node, Call) and node.name in FUNCTIONS):
            self.exprs["mask"] = node  # checked once the inputs are known (check_expressions)
            return
        kinds = ("none", "causal", "causal(bottom_right)", "window", "custom")
        if isinstance(node, Word):
            if node.text in ("none", "causal", "custom"):
                self.fields["mask"] = Mask(node.text)
            elif node.text == "window":
                self.error("window needs its size", node.span, "write: window(left=N) or window(left=N, right=M)")
            else:
                self.choice("mask", node, kinds)
            return
        if not isinstance(node, Call):
            self.usage("mask", node)
            return
        if node.name == "causal":
            if len(node.args) == 1 and isinstance(node.args[0], Word) and \
                    node.args[0].text in ("bottom_right", "top_left"):
                self.fields["mask"] = Mask("causal", bottom_right=node.args[0].text == "bottom_right")
            else:
                bad = [a for a in node.args if not (isinstance(a, Word) and a.text in ("bottom_right", "top_left"))]
                arg = bad[0] if bad else (node.args[1] if len(node.args) > 1 else node)
                hint = None
                if isinstance(arg, Word) and arg.text not in ("bottom_right", "top_left"):
                    hint = did_you_mean(arg.text, ["bottom_right", "top_left"])
                self.error("causal takes one alignment: causal(bottom_right) or causal(top_left)",
                           arg.span, hint)
            return
        if node.name == "window":
            p = self.pairs("mask", node.args, ("left", "right"), ("left",), at=node.span)
            if p is None:
                return
            left = self.integer("window.left", p["left"].value, 0)
            right = self.integer("window.right", p["right"].value, 0) if "right" in p else 0
            if left is not False and right is not False:
                self.fields["mask"] = Mask("window", left=left, right=right)
            return
        hint = did_you_mean(node.name, ["causal", "window"]) or f"write: {self.USAGE['mask']}"
        self.error(f"unknown mask '{clip(node.name)}(...)'", node.span, hint)

    def key_score(self, s):
        node = self.single(s)
        if node is None:
            return
        if isinstance(node, Pair):
            self.usage("score", node, f"unexpected '{_shown(node)}'")
            return
        self.exprs["score"] = node

    def key_input(self, s):
        """`input NAME[AXES] DTYPE [grad]`: one Input, reported with every problem it has."""
        vals = s.values
        if not vals:
            self.usage("input", _At(s.key_span), "missing value")
            return
        decl = vals[0]
        if isinstance(decl, Word):
            self.error(f"input '{clip(decl.text)}' needs its axes", decl.span,
                       f"write e.g.: input {clip(decl.text)}[b, h] f32")
            return
        if not isinstance(decl, Index):
            self.usage("input", decl, f"expected NAME[AXES], not '{_shown(decl)}'")
            return
        ok = self.input_name(decl)
        if not ok:  # a reserved or repeated name: reads of it are not reported again
            self.bad_inputs.add(decl.name)
        axes = []
        for a in decl.indices:
            if isinstance(a, Word) and a.text in INDEX_NAMES:
                axes.append(a.text)
            elif isinstance(a, Number) and isinstance(a.value, int):
                n = self.integer("input axis", a, 1)
                ok &= n is not False
                axes.append(n)
            else:
                word = a.text if isinstance(a, Word) else ""
                hint = did_you_mean(word, INDEX_NAMES) if word else None
                if word in VARS:
                    hint = f"{word} is not an axis: axes are {', '.join(INDEX_NAMES)} or sizes"
                self.error(f"an input's axis is an index name ({', '.join(INDEX_NAMES)}) or a positive integer, "
                           f"not '{_shown(a)}'", a.span, hint)
                ok = False
        if len(vals) < 2:
            self.error(f"input '{decl.name}' needs its dtype", decl.span,
                       f"write e.g.: input {decl.show()} f32  (dtypes: {', '.join(INPUT_DTYPES)})")
            return
        dtype = self.choice("input", vals[1], INPUT_DTYPES, INPUT_DTYPE_ALIASES, what="input dtype")
        grad = False
        for extra in vals[2:3]:
            if isinstance(extra, Word) and extra.text == "grad":
                grad = dtype in ("f32", "f16", "bf16")
                if dtype and not grad:  # reported; the input is still declared (no follow-on errors)
                    self.error(f"input '{decl.name}' is {dtype}: only a real input (f32, f16, bf16) has a gradient",
                               extra.span, "remove grad, or make the input real")
            else:
                hint = did_you_mean(extra.text, ["grad"]) if isinstance(extra, Word) else None
                self.error(f"unexpected '{_shown(extra)}' after the input's dtype (only grad may follow)",
                           extra.span, hint)
                ok = False
        if len(vals) > 3:
            self.usage("input", vals[3], "too many values")
            ok = False
        if ok and dtype:
            self.inputs[decl.name] = Input(decl.name, tuple(axes), dtype, grad)
            self.spans[f"input.{decl.name}"] = s.span
        elif decl.name not in self.inputs:
            self.bad_inputs.add(decl.name)

    def input_name(self, decl) -> bool:
        """Whether an input may take the name `decl.name` (reported where not)."""
        name = decl.name
        why = ("it names an index or length in expressions" if name in VARS else
               "it names a function" if name in FUNCTIONS else
               "it is a keyword of the kernel call" if name in CALL_KEYWORDS else
               f"names are at most {MAX_NAME_LENGTH} characters" if len(name) > MAX_NAME_LENGTH else
               "names starting with '__' are reserved" if name.startswith("__") else None)
        if why:
            self.error(f"an input may not be named '{clip(name)}': {why}", decl.name_span, "choose another name")
            return False
        if name in self.inputs:
            first = self.spans[f"input.{name}"].line
            self.error(f"duplicate input '{name}' (first on line {first})", decl.name_span, "remove one of them")
            return False
        return True

    def check_expressions(self):
        """Type the mask and score expressions (the inputs are all read by now), and check the
        inputs against them: each is read by one, and a `grad` input by the score."""
        for key in ("mask", "score"):
            node = self.exprs.get(key)
            if node is None:
                continue
            self.spans[f"{key}.expr"] = node.span
            e = Checker(self.error, self.inputs, key, self.bad_inputs).check(node)
            if e is None:
                continue
            if key == "mask":
                self.fields["mask"] = Mask("expr", expr=e)
            else:
                self.fields["score"] = e
        if "score" in self.exprs and "softcap" in self.fields:
            self.error("a score expression and a softcap together: which one applies first is not said",
                       self.exprs["score"].span, "write the soft-cap in the score: score C * tanh(s / C)")
        read = {key: inputs_read(self.fields.get(key) if key == "score" else self.fields["mask"].expr)
                for key in ("mask", "score") if key in self.fields and (key == "score" or
                                                                         self.fields["mask"].kind == "expr")}
        failed = {key for key in self.exprs if key not in read}  # an expression with errors: no more
        for inp in self.inputs.values():
            span = self.spans[f"input.{inp.name}"]
            if failed:
                break
            if inp.grad and inp.name not in read.get("score", ()):
                self.error(f"input '{inp.name}' has grad, but the score does not read it", span,
                           f"read it in the score (e.g. score s + {inp.name}[...]), or remove grad")
            elif not any(inp.name in r for r in read.values()):
                self.error(f"input '{inp.name}' is read by no expression", span,
                           "read it in `score` or `mask`, or remove the line")

    def key_softcap(self, s):
        node = self.single(s)
        if node is None:
            return
        if isinstance(node, Word) and node.text == "none":
            return
        v = self.positive_float("softcap", node)
        if v is not False:
            self.fields["softcap"] = v

    def key_scale(self, s):
        node = self.single(s)
        if node is None:
            return
        if isinstance(node, Word) and node.text == "auto":
            return
        v = self.positive_float("scale", node)
        if v is not False:
            self.fields["scale"] = v

    def key_tile(self, s):
        p = self.pairs("tile", s.values, ("q", "kv", "d"))
        if not p:
            if p is not None:
                self.usage("tile", _At(s.key_span), "missing value")
            return
        sizes = {}
        for name, node in p.items():
            mult = 8 if name == "d" else None
            sizes[name] = self.integer(f"tile.{name}", node.value, 8 if name == "d" else 1,
                                       MAX_HEAD_DIM, mult, allow_auto=True)
        if all(v is not False for v in sizes.values()):
            self.fields["tile"] = Tile(**sizes)

    def key_schedule(self, s):
        node = self.single(s)
        if node is None:
            return
        if isinstance(node, Word) and node.text in ("fused", "two_pass"):
            self.fields["schedule"] = Schedule(node.text)
        elif isinstance(node, Word) and node.text == "split_kv":
            self.error("split_kv needs its number of splits", node.span,
                       "write: split_kv(N) or split_kv(auto)")
        elif isinstance(node, Call) and node.name == "split_kv":
            if len(node.args) != 1 or isinstance(node.args[0], Pair):
                self.error("split_kv takes one argument: a number of splits or auto", node.span,
                           "write: split_kv(4) or split_kv(auto)")
                return
            n = self.integer("schedule", node.args[0], 1, 1024, allow_auto=True)
            if n is not False:
                self.fields["schedule"] = Schedule("split_kv", n)
        else:
            name = node.text if isinstance(node, Word) else getattr(node, "name", node.show())
            hint = did_you_mean(name, ["fused", "split_kv", "two_pass"]) or f"write: {self.USAGE['schedule']}"
            self.error(f"unknown schedule '{_shown(node)}'", node.span, hint)

    def key_kv_cache(self, s):
        node = self.single(s)
        if node is None:
            return
        if isinstance(node, Word) and node.text == "contiguous":
            self.fields["kv_cache"] = KVCache("contiguous")
        elif isinstance(node, Word) and node.text == "paged":
            self.error("paged needs its page size", node.span, "write: paged(page=16)")
        elif isinstance(node, Call) and node.name == "paged":
            p = self.pairs("kv_cache", node.args, ("page",), ("page",), at=node.span)
            if p is not None:
                page = self.integer("kv_cache.page", p["page"].value, 1, 65536)
                if page is not False:
                    self.fields["kv_cache"] = KVCache("paged", page)
        else:
            name = node.text if isinstance(node, Word) else getattr(node, "name", node.show())
            hint = did_you_mean(name, ["contiguous", "paged"]) or f"write: {self.USAGE['kv_cache']}"
            self.error(f"unknown kv_cache '{_shown(node)}'", node.span, hint)

    def key_kv_dtype(self, s):
        node = self.single(s)
        if node is not None:
            d = self.choice("kv_dtype", node, KV_DTYPES, KV_DTYPE_ALIASES)
            if d:
                self.fields["kv_dtype"] = d

    def read_target(self, s: Setting, seen: dict):
        schemas = target_schemas()
        if s.values and isinstance(s.values[0], Word) and target_schema(s.values[0].text) is None:
            self.choice("target", s.values[0], tuple(t.name for t in schemas))  # an unknown name, first
            return
        if len(s.values) > 1 and isinstance(s.values[0], Word):
            # `target cuda auto`: the name is there, the rest is not an option block
            self.usage("target", _At(s.values[1].span),
                       f"expected an option block after 'target {s.values[0].text}': "
                       f"{{ key=value ... }}, or nothing (every option auto)")
            return
        if len(s.values) != 1 or not isinstance(s.values[0], Word):
            self.usage("target", _At(s.values[0].span if s.values else s.key_span),
                       f"expected a target name ({_either(t.name for t in schemas)})")
            return
        name = s.values[0].text
        schema = target_schema(name)
        if schema is None:
            self.choice("target", s.values[0], tuple(t.name for t in schemas))
            return
        key = f"target {name}"
        if key in seen:
            self.error(f"duplicate '{key}' block (first on line {seen[key].line})", s.key_span,
                       "merge the options into one block")
            return
        seen[key] = s.key_span
        self.spans[f"target.{name}"] = s.span
        p = self.pairs("target", s.options or (), tuple(o.name for o in schema.options))
        if p is None:
            return
        values, ok = {}, True
        for opt in schema.options:
            if opt.name not in p:
                continue
            node = p[opt.name].value
            if opt.kind == "int":
                v = self.integer(f"target.{opt.name}", node, opt.lo, opt.hi, allow_auto=True)
            else:
                v = self.choice("target", node, opt.choices, what=opt.what or None)
                v = None if v == "auto" else v
            ok &= v is not False
            values[opt.name] = v
        if ok:
            self.targets[name] = values

    def cross_checks(self):
        f = self.fields
        if f.get("dtype") in FP8_DTYPES and f.get("kv_dtype") is not None:
            self.error(f"kv_dtype quantizes the K and V of an f16 / bf16 / f32 kernel; dtype {f['dtype']} stores "
                       "q, k and v in FP8 already (descaled at the call)", self.spans["kv_dtype"],
                       "leave kv_dtype out")
        if f.get("kv_dtype") == "i8" and "head_dim_qk" in f and (f["head_dim_qk"] % 32 or f["head_dim_v"] % 32):
            self.error(f"kv_dtype i8 needs head dims that are multiples of 32 (one scale per block of 32 values "
                       f"along the head dim), not {f['head_dim_qk']}/{f['head_dim_v']}", self.spans["kv_dtype"],
                       "use kv_dtype e4m3 (one scale per head), or a head dim that is a multiple of 32")
        tile = f.get("tile")
        if tile and tile.d is not None and "head_dim_qk" in f:
            big = max(f["head_dim_qk"], f["head_dim_v"])
            if tile.d > big:
                self.error(f"tile d={tile.d} is larger than the head dim ({big})", self.spans["tile"])
        if f.get("acc_qk") == "f16" or f.get("acc_pv") == "f16":
            if f.get("dtype") in ("f32", "bf16"):
                self.error(f"accumulate f16 needs dtype f16 (this kernel stores {f['dtype']}: its "
                           "products are not f16 and tensor cores accumulate bf16 only in f32)",
                           self.spans["accumulate"], "use accumulate qk=f32 pv=f32")
            elif f.get("dtype") in FP8_DTYPES:
                self.error(f"accumulate f16 needs dtype f16 (this kernel stores {f['dtype']}: FP8 products "
                           "accumulate in f32)", self.spans["accumulate"], "use accumulate qk=f32 pv=f32")
        if f.get("acc_qk") == "f16" and f.get("scale") is not None and f["scale"] > MAX_F16_SCALE:
            # Q is multiplied by the scale as it is staged in f16 (so the f16 sums stay small):
            # a scale above 1 could push |q| past the f16 range (docs/language.md, Numerics).
            self.error(f"accumulate qk=f16 needs scale <= {MAX_F16_SCALE:g} (Q is multiplied by the scale in f16), "
                       f"not {f['scale']:g}", self.spans["scale"],
                       "use accumulate qk=f32, or a smaller scale")


def _short(text: str) -> str:
    """A number's text as quoted in a message: a 5000-digit one is cut short."""
    return clip(text, NUMBER_QUOTED)


def _shown(node) -> str:
    """A value as quoted in a message (attngen.errors.clip): a word of megabytes is cut short."""
    return _short(node.show()) if isinstance(node, Number) else clip(node.show())


class _At:
    """A stand-in node that only carries a span (for errors about missing values)."""

    def __init__(self, span):
        self.span = span


def build_specs(blocks, source) -> tuple[list[AttentionSpec], list[Diagnostic]]:
    """Read every block; return the valid specs and every diagnostic found."""
    diags: list[Diagnostic] = []
    specs = []
    names: dict = {}
    if not blocks:
        diags.append(Diagnostic("the file defines no attention kernel", Span(source, 1, 1, 1, 2),
                                "a spec file holds one or more `attention NAME { ... }` blocks"))
    for block in blocks:
        name_diag = None
        if len(block.name) > MAX_NAME_LENGTH:
            name_diag = Diagnostic(f"kernel name is {len(block.name)} characters long (at most "
                                   f"{MAX_NAME_LENGTH})", block.name_span)
        elif block.name.startswith("__"):
            languages = _both(t.language for t in target_schemas() if t.language) or "the generated code"
            name_diag = Diagnostic(f"kernel names may not start with '__' (reserved in {languages})",
                                   block.name_span)
        elif block.name in names:
            name_diag = Diagnostic(f"duplicate kernel name '{block.name}' (first on line "
                                   f"{names[block.name].line})", block.name_span,
                                   "each attention block needs its own name")
        else:
            names[block.name] = block.name_span
        # A block with a bad name is still read, so that its other errors are reported too.
        fields = _Reader(block, diags).read()
        if name_diag is not None:
            diags.append(name_diag)
        elif fields is not None:
            specs.append(AttentionSpec(name=block.name, **fields))
    return specs, diags


def parse(text: str, filename: str = "<string>") -> list[AttentionSpec]:
    """Parse spec text into validated AttentionSpecs; raise SpecError with every problem."""
    specs, diags = parse_collect(text, filename)
    if diags:
        raise SpecError(diags)
    return specs


def parse_collect(text, filename="<string>"):
    """Like parse, but return (specs, diagnostics) without raising for semantic errors."""
    if isinstance(text, (bytes, bytearray)):
        text = decode_source(bytes(text), filename)
    if not isinstance(text, str):
        raise TypeError(f"spec text must be str, not {type(text).__name__}")
    if text.startswith("\ufeff"):
        text = text[1:]  # a UTF-8 byte-order mark (some Windows editors write one) is not text
    if "\r" in text:  # classic Mac line endings: lone CRs end lines too
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    source, blocks = parse_blocks(text, filename)
    return build_specs(blocks, source)


# The fields of AttentionSpec and the exact types their values must have (before the language's
# rules): an int field holds an int, not True, 32.0 or numpy.int64(32) (equal to 32, but the
# generated code and the manifest would show them as they are); scale and softcap are reals, an
# int or a float. The fields of Mask, Tile, Schedule and KVCache, and target options, are checked
# by the printed text read back (32.0 prints as 32.0, which the reader refuses) and then by type.
_NONE = type(None)
_FIELD_TYPES = {
    "name": (str,), "head_dim_qk": (int,), "head_dim_v": (int,), "dtype": (str,), "heads_q": (int, _NONE),
    "heads_kv": (int, _NONE), "acc_qk": (str,), "acc_pv": (str,), "mask": (Mask,), "softcap": (int, float, _NONE),
    "scale": (int, float, _NONE), "tile": (Tile,), "schedule": (Schedule,), "kv_cache": (KVCache,),
    "kv_dtype": (str, _NONE), "targets": (tuple,), "inputs": (tuple,), "score": EXPR_TYPES + (_NONE,),
    "out_dtype": (str, _NONE),
}
_REALS = ("softcap", "scale")


def validate(spec) -> list[Diagnostic]:
    """Every problem of an AttentionSpec however it was made (parsed, built directly, changed
    with dataclasses.replace), by the language's own rules: the spec is printed (format_spec)
    and read back by this reader, so an object is checked exactly as strictly as text. A value
    the text cannot say (a wrong type, a field that reads back differently or as another type)
    is reported by name. Diagnostics point into the printed text, named <AttentionSpec NAME>."""
    if not isinstance(spec, AttentionSpec):
        return [Diagnostic(f"expected an AttentionSpec, not {type(spec).__name__}")]
    name = clip(repr(spec.name), 80)  # a valid name (64 characters) whole, with its quotes
    bad = [(f, getattr(spec, f), types) for f, types in _FIELD_TYPES.items() if type(getattr(spec, f)) not in types]
    if bad:
        return [Diagnostic(f"AttentionSpec {name}: field {f} = {clip(repr(v), 200)} has the wrong type "
                           f"({type(v).__name__}; {_needed(types)} is needed)") for f, v, types in bad]
    where = f"<AttentionSpec {spec.name[:64]!r}>"
    try:
        text = format_spec(spec)
    except (TypeError, ValueError, AttributeError, OverflowError) as e:
        return [Diagnostic(f"AttentionSpec {name} cannot be written in the language: {clip(str(e), 200)}")]
    try:
        specs, diags = parse_collect(text, where)
    except SpecError as e:
        return list(e.diagnostics)
    if diags:
        return diags
    back = specs[0]
    # equal is not enough: numpy.int64(3) prints as 3 and reads back equal (an int real, which
    # reads back as a float, is the one difference of type the language has)
    reals = {f: float(getattr(spec, f)) for f in _REALS if type(getattr(spec, f)) is int}
    same_types = typed_key(dataclasses.replace(spec, **reals)) == typed_key(back) if reals else \
        typed_key(spec) == typed_key(back)
    if specs != [spec] or not same_types:
        fields = [f for f in _FIELD_TYPES if f not in reals and
                  typed_key(getattr(back, f)) != typed_key(getattr(spec, f))]
        return [Diagnostic(f"AttentionSpec {name}: field {f} = {clip(repr(getattr(spec, f)), 200)} is not a value "
                           f"of the language (it reads back as {clip(repr(getattr(back, f)), 200)})") for f in fields]
    return []


def _needed(types) -> str:
    """'an int', 'a str or None', 'an int, a float or None'."""
    names = ["None" if t is _NONE else ("an " if t.__name__[0] in "aeiouAEIOU" else "a ") + t.__name__ for t in types]
    return _either(names)
