"""The language: spec text -> syntax tree with spans (syntax.py) -> AttentionSpec (reader.py).

Knows nothing of plans, targets' internals or devices. The options of `target NAME { }`
blocks are registered by the backends (options.py). lark is imported only when text is parsed.
"""

from __future__ import annotations


def parse(text, filename: str = "<string>"):
    """Parse spec text into validated AttentionSpecs; raise SpecError with every problem."""
    from .reader import parse as _parse
    return _parse(text, filename)


def parse_collect(text, filename: str = "<string>"):
    """Like parse, but return (specs, diagnostics) without raising for semantic errors."""
    from .reader import parse_collect as _parse_collect
    return _parse_collect(text, filename)


def validate(spec):
    """Every problem of an AttentionSpec however it was made (list of Diagnostic; empty: valid)."""
    from .reader import validate as _validate
    return _validate(spec)


def decode_source(data: bytes, filename: str) -> str:
    """UTF-8 text of a spec file, or a SpecError pointing at the first undecodable byte."""
    from .reader import decode_source as _decode
    return _decode(data, filename)


__all__ = ["decode_source", "parse", "parse_collect", "validate"]
