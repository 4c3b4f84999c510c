"""The language: spec text -> syntax tree with spans (syntax.py) -> AttentionSpec (reader.py).

Knows nothing of plans, targets' internals or devices. The options of `target NAME { }`
blocks are registered by the backends (options.py). lark is imported only when text is parsed.
"""

from __future__ import annotations

from .source import MAX_SOURCE_BYTES, decode_source, read_source
from .spec import typed_key


def parse(text, filename: str = "<string>"):
    """Parse spec text into validated AttentionSpecs; raise SpecError with every problem."""
    from .reader import parse as _parse
    specs = _parse(text, filename)
    mark_read(specs)
    return specs


def parse_collect(text, filename: str = "<string>"):
    """Like parse, but return (specs, diagnostics) without raising for semantic errors."""
    from .reader import parse_collect as _parse_collect
    return _parse_collect(text, filename)


# Specs the reader built from text with no diagnostic: valid by construction (parse of their
# printed text gives them back), so validate() need not print and re-read them (which would
# load lark and build its parser: most of a cached compile's time in a fresh process).
_READ: dict = {}
_READ_MAX = 4096


def mark_read(specs) -> None:
    """Remember `specs` as built by the reader (or found in the disk cache of parsed text)."""
    if len(_READ) > _READ_MAX:
        _READ.clear()
    for s in specs:
        _READ[typed_key(s)] = None


def validate(spec):
    """Every problem of an AttentionSpec however it was made (list of Diagnostic; empty: valid)."""
    try:
        # keyed by value and type: an equal spec of other types (32.0 for 32) is not the one read
        if typed_key(spec) in _READ:
            return []
    except TypeError:  # unhashable: not something the reader made
        pass
    from .reader import validate as _validate
    return _validate(spec)


__all__ = ["MAX_SOURCE_BYTES", "decode_source", "read_source", "mark_read", "parse", "parse_collect", "validate"]
