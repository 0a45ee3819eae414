"""One launch plan for every encoder and decoder: its kernels' launches with everything but the
stream fixed.

A plan is a short sequence of steps (a tile kernel, then a finishing kernel), each a compiled
kernel (``launch.Kernel``), its grid and its packed parameters (``launch.Params``). It is
built once per buffer set (``codec/gpu_workspace.py`` caches it); ``launch(stream)`` is one
driver call per step, and ``retarget`` points the steps at other buffers of the same sizes by
rewriting the data-pointer slots of the arguments that name the two buffers (the input and
the output of the call). Each codec module's ``Plan`` says which kernels and arguments; this
class does the rest.
"""

from __future__ import annotations

from . import launch as launch_route
from ._common import TPB


class Step:
    """One launch of a plan: ``kernel`` with ``values`` (``launch.Params``' form) on ``grid``
    blocks; ``first`` / ``second``: the argument numbers that hold the plan's first buffer
    (what ``retarget`` calls ``a_ptr``) and its second (``b_ptr``)."""

    __slots__ = ("function", "grid", "params", "first", "second")

    def __init__(self, kernel: launch_route.Kernel, device: int, grid: int, values,
                 first: tuple[int, ...], second: tuple[int, ...]):
        self.function = kernel.function(device)
        self.grid = grid
        self.params = launch_route.Params(kernel, values)
        self.first = tuple(kernel.data_slot(i) for i in first)
        self.second = tuple(kernel.data_slot(i) for i in second)


class Plan:
    """The launches of one encode or decode (``steps``, in order) on ``device``."""

    __slots__ = ("device", "steps", "workspace")

    def __init__(self, device: int, steps: tuple[Step, ...]):
        self.device = device
        self.steps = steps
        self.workspace = None  # the caller's workspace object, kept alive with the plan

    def retarget(self, a_ptr: int, b_ptr: int) -> None:
        """Point the plan at other buffers of the same sizes: the input (values to encode, or
        the frame to decode) at ``a_ptr``, the output at ``b_ptr``."""
        for step in self.steps:
            p = step.params
            for slot in step.first:
                p.set(slot, a_ptr)
            for slot in step.second:
                p.set(slot, b_ptr)

    def launch(self, stream: int) -> None:
        """Enqueue the steps on ``stream`` (a CUstream handle as an int)."""
        for step in self.steps:
            launch_route.launch(step.function, step.grid, TPB, stream, step.params)
