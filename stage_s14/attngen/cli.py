"""The `attngen` command: build, check, run, cache. docs/cli.md describes every option; the
parser that reads them is cli_parser.py.

Exit codes: 0 success; 1 invalid spec, failed check or failed run (error above tolerance, no
device), output that cannot be written (a full disk, a closed pipe, no permission, a FIFO or a
directory as the output file), or a cache directory that cannot be read; 2 usage error (bad
arguments, unreadable spec file, unknown profile or kernel, --shape heads that contradict the
spec's or pass a limit of the target, a --port outside 0-65535); 130 interrupted (Ctrl-C). No
Python traceback reaches the user unless --debug is given (anywhere on the line).

Inputs. SPEC is a .attn file, '-' for standard input, or (check and build) a directory, which
means every *.attn file directly in it, in sorted order. `check DIR` reports every file
(exit 1 if any fails); `build DIR` needs `-o OUTDIR` (made if missing) and writes one file per
kernel, OUTDIR/<kernel>.<ext> (ext: the target's source extension, json for --emit manifest,
ir for --emit ir); it checks every kernel first and writes nothing if any fails.

Output of build. No -o, or `-o -`: standard output. `-o PATH`: the file PATH (to write a file
named '-', say `-o ./-`); `-o ''` is a usage error. An existing PATH that is a FIFO (named pipe)
or a socket is refused: opening a FIFO blocks until a reader comes, possibly forever (the file
is opened with O_NONBLOCK and checked again after opening, so a FIFO made meanwhile is refused
too instead of blocking). Character devices (/dev/null, a terminal) are written like files.

`attngen run` prints its table on standard output and what it is doing (compiling, drawing
inputs, timing, the float64 reference) on standard error, unless --quiet.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
import warnings

from . import api, backends
from .errors import CompileError, ConfigError, LaunchError, SpecError, clip, did_you_mean
from .cli_interrupt import EXIT_INTERRUPTED, PromptInterrupt, interrupted
from .cli_parser import UsageError, build_parser
from .limits import MAX_SEQ_LEN
from .plan.profiles import ProfileError

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


class OutputError(Exception):
    """Output that cannot be written, or a cache directory that cannot be read: exit code 1."""


# -- helpers ------------------------------------------------------------------------------------
def _reason(e: OSError) -> str:
    return e.strerror or str(e)


def _read_source(path: str) -> tuple[str, str]:
    """(text, name) of a spec file, or of standard input for '-'."""
    if path == "-":
        return api.read_source(sys.stdin.buffer, "<stdin>"), "<stdin>"
    try:
        return api.read_spec_file(path)
    except IsADirectoryError:
        raise UsageError(f"{path} is a directory; run takes one spec file (check and build take "
                         "directories)") from None
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None


def _spec_files(path: str) -> list[str] | None:
    """The *.attn files directly in `path`, sorted, when it is a directory; else None."""
    if path == "-" or not os.path.isdir(path):
        return None
    try:
        names = sorted(n for n in os.listdir(path) if n.endswith(".attn") and os.path.isfile(os.path.join(path, n)))
    except OSError as e:
        raise UsageError(f"cannot read the directory {path}: {_reason(e)}") from None
    if not names:
        raise UsageError(f"the directory {path} has no *.attn files")
    return [os.path.join(path, n) for n in names]


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


def _write_stdout(text: str) -> None:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as e:
        raise OutputError(f"cannot write to standard output: {_reason(e)}") from None


def _print(line: str = "") -> None:
    _write_stdout(line + "\n")


def _silence_stdout() -> None:
    """After a failed write to standard output: point it at /dev/null, so that the interpreter's
    last flush of what is still buffered neither fails again nor prints "Exception ignored"."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass  # standard output is not a file descriptor (tests capture it)


_NOT_FILES = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))


def _refuse(path: str, mode: int) -> None:
    for test, what in _NOT_FILES:
        if test(mode):
            raise OutputError(f"cannot write {path}: it is {what}, which attngen does not write to (it "
                              "could block forever); write to standard output instead and redirect it")


