"""The frontend: spec text -> syntax tree (syntax.py) -> AttentionSpec (build.py)."""

from .build import decode_source, parse, parse_collect

__all__ = ["decode_source", "parse", "parse_collect"]
