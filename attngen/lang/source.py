"""Spec files as text: the bytes of a file decoded (no parser needed: lark is not imported)."""

from __future__ import annotations

from ..errors import Diagnostic, Source, Span, SpecError


def decode_source(data: bytes, filename: str) -> str:
    """UTF-8 text of a spec file, or a SpecError pointing at the first undecodable byte."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        good = data[: e.start].decode("utf-8")
        line = good.count("\n") + 1
        col = len(good) - (good.rfind("\n") + 1) + 1
        src = Source(filename, good + "\n")
        raise SpecError([Diagnostic(f"the file is not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                                    f"{e.start})", Span(src, line, col, line, col + 1),
                                    "spec files are plain text")]) from None
    if "\x00" in text:
        pos = text.index("\x00")
        line = text.count("\n", 0, pos) + 1
        col = pos - (text.rfind("\n", 0, pos) + 1) + 1
        src = Source(filename, text)
        raise SpecError([Diagnostic("the file contains a NUL byte (is it binary?)",
                                    Span(src, line, col, line, col + 1), "spec files are plain text")])
    return text
