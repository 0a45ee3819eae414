"""``python -m zipccl``: see zipccl.cli."""

import sys

from .cli import main

sys.exit(main(prog="python -m zipccl"))
