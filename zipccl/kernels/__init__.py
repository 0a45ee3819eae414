"""CUDA kernels of the GPU codec (Numba ``@cuda.jit``): the only package that imports numba.cuda.

``encode`` (every element type; one tile's device functions in ``encode_tile``, the grids
and launches in ``encode_launch``) and ``decode`` (BF16, FP32; ``decode_fp16`` FP16 and the
wide types' finishing kernel; ``decode_warps`` the BF16 / FP32 decoder of large frames, a
warp a tile) hold the codec kernels and their launchers, ``layout`` the
frame as the kernels see it, ``plan`` the launch plans, ``stats`` the
sigma estimate and exponent histogram, ``_common`` the look-back scan and header
CRC they share, ``runtime`` the Numba-side host glue, ``compat`` the fixes that
must precede any compilation. ``spill`` holds the collectives' spill kernels, in CUDA C
compiled by CuPy (they spin on host memory, which Numba cannot express), beside their
NumPy twins. ``zipccl.codec.gpu`` is the public entry; nothing is imported here, so
``import zipccl`` never loads numba.cuda.
"""
