"""Spec files as text: the bytes of a file decoded (no parser needed: lark is not imported)."""

from __future__ import annotations

from ..errors import Diagnostic, Source, Span, SpecError


# A spec file holds a few lines per kernel (and may carry long comments: tests/cli's 8 MB one).
# Reading stops past this many bytes and the file is refused, so that an endless stream
# (/dev/zero, /dev/full, a pipe that never closes) costs bounded memory and time instead of all
# of both.
MAX_SOURCE_BYTES = 64 << 20


def read_source(stream, filename: str) -> str:
    """The UTF-8 text read from a binary `stream` (a spec file, standard input), at most
    MAX_SOURCE_BYTES; a SpecError for more, or for bytes that are not spec text."""
    data = stream.read(MAX_SOURCE_BYTES + 1)
    if len(data) > MAX_SOURCE_BYTES:
        size = f"{MAX_SOURCE_BYTES >> 20} MiB" if MAX_SOURCE_BYTES >= 1 << 20 else f"{MAX_SOURCE_BYTES} bytes"
        raise SpecError([Diagnostic(f"the file is longer than {size} (reading stopped "
                                    "there); a spec file holds a few lines per kernel",
                                    Span(Source(filename, "\n"), 1, 1, 1, 2),
                                    "is this a spec file? (not a device such as /dev/zero, nor an endless "
                                    "stream)")])
    return decode_source(data, filename)


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
