"""The two side tables of a 3.11+ code object, in bytes.

``co_linetable`` (PEP 626/657 location table) gives each code unit a source
span; ``co_exceptiontable`` maps code ranges to handlers. Both formats are the
same on 3.11 and 3.12; both use six-bit varints, but the line table writes
them least significant chunk first and the exception table most significant
first (see CPython's ``Objects/locations.md`` and ``exception_handling_notes``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

from kiln.capture.bytecode.instructions import Positions

__all__ = [
    "RawExceptionEntry",
    "encode_exception_table",
    "encode_linetable",
    "parse_exception_table",
]

_NO_LOCATION = 15
_LONG = 14
_NO_COLUMN = 13
_ONE_LINE = 10  # 10, 11, 12: line delta 0, 1, 2
_MAX_UNITS = 8


@dataclasses.dataclass(frozen=True)
class RawExceptionEntry:
    """An exception-table row in byte offsets: ``[start, end)`` jumps to ``target``."""

    start: int
    end: int
    target: int
    depth: int
    lasti: bool


def _varint_lsb(value: int) -> bytes:
    out = bytearray()
    while value >= 64:
        out.append(0x40 | (value & 63))
        value >>= 6
    out.append(value)
    return bytes(out)


def _svarint(value: int) -> bytes:
    return _varint_lsb(((-value) << 1) | 1 if value < 0 else value << 1)


def _location_entry(pos: Positions | None, units: int, prev_line: int) -> tuple[bytes, int]:
    """One entry covering ``units`` (1..8) code units; returns it and the new line."""
    if pos is None or pos.lineno is None:
        return bytes([0x80 | (_NO_LOCATION << 3) | (units - 1)]), prev_line
    line = pos.lineno
    delta = line - prev_line
    col, end_col, end_line = pos.col_offset, pos.end_col_offset, pos.end_lineno
    if col is None or end_col is None or end_line is None or end_line < line:
        return bytes([0x80 | (_NO_COLUMN << 3) | (units - 1)]) + _svarint(delta), line
    if end_line == line and 0 <= delta < 3 and col < 128 and end_col < 128:
        if delta == 0 and col < 80 and 0 <= end_col - col < 16:
            head = 0x80 | ((col >> 3) << 3) | (units - 1)
            return bytes([head, ((col & 7) << 4) | (end_col - col)]), line
        head = 0x80 | ((_ONE_LINE + delta) << 3) | (units - 1)
        return bytes([head, col, end_col]), line
    body = _svarint(delta) + _varint_lsb(end_line - line) + _varint_lsb(col + 1)
    return bytes([0x80 | (_LONG << 3) | (units - 1)]) + body + _varint_lsb(end_col + 1), line


def encode_linetable(spans: Sequence[tuple[Positions | None, int]], firstlineno: int) -> bytes:
    """Encode ``(positions, code units)`` runs, in code order, as ``co_linetable``."""
    out = bytearray()
    line = firstlineno
    for pos, units in spans:
        left = units
        while left > 0:
            n = min(left, _MAX_UNITS)
            entry, line = _location_entry(pos, n, line)
            out += entry
            left -= n
    return bytes(out)


def _varint_msb(value: int, first: bool) -> bytes:
    chunks = [value & 63]
    value >>= 6
    while value:
        chunks.append(value & 63)
        value >>= 6
    chunks.reverse()
    out = bytearray(c | 0x40 for c in chunks[:-1])
    out.append(chunks[-1])
    if first:
        out[0] |= 0x80
    return bytes(out)


def encode_exception_table(entries: Sequence[RawExceptionEntry]) -> bytes:
    """Encode rows (sorted, disjoint, byte offsets) as ``co_exceptiontable``."""
    out = bytearray()
    for e in entries:
        out += _varint_msb(e.start // 2, first=True)
        out += _varint_msb((e.end - e.start) // 2, first=False)
        out += _varint_msb(e.target // 2, first=False)
        out += _varint_msb((e.depth << 1) | int(e.lasti), first=False)
    return bytes(out)


def _read_varint_msb(it: Iterator[int]) -> int:
    b = next(it)
    value = b & 63
    while b & 64:
        b = next(it)
        value = (value << 6) | (b & 63)
    return value


def parse_exception_table(table: bytes) -> list[RawExceptionEntry]:
    """Decode ``co_exceptiontable`` into rows in byte offsets."""
    it = iter(table)
    rows: list[RawExceptionEntry] = []
    while True:
        try:
            start = _read_varint_msb(it) * 2
        except StopIteration:
            return rows
        length = _read_varint_msb(it) * 2
        target = _read_varint_msb(it) * 2
        depth_lasti = _read_varint_msb(it)
        rows.append(
            RawExceptionEntry(
                start, start + length, target, depth_lasti >> 1, bool(depth_lasti & 1)
            )
        )
