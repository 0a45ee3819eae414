"""Every error bit zipccl raises from a device or a peer, with its text.

One 32-bit word carries them: the decode kernels set the low 16 bits of a frame's error word
(``FRAME_ERRORS``), the slot exchange and the spill path set the high ones in the sticky word
of a communicator (``SLOT_ERRORS``). The kernels compile these values in as constants; the
hosts turn a word back into words with ``describe``.
"""

from __future__ import annotations

# -- a frame that does not decode (the decode kernels' bits, 1..64) --------------------------
ERR_HEADER = 1  # magic / version / dtype / flags / n / lengths do not fit
ERR_HEADER_CRC = 2
ERR_COUNTS = 4  # a block's escape count disagrees with its code planes (or is impossible)
ERR_TOTAL = 8  # the escape counts do not add up to the header's n_escapes
ERR_CHECKSUM = 16  # payload checksum mismatch
ERR_ESCAPE_RANGE = 32  # an escape position fell outside the escape section
ERR_ESCAPE_VALUE = 64  # FP16: an escape byte above 31

FRAME_ERRORS = {
    ERR_HEADER: "bad header fields (magic, version, dtype, flags, element count or lengths)",
    ERR_HEADER_CRC: "header checksum mismatch",
    ERR_COUNTS: "a block's escape count disagrees with its code planes",
    ERR_TOTAL: "escape counts do not add up to the header's",
    ERR_CHECKSUM: "payload checksum mismatch",
    ERR_ESCAPE_RANGE: "an escape position falls outside the escape section",
    ERR_ESCAPE_VALUE: "an escape byte is not a float16 exponent (above 31)",
}
FRAME_MASK = 0xFFFF

# -- a collective's slots, peers and spills (the sticky word's high bits) ---------------------
ERR_SLOT_HEADER = 1 << 16
ERR_SLOT_SEQ = 1 << 17
ERR_SLOT_CALL = 1 << 18
ERR_SLOT_SIZE = 1 << 19
ERR_PEER = 1 << 20
ERR_PROGRESS = 1 << 21
ERR_HOST_DECODE = 1 << 22  # set by the host (a host call's frame did not decode)

SLOT_ERRORS = {
    ERR_SLOT_HEADER: "a received slot header is not one (magic, version or CRC)",
    ERR_SLOT_SEQ: "a received slot header belongs to another call (call sequence number)",
    ERR_SLOT_CALL: "a peer made another call (operation, element type or element count differ)",
    ERR_SLOT_SIZE: "slot sizes differ between ranks, or a frame is longer than its region",
    ERR_PEER: "a peer reported an error in its slot header",
    ERR_PROGRESS: "the spill progress thread failed (host channel)",
    ERR_HOST_DECODE: "a frame did not decode (host arrays)",
}


def describe(bits: int, table: dict[int, str]) -> str:
    """The set bits of ``bits`` that ``table`` names, in words ("no error" for none).

    >>> describe(ERR_COUNTS | ERR_TOTAL, FRAME_ERRORS)
    "a block's escape count disagrees with its code planes; escape counts do not add up to the header's"
    """
    return "; ".join(text for bit, text in table.items() if bits & bit) or "no error"
