"""Turning a nested training state into tensors plus a JSON tree, and back.

A state is any nesting of dicts (str or int keys), lists and tuples whose leaves are numpy arrays,
torch tensors (when torch is installed), numpy scalars, bytes or JSON values. The tree keeps the
shape of the nesting; every array becomes a named tensor whose raw bytes are chunked by the
store. Small tensors (biases, RNG states, step counters), and tensors that train of up to
1 MiB, are packed into one shared byte range so a model with hundreds of them does not
become hundreds of small chunk files. A save that copies the state copies the pack into one
buffer; one that does not describes it as pieces of the live tensors (`Gathered`).

torch is never imported here unless the caller already imported it: if `torch` is not in
`sys.modules`, no value can be a torch tensor.
"""

from __future__ import annotations

import base64
import contextlib
import mmap
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from .errors import StoreError
from .manifest import ChunkList

SMALL_TENSOR_BYTES = 256 * 1024
# Tensors that train, up to this size (or the store's chunk size, when smaller: a tensor of a
# chunk or more gets whole chunks of its own anyway), are packed too: a chunk file of their
# own each made a state of 300 KiB tensors save at 4x the raw write, of 1 MiB ones at 1.7x,
# of 2 MiB ones at 1.09-1.25x; packed, 1.16x, 0.95x and 0.93-1.17x. 4 MiB ones gained in two
# runs of three and lost in none; 8 MiB ones gained nothing (decision 055). Frozen ones above
# SMALL_TENSOR_BYTES keep their own chunks, which a later save skips unread.
PACK_TENSOR_BYTES = 4 * 1024 * 1024


def pack_limit_for(chunk_size: int) -> int:
    """The largest tensor that trains which a snapshot for a store of `chunk_size` packs."""
    return min(PACK_TENSOR_BYTES, chunk_size)


# The copies an asynchronous save makes while the training loop waits go in pieces of this
# size over the cores the process may use: one thread copied 256 MiB in 36-40 ms here, two
# in 22-25 ms (decision 055). Beyond a few threads memory bandwidth, not the cores, sets the
# pace (measured on two cores only), hence a cap.
_COPY_PIECE = 4 * 1024 * 1024
_COPY_THREADS_MAX = 8
_copiers: ThreadPoolExecutor | None = None
_copiers_lock = threading.Lock()


def _forget_copiers() -> None:
    """In a forked child, which has none of its parent's threads: start copiers of its own."""
    global _copiers, _copiers_lock
    _copiers, _copiers_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_copiers)


def _copy_threads() -> int:
    """One per core this process may run on, at most `_COPY_THREADS_MAX`."""
    if hasattr(os, "sched_getaffinity"):
        return min(len(os.sched_getaffinity(0)), _COPY_THREADS_MAX)
    return min(os.cpu_count() or 1, _COPY_THREADS_MAX)


