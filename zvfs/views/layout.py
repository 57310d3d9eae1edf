"""Byte-range arithmetic over a C-order array, shared by every decoded view.

A read of bytes [offset, offset+length) of an array laid out in C order maps
to an element range, which splits into at most 2·ndim-1 boxes whose C-order
concatenation is exactly that range. Only the chunks those boxes touch are
decoded, so a small read never decodes whole planes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (lo, hi), hi exclusive


def range_boxes(shape: tuple[int, ...], start: int, stop: int) -> Iterator[Box]:
    """Boxes covering flat C-order element indices [start, stop), in order."""
    if start >= stop:
        return
    if not shape:
        yield (), ()
        return
    if len(shape) == 1:
        yield (start,), (stop,)
        return
    inner = math.prod(shape[1:])
    rest = shape[1:]
    first, last = start // inner, (stop - 1) // inner
    if first == last:
        for lo, hi in range_boxes(rest, start - first * inner, stop - first * inner):
            yield (first, *lo), (first + 1, *hi)
        return
    if start % inner:
        for lo, hi in range_boxes(rest, start % inner, inner):
            yield (first, *lo), (first + 1, *hi)
        first += 1
    full_end = last if stop % inner else last + 1
    if full_end > first:
        yield (first, *(0 for _ in rest)), (full_end, *rest)
    if stop % inner:
        for lo, hi in range_boxes(rest, 0, stop % inner):
            yield (last, *lo), (last + 1, *hi)


def chunks_in_box(box: Box, chunks: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    """Chunk grid indices that intersect ``box``, in C order."""
    lo, hi = box
    ranges = [range(a // c, (b - 1) // c + 1) for a, b, c in zip(lo, hi, chunks, strict=True)]
    if any(len(r) == 0 for r in ranges):
        return
    yield from _product(ranges)


def chunks_under(boxes: list[Box], chunks: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    """Chunk grid indices that intersect any of ``boxes``, each once, in the order first
    met, made as they are asked for: a read of a million 1-byte chunks never holds all
    their indices (``dict.fromkeys`` of them took a 64-dimensional tuple each). A chunk
    is yielded at its first box: one that also meets an earlier box was yielded there."""
    for j, box in enumerate(boxes):
        earlier = boxes[:j]
        for idx in chunks_in_box(box, chunks):
            if earlier and any(_meets(idx, chunks, b) for b in earlier):
                continue
            yield idx


def _meets(idx: tuple[int, ...], chunks: tuple[int, ...], box: Box) -> bool:
    lo, hi = box
    return all(i * c < h and (i + 1) * c > low for i, c, low, h in zip(idx, chunks, lo, hi, strict=True))


def _product(ranges: list[range]) -> Iterator[tuple[int, ...]]:
    if not ranges:
        yield ()
        return
    for i in ranges[0]:
        for rest in _product(ranges[1:]):
            yield (i, *rest)


def chunk_span(shape: tuple[int, ...], chunks: tuple[int, ...], idx: tuple[int, ...]) -> tuple[int, int]:
    """[first, end) of the flat C-order element indices chunk ``idx`` spans: its elements
    all lie there (with others' between them, unless the chunk is a slab of whole rows)."""
    first = last = 0
    for n, c, i in zip(shape, chunks, idx, strict=True):
        lo = i * c
        first = first * n + lo
        last = last * n + min(lo + c, n) - 1
    return first, last + 1
