"""Errors users see: positions in spec files, diagnostics with carets and hints.

A `Span` points into a `Source` (the file's name and text). Spans never take part in the
equality of the dataclasses that carry them, so a spec parsed from two differently
formatted files compares equal when it means the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import difflib
import functools


@dataclass(frozen=True, eq=False)
class Source:
    """A spec file's name and text, shared by all spans into it."""

    name: str
    text: str

    @functools.cached_property
    def lines(self) -> list[str]:
        """The lines as the parser counts them: split at newlines only (str.splitlines also
        breaks at form feeds, lone carriage returns and U+2028), a CRLF's carriage return dropped."""
        return [ln[:-1] if ln.endswith("\r") else ln for ln in self.text.split("\n")]

    def line(self, lineno: int) -> str:
        lines = self.lines
        return lines[lineno - 1] if 1 <= lineno <= len(lines) else ""


@dataclass(frozen=True)
class Span:
    """A region of a source: 1-based line and column of its start and end."""

    source: Source = field(compare=False, repr=False)
    line: int
    column: int
    end_line: int
    end_column: int

    @property
    def filename(self) -> str:
        return self.source.name

    def __str__(self) -> str:
        return f"{self.source.name}:{self.line}:{self.column}"


@dataclass(frozen=True)
class Diagnostic:
    """One error: where, what, and how to fix it."""

    message: str
    span: Span | None = None
    hint: str | None = None

    def sort_key(self):
        if self.span is None:
            return ("", 0, 0, self.message)
        return (self.span.filename, self.span.line, self.span.column, self.message)

    def format(self) -> str:
        if self.span is None:
            out = [f"error: {self.message}"]
        else:
            s = self.span
            out = [f"{s}: error: {self.message}"]
            text = s.source.line(s.line)
            if text or s.line >= 1:
                width = 1
                if s.end_line == s.line and s.end_column > s.column:
                    width = s.end_column - s.column
                col = max(1, min(s.column, len(text) + 1))
                width = max(1, min(width, len(text) + 1 - col + 1))
                # clip first: a diagnostic costs the window, not the whole line (linear in errors)
                shown, col, width = _clip(text, col, width)
                out.append(f"    {_printable(shown)}")
                out.append("    " + " " * (col - 1) + "^" * width)
        if self.hint:
            out.append(f"  hint: {self.hint}")
        return "\n".join(out)


# Snippet lines longer than this are cut to a window around the caret.
SNIPPET_WIDTH = 100
# A SpecError shows at most this many diagnostics (the first by position), then how many more.
MAX_SHOWN = 50


def _clip(shown: str, col: int, width: int) -> tuple[str, int, int]:
    """A window of at most SNIPPET_WIDTH characters of a long line, '...' marking the cuts
    (the caret's column and width moved into the window)."""
    if len(shown) <= SNIPPET_WIDTH:
        return shown, col, width
    width = min(width, SNIPPET_WIDTH // 2)
    start = max(0, col - 1 - SNIPPET_WIDTH // 4)
    end = start + SNIPPET_WIDTH
    head = "..." if start > 0 else ""
    tail = "..." if end < len(shown) else ""
    return head + shown[start:end] + tail, col - start + len(head), width


def _printable(text: str) -> str:
    """The line as shown in a snippet: tabs as one space, control characters as '?'."""
    return "".join(" " if c == "\t" else (c if c.isprintable() else "?") for c in text)


class SpecError(ValueError):
    """An invalid spec: every diagnostic found, sorted by position."""

    def __init__(self, diagnostics):
        diags = sorted(diagnostics, key=Diagnostic.sort_key)
        if not diags:
            raise ValueError("SpecError needs at least one diagnostic")
        self.diagnostics = tuple(diags)
        super().__init__(self.format())

    def __reduce__(self):  # picklable (process pools, pytest-xdist): rebuilt from its diagnostics
        return (type(self), (self.diagnostics,))

    def format(self) -> str:
        """The first MAX_SHOWN diagnostics by position, then how many more there are."""
        n = len(self.diagnostics)
        body = "\n".join(d.format() for d in self.diagnostics[:MAX_SHOWN])
        if n > MAX_SHOWN:
            body += f"\n... and {n - MAX_SHOWN} more (the first {MAX_SHOWN} are shown)"
        if n > 1:
            body += f"\n{n} errors"
        return body


class LaunchError(ValueError):
    """Bad run-time inputs to a compiled kernel: wrong shape, dtype, device or layout."""


class ConfigError(ValueError):
    """A model config (attngen.transformers, `attngen spec --from-hf`) attngen cannot turn into
    specs: the message names the field and why."""


class CompileError(RuntimeError):
    """A generated kernel failed to compile: a bug in attngen, reported with the log."""


# How much of the user's text a message quotes: a number's digits, a word (a key, dtype, option
# or kernel name: MAX_NAME_LENGTH, the longest name a kernel may have, so every word that could be
# valid is quoted whole). A file may hold a word of megabytes; its message stays a line.
NUMBER_QUOTED = 24
WORD_QUOTED = 64


def clip(text: str, limit: int = WORD_QUOTED) -> str:
    """`text` as a message quotes it: whole up to `limit` characters, else cut short with '...'."""
    return text if len(text) <= limit else text[:limit - 4] + "..."


def did_you_mean(word: str, choices, aliases: dict[str, str] | None = None) -> str | None:
    """A hint naming the closest valid choice, or None."""
    close = closest(word, choices, aliases)
    return f"did you mean '{close}'?" if close else None


def closest(word: str, choices, aliases: dict[str, str] | None = None) -> str | None:
    """The valid choice `word` is most likely a typo of (an alias's name first), or None."""
    choices = list(choices)
    # difflib's ratio is at most 2*min(len)/(len+len): below its 0.6 cutoff once the word is over
    # 3 times the longest choice. Such a word (a hostile file's megabytes) gets no suggestion
    # without difflib indexing it (a 50 MB key took seconds and gigabytes).
    if len(word) > 3 * max((len(c) for c in [*choices, *(aliases or ())]), default=0):
        return None
    if aliases and word.lower() in aliases:
        return aliases[word.lower()]
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if not close:
        close = difflib.get_close_matches(word.lower(), choices, n=1, cutoff=0.6)
    return close[0] if close else None
