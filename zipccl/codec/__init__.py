"""Codecs: one frame format (``zipccl.format``), three implementations.

``reference`` is the specification (NumPy); ``cpu`` is the Numba ``@njit`` fast
path for host memory (its loops in ``cpu_loops``, its thread counts in ``cpu_threads``);
``gpu`` runs the CUDA kernels of ``zipccl.kernels`` on device memory. All three write the
same bytes and read each other's frames.
"""
