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

    __slots__ = ("device", "steps", "workspace", "_at")

    def __init__(self, device: int, steps: tuple[Step, ...]):
        self.device = device
        self.steps = steps
        self.workspace = None  # the caller's workspace object, kept alive with the plan
        self._at = None  # the (input, output) addresses the parameters hold, once retargeted

    def retarget(self, a_ptr: int, b_ptr: int) -> None:
        """Point the plan at other buffers of the same sizes: the input (values to encode, or
        the frame to decode) at ``a_ptr``, the output at ``b_ptr`` (nothing to write where
        they are the ones it points at)."""
        if self._at == (a_ptr, b_ptr):
            return
        for step in self.steps:
            vals = step.params.vals  # Params.set, inline: one store per slot
            for slot in step.first:
                vals[slot] = a_ptr
            for slot in step.second:
                vals[slot] = b_ptr
        self._at = (a_ptr, b_ptr)

    def launch(self, stream: int) -> None:
        """Enqueue the steps on ``stream`` (a CUstream handle as an int)."""
        for step in self.steps:
            launch_route.launch(step.function, step.grid, TPB, stream, step.params)
