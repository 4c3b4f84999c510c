"""attngen: a compiler for flash-attention kernels (CUDA C++ and WGSL from one spec).

    import attngen
    spec = attngen.load("examples/llama3_8b.attn")
    src = attngen.emit(spec, target="wgsl").source
    kernel = attngen.compile(spec, target="cuda")
    out = kernel(q, k, v)

The names below are imported on first use, so `import attngen` loads neither the parser (lark),
nor the templates (jinja2), nor a device library: each comes when a call needs it.
"""

from .version import __version__
from .errors import CompileError, LaunchError, SpecError
# Functions named like their modules are bound here, so that a later import of the module
# (attngen.reference, attngen.merge) cannot shadow them; both need only numpy.
from .merge import merge
from .reference import reference, reference_backward

# public name -> (module, attribute)
_LAZY = {
    "AttentionSpec": ("lang.spec", "AttentionSpec"),
    "format_spec": ("api", "format_spec"),
    "parse": ("api", "parse"),
    "load": ("api", "load"),
    "lower": ("api", "lower"),
    "check": ("api", "check"),
    "emit": ("api", "emit"),
    "compile": ("api", "compile"),
    "targets": ("api", "targets"),
    "BlockMask": ("runtime.blockmask", "BlockMask"),
    "block_mask": ("runtime.blockmask", "block_mask"),
    "quantize_kv": ("runtime.kvquant", "quantize_kv"),
    "dequantize_kv": ("runtime.kvquant", "dequantize_kv"),
    "quantize_fp8": ("runtime.fp8", "quantize_fp8"),
    "dequantize_fp8": ("runtime.fp8", "dequantize_fp8"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "AttentionSpec", "BlockMask", "CompileError", "LaunchError", "SpecError", "block_mask", "check", "compile",
    "dequantize_fp8", "dequantize_kv", "emit", "format_spec", "load", "lower", "merge", "parse", "quantize_fp8",
    "quantize_kv", "reference", "reference_backward", "targets",
    "__version__",
]
