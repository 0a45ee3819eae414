"""Codecs: one frame format (``zipccl.format``), three implementations.

``reference`` is the specification (NumPy); ``cpu`` is the Numba ``@njit`` fast
path for host memory; ``gpu`` runs the CUDA kernels of ``zipccl.kernels`` on
device memory. All three write the same bytes and read each other's frames.
"""
