"""What every backend's emitter shares: the jinja environment, the source header, the common
part of the manifest, the numeric constants of the algorithm.

Templates only substitute: Python builds every list and number they print. A template
error names the template and its line. Nothing here knows a target.
"""

from __future__ import annotations

import functools
import math

import jinja2

from ..lang.expr import format_expr
from ..plan import masks
from ..plan.kernel_plan import F16_SCORE_BOUND, LN2, LOG2E, KernelPlan
from ..resources import generator_version, resource_dir
from ..version import __version__


class TemplateError(RuntimeError):
    """A template failed to render: a bug in attngen, reported with template and line."""


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(resource_dir("templates"))),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render(template: str, **context) -> str:
    try:
        return environment().get_template(template).render(**context)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"{e.filename or e.name}:{e.lineno}: {e.message}") from None
    except jinja2.UndefinedError as e:
        raise TemplateError(f"{template}{_template_line(e)}: {e.message}") from None


def _template_line(exc: BaseException) -> str:
    """':LINE (in NAME)' of the innermost template frame of a rendering error."""
    tb, found = exc.__traceback__, ""
    while tb is not None:
        name = tb.tb_frame.f_globals.get("__jinja_template__")
        if name is not None:
            found = f":{name.get_corresponding_lineno(tb.tb_lineno)} (in {name.name})"
        tb = tb.tb_next
    return found


def c_float(x: float) -> str:
    """A float literal both C++ (with the f suffix added by the caller's template) and WGSL read."""
    if not math.isfinite(x):
        raise ValueError(f"not a finite constant: {x}")
    text = repr(float(x))
    return text if ("e" in text or "." in text) else text + ".0"


def constants(plan: KernelPlan) -> dict:
    """The numeric constants both templates print, with what they mean."""
    # The factor left to apply to a raw dot product: 1 when Q was pre-scaled.
    left = 1.0 if plan.prescale_q else plan.scale
    out = {
        "scale": c_float(plan.scale),
        "scale_log2": c_float(left * LOG2E),
        "scale_doc": ("1 / sqrt(head_dim qk)" if plan.spec.scale is None else "from the spec")
        + ("; applied to Q as it is staged (f16 accumulators)" if plan.prescale_q else ""),
        "prescale_q": plan.prescale_q,
        "ln2": c_float(LN2),
        "log2e": c_float(LOG2E),
        "f16_score_bound": c_float(F16_SCORE_BOUND),
    }
    if plan.softcap is not None:
        out.update(
            softcap=c_float(plan.softcap),
            scale_over_cap=c_float(left / plan.softcap),
            softcap_log2=c_float(plan.softcap * LOG2E),
        )
    else:
        out["softcap"] = None
    return out


def mask_doc(plan: KernelPlan) -> str:
    return masks.describe(plan.mask)


def transform_doc(plan: KernelPlan) -> str:
    s = "s" if plan.prescale_q else "scale * s"
    if plan.spec.score is not None:
        return f"score_expr({s}, the indices), the spec's score {format_expr(plan.spec.score)}"
    if plan.softcap is not None:
        return f"softcap * tanh({s} / softcap)"
    return s


def layout_lines(plan: KernelPlan, title: str) -> list[str]:
    """The header's description of the on-chip buffers, one line each."""
    c = plan.config
    width = max(len(b.name) for b in c.buffers)
    lines = [f"{title}: {c.smem_bytes} bytes (each buffer 16-byte aligned):"]
    for b in c.buffers:
        copies = f"{b.copies} x " if b.copies > 1 else ""
        lines.append(f"  {b.name:<{width}} at {b.offset:>6}: {copies}{b.rows} x {b.cols} {b.dtype} ({b.doc})")
    return lines


