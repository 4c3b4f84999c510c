"""Text -> syntax tree: one cached LALR parser, positions kept, lark errors made ours.

The tree is small frozen dataclasses (Block, Setting, Word, Number, Pair, Call, and in the
expressions of `mask`, `score` and `input` also Unary, Binary, Index), each with a Span.
Nothing here knows which keys exist; that is attngen.lang.reader's job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import functools
import re

import lark
from lark import Transformer, v_args

from ..errors import Diagnostic, Source, Span, SpecError, clip, did_you_mean
from ..resources import resource_path

# Kernel names become C and WGSL identifiers (prefixed); keep them short and plain.
MAX_NAME_LENGTH = 64


@dataclass(frozen=True)
class Word:
    text: str
    span: Span = field(compare=False)

    def show(self) -> str:
        return self.text


@dataclass(frozen=True)
class Number:
    value: int | float
    text: str
    span: Span = field(compare=False)

    def show(self) -> str:
        return self.text


@dataclass(frozen=True)
class Pair:
    key: str
    key_span: Span = field(compare=False)
    value: Word | Number = None
    span: Span = field(compare=False, default=None)

    def show(self) -> str:
        return f"{self.key}={self.value.show()}"


@dataclass(frozen=True)
class Call:
    name: str
    args: tuple
    span: Span = field(compare=False)

    def show(self) -> str:
        return f"{self.name}({', '.join(a.show() for a in self.args)})"


@dataclass(frozen=True)
class Unary:
    """`-x` or `!x` in an expression (a negated number literal is read as a Number)."""

    op: str
    operand: object
    span: Span = field(compare=False)

    def show(self) -> str:
        return f"{self.op}{self.operand.show()}"


@dataclass(frozen=True)
class Binary:
    """`left OP right` in an expression: || && == != < <= > >= + - * / // %."""

    op: str
    left: object
    right: object
    span: Span = field(compare=False)

    def show(self) -> str:
        return f"{self.left.show()} {self.op} {self.right.show()}"


@dataclass(frozen=True)
class Index:
    """`name[i, j, ...]`: an element of an input tensor."""

    name: str
    name_span: Span = field(compare=False)
    indices: tuple
    span: Span = field(compare=False)

    def show(self) -> str:
        return f"{self.name}[{', '.join(i.show() for i in self.indices)}]"


@dataclass(frozen=True)
class Setting:
    key: str
    key_span: Span = field(compare=False)
    values: tuple
    options: tuple | None  # the pairs of a `{ ... }` block, or None
    span: Span = field(compare=False)


@dataclass(frozen=True)
class Block:
    name: str
    name_span: Span = field(compare=False)
    settings: tuple
    span: Span = field(compare=False)


@functools.lru_cache(maxsize=1)
def _parser() -> lark.Lark:
    grammar = resource_path("grammar", "attn.lark").read_text()
    return lark.Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=False)


def _span(source: Source, meta_or_token) -> Span:
    m = meta_or_token
    return Span(source, m.line, m.column, m.end_line, m.end_column)


class _ToAst(Transformer):
    def __init__(self, source: Source):
        super().__init__()
        self.source = source

    def _s(self, x):
        return _span(self.source, x)

    def start(self, items):
        return tuple(items)

    @v_args(meta=True)
    def attention(self, meta, items):
        name, *settings = items
        return Block(str(name), self._s(name), tuple(settings), self._s(meta))

    @v_args(meta=True)
    def setting(self, meta, items):
        key, *rest = items
        options = None
        if rest and isinstance(rest[-1], list):
            options = tuple(rest.pop())
        return Setting(str(key), self._s(key), tuple(rest), options, self._s(meta))

    def options(self, items):
        return list(items)

    @v_args(meta=True)
    def pair(self, meta, items):
        key, value = items
        return Pair(str(key), self._s(key), value, self._s(meta))

    @v_args(meta=True)
    def call(self, meta, items):
        name, *args = items
        return Call(str(name), tuple(a for a in args if a is not None), self._s(meta))

    @v_args(meta=True)
    def binary(self, meta, items):
        left, op, right = items
        return Binary(str(op), left, right, self._s(meta))

    @v_args(meta=True)
    def unary(self, meta, items):
        op, operand = items
        if str(op) == "-" and isinstance(operand, Number) and (not operand.text.startswith("-") or operand.value == 0):
            # `-1`: the literal -1 (as the signed numbers of other settings read), so that
            # `window(left=-1)` is the number it always was; `-(-0)` is the literal 0 too, as
            # format_expr prints it (the IR has no other text for it)
            return Number(-operand.value, "-" + operand.text, self._s(meta))
        return Unary(str(op), operand, self._s(meta))

    @v_args(meta=True)
    def index(self, meta, items):
        name, *indices = items
        return Index(str(name), self._s(name), tuple(indices), self._s(meta))

    def word(self, items):
        (tok,) = items
        return Word(str(tok), self._s(tok))

    def number(self, items):
        (tok,) = items
        text = str(tok)
        is_int = all(c in "0123456789+-" for c in text)
        if is_int:
            # Python refuses to convert very long digit strings; anything that long is
            # out of every range anyway, so keep a stand-in that is too large (or, for a
            # negative number, too small). Leading zeros do not make a number large.
            digits = text.lstrip("+-").lstrip("0") or "0"
            value = (-1 if text.startswith("-") else 1) * (int(digits) if len(digits) <= 40 else 10**40)
        else:
            value = float(text)
        return Number(value, text, self._s(tok))


