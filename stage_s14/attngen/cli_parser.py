"""The `attngen` command line: its commands, options and help texts (the argparse parser), and
the usage error it raises. cli.py runs the commands; docs/cli.md describes every option.
"""

from __future__ import annotations

import argparse
import sys

from . import backends
from .errors import did_you_mean
from .limits import MAX_PORT
from .version import __version__


class UsageError(Exception):
    """Bad command-line use: exit code 2."""


class _Parser(argparse.ArgumentParser):
    """A parser whose errors raise UsageError (cli.main reports it and exits 2) instead of exiting."""

    def error(self, message):
        self.print_usage(sys.stderr)
        raise UsageError(f"{self.prog}: {message}")


def _target(text: str) -> str:
    """--target's value: target names are lower case, and WGSL or Cuda mean the same targets. A
    name no backend has is a one-line usage error with the closest name (UsageError passes through
    argparse, which would print its usage block first)."""
    name = text.lower()
    targets = backends.names()
    if name not in targets:
        hint = did_you_mean(name, targets)
        raise UsageError(f"unknown target {text!r} for --target" + (f": {hint}" if hint else "")
                         + f" (targets: {', '.join(targets)})")
    return name


def _port(text: str) -> int:
    """--port's value, checked here so that a bad one is a usage error before anything is written."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0 to {MAX_PORT}; 0: any free port)") from None
    if not 0 <= n <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"{n} is not a port number: ports are 0 to {MAX_PORT} (0: any free port)")
    return n


# The text of every command that takes a directory of specs.
DIRECTORIES = ("SPEC may be a directory: every *.attn file in it, in sorted order")


def build_parser() -> argparse.ArgumentParser:
    """The parser of the whole command line: every command, its options and their help."""
    targets = backends.names()
    # --debug is accepted before and after the command (SUPPRESS: a command's parser does not
    # reset what the top-level one read).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show Python tracebacks")
    p = _Parser(prog="attngen", description="Compile attention specs into flash-attention kernels "
                f"(targets: {', '.join(targets)}).",
                epilog="Exit codes: 0 success; 1 invalid spec, failed check or run, output that cannot be "
                       "written; 2 usage error; 130 interrupted. See docs/cli.md.")
    p.add_argument("--version", action="version", version=f"attngen {__version__}")
    p.add_argument("--debug", action="store_true", default=False, help="show Python tracebacks")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    b = sub.add_parser("build", parents=[common], help="generate kernel source, IR or manifest",
                       description="Generate a kernel's source, IR or manifest. " + DIRECTORIES +
                       "; then -o must name an output directory, which gets one file per kernel, "
                       "<kernel>.<ext> (the target's source extension, json or ir).")
    b.add_argument("spec", metavar="SPEC", help="a .attn file, '-' for standard input, or a directory")
    b.add_argument("--target", required=True, type=_target, choices=targets)
    b.add_argument("--kernel", metavar="NAME", help="which kernel, when the file defines several")
    defaults = " / ".join(backends.get(t).default_profile for t in targets)
    b.add_argument("--profile", metavar="P", help=f"target profile (default {defaults})")
    b.add_argument("--emit", choices=("source", "ir", "manifest", "block-mask", "mask-custom", "backward"),
                   default="source",
                   help="block-mask: the block-mask builder a foreign runtime runs before a mask custom kernel; "
                        "mask-custom: the attention kernel of a mask over inputs, run on the builder's BlockMask "
                        "(the manifest's mask_inputs); backward: the backward pass's source (docs/backward.md)")
    b.add_argument("-o", "--output", metavar="PATH",
                   help="write here instead of standard output ('-': standard output; a directory "
                        "when SPEC is one; FIFOs are refused)")

    c = sub.add_parser("check", parents=[common],
                       help="validate a spec; print tiles, threads, memory, features",
                       description="Validate specs and print the plan of each kernel. " + DIRECTORIES +
                       ", all of them reported (exit 1 if any fails).")
    c.add_argument("spec", metavar="SPEC", help="a .attn file, '-' for standard input, or a directory")
    c.add_argument("--target", type=_target, choices=targets, help="only this target (default: both)")
    c.add_argument("--profile", metavar="P", help="a profile name, or 'all' (default: the target's default)")
    c.add_argument("--kernel", metavar="NAME", help="only this kernel (default: every kernel)")

    r = sub.add_parser("run", parents=[common],
                       help="run on this machine's device and compare with the reference",
                       description="Run a kernel on this machine's device with random inputs, time it and "
                       "compare it with the float64 reference. The table goes to standard output, "
                       "progress to standard error.")
    r.add_argument("spec", metavar="SPEC", help="a .attn file or '-' for standard input")
    r.add_argument("--target", required=True, type=_target, choices=targets)
    r.add_argument("--kernel", metavar="NAME", help="which kernel, when the file defines several")
    r.add_argument("--profile", metavar="P", help="profile (default: the live device's)")
    r.add_argument("--shape", action="append", metavar="B=..,Lq=..,Lk=..[,Hq=..,Hkv=..]",
                   help="a run-time shape; repeat for several (default B=1,Lq=Lk=256; Hq and Hkv "
                        "default to the spec's heads, and must equal them when the spec fixes them)")
    r.add_argument("--repeat", type=int, default=10, help="timed runs per shape (median reported)")
    r.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    r.add_argument("--no-reference", action="store_true",
                   help="time only (the float64 reference is slow for large shapes)")
    r.add_argument("-q", "--quiet", action="store_true", help="no progress lines on standard error")

    pc = sub.add_parser("precompile", parents=[common],
                        help="build kernels into the disk cache ahead of time (no GPU needed)",
                        description="Build every kernel of the SPECs for the named devices into the disk "
                        "cache, so that attngen.compile() on such a device finds it (a new process then "
                        "neither renders nor compiles). Needs the target's compiler, not its device. "
                        "A SPEC may be a directory: every *.attn file in it.")
    pc.add_argument("spec", metavar="SPEC", nargs="+", help="a .attn file or a directory")
    pc.add_argument("--target", required=True, type=_target, choices=targets)
    kinds = "; ".join(f"{t}: {backends.get(t).device_kinds}" for t in targets if backends.get(t).device_kinds)
    pc.add_argument("--device", action="append", metavar="D[,D...]",
                    help=f"devices to build for ({kinds}); default: this machine's devices, else every "
                         "architecture of the target's profiles")
    pc.add_argument("--kernel", metavar="NAME", help="only this kernel")
    pc.add_argument("-q", "--quiet", action="store_true", help="no progress on standard error")

    t = sub.add_parser("tune", parents=[common], help="find the fastest tiles for this machine's device",
                       description="Sweep the tile choices of a kernel (tile q, tile kv and the target's options) "
                       "on this machine's device: every candidate is checked against the float64 reference "
                       "before it is timed; the fastest is stored in the cache and used by attngen.compile on "
                       "this device when the spec leaves those choices at auto (attngen check lists it).")
    t.add_argument("spec", metavar="SPEC", help="a .attn file or '-' for standard input")
    t.add_argument("--target", required=True, type=_target, choices=targets)
    t.add_argument("--kernel", metavar="NAME", help="which kernel, when the file defines several")
    t.add_argument("--shape", metavar="B=..,Lq=..,Lk=..[,Hq=..,Hkv=..]",
                   help="the shape to tune for (default B=1,Lq=Lk=256); results are kept per shape class "
                        "(decode or prefill, and the order of Lk)")
    t.add_argument("--repeat", type=int, default=5, help="timed runs per candidate (median)")
    t.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    t.add_argument("-q", "--quiet", action="store_true", help="no progress lines on standard error")

    d = sub.add_parser("serve-demo", parents=[common], help="a web page that runs a kernel in the browser",
                       description="Build a kernel with its manifest into a folder beside the web runtime "
                       "and a demo page (docs/web.md), and serve the folder over HTTP on localhost: open the "
                       "address it prints in a browser with WebGPU. With --no-serve the folder is only written "
                       "(a static page to copy anywhere).")
    d.add_argument("spec", metavar="SPEC", help="a .attn file or '-' for standard input")
    d.add_argument("--target", required=True, type=_target, choices=targets, help="a target with a web runtime")
    d.add_argument("--kernel", metavar="NAME", help="which kernel, when the file defines several")
    d.add_argument("--profile", metavar="P", help="target profile (default: the target's)")
    d.add_argument("--dir", metavar="DIR", help="write the page here (default: a new temporary folder)")
    d.add_argument("--port", type=_port, default=8000, help="HTTP port on 127.0.0.1 (default 8000; 0: any free)")
    d.add_argument("--no-serve", action="store_true", help="write the folder and exit")

    sp = sub.add_parser("spec", parents=[common], help="write the specs a Hugging Face model needs",
                        description="Write the .attn specs of a model's attention from its Hugging Face config: "
                        "per layer type (global, sliding window) a prefill and a decode kernel, with heads, head "
                        "dims, dtype, mask, softcap and scale read from the config (docs/transformers.md). "
                        "Needs neither transformers nor PyTorch.")
    sp.add_argument("--from-hf", metavar="CONFIG", required=True, dest="from_hf",
                    help="a config.json, or a model directory that holds one")
    sp.add_argument("--dtype", choices=("f16", "bf16", "f32"),
                    help="instead of the config's dtype (f16 for a target without bf16)")
    sp.add_argument("--name", metavar="NAME", help="the kernels' name prefix (default: from the config)")
    sp.add_argument("-o", "--output", metavar="PATH", help="write here instead of standard output")

    k = sub.add_parser("cache", parents=[common], help="show or empty the disk cache of built kernels",
                       description="The disk cache of built kernels: $ATTNGEN_CACHE_DIR, else "
                       "$XDG_CACHE_HOME/attngen, else ~/.cache/attngen.")
    actions = k.add_subparsers(dest="action", parser_class=_Parser)
    actions.add_parser("info", parents=[common], help="the cache's directory, entries and size")
    actions.add_parser("clear", parents=[common], help="remove every entry (files attngen did not write stay)")
    return p