def _write_file(path: str, text: str) -> None:
    """Write `text` to the file `path` (module docstring: FIFOs and sockets are refused)."""
    try:
        _refuse(path, os.stat(path).st_mode)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise OutputError(f"cannot write {path}: {_reason(e)}") from None
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        raise OutputError(f"cannot write {path}: {_reason(e)}") from None
    try:
        _refuse(path, os.fstat(fd).st_mode)  # made a FIFO between the stat and the open
        if hasattr(os, "O_NONBLOCK"):
            os.set_blocking(fd, True)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            fd = None
            f.write(text)
    except OSError as e:
        raise OutputError(f"cannot write {path}: {_reason(e)}") from None
    finally:
        if fd is not None:
            os.close(fd)


def _write(args, text: str):
    if args.output is None or args.output == "-":
        _write_stdout(text)
    else:
        _write_file(args.output, text)


def _check_output(args) -> None:
    if args.output == "":
        raise UsageError("-o/--output is empty: give a file name, or '-' for standard output")


def _plan_lines(p) -> list[str]:
    from .plan import expr_blocks
    backend = backends.get(p.target)
    return list(p.notes) + backend.describe(p) + expr_blocks.describe(p, backend.expression_tiles(p.spec))


def _render(spec, args, profile) -> str:
    """What build writes for one kernel."""
    p = api.lower(spec, args.target, profile)
    if args.emit == "ir":
        text = api.format_spec(spec)
        text += f"\n# plan for {p.target} (profile {p.profile})\n"
        text += "".join(f"#   {ln}\n" for ln in _plan_lines(p) + backends.get(p.target).describe_ir(p))
        return text
    if args.emit not in ("source", "manifest"):  # a helper module
        helpers = backends.get(p.target).helper_sources(p)
        if args.emit not in helpers:
            if args.emit == "backward":
                why = backends.get(p.target).backward_problems(p)  # (the target's own reasons too)
                raise UsageError(f"kernel '{spec.name}' has no backward: {why[0].message}" if why else
                                 f"target {p.target} builds no backward yet (docs/backward.md)")
            raise UsageError(f"target {p.target} emits no {args.emit} for kernel '{spec.name}' (block-mask: mask custom "
                             "or a mask over inputs, on a foreign runtime's target; mask-custom: a mask over inputs)")
        return helpers[args.emit]
    out = api.emit_plan(p)
    if args.emit == "manifest":
        return json.dumps(out.manifest, indent=2) + "\n"
    return out.source


# -- commands ------------------------------------------------------------------------------------
def cmd_build(args) -> int:
    _check_output(args)
    files = _spec_files(args.spec)
    if files is not None:
        return _build_directory(args, files)
    spec = _one_spec(args)
    _write(args, _render(spec, args, _profile(args.profile, args.target)))
    return EXIT_OK


def _kernels_of(files: list[str], kernel: str | None, where: str) -> tuple[list, list]:
    """(spec, file name) of every kernel of the files (only those named `kernel`, when given),
    and the diagnostics of the files that do not parse; a UsageError when no file that parses
    defines `kernel`."""
    kernels, diags = [], []
    for path in files:
        try:
            specs, name = _read_specs(path)
        except SpecError as e:
            diags += e.diagnostics
            continue
        kernels += [(spec, name) for spec in specs]
    if kernel is not None:
        chosen = [(s, f) for s, f in kernels if s.name == kernel]
        if not chosen and not diags:
            hint = did_you_mean(kernel, [s.name for s, _ in kernels])
            place = (f"{files[0]} defines no kernel named '{kernel}'" if len(files) == 1 and files[0] == where
                     else f"no *.attn file in {where} defines a kernel named '{kernel}'")
            names = [s.name for s, _ in kernels]
            shown = ", ".join(names[:6]) + (f", ... ({len(names)} in all)" if len(names) > 6 else "")
            raise UsageError(place + (f" ({hint})" if hint else f" (kernels: {shown})" if names else ""))
        kernels = chosen
    return kernels, diags