_TOKEN_NAMES = {
    "LBRACE": "'{'", "RBRACE": "'}'", "LPAR": "'('", "RPAR": "')'", "EQUAL": "'='",
    "COMMA": "','", "_NL": "a new line", "NAME": "a name", "NUMBER": "a number",
    "ATTENTION": "'attention'", "$END": "the end of the file", "UNUMBER": "a number",
    "LSQB": "'['", "RSQB": "']'", "NEG": "'-'", "BANG": "'!'",
    "MASK": "a name", "SCORE": "a name", "INPUT": "a name",  # keywords only where a setting starts
}
# The operators between two operands: an error after an operand names them once, as "an operator".
_OPERATORS = {"OROR", "ANDAND", "CMP", "ADDOP", "MULOP"}
_EXPRESSION_KEYS = ("mask", "score", "input")
# Tokens of expressions only: where no expression is parsed they are characters the file may not hold.
_EXPRESSION_TOKENS = _OPERATORS | {"NEG", "BANG", "LSQB", "RSQB"}


def _describe(expected) -> str:
    names = sorted({_TOKEN_NAMES.get(e, e) for e in expected if e not in _OPERATORS})
    if not names:
        return "an operator" if _OPERATORS & set(expected) else "nothing"
    listed = ", ".join(names[:-1]) + (" or " if len(names) > 1 else "") + names[-1]
    return listed + (" (or an operator)" if _OPERATORS & set(expected) else "")


def _end_of_text(source: Source) -> tuple[int, int]:
    """Line and column just after the last line that is not blank."""
    lines = source.lines
    n = len(lines)
    while n > 1 and not lines[n - 1].strip():
        n -= 1
    return n, len(lines[n - 1]) + 1


def _unclosed_block(source: Source, upto_line: int) -> int | None:
    """The line of an `attention` block opened inside another one before `upto_line`, if any:
    the usual cause of a confusing syntax error is a '}' missing before that line."""
    depth = 0
    for n, text in enumerate(source.lines[:upto_line], start=1):
        code = text.split("#", 1)[0]
        if depth > 0 and code.split()[:1] == ["attention"]:
            return n
        depth += code.count("{") - code.count("}")
    return None


def _bad_character(source: Source, pos: int) -> tuple[str, str | None]:
    """The message and hint for a character the grammar does not take at offset `pos`."""
    ch = source.text[pos] if pos < len(source.text) else ""
    shown = repr(ch) if ch.isprintable() else f"U+{ord(ch):04X}" if ch else "end of file"
    before = source.text[pos - 1] if pos > 0 else ""
    in_name = before.isascii() and (before.isalnum() or before == "_")
    hint = None
    if ch and ((ch in "-." and in_name) or (ch.isalpha() and not ch.isascii())):
        hint = "names are ASCII letters, digits and '_', starting with a letter or '_'"
    elif ch and ch.isdigit() and not ch.isascii():
        hint = "numbers are written with the ASCII digits 0-9"
    return f"unexpected character {shown}", hint


