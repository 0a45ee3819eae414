"""The command line: ``zipccl analyze | demo | warmup`` (also ``python -m zipccl ...``).

Subcommands live in their own modules (``zipccl.analyze``, ``zipccl.demo``, ``zipccl.warmup``);
this file only dispatches, so that importing one never pulls in another's
dependencies (the demo needs mpi4py, analyze does not).

Exit status: 0 success, 1 the subcommand's check failed (a round trip not
bit-exact; warmup: a kernel did not build), 2 a usage or input error, or no GPU for
``warmup`` (what was wrong is said on stderr).
"""

from __future__ import annotations

import sys

COMMANDS = {
    "analyze": ("zipccl.analyze", "ratio, coverage and entropy of the tensors in checkpoint files"),
    "demo": ("zipccl.demo", "compressed all-gather of a real checkpoint, checked bit for bit (mpiexec)"),
    "warmup": ("zipccl.warmup", "compile every GPU kernel once for this machine's GPU (kernel cache)"),
}
USAGE_ERROR = 2


def usage(prog: str) -> str:
    """The top-level help text."""
    lines = [f"usage: {prog} [-h] [--version] {{{','.join(COMMANDS)}}} [args]", "",
             "subcommands:"]
    lines += [f"  {name:8s} {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", f"'{prog} COMMAND --help' describes one."]
    return "\n".join(lines)


def main(argv: list[str] | None = None, prog: str = "zipccl") -> int:
    """Dispatch ``argv`` (default: ``sys.argv[1:]``) to a subcommand; return the exit status.

    ``prog`` is how the user started it (``zipccl`` or ``python -m zipccl``), for messages.

    >>> main(["no-such-command"])  # usage and "unknown subcommand" go to stderr
    2
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("-h", "--help"):
        print(usage(prog))
        return 0
    if argv and argv[0] in ("-V", "--version"):
        from . import __version__

        print(f"zipccl {__version__}")
        return 0
    if not argv or argv[0] not in COMMANDS:
        why = ("a subcommand is required" if not argv else
               f"unknown subcommand {argv[0]!r} (choose from {', '.join(COMMANDS)})")
        print(f"{usage(prog)}\n\n{prog}: error: {why}", file=sys.stderr)
        return USAGE_ERROR
    import importlib

    module = importlib.import_module(COMMANDS[argv[0]][0])
    return int(module.main(argv[1:], prog=f"{prog} {argv[0]}") or 0)