def _build_directory(args, files: list[str]) -> int:
    """build DIR -o OUTDIR: every kernel of every file checked first, then one file each."""
    if args.output is None or args.output == "-":
        where = "no -o" if args.output is None else "-o -"
        raise UsageError(f"{args.spec} is a directory: building it writes one file per kernel, so it needs "
                         f"an output directory (-o DIR), not standard output ({where})")
    out_dir = args.output
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UsageError(f"-o {out_dir} is not a directory: building the directory {args.spec} writes one "
                         "file per kernel into -o DIR")
    profile = _profile(args.profile, args.target)
    kernels, diags = _kernels_of(files, args.kernel, args.spec)
    seen: dict = {}
    for spec, name in kernels:
        if spec.name in seen:
            raise UsageError(f"kernel '{spec.name}' is defined in both {seen[spec.name]} and {name}: both "
                             f"would be written to the same file of {out_dir}")
        seen[spec.name] = name
    suffix = backends.get(args.target).source_suffix
    # a helper module (block-mask) is named apart from the kernel's source, which shares the folder
    ext = {"ir": "ir", "manifest": "json", "source": suffix}.get(args.emit) or f"{args.emit}.{suffix}"
    outputs, skipped = [], []
    for spec, _ in kernels:
        try:
            outputs.append((os.path.join(out_dir, f"{spec.name}.{ext}"), _render(spec, args, profile)))
        except SpecError as e:
            diags += e.diagnostics
        except UsageError:
            if args.emit in ("source", "manifest", "ir") or args.kernel is not None:
                raise
            skipped.append(spec.name)  # a helper only some kernels have: the others have nothing to write
    if diags:
        raise SpecError(diags)  # nothing is written
    if skipped and not outputs:
        raise UsageError(f"no kernel of {args.spec} has a {args.emit} on target {args.target} (only mask custom "
                         "kernels of targets whose runtime is foreign have one)")
    for name in skipped:
        _print(f"skipped {name}: no {args.emit} (not a mask custom kernel)")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot make the directory {out_dir}: {_reason(e)}") from None
    for path, text in outputs:
        _write_file(path, text)
        _print(f"wrote {path}")
    return EXIT_OK


def _check_one(args, text, name, targets, diags, report) -> bool:
    """Check the kernels of one source; False when --kernel names none of them."""
    specs, found = api.parse_collect(text, name)
    diags += found
    if args.kernel is not None:
        specs = [s for s in specs if s.name == args.kernel]
    for spec in specs:
        lines = [spec.name]
        for target in targets:
            backend = backends.get(target)
            profiles = backend.profiles() if args.profile == "all" else [_profile(args.profile, target)]
            for prof in profiles:
                if args.target is None and spec.dtype not in prof.storage_dtypes:
                    # every target by default: one that never stores this dtype is not a failure of
                    # the spec (a bf16 kernel on wgsl); `--target` asks for it, and gets the error
                    lines.append(f"  {target} ({prof.name}): n/a (dtype {spec.dtype}; it stores "
                                 f"{', '.join(prof.storage_dtypes)})")
                    continue
                try:  # one configuration search: what build would use
                    p = api.lower(spec, target, prof)
                except SpecError as e:
                    diags += e.diagnostics
                    lines.append(f"  {target} ({prof.name}): error (see above)")
                    continue
                lines.append(f"  {target} ({prof.name}): ok")
                lines.append(f"    profile: {prof.name} ({_check_profile_reason(args.profile)})")
                lines += [f"    {ln}" for ln in _plan_lines(p)]
                lines += [f"    {ln}" for ln in _backward_lines(p)]
                lines += [f"    {ln}" for ln in _tuned_lines(spec, target)]
        report.append("\n".join(lines))
    return bool(specs)


def _backward_lines(p) -> list[str]:
    """The backward's plan (docs/backward.md): its entries, grids and memory, or why there is none."""
    from .plan import backward
    why = backward.problems(p.spec, backends.get(p.target).backward_expressions)
    if why:
        return [f"backward: none ({why[0].message})"]
    lines = backends.get(p.target).describe_backward(p)  # its first line starts "backward: "
    if not lines:
        return [f"backward: not built by target {p.target} yet (docs/backward.md)"]
    return [lines[0]] + [f"  {ln.strip()}" for ln in lines[1:]]