def _syntax_error(source: Source, err: lark.exceptions.UnexpectedInput) -> Diagnostic:
    line, col = max(err.line, 1), max(err.column, 1)
    hint = None
    if isinstance(err, lark.exceptions.UnexpectedCharacters):
        msg, hint = _bad_character(source, err.pos_in_stream)
        end_col = col + 1
    elif (isinstance(err, lark.exceptions.UnexpectedToken) and err.token.type in _EXPRESSION_TOKENS
          and not _EXPRESSION_TOKENS & set(err.expected)):
        # an operator outside an expression (`scale -inf`, `attention x*/`): a character the file
        # may not hold there, reported as before expressions existed
        msg, hint = _bad_character(source, err.token.start_pos)
        end_col = col + 1
        key = source.line(line).split("#", 1)[0].split()[:1]
        if hint is None and key and err.token.type not in ("ADDOP", "NEG"):  # `maks k <= q`
            close = did_you_mean(key[0], _EXPRESSION_KEYS)
            if close:
                hint = f"{close} (expressions follow {', '.join(_EXPRESSION_KEYS)} only)"
    elif isinstance(err, lark.exceptions.UnexpectedEOF):
        msg = f"unexpected end of file; expected {_describe(err.expected)}"
        line, col = _end_of_text(source)
        end_col = col + 1
        if "RBRACE" in err.expected:
            hint = "a block opened with '{' is not closed with '}'"
    else:
        tok = err.token
        if tok.type == "$END":
            line, col = _end_of_text(source)
            msg = f"unexpected end of file; expected {_describe(err.expected)}"
            if "RBRACE" in err.expected:
                hint = "a block opened with '{' is not closed with '}'"
            end_col = col + 1
        else:
            shown = "end of line" if tok.type == "_NL" else repr(clip(str(tok)))
            msg = f"unexpected {shown}; expected {_describe(err.expected)}"
            end_col = col + max(1, len(str(tok).split("\n")[0]))
            unclosed = _unclosed_block(source, line)
            if unclosed is not None:
                hint = f"the block before line {unclosed} is not closed: is a '}}' missing there?"
            elif "ATTENTION" in err.expected and tok.type == "NAME":
                hint = did_you_mean(str(tok), ["attention"]) or "a file holds `attention NAME { ... }` blocks"
            elif tok.type == "RBRACE" and "ATTENTION" in err.expected:
                hint = "this '}' closes no block: is there one '}' too many?"
            elif tok.type in ("NUMBER", "UNUMBER") and set(err.expected) == {"NAME"}:
                hint = "names are ASCII letters, digits and '_', starting with a letter or '_'"
            elif tok.type == "COMMA" and "RBRACE" in err.expected:
                hint = "separate a target's options with spaces, not commas"
            elif tok.type == "_NL" and "RBRACE" in err.expected:
                hint = "put one setting per line; a target's options go inside { } on one or more lines"
            elif tok.type == "RBRACE" and "_NL" in err.expected:
                hint = "is a '{' missing before it?"
            elif tok.type in ("NAME", "ATTENTION") and "_NL" in err.expected:
                hint = "settings go one per line"
    return Diagnostic(msg, Span(source, line, col, line, end_col), hint)


# A spec file holds a few lines per kernel (about 50 tokens). Past this many tokens a file is
# refused before it is parsed, so that a huge or hostile file costs a fraction of a second: the
# scan below runs in C (the regex engine), the parser in Python.
MAX_TOKENS = 20_000
_TOKENS = re.compile(r"#[^\n]*|[A-Za-z_][A-Za-z0-9_]*|[^\s#]")


def _check_size(source: Source) -> None:
    """A SpecError at the first token past MAX_TOKENS (comments and blanks do not count)."""
    count = 0
    for m in _TOKENS.finditer(source.text):
        if m.group().startswith("#"):
            continue
        count += 1
        if count > MAX_TOKENS:
            pos = m.start()
            line = source.text.count("\n", 0, pos) + 1
            col = pos - (source.text.rfind("\n", 0, pos) + 1) + 1
            raise SpecError([Diagnostic(
                f"the file has more than {MAX_TOKENS} tokens; a spec file holds a few lines per kernel",
                Span(source, line, col, line, col + 1),
                "is this a spec file? split very large files, one or more kernels each")])


def parse_blocks(text: str, filename: str = "<string>") -> tuple[Source, tuple[Block, ...]]:
    """Parse text into blocks; syntax errors raise SpecError (the first one, with position)."""
    source = Source(filename, text)
    _check_size(source)
    try:
        tree = _parser().parse(text)
    except lark.exceptions.UnexpectedInput as err:
        raise SpecError([_syntax_error(source, err)]) from None
    return source, _ToAst(source).transform(tree)
