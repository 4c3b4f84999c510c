"""The `attngen` command: build, check, run.

Exit codes: 0 success; 1 invalid spec, failed check or failed run (error above tolerance, no
device); 2 usage error (bad arguments, unreadable file, unknown profile or kernel). No Python
traceback reaches the user unless --debug is given.
"""

from __future__ import annotations

import argparse
import json
import sys

from . import api, backends
from .errors import CompileError, LaunchError, SpecError
from .plan.profiles import ProfileError
from .version import __version__

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad command-line use: exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        raise UsageError(f"{self.prog}: {message}")


def _parser() -> argparse.ArgumentParser:
    targets = backends.names()
    p = _Parser(prog="attngen", description="Compile attention specs into flash-attention kernels "
                f"(targets: {', '.join(targets)}).")
    p.add_argument("--version", action="version", version=f"attngen {__version__}")
    p.add_argument("--debug", action="store_true", help="show Python tracebacks")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    b = sub.add_parser("build", help="generate kernel source, IR or manifest")
    b.add_argument("spec", metavar="SPEC", help="a .attn file ('-' reads standard input)")
    b.add_argument("--target", required=True, choices=targets)
    b.add_argument("--kernel", metavar="NAME", help="which kernel, when the file defines several")
    defaults = " / ".join(backends.get(t).default_profile for t in targets)
    b.add_argument("--profile", metavar="P", help=f"target profile (default {defaults})")
    b.add_argument("--emit", choices=("source", "ir", "manifest"), default="source")
    b.add_argument("-o", "--output", metavar="PATH", help="write here instead of standard output")

    c = sub.add_parser("check", help="validate a spec; print tiles, threads, memory, features")
    c.add_argument("spec", metavar="SPEC")
    c.add_argument("--target", choices=targets, help="only this target (default: both)")
    c.add_argument("--profile", metavar="P", help="a profile name, or 'all' (default: the target's default)")
    c.add_argument("--kernel", metavar="NAME")

    r = sub.add_parser("run", help="run on this machine's device and compare with the reference")
    r.add_argument("spec", metavar="SPEC")
    r.add_argument("--target", required=True, choices=targets)
    r.add_argument("--kernel", metavar="NAME")
    r.add_argument("--profile", metavar="P", help="profile (default: the live device's)")
    r.add_argument("--shape", action="append", metavar="B=..,Lq=..,Lk=..[,Hq=..,Hkv=..]",
                   help="a run-time shape; repeat for several (default B=1,Lq=Lk=256)")
    r.add_argument("--repeat", type=int, default=10, help="timed runs per shape (median reported)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--no-reference", action="store_true",
                   help="time only (the float64 reference is slow for large shapes)")
    return p


# -- helpers ------------------------------------------------------------------------------------
def _read_source(path: str) -> tuple[str, str]:
    """(text, name) of a spec file, or of standard input for '-'."""
    if path == "-":
        return api.decode_source(sys.stdin.buffer.read(), "<stdin>"), "<stdin>"
    try:
        return api.read_spec_file(path)
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None


def _read_specs(path: str):
    text, name = _read_source(path)
    return api.parse(text, filename=name), name


def _one_spec(args):
    specs, name = _read_specs(args.spec)
    if args.kernel is None and len(specs) > 1:
        names = ", ".join(s.name for s in specs)
        raise UsageError(f"{name} defines {len(specs)} kernels ({names}); choose one with --kernel")
    try:
        return api.pick(specs, args.kernel, name)
    except SpecError as e:
        raise UsageError(e.diagnostics[0].message + (f" ({e.diagnostics[0].hint})"
                         if e.diagnostics[0].hint else "")) from None


def _profile(name, target):
    try:
        return backends.get(target).profile(name)
    except ProfileError as e:
        raise UsageError(str(e)) from None


def _write(args, text: str):
    if args.output:
        try:
            with open(args.output, "w") as f:
                f.write(text)
        except OSError as e:
            raise UsageError(f"cannot write {args.output}: {e.strerror or e}") from None
    else:
        sys.stdout.write(text)


def _plan_lines(p) -> list[str]:
    return backends.get(p.target).describe(p)


# -- commands ------------------------------------------------------------------------------------
def cmd_build(args) -> int:
    spec = _one_spec(args)
    p = api.lower(spec, args.target, _profile(args.profile, args.target))
    if args.emit == "ir":
        text = api.format_spec(spec)
        text += f"\n# plan for {p.target} (profile {p.profile})\n"
        text += "".join(f"#   {ln}\n" for ln in _plan_lines(p))
        _write(args, text)
        return EXIT_OK
    out = api.emit_plan(p)
    if args.emit == "manifest":
        _write(args, json.dumps(out.manifest, indent=2) + "\n")
    else:
        _write(args, out.source)
    return EXIT_OK