def _check_profile_reason(given: str | None) -> str:
    """Why check plans with a profile: `attngen run` plans with the device's, so the two differ."""
    if given is None:
        return "the target's default: no --profile given; attngen run picks this machine's device's"
    return f"--profile {given}; attngen run picks this machine's device's unless given --profile"


def _run_profile_line(args, backend, kernel) -> str:
    """Which profile `attngen run` compiled with and why (check plans with the target's default)."""
    name = kernel.plan.profile
    if args.profile:
        return f"profile: {name} (--profile {args.profile})"
    return (f"profile: {name} (this machine's device's, as no --profile was given; attngen check plans with "
            f"the target's default, {backend.default_profile}, unless given --profile)")


def cmd_check(args) -> int:
    if args.profile and args.profile != "all" and not args.target:
        raise UsageError("--profile needs --target (or use --profile all)")
    targets = [args.target] if args.target else list(backends.names())
    files = _spec_files(args.spec)
    diags, report, unreadable = [], [], False
    if files is None:
        text, name = _read_source(args.spec)
        if not _check_one(args, text, name, targets, diags, report) and args.kernel is not None and not diags:
            raise UsageError(f"{name} has no kernel named '{args.kernel}'")
    else:  # every file of the directory, each under a line naming it
        found = False
        for path in files:
            before = len(diags)
            part: list = []
            try:
                text, name = _read_source(path)
                found |= _check_one(args, text, name, targets, diags, part)
            except SpecError as e:  # not UTF-8
                diags += e.diagnostics
            except UsageError as e:  # unreadable: a failed check of this file
                print(f"error: {e}", file=sys.stderr)
                unreadable = True
                part = ["  error: cannot read it (see above)"]
            if not part and len(diags) > before:
                part = ["  error (see above)"]
            if part:  # with --kernel, files without that kernel are left out
                report.append(f"# {path}\n" + "\n".join(part))
        if args.kernel is not None and not found and not diags and not unreadable:
            raise UsageError(f"no *.attn file in {args.spec} defines a kernel named '{args.kernel}'")
    if diags:
        print(SpecError(diags).format(), file=sys.stderr)
    if report:
        _print("\n".join(report))
    return EXIT_INVALID if diags or unreadable else EXIT_OK


def _parse_shape(text: str | None, spec) -> dict:
    """The --shape argument (None: not given, the defaults) as B, Lq, Lk, Hq, Hkv."""
    keys = {"b": "B", "lq": "Lq", "lk": "Lk", "hq": "Hq", "hkv": "Hkv"}
    out = {"B": 1, "Lq": 256, "Lk": 256, "Hq": spec.heads_q, "Hkv": spec.heads_kv}
    fixed = {"Hq": spec.heads_q, "Hkv": spec.heads_kv}
    if text is not None and not text.strip():
        raise UsageError("--shape is empty: give B=, Lq=, Lk= (and Hq=, Hkv=), e.g. --shape B=1,Lq=256,Lk=256, "
                         "or leave --shape out for that default")
    seen = set()
    for part in (text or "").replace(" ", "").split(",") if text else ():
        key, _, value = part.partition("=")
        if key.lower() not in keys or not value:
            raise UsageError(f"bad --shape item {part!r}: expected B=, Lq=, Lk=, Hq= or Hkv= with a number, "
                             "items separated by single commas")
        if keys[key.lower()] in seen:
            raise UsageError(f"--shape gives {keys[key.lower()]} twice ({text!r})")
        seen.add(keys[key.lower()])
        try:
            n = int(value)
        except ValueError:
            raise UsageError(f"bad --shape value {part!r}: not an integer") from None
        if n < 1 or n > MAX_SEQ_LEN:
            raise UsageError(f"bad --shape value {part!r}: must be between 1 and 2^30")
        name = keys[key.lower()]
        if fixed.get(name) is not None and n != fixed[name]:
            raise UsageError(f"--shape {name}={n}: kernel '{spec.name}' is built for heads q={spec.heads_q} "
                             f"kv={spec.heads_kv} (the spec's 'heads' line); leave Hq and Hkv out of --shape, "
                             "or give those numbers")
        out[name] = n
    if out["Hq"] is None:
        out["Hq"] = 8
    if out["Hkv"] is None:
        out["Hkv"] = out["Hq"] if spec.heads_q is None else spec.heads_kv
    if out["Hq"] % out["Hkv"]:
        raise UsageError(f"--shape Hq={out['Hq']} is not a multiple of Hkv={out['Hkv']}")
    return out


