"""Redis Cluster hash slots, and a short hash tag for each (pure).

A lock's per-name keys share the hash tag ``{<name>}``. What the engine keeps beyond
a lock's lease (the fencing counter and the recent history) is kept per *slot*
instead, in a key whose hash tag is chosen to land in the lock's own slot, so one
script still touches a single slot on a Cluster, and the memory that state takes is
bounded by the number of slots (16,384), not by the number of names.

:func:`slot_tag` finds, for any slot, a four-letter tag (letters ``@`` to ``O``)
that Redis hashes to it. Redis's key hash is CRC16 (XMODEM), which is linear over
GF(2) for messages of one length: flipping a bit of the message flips a fixed set of
bits of the CRC. Each letter is ``0x40`` with its low four bits free, so the tag has
16 free bits; the 14 slot bits they reach are solved for once, at import (16 CRCs
and a small elimination), and a tag is then 14 XORs.
"""

from __future__ import annotations

from binascii import crc_hqx
from functools import lru_cache

#: How many hash slots Redis Cluster has.
SLOTS = 16384
_MASK = SLOTS - 1
_BASE = b"@@@@"


def key_slot(key: bytes) -> int:
    """The hash slot Redis Cluster gives *key*: the CRC16 of its hash tag (what lies
    between its first ``{`` and the first ``}`` after it, when not empty), else of
    the whole key."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return crc_hqx(key, 0) & _MASK


def _flip(bit: int) -> bytes:
    tag = bytearray(_BASE)
    tag[bit // 4] ^= 1 << (bit % 4)
    return bytes(tag)


def _solve() -> tuple[int, list[int]]:
    """The base tag's slot, and for each slot bit the free bits that flip it alone."""
    base = key_slot(_BASE)  # (no braces: the whole text is hashed)
    rows: dict[int, tuple[int, int]] = {}  # pivot bit -> (slot bits flipped, free bits)
    for bit in range(4 * len(_BASE)):
        effect, combo = key_slot(_flip(bit)) ^ base, 1 << bit
        for pivot in sorted(rows, reverse=True):
            if effect >> pivot & 1:
                effect ^= rows[pivot][0]
                combo ^= rows[pivot][1]
        if effect:
            rows[effect.bit_length() - 1] = (effect, combo)
    if len(rows) != SLOTS.bit_length() - 1:  # pragma: no cover - a property of CRC16
        raise AssertionError("the tag's free bits do not reach every slot")
    # Back-substitution: each row flips exactly its pivot bit.
    for pivot in sorted(rows):
        effect, combo = rows[pivot]
        for lower in range(pivot):
            if effect >> lower & 1:
                effect ^= rows[lower][0]
                combo ^= rows[lower][1]
        rows[pivot] = (effect, combo)
    return base, [rows[bit][1] for bit in range(SLOTS.bit_length() - 1)]


_BASE_SLOT, _UNIT = _solve()


@lru_cache(maxsize=SLOTS)
def slot_tag(slot: int) -> str:
    """A four-letter hash tag that Redis hashes to *slot* (0 to 16,383)."""
    if not 0 <= slot < SLOTS:
        raise ValueError(f"a hash slot is between 0 and {SLOTS - 1}, not {slot}")
    want, free = slot ^ _BASE_SLOT, 0
    for bit, combo in enumerate(_UNIT):
        if want >> bit & 1:
            free ^= combo
    return "".join(chr(0x40 | (free >> (4 * i) & 15)) for i in range(len(_BASE)))
