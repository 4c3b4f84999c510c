"""The `target NAME { key=value ... }` blocks: which targets exist and which options each takes.

The language has one generic form for target options. The vocabulary is contributed by the
backends: attngen.backends registers each backend's `TargetSchema` here, so that a new target
adds to the language without an edit to it. Every option is an integer range or a choice of
words, and every option may be `auto` (stored as None), which is also its default.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..limits import INT32_MAX as MAX_INT


@dataclass(frozen=True)
class Option:
    """One option of a target block."""

    name: str
    kind: str  # "int" (lo..hi) or "choice" (one of `choices`; "auto" among them)
    lo: int = 1
    hi: int = MAX_INT
    choices: tuple = ()
    what: str = ""  # how an error names a bad choice, e.g. "subgroups mode"
    usage: str = "N"  # the value's form in usage hints: "N", "auto|on|off"
    # the option is one of the choices `attngen tune` makes (its sweep sets it, or it fixes what
    # the sweep sets, as cuda's warps fix tile q): a spec that sets it is not tuned; the other
    # options are kept through a tuned choice
    tiling: bool = False
    # whether a spec's canonical text (spec.format_spec) shows the option at auto: False for options
    # added after specs were stored (cuda's mask_expr), so that the text of specs that leave them
    # at auto, and so every golden file and cache key of theirs, stays what it was
    printed_at_auto: bool = True

    def __post_init__(self):
        if self.kind not in ("int", "choice"):
            raise ValueError(f"option {self.name}: kind must be 'int' or 'choice', not {self.kind!r}")


@dataclass(frozen=True)
class TargetSchema:
    """The options of `target NAME { ... }`, in the order they are printed."""

    name: str
    options: tuple
    language: str = ""  # the language kernels are generated in ("C++"), for messages

    def option(self, name: str) -> Option | None:
        return next((o for o in self.options if o.name == name), None)

    @property
    def usage(self) -> str:
        return f"target {self.name} {{ " + " ".join(f"{o.name}={o.usage}" for o in self.options) + " }"


_SCHEMAS: dict[str, TargetSchema] = {}


def register_target(schema: TargetSchema) -> None:
    """Add (or replace) a target's options; the backends registry calls this."""
    _SCHEMAS[schema.name] = schema


def unregister_target(name: str) -> None:
    _SCHEMAS.pop(name, None)


def target_schemas() -> tuple[TargetSchema, ...]:
    """The registered targets, in registration order."""
    return tuple(_SCHEMAS.values())


def target_schema(name: str) -> TargetSchema | None:
    return _SCHEMAS.get(name)