def _tuned_lines(spec, target) -> list[str]:
    """Where the tile choices come from: the profile's defaults, and any `attngen tune` result
    stored for this spec (compile uses the one of its device when the spec leaves tiles auto)."""
    from .harness import tune
    if not tune.is_auto(spec, target):
        return ["tiles: from the spec"]
    found = tune.stored_for(target, spec)
    if not found:
        return ["tiles: the profile's defaults (no attngen tune result stored for this spec)"]
    return ["tiles: the profile's defaults here; attngen.compile on a tuned device uses its result:"] + [
        f"  tuned {tune.label(r['choice'])} on {r['device']} for {r['shape_class']} ({r['ms']:.4g} ms, "
        f"defaults {r['default_ms']:.4g} ms; {r['date']})" if r.get("default_ms") else
        f"  tuned {tune.label(r['choice'])} on {r['device']} for {r['shape_class']} ({r['date']})" for r in found]


def cmd_tune(args) -> int:
    with PromptInterrupt():
        return _tune(args)


def _tune(args) -> int:
    from .harness import tune
    spec = _one_spec(args)
    backend = backends.get(args.target)
    if not tune.is_auto(spec, args.target):
        from .lang.options import target_schema
        tiling = [o.name for o in target_schema(args.target).options if o.tiling]
        raise UsageError(f"{spec.name} fixes its own tile q, tile kv or {', '.join(tiling) or 'tiling options'} of "
                         f"target {args.target}: tune sweeps those, so leave them at auto (its other target options "
                         "are kept)")
    if not backend.tune_space(spec):
        raise UsageError(f"target {args.target} has nothing to tune")
    if args.repeat < 1:
        raise UsageError("--repeat must be at least 1")
    shape = _parse_shape(args.shape, spec)

    def progress(line: str) -> None:
        if not args.quiet:
            print(f"attngen tune: {line}", file=sys.stderr, flush=True)
    try:
        profile = backend.profile(None)
        diags = api.check(spec, args.target, profile)
        if diags:
            raise SpecError(diags)
        progress(f"{spec.name} on {backend.device_identity()}, B={shape['B']} Lq={shape['Lq']} Lk={shape['Lk']}: "
                 "the profile's defaults first")
        default, rows = tune.sweep(backend, spec, shape, repeat=args.repeat, seed=args.seed, progress=progress,
                                   check=lambda s: api.check(s, args.target, profile),
                                   compile_=lambda s: api.compile(s, args.target, tuned=False))
    except (ImportError, RuntimeError, OSError) as e:
        raise LaunchError(f"no usable {getattr(backend, 'device_name', 'device')} on this machine: "
                          f"{type(e).__name__}: {e}") from None
    _print(f"{spec.name} on {args.target} ({backend.device_identity()}), B={shape['B']} Lq={shape['Lq']} "
           f"Lk={shape['Lk']} Hq={shape['Hq']} Hkv={shape['Hkv']}; {backend.timing}")
    # each row labelled by the plan fields that vary among the rows (tune.plan_labels), so that
    # two different plans never look alike; the defaults' row first
    labels = tune.plan_labels([default] + rows)
    named = {id(r): text for r, text in zip(rows, labels[1:])}
    status, default_ms, default_plan = default[1], default[2], default[4]
    width = max([42] + [len(t) + 1 for t in labels[1:]] + [len(labels[0]) + 15])
    _print(f"  {'candidate':{width}} {'ms':>10}  result")
    ms_text = "-" if default_ms is None else f"{default_ms:.4g}"
    _print(f"  {'the defaults: ' + labels[0]:{width}} {ms_text:>10}  {status}")
    for row in rows:
        choice, status, ms, summary = row[0], row[1], row[2], row[4]
        same = " (the defaults' plan)" if summary == default_plan else ""
        _print(f"  {named[id(row)]:{width}} {('-' if ms is None else f'{ms:.4g}'):>10}  {status}{same}")
    ok = [r for r in rows if r[2] is not None]
    if not ok:
        _print("no candidate ran correctly: nothing stored")
        return EXIT_INVALID
    choice, ms = ok[0][0], ok[0][2]
    best = named[id(ok[0])] + ("" if named[id(ok[0])] == tune.label(choice) else f" (set as {tune.label(choice)})")
    if default_ms is not None and default_ms <= ms:
        # no candidate beats the defaults: they are the result (compile keeps the spec as it is)
        where = tune.store(backend, spec, shape, tune.DEFAULTS, default_ms, default_ms)
        _print(f"fastest: the profile's defaults, {default_ms:.4g} ms (the best candidate, {best}, "
               f"took {ms:.4g} ms); stored in {where}")
        return EXIT_OK
    where = tune.store(backend, spec, shape, choice, ms, default_ms)
    versus = f"{default_ms / ms:.2f}x the defaults" if default_ms else "the defaults were wrong"
    _print(f"fastest: {best}, {ms:.4g} ms ({versus}); stored in {where}")
    return EXIT_OK