def _copy_all(pairs: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """Copy each source into its destination (uint8 arrays of one length each), the pieces
    shared between the calling thread and a helper thread for each other core."""
    global _copiers
    pieces = [
        (dst[start : start + _COPY_PIECE], src[start : start + _COPY_PIECE])
        for dst, src in pairs
        for start in range(0, len(src), _COPY_PIECE)
    ]
    threads = _copy_threads()
    shares = min(threads, len(pieces))

    def copy_share(share: list[tuple[np.ndarray, np.ndarray]]) -> None:
        for dst, src in share:
            np.copyto(dst, src)

    if shares <= 1:
        copy_share(pieces)
        return
    with _copiers_lock:
        if _copiers is None:
            _copiers = ThreadPoolExecutor(threads - 1, thread_name_prefix="baton-copy")
    helped = [_copiers.submit(copy_share, pieces[k::shares]) for k in range(1, shares)]
    try:
        copy_share(pieces[::shares])
    finally:
        for future in helped:
            future.result()


_ALIGN = 64
_NUMPY_KINDS = "biufc"


class PrivateMap(mmap.mmap):
    """Anonymous memory only the array made from it can reach (see `aligned_empty`)."""


_MAP_MIN = 1024 * 1024
_HUGE_PAGE = 2 * 1024 * 1024


def aligned_empty(nbytes: int, align: int = 4096, *, huge: bool = False) -> np.ndarray:
    """An uninitialised uint8 array whose data starts on an `align` boundary (O_DIRECT I/O).

    Large buffers come straight from an anonymous mapping: page-aligned, and faulted in at a
    predictable cost (numpy's allocator asks for transparent huge pages, whose first
    compaction can stall for most of a second).

    `huge` asks for transparent huge pages on purpose, for buffers the disk reads into or
    writes from directly (a store's staging buffers): a direct write
    from 2 MiB pages is one segment per page where 4 KiB pages need 256 per MiB, and a
    virtual disk that takes at most a few hundred segments per request splits every 1 MiB
    write from 4 KiB pages in two (decision 055). Where the kernel gives no huge pages the
    buffer is an ordinary one, and so is one smaller than a huge page and the tail of one
    that is not a whole number of them (a partly used huge page would take 2 MiB).
    """
    if huge and nbytes >= _HUGE_PAGE and hasattr(mmap, "MADV_HUGEPAGE"):
        region = PrivateMap(-1, nbytes + _HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        whole = np.frombuffer(region, dtype=np.uint8)
        start = (-whole.ctypes.data) % _HUGE_PAGE
        with contextlib.suppress(OSError):
            region.madvise(mmap.MADV_HUGEPAGE, start, nbytes - nbytes % _HUGE_PAGE)
        return whole[start : start + nbytes]
    if nbytes >= _MAP_MIN and hasattr(mmap, "MAP_ANONYMOUS") and align <= mmap.PAGESIZE:
        region = PrivateMap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        return np.frombuffer(region, dtype=np.uint8, count=nbytes)
    raw = np.empty(nbytes + align, dtype=np.uint8)
    start = (-raw.ctypes.data) % align
    return raw[start : start + nbytes]


def _torch() -> Any | None:
    """The torch module if the process already imported it, else None (never imports it)."""
    return sys.modules.get("torch")


def _is_torch_tensor(value: object) -> bool:
    torch = _torch()
    return torch is not None and isinstance(value, torch.Tensor)


def is_frozen(arr: np.ndarray) -> bool:
    """True if no array in `arr`'s base chain is writeable, so its bytes cannot change in place.

    The SDK neither copies nor rehashes such arrays when they are the same object as at the
    previous save: a frozen base model marked read-only costs nothing after its first save.
    """
    node: object = arr
    while isinstance(node, np.ndarray):
        if node.flags.writeable:
            return False
        node = node.base
    # bytes are immutable; a PrivateMap is reachable only through the arrays just checked.
    return node is None or isinstance(node, bytes | PrivateMap)


class Gathered:
    """A byte range made of pieces of other memory at given offsets, zeros between them: the
    pack of a save that does not copy. A chunk of it is gathered into one buffer only as it is
    written, on the worker that writes it."""

    def __init__(self, parts: list[tuple[int, memoryview]], nbytes: int) -> None:
        self.parts = parts  # (offset, bytes), in order, not overlapping
        self.nbytes = nbytes

    def __len__(self) -> int:
        return self.nbytes

    def __getitem__(self, where: slice) -> Gathered:
        start, stop, _ = where.indices(self.nbytes)
        stop = max(start, stop)
        parts = []
        for offset, view in self.parts:
            first, last = max(offset, start), min(offset + len(view), stop)
            if first < last:
                parts.append((first - start, view[first - offset : last - offset]))
        return Gathered(parts, stop - start)

    def copy_into(self, out: np.ndarray) -> None:
        """Write the bytes into `out` (uint8, of this length)."""
        end = 0
        for offset, view in self.parts:
            out[end:offset] = 0  # gaps must be deterministic or the pack never dedupes
            out[offset : offset + len(view)] = np.frombuffer(view, dtype=np.uint8)
            end = offset + len(view)
        out[end:] = 0

    def gather(self) -> memoryview:
        """The bytes, in the calling thread's `staging_buffer`."""
        out = staging_buffer(self.nbytes)
        self.copy_into(out)
        return out.data


_staging = threading.local()


def staging_buffer(nbytes: int) -> np.ndarray:
    """The calling thread's buffer of `nbytes`, aligned for O_DIRECT and in huge pages, where a
    chunk is gathered or staged before it is hashed and written: kept for the thread's next
    chunk, so its contents are valid until the thread stages again."""
    buf = getattr(_staging, "buf", None)
    if buf is None or buf.nbytes < nbytes:
        buf = aligned_empty(nbytes, huge=True)
        _staging.buf = buf
    return cast(np.ndarray, buf[:nbytes])


@dataclass
class TensorSource:
    """One tensor to save: its description plus either its bytes or its already-known chunks."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    framework: str
    nbytes: int
    data: memoryview | None = None
    known_chunks: ChunkList | None = None
    frozen: np.ndarray | None = None

    def describe(self) -> dict[str, Any]:
        """The manifest entry without its chunk list."""
        return {
            "dtype": self.dtype,
            "shape": list(self.shape),
            "framework": self.framework,
            "nbytes": self.nbytes,
        }


class BufferPool:
    """Snapshot buffers kept between saves: rewriting warm memory is about twice as fast as
    faulting in fresh pages, and at most one persist is in flight so one set suffices."""

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}

    def get(self, name: str, nbytes: int) -> np.ndarray:
        """A uint8 buffer of `nbytes` for tensor `name`, reused when the size matches."""
        buf = self._buffers.get(name)
        if buf is None or buf.nbytes != nbytes:
            buf = aligned_empty(nbytes)
            self._buffers[name] = buf
        return buf

    def keep_only(self, names: set[str]) -> None:
        """Drop buffers of tensors that are gone from the state."""
        for name in set(self._buffers) - names:
            del self._buffers[name]

    @property
    def nbytes(self) -> int:
        """Memory held by the pool."""
        return sum(b.nbytes for b in self._buffers.values())


class FrozenCache:
    """Chunk lists of read-only numpy arrays from the previous save, keyed by object identity.

    The array itself is kept so its id cannot be reused by another object.
    """

    def __init__(self) -> None:
        self._entries: dict[int, tuple[np.ndarray, ChunkList]] = {}

    def lookup(self, arr: np.ndarray) -> ChunkList | None:
        """The chunks of `arr` if it is the very array saved before and is still frozen."""
        entry = self._entries.get(id(arr))
        if entry is None or entry[0] is not arr or not is_frozen(arr):
            return None
        return entry[1]

    def remember(self, arr: np.ndarray, chunks: ChunkList) -> None:
        """Record the chunks a committed save found for the frozen array `arr`."""
        self._entries[id(arr)] = (arr, list(chunks))

    def keep_only(self, arrays: list[np.ndarray]) -> None:
        """Forget arrays that were not part of the latest state."""
        alive = {id(a) for a in arrays}
        self._entries = {k: v for k, v in self._entries.items() if k in alive}

    def clear(self) -> None:
        """Forget everything (after gc, chunks may be gone)."""
        self._entries.clear()


@dataclass
class Snapshot:
    """A state captured for saving: the tree, large tensors and the pack of small ones."""

    tree: dict[str, Any]
    tensors: list[TensorSource]
    small: dict[str, tuple[dict[str, Any], int]] = field(default_factory=dict)
    pack: memoryview | Gathered | None = None
    bytes_total: int = 0

    @classmethod
    def capture(
        cls,
        state: object,
        extra: object = None,
        *,
        copy: bool,
        buffers: BufferPool | None = None,
        frozen: FrozenCache | None = None,
        small_limit: int = SMALL_TENSOR_BYTES,
        pack_limit: int = PACK_TENSOR_BYTES,
    ) -> Snapshot:
        """Capture `state` and `extra`.

        With `copy`, every tensor that may change is copied (into `buffers` when given) so the
        caller may keep training while the snapshot is persisted; without it the snapshot
        refers to the live memory and the caller must not modify it until the save returns.
        Tensors up to `small_limit`, and those that train up to `pack_limit`, share the pack.
        """
        encoder = _Encoder()
        tree = {"state": encoder.encode(state, "state"), "extra": encoder.encode(extra, "extra")}
        large: list[TensorSource] = []
        small: list[tuple[bool, TensorSource, memoryview]] = []
        frozen_seen: list[np.ndarray] = []
        copies: list[tuple[np.ndarray, np.ndarray]] = []
        for name, value in encoder.tensors.items():
            source, view, arr = _describe(name, value)
            if arr is not None and is_frozen(arr):
                frozen_seen.append(arr)
            still = arr is not None and is_frozen(arr)
            if source.nbytes <= small_limit or (not still and source.nbytes <= pack_limit):
                small.append((still, source, view))
                continue
            known = frozen.lookup(arr) if (frozen is not None and arr is not None) else None
            if arr is not None and is_frozen(arr):
                # Frozen arrays cannot change while the persist runs: no copy needed, and no
                # hashing either when it is the very array saved last time.
                source.data = view
                source.frozen = arr
                source.known_chunks = known
            elif copy:
                buf = (
                    buffers.get(name, source.nbytes)
                    if buffers is not None
                    else np.empty(source.nbytes, np.uint8)
                )
                copies.append((buf, np.frombuffer(view, dtype=np.uint8)))
                source.data = buf.data
            else:
                source.data = view
            large.append(source)
        _copy_all(copies)
        # Frozen small tensors go first: they then fill the same leading pack chunks at every
        # save, and only the chunks holding tensors that train are written again.
        small.sort(key=lambda item: not item[0])
        small_entries: dict[str, tuple[dict[str, Any], int]] = {}
        small_views: list[tuple[int, memoryview]] = []
        offset = 0
        for _, source, view in small:
            small_entries[source.name] = (source.describe(), offset)
            small_views.append((offset, view))
            offset += -(-source.nbytes // _ALIGN) * _ALIGN
        pack: memoryview | Gathered | None = None
        if small_views and not copy:
            pack = Gathered(small_views, offset)
        elif small_views:
            pack_buf = (
                buffers.get("\0pack", offset) if buffers is not None else np.empty(offset, np.uint8)
            )
            pack_buf[:] = 0  # alignment gaps must be deterministic or the pack never dedupes
            for start, view in small_views:
                pack_buf[start : start + len(view)] = np.frombuffer(view, dtype=np.uint8)
            pack = pack_buf.data
        if buffers is not None:
            buffers.keep_only({t.name for t in large} | {"\0pack"})
        if frozen is not None:
            frozen.keep_only(frozen_seen)
        # What a full copy of this checkpoint occupies in the store (pack alignment included).
        total = sum(t.nbytes for t in large) + offset
        return cls(
            tree=tree,
            tensors=large,
            small=small_entries,
            pack=pack,
            bytes_total=total,
        )


def state_nbytes(state: object) -> int:
    """The bytes of the tensors in `state`, read from their descriptions: nothing is copied,
    and a tensor on a GPU stays there."""
    encoder = _Encoder()
    encoder.encode(state, "state")
    return sum(
        value.nbytes if isinstance(value, np.ndarray) else value.numel() * value.element_size()
        for value in encoder.tensors.values()
    )


def _describe(name: str, value: Any) -> tuple[TensorSource, memoryview, np.ndarray | None]:
    """The source description, a flat byte view and (for numpy) the array of one tensor."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in _NUMPY_KINDS:
            raise StoreError(f"tensor {name} has dtype {value.dtype}, which cannot be saved")
        arr = value if value.flags.c_contiguous else np.ascontiguousarray(value)
        view = arr.reshape(-1).view(np.uint8).data
        source = TensorSource(name, arr.dtype.str, tuple(arr.shape), "numpy", arr.nbytes)
        return source, view, value if value is arr else None
    tensor = value.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    tensor = tensor.resolve_conj().resolve_neg().contiguous()
    torch = _torch()
    assert torch is not None
    raw = tensor.reshape(-1).view(torch.uint8).numpy()
    nbytes = tensor.numel() * tensor.element_size()
    source = TensorSource(name, str(tensor.dtype), tuple(tensor.shape), "torch", nbytes)
    return source, raw.data, None


_PLAIN = frozenset({type(None), bool, int, float, str})


class _Encoder:
    """Walks a nested object, replacing tensors by references and collecting them by name."""

    def __init__(self) -> None:
        self.tensors: dict[str, Any] = {}

    def _name(self, path: str) -> str:
        name, n = path, 1
        while name in self.tensors:
            n += 1
            name = f"{path}#{n}"
        return name

    def _items(self, values: list[Any] | tuple[Any, ...], path: str) -> list[Any]:
        # Plain values pass as they are, without a path each: a training loop's state holds
        # long runs of them (Python's random state is 625 ints), and every save encodes it.
        return [
            v if type(v) in _PLAIN else self.encode(v, f"{path}/{i}") for i, v in enumerate(values)
        ]

    def encode(self, value: Any, path: str) -> Any:
        if value is None or isinstance(value, bool | int | float | str):
            return value
        if isinstance(value, np.ndarray) or _is_torch_tensor(value):
            name = self._name(path)
            self.tensors[name] = value
            return {"$tensor": name}
        if isinstance(value, np.generic):
            name = self._name(path)
            self.tensors[name] = np.asarray(value)
            return {"$scalar": name}
        if isinstance(value, dict):
            items = []
            for key, item in value.items():
                if isinstance(key, bool) or not isinstance(key, str | int):
                    raise StoreError(f"{path}: dict key {key!r} must be a str or an int")
                items.append([key, self.encode(item, f"{path}/{key}")])
            return {"$dict": items}
        if isinstance(value, tuple):
            return {"$tuple": self._items(value, path)}
        if isinstance(value, list):
            return self._items(value, path)
        if isinstance(value, bytes | bytearray):
            return {"$bytes": base64.b64encode(bytes(value)).decode()}
        raise StoreError(f"{path}: cannot checkpoint a value of type {type(value).__name__}")


def decode(node: Any, tensors: dict[str, Any]) -> Any:
    """Rebuild a nested object from its tree node and the loaded tensors."""
    if isinstance(node, list):
        return [decode(v, tensors) for v in node]
    if not isinstance(node, dict):
        return node
    if "$tensor" in node:
        return tensors[node["$tensor"]]
    if "$scalar" in node:
        return np.asarray(tensors[node["$scalar"]])[()]
    if "$dict" in node:
        return {key: decode(v, tensors) for key, v in node["$dict"]}
    if "$tuple" in node:
        return tuple(decode(v, tensors) for v in node["$tuple"])
    if "$bytes" in node:
        return base64.b64decode(node["$bytes"])
    raise StoreError(f"unknown tree node {sorted(node)}")


def _import_torch() -> Any | None:
    """torch, imported now because a checkpoint holds torch tensors; None if not installed."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def materialise(entry: dict[str, Any], raw: np.ndarray) -> Any:
    """Turn the raw bytes of one tensor back into a numpy array or a torch tensor."""
    shape = tuple(entry["shape"])
    dtype: str = entry["dtype"]
    if entry.get("framework") == "torch":
        torch = _import_torch()
        if torch is not None:
            torch_dtype = getattr(torch, dtype.removeprefix("torch."))
            return torch.from_numpy(raw).view(torch_dtype).reshape(shape)
        numpy_dtype = _TORCH_TO_NUMPY.get(dtype)
        if numpy_dtype is None:
            raise StoreError(f"tensor of dtype {dtype} needs torch, which is not installed")
        return raw.view(numpy_dtype).reshape(shape)
    return raw.view(np.dtype(dtype)).reshape(shape)


_TORCH_TO_NUMPY: dict[str, str] = {
    "torch.float64": "<f8",
    "torch.float32": "<f4",
    "torch.float16": "<f2",
    "torch.int64": "<i8",
    "torch.int32": "<i4",
    "torch.int16": "<i2",
    "torch.int8": "|i1",
    "torch.uint8": "|u1",
    "torch.bool": "|b1",
    "torch.complex64": "<c8",
    "torch.complex128": "<c16",
}
