"""attngen.torch: compiled kernels as PyTorch operators (docs/torch.md).

    import attngen, attngen.torch
    kernel = attngen.compile(spec, target=...)
    attn = attngen.torch.operator(kernel)      # torch.ops.attngen.<name>, with a fake implementation
    out = attn(q, k, v)                        # also inside torch.compile(fullgraph=True) and CUDA graphs

The operator is the kernel's target's: a target whose kernels have none says so.
"""

from __future__ import annotations


def operator(kernel, name: str | None = None):
    """The PyTorch operator of a compiled kernel (registered once per kernel plan; `name`
    overrides the registered name attngen::<spec name>_<key>)."""
    return kernel.torch_operator(name)


__all__ = ["operator"]