def cmd_run(args) -> int:
    with PromptInterrupt():
        return _run(args)


def _run(args) -> int:
    from .harness.runner import check_shape, run_shapes
    spec = _one_spec(args)
    if args.repeat < 1:
        raise UsageError("--repeat must be at least 1")
    if args.seed < 0:
        raise UsageError("--seed must be a non-negative integer")
    shapes = [_parse_shape(s, spec) for s in (args.shape or [None])]
    profile = _profile(args.profile, args.target) if args.profile else None
    backend = backends.get(args.target)

    def progress(line: str) -> None:
        if not args.quiet:
            print(f"attngen run: {line}", file=sys.stderr, flush=True)
    progress(f"compiling {spec.name} for {args.target} on this machine's device")
    t0 = time.perf_counter()
    try:
        kernel = api.compile(spec, target=args.target, profile=profile)
    except (ImportError, RuntimeError, OSError) as e:
        raise LaunchError(f"no usable {getattr(backend, 'device_name', 'device')} on this machine: "
                          f"{type(e).__name__}: {e}") from None
    progress(f"compiled in {time.perf_counter() - t0:.2f} s")
    for i, (text, shape) in enumerate(zip(args.shape or [None], shapes)):
        try:  # every limit, from the shape alone: nothing is drawn for a shape that cannot run
            check_shape(kernel, backend, shape)
        except LaunchError as e:
            given = f"--shape {text}" if text is not None else "the default shape"
            raise UsageError(f"shape {i + 1}/{len(shapes)} ({given}): {e}; give a smaller B, Lq, Lk or "
                             "heads") from None
    notes = [_run_profile_line(args, backend, kernel)] + _run_tiles_lines(args, spec, backend)
    ok = run_shapes(kernel, backend, shapes, repeat=args.repeat, seed=args.seed,
                    use_reference=not args.no_reference, echo=_print, progress=progress, notes=notes)
    return EXIT_OK if ok else EXIT_INVALID