def cmd_check(args) -> int:
    if args.profile and args.profile != "all" and not args.target:
        raise UsageError("--profile needs --target (or use --profile all)")
    text, name = _read_source(args.spec)
    specs, diags = api.parse_collect(text, name)
    if args.kernel is not None:
        specs = [s for s in specs if s.name == args.kernel]
        if not specs and not diags:
            raise UsageError(f"{name} has no kernel named '{args.kernel}'")
    targets = [args.target] if args.target else list(backends.names())
    report = []
    for spec in specs:
        lines = [spec.name]
        for target in targets:
            backend = backends.get(target)
            profiles = backend.profiles() if args.profile == "all" else [_profile(args.profile, target)]
            for prof in profiles:
                try:  # one configuration search: what build would use
                    p = api.lower(spec, target, prof)
                except SpecError as e:
                    diags += e.diagnostics
                    lines.append(f"  {target} ({prof.name}): error (see above)")
                    continue
                lines.append(f"  {target} ({prof.name}): ok")
                lines += [f"    {ln}" for ln in _plan_lines(p)]
        report.append("\n".join(lines))
    if diags:
        print(SpecError(diags).format(), file=sys.stderr)
    if report:
        print("\n".join(report))
    return EXIT_INVALID if diags else EXIT_OK


def _parse_shape(text: str, spec) -> dict:
    keys = {"b": "B", "lq": "Lq", "lk": "Lk", "hq": "Hq", "hkv": "Hkv"}
    out = {"B": 1, "Lq": 256, "Lk": 256, "Hq": spec.heads_q, "Hkv": spec.heads_kv}
    for part in filter(None, text.replace(" ", "").split(",")):
        key, _, value = part.partition("=")
        if key.lower() not in keys or not value:
            raise UsageError(f"bad --shape item {part!r}: expected B=, Lq=, Lk=, Hq= or Hkv= with a number")
        try:
            n = int(value)
        except ValueError:
            raise UsageError(f"bad --shape value {part!r}: not an integer") from None
        if n < 1 or n > 1 << 30:
            raise UsageError(f"bad --shape value {part!r}: must be between 1 and 2^30")
        out[keys[key.lower()]] = n
    if out["Hq"] is None:
        out["Hq"] = 8
    if out["Hkv"] is None:
        out["Hkv"] = out["Hq"] if spec.heads_q is None else spec.heads_kv
    if out["Hq"] % out["Hkv"]:
        raise UsageError(f"--shape Hq={out['Hq']} is not a multiple of Hkv={out['Hkv']}")
    return out


def cmd_run(args) -> int:
    from .runtime.runner import run_shapes
    spec = _one_spec(args)
    if args.repeat < 1:
        raise UsageError("--repeat must be at least 1")
    if args.seed < 0:
        raise UsageError("--seed must be a non-negative integer")
    shapes = [_parse_shape(s, spec) for s in (args.shape or [""])]
    profile = _profile(args.profile, args.target) if args.profile else None
    backend = backends.get(args.target)
    try:
        kernel = api.compile(spec, target=args.target, profile=profile)
    except (ImportError, RuntimeError, OSError) as e:
        raise LaunchError(f"no usable {getattr(backend, 'device_name', 'device')} on this machine: "
                          f"{type(e).__name__}: {e}") from None
    ok = run_shapes(kernel, backend, shapes, repeat=args.repeat, seed=args.seed,
                    use_reference=not args.no_reference, echo=print)
    return EXIT_OK if ok else EXIT_INVALID


COMMANDS = {"build": cmd_build, "check": cmd_check, "run": cmd_run}


def main(argv=None) -> int:
    parser = _parser()
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        return COMMANDS[args.command](args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except SpecError as e:
        print(e.format(), file=sys.stderr)
        return EXIT_INVALID
    except (LaunchError, CompileError) as e:
        if debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INVALID
    except KeyboardInterrupt:
        return 130
    except SystemExit as e:  # --help / --version
        return e.code if isinstance(e.code, int) else EXIT_OK
    except Exception as e:  # a bug in attngen: say so without a traceback
        if debug:
            raise
        print(f"internal error: {type(e).__name__}: {e}\n(this is a bug in attngen; rerun with --debug "
              "for the traceback and report it)", file=sys.stderr)
        return EXIT_INVALID


if __name__ == "__main__":
    sys.exit(main())
