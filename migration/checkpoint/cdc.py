"""Content-defined chunking of directory-mode files (FastCDC 2020, the `pyfastcdc` package).

A file rewritten with mostly the same content (a `torch.save` of a model whose frozen tensors
did not change) gets most of the same chunk boundaries again, because a boundary depends only
on the bytes just before it, not on its offset: a changed tensor changes the chunks it covers
and, usually, one chunk on either side (a few more now and then: in 3000 random files of 8 MiB
with 100 KB inserted, the chunks around the insertion added 122 KB at the median, 408 KB at
the 99th percentile and 674 KB at most). The choice and its measurement are in
docs/decisions/061-content-defined-chunking.md.

A file is read in segments with `pread` (never mapped: a file truncated while it is read would
fault a mapping), and cut as one stream: the last, unfinished chunk of a segment is carried into
the next, so the boundaries are those of cutting the whole file at once.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from pyfastcdc import FastCDC

# Measured (decision 061, bench/directory.py): with 5% of the tensors of a 256 MiB torch.save
# changed, a sync stores 1.03-1.17x the changed bytes at a 64 KiB average (1.07-1.21x at
# 128 KiB, whose full save is faster: 1.3 s against 2.0 s), 4-19x with 16 MiB fixed chunks.
MIN_SIZE = 16 * 1024
AVG_SIZE = 64 * 1024
MAX_SIZE = 256 * 1024
SEGMENT = 8 * 1024 * 1024
ALGORITHM = f"fastcdc2020/{MIN_SIZE}/{AVG_SIZE}/{MAX_SIZE}"

_chunker = FastCDC(AVG_SIZE, min_size=MIN_SIZE, max_size=MAX_SIZE)


def cut(data: memoryview) -> Iterator[tuple[int, int]]:
    """(offset, length) of each chunk of `data`, cut as a whole."""
    for chunk in _chunker.cut_buf(data):
        yield chunk.offset, chunk.length


def read_chunks(fd: int, size: int, segment: int = SEGMENT) -> Iterator[memoryview]:
    """The chunks of the first `size` bytes of the open file `fd`, each a view of its own
    buffer segment (safe to hand to another thread). Stops early at the end of the file if it
    is shorter than `size` now (the caller compares what it got with what it expected)."""
    carry = b""
    offset = 0
    while offset < size:
        data = os.pread(fd, min(segment, size - offset), offset)
        if not data:
            break
        offset += len(data)
        buffer = memoryview(carry + data) if carry else memoryview(data)
        last = offset >= size
        pieces = list(cut(buffer))
        keep = pieces if last else pieces[:-1]
        for start, length in keep:
            yield buffer[start : start + length]
        if last:
            return
        start, length = pieces[-1]
        carry = bytes(buffer[start : start + length])
    if carry:
        yield memoryview(carry)
