"""attngen: a compiler for flash-attention kernels (CUDA C++ and WGSL from one spec).

    import attngen
    spec = attngen.load("examples/llama3_8b.attn")
    src = attngen.emit(spec, target="wgsl").source
    kernel = attngen.compile(spec, target="cuda")
    out = kernel(q, k, v)
"""

__version__ = "0.1.0"

from .errors import CompileError, LaunchError, SpecError  # noqa: E402
from .spec import AttentionSpec, format_spec  # noqa: E402
from .api import compile, emit, load, parse, reference  # noqa: E402
from .blockmask import BlockMask, block_mask  # noqa: E402
from .merge import merge  # noqa: E402

__all__ = [
    "AttentionSpec", "BlockMask", "CompileError", "LaunchError", "SpecError", "compile", "block_mask", "emit", "format_spec",
    "load", "merge", "parse", "reference", "__version__",
]