def _run_tiles_lines(args, spec, backend) -> list[str]:
    """A line when attngen.compile took an `attngen tune` result for this device (api.compile),
    which check does not: the other reason the two plans differ."""
    from .harness import tune
    if args.profile or not tune.is_auto(spec, args.target):
        return []
    try:
        found = tune.lookup(backend, spec)
    except Exception:  # noqa: BLE001  (no device identity: compile used no tuned result either)
        return []
    if found is None or tune.is_defaults(found["choice"]):
        return []
    return [f"tiles: {tune.label(found['choice'])}, attngen tune's result for this device ({found['shape_class']}, "
            f"{found['date']}); attngen check shows the profile's defaults"]


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def cmd_precompile(args) -> int:
    backend = backends.get(args.target)
    if not backend.device_kinds:
        raise UsageError(f"target {args.target} builds its kernels when they are loaded: there is nothing "
                         "to precompile")
    devices = [d.strip() for arg in (args.device or []) for d in arg.split(",")]
    if args.device is not None and not any(devices):
        raise UsageError(f"--device is empty: name {backend.device_kinds}")
    if any(not d for d in devices):
        raise UsageError(f"--device {','.join(args.device)}: an empty item; name devices separated by single commas")
    devices = list(dict.fromkeys(devices)) or list(backend.precompile_devices())
    files = [file for path in args.spec for file in (_spec_files(path) or [path])]
    kernels, diags = _kernels_of(files, args.kernel, ", ".join(args.spec))
    if diags:
        raise SpecError(diags)
    todo = [(spec, device) for spec, _ in kernels for device in devices]
    progress = _Progress(len(todo), quiet=args.quiet)
    built = found = failed = 0
    for spec, device in todo:
        start = time.perf_counter()
        try:
            hit = backend.precompile(spec, device)
        except SpecError as e:  # the target refuses this spec (attngen check says why)
            failed += 1
            progress.step(f"{spec.name} {device}: refused: {e.diagnostics[0].message}", failed=True)
            continue
        except LaunchError:  # no compiler on this machine: the same for every kernel
            raise
        except ValueError as e:  # a device name the target does not know
            raise UsageError(f"--device {device}: {e}") from None
        except CompileError as e:
            failed += 1
            progress.step(f"{spec.name} {device}: compile error: {str(e).splitlines()[0]}", failed=True)
            continue
        found += hit
        built += not hit
        progress.step(f"{spec.name} {device}: " + ("already cached" if hit else
                                                    f"built in {time.perf_counter() - start:.1f} s"))
    progress.done()
    from .runtime import cache
    _print(f"{_count(built, 'kernel', 'kernels')} built, {found} already cached"
           + (f", {failed} failed" if failed else "") + f" (cache: {cache.cache_dir()})")
    return EXIT_INVALID if failed else EXIT_OK


class _Progress:
    """Progress of a long command on standard error: a bar redrawn in place on a terminal, one
    line per step otherwise (logs, pipes)."""

    WIDTH = 24

    def __init__(self, total: int, quiet: bool = False):
        self.total, self.n, self.quiet = total, 0, quiet
        self.tty = sys.stderr.isatty()

    def step(self, what: str, failed: bool = False) -> None:
        self.n += 1
        if self.quiet and not failed:
            return
        filled = self.WIDTH * self.n // max(self.total, 1)
        line = f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {self.n}/{self.total} {what}"
        try:
            if self.tty and not failed:
                sys.stderr.write("\r\x1b[2K" + line)
            else:
                sys.stderr.write(("\r\x1b[2K" if self.tty else "") + line + "\n")
            sys.stderr.flush()
        except OSError:
            pass

    def done(self) -> None:
        if self.tty and not self.quiet and self.n:
            try:
                sys.stderr.write("\n")
            except OSError:
                pass


def cmd_cache(args) -> int:
    from .runtime import cache
    if args.action is None:
        raise UsageError("attngen cache needs an action: 'info' (show the cache) or 'clear' (empty it)")
    where = cache.cache_dir()
    try:
        if args.action == "info":
            for line in cache.describe(cache.summary(where)):
                _print(line)
            return EXIT_OK
        report = cache.clear(where)
    except OSError as e:
        raise OutputError(f"cannot read the cache directory {where}: {_reason(e)}") from None
    if not report.exists:
        _print(f"nothing to remove: the cache directory {where} does not exist")
    elif not (report.removed_files or report.busy_locks or report.errors):
        _print(f"nothing to remove: no attngen files in {where}")
    else:
        _print(f"removed {_count(report.removed_entries, 'entry', 'entries')} "
               f"({_count(report.removed_files, 'file', 'files')}, {cache.human_size(report.removed_bytes)}) "
               f"from {where}")
    if report.busy_locks:
        _print(f"left {_count(report.busy_locks, 'lock file', 'lock files')} of builds in progress")
    if report.other_files:
        _print(f"left {_count(len(report.other_files), 'file', 'files')} that attngen did not write: "
               + ", ".join(report.other_files))
    for name, reason in report.errors:
        print(f"error: cannot remove {where / name}: {reason}", file=sys.stderr)
    return EXIT_INVALID if report.errors else EXIT_OK


