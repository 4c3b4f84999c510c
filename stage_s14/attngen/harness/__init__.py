"""Kernels on this machine's device against the float64 oracle: `attngen run` (runner.py) and
`attngen tune` (tune.py: the sweep, the stored results, their lookup). They sit above both
runtime/ and reference.py, which they compare; the target's backend is handed in, so nothing
here knows a target."""
