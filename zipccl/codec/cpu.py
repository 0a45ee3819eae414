"""Placeholder until the Numba fast path lands: delegates to the reference."""
from .reference import decode, encode  # noqa: F401
