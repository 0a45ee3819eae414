"""CUDA kernels of the GPU codec (Numba ``@cuda.jit``): the only package that imports numba.cuda.

``encode`` and ``decode`` hold the codec kernels and their launchers, ``stats`` the
sigma estimate and exponent histogram, ``_common`` the look-back scan and header
CRC they share, ``runtime`` the Numba-side host glue, ``compat`` the fixes that
must precede any compilation. ``zipccl.codec.gpu`` is the public entry; nothing is
imported here, so ``import zipccl`` never loads numba.cuda.
"""