def cmd_serve_demo(args) -> int:
    backend = backends.get(args.target)
    spec = _one_spec(args)
    try:
        files = backend.demo_files(spec, _profile(args.profile, args.target))
    except NotImplementedError as e:
        raise UsageError(f"{e}: serve-demo needs a target with a web runtime") from None
    if spec.mask.is_custom:
        raise UsageError(f"kernel '{spec.name}' has mask custom: the demo page draws only q, k and v, while such a "
                         "kernel needs its mask and the block-mask builder (build them with --emit source and "
                         "--emit block-mask, and pass the builder to loadKernel: docs/web.md)")
    import tempfile
    folder = args.dir or tempfile.mkdtemp(prefix=f"attngen-demo-{spec.name}-")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot make {folder}: {_reason(e)}") from None
    for name, text in files.items():
        _write_file(os.path.join(folder, name), text)
    print(f"wrote {', '.join(files)} to {folder}")
    if args.no_serve:
        return EXIT_OK
    import functools
    from .demo_server import DemoServer, DemoHandler
    try:
        server = DemoServer(("127.0.0.1", args.port), functools.partial(DemoHandler, directory=folder))
    except OSError as e:
        raise UsageError(f"cannot listen on 127.0.0.1:{args.port}: {_reason(e)} (try --port 0)") from None
    print(f"serving on http://127.0.0.1:{server.server_address[1]}/ (a browser with WebGPU; Ctrl-C stops)",
          flush=True)
    try:
        server.serve_forever()  # until Ctrl-C: main reports it, exit 130 (docs/cli.md)
    finally:
        server.server_close()
    return EXIT_OK


def cmd_spec(args) -> int:
    """attngen spec --from-hf CONFIG: the .attn text of a model's attention."""
    from .transformers.config import model_attention, specs_text
    _check_output(args)
    if args.name is not None and not (args.name.isascii() and args.name.isidentifier()):
        raise UsageError(f"--name {clip(args.name)!r} is not a name a spec takes (letters, digits, '_')")
    text = specs_text(model_attention(args.from_hf, dtype=args.dtype, name=args.name))
    api.parse(text, filename="<from-hf>")  # what is written parses and checks
    _write(args, text)
    return EXIT_OK


COMMANDS = {"build": cmd_build, "spec": cmd_spec, "check": cmd_check, "run": cmd_run, "precompile": cmd_precompile,
            "serve-demo": cmd_serve_demo, "tune": cmd_tune, "cache": cmd_cache}


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """Warnings (e.g. a cache entry rebuilt) as one line, without the source line."""
    try:
        print(f"warning: {message}", file=sys.stderr)
    except OSError:
        pass


def main(argv=None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv  # until the line is parsed
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            args = parser.parse_args(argv)
            debug = args.debug
            if args.command is None:
                parser.print_help(sys.stderr)
                return EXIT_USAGE
            code = COMMANDS[args.command](args)
            _write_stdout("")  # what print() left in the buffer, while errors can be reported
            return code
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except SpecError as e:
        print(e.format(), file=sys.stderr)
        return EXIT_INVALID
    except OutputError as e:
        print(f"error: {e}", file=sys.stderr)
        _silence_stdout()
        return EXIT_INVALID
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INVALID
    except (LaunchError, CompileError) as e:
        if debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INVALID
    except KeyboardInterrupt:
        interrupted()
        return EXIT_INTERRUPTED
    except SystemExit as e:  # --help / --version
        try:
            _write_stdout("")
        except OutputError as oe:
            print(f"error: {oe}", file=sys.stderr)
            _silence_stdout()
            return EXIT_INVALID
        return e.code if isinstance(e.code, int) else EXIT_OK
    except Exception as e:  # a bug in attngen: say so without a traceback
        if debug:
            raise
        print(f"internal error: {type(e).__name__}: {e}\n(this is a bug in attngen; rerun with --debug "
              "for the traceback and report it)", file=sys.stderr)
        return EXIT_INVALID


if __name__ == "__main__":
    sys.exit(main())