def header_lines(plan: KernelPlan, layout_lines: list[str]) -> list[str]:
    """The comment at the top of every generated source (without comment markers)."""
    lines = [
        f"attngen {__version__}: flash-attention forward kernel for target {plan.target} "
        f"(profile {plan.profile}).",
        f"Generated from the spec below; regenerate with `attngen build SPEC --target {plan.target}"
        f" --kernel {plan.spec.name}` rather than editing.",
        "",
        "Spec (normalised, every default filled in):",
    ]
    lines += ["  " + ln for ln in plan.spec_text.rstrip("\n").splitlines()]
    lines += [
        "",
        f"Plan: {plan.summary()}.",
        f"Scale {plan.scale!r}" + (f", softcap {plan.softcap!r}" if plan.softcap is not None else "")
        + f"; {mask_doc(plan)}",
        *layout_lines,
        f"Grid: ({', '.join(plan.grid)}), {plan.threads} threads each; tensors are "
        "(batch, seq, heads, head_dim): q (B, Lq, Hq, Dqk), k (B, Lk, Hkv, Dqk), v (B, Lk, Hkv, Dv), "
        "out (B, Lq, Hq, Dv); lse (B, Hq, Lq) f32.",
        f"Entry point: {plan.entry}; the manifest (attngen build --emit manifest) lists the "
        "parameters in order.",
    ]
    return lines


def comment_block(lines: list[str], prefix: str = "//") -> str:
    width = 96
    out = [prefix + " " + "=" * (width - len(prefix) - 1)]
    for ln in lines:
        out.append((prefix + " " + ln).rstrip())
    out.append(prefix + " " + "=" * (width - len(prefix) - 1))
    return "\n".join(out)


MANIFEST_VERSION = 1  # raised when a field a foreign runtime reads changes meaning or goes away


def manifest(plan: KernelPlan, extra: dict) -> dict:
    """Everything a runtime without Python needs to launch the source."""
    c = plan.config
    out = {
        # the manifest's own version: a foreign runtime checks it (WGSL: docs/manifest-wgsl.schema.json)
        "manifest_version": MANIFEST_VERSION,
        "attngen": __version__,
        "generator": generator_version(),
        "target": plan.target,
        "profile": plan.profile,
        "entry_point": plan.entry,
        "kernel": plan.spec.name,
        "spec": plan.spec_text,
        "parameters": manifest_params(plan.params),
        "grid": list(plan.grid),
    }
    if plan.entries:
        # Every entry point in launch order, all on the same stream (Entry.before: before the main one).
        later = [{"role": e.name, "entry_point": e.entry, "doc": e.doc, "grid": list(e.grid),
                  "threads": e.threads, "shared_memory_bytes": e.smem_bytes,
                  "parameters": manifest_params(e.params)} for e in plan.entries]
        main = [{"role": "main", "entry_point": plan.entry, "grid": list(plan.grid),
                 "threads": plan.threads, "shared_memory_bytes": plan.smem_bytes}]
        first = sum(e.before for e in plan.entries)  # (the entries before the main one come first)
        out["entry_points"] = later[:first] + main + later[first:]
    out.update({
        "grid_symbols": {
            "B": "batch", "Lq": "query rows per sequence", "Lk": "keys per sequence",
            "Hq": "query heads", "Hkv": "KV heads", "Dqk": plan.d_qk, "Dv": plan.d_v,
        },
        "tile": {"q": c.tile_q, "kv": c.tile_kv},
        "dtype": plan.dtype,
        **({"out_dtype": plan.out_dtype} if plan.out_dtype != plan.dtype else {}),
        "accumulate": {"qk": plan.acc_qk, "pv": plan.acc_pv},
        "scale": plan.scale,
        "softcap": plan.softcap,
        "lse": {"layout": ["B", "Hq", "Lq"], "dtype": "f32", "units": "natural log",
                "empty_row": "-inf"},
        "layout": "contiguous head_dim (stride 1); other strides as passed",
    })
    out.update(extra)
    return out


def manifest_params(params) -> list:
    """The parameters (CUDA, in order) or bindings (WGSL) of one entry point, as JSON."""
    out = []
    for p in params:
        entry = {"name": p.name, "kind": p.kind, "dtype": p.dtype}
        if p.shape:
            entry["shape"] = list(p.shape)
        if p.binding is not None:
            entry["binding"] = p.binding
            entry["group"] = 0
        entry["access"] = p.access
        if p.optional:
            entry["optional"] = True
        entry["doc"] = p.doc
        out.append(entry)
    return out
