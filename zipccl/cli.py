"""The command line: ``python -m zipccl analyze | demo``.

Subcommands live in their own modules (``zipccl.analyze``, ``zipccl.demo``);
this file only dispatches, so that importing one never pulls in another's
dependencies (the demo needs mpi4py, analyze does not).
"""

from __future__ import annotations

import sys

COMMANDS = {
    "analyze": ("zipccl.analyze", "ratio, coverage and entropy of the tensors in checkpoint files"),
    "demo": ("zipccl.demo", "compressed all-gather of a real checkpoint, checked bit for bit (mpiexec)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: python -m zipccl {" + ",".join(COMMANDS) + "} [args]\n")
        for name, (_, text) in COMMANDS.items():
            print(f"  {name:8s} {text}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    import importlib

    module = importlib.import_module(COMMANDS[argv[0]][0])
    return int(module.main(argv[1:]) or 0)
