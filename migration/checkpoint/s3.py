"""A store in an S3 bucket under a prefix (AWS or any S3-compatible server).

S3 makes an object visible only once its upload completed, so chunk and manifest writes are
atomic by themselves; the manifest is still uploaded only after every chunk succeeded. Every
request is retried with exponential back-off and jitter on connection errors, timeouts and 5xx
answers, up to `retry_seconds`; past that the operation fails with StoreUnavailable and, since
the manifest is written last, nothing half-done is ever committed.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import random
import secrets
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any, TypeVar

import boto3
import botocore.exceptions as bce
import urllib3.exceptions
from botocore.config import Config

from .errors import CorruptChunk, ManifestNotFound, StoreError, StoreUnavailable
from .manifest import Manifest, job_folders
from .store import DEFAULT_CHUNK_SIZE, Store, Wait

logger = logging.getLogger(__name__)

T = TypeVar("T")

_TRANSIENT = (
    bce.ConnectionError,  # includes EndpointConnectionError, ConnectTimeoutError
    bce.HTTPClientError,  # includes ConnectionClosedError, ReadTimeoutError, streaming errors
    bce.IncompleteReadError,
    urllib3.exceptions.HTTPError,
    ConnectionError,
    TimeoutError,
)
_TRANSIENT_CODES = {"SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable", "503"}
_NOT_FOUND_CODES = {"404", "NoSuchKey", "NotFound"}
# Where gc keeps the chunks it removes until it has read the manifests again (`_sweep_chunks`):
# `trash/<start time>-<random>/<chunk>`, one folder per sweep. A folder older than this is a
# sweep that died before it finished; the next sweep puts its chunks back.
_TRASH = "trash/"
_TRASH_ABANDONED_S = 3600.0
# Each manifest is put with a random commit id in this metadata field, so that a later save can
# tell the object it committed from one put at the same key since (`_unchecked`).
_COMMIT_META = "baton-commit"
# How many checked commits (its own, or read whole) a store remembers for later saves' checks.
_CHECKED_KEPT = 4


_SESSION_LOCK = threading.Lock()
_SESSIONS: list[boto3.session.Session] = []


def _forget_session_lock() -> None:
    """In a forked child: another thread of the parent may have held the lock at the fork."""
    global _SESSION_LOCK
    _SESSION_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_session_lock)


def _session() -> boto3.session.Session:
    """One boto3 session per process: creating one loads its data files (~0.5 s); clients made
    from it are independent (creation is serialised by _SESSION_LOCK, as boto3 requires)."""
    if not _SESSIONS:
        _SESSIONS.append(boto3.session.Session())
    return _SESSIONS[0]


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, bce.ClientError):
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return status >= 500 or error.get("Code") in _TRANSIENT_CODES
    return isinstance(exc, _TRANSIENT)


def _is_not_found(exc: bce.ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code") in _NOT_FOUND_CODES


class S3Store(Store):
    """A store at `s3://bucket/prefix`; credentials come from the usual AWS environment."""

    _cache_presence = True
    verify_after_write = True

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint: str | None = None,
        region: str | None = None,
        retry_seconds: float = 60.0,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        workers: int = 8,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
    ) -> None:
        super().__init__(chunk_size=chunk_size, workers=workers)
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint = endpoint
        self.retry_seconds = retry_seconds
        config = Config(
            # One attempt per call: the back-off below is the only retry policy, so its budget
            # is what the caller configured and not multiplied by botocore's own.
            retries={"total_max_attempts": 1},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_pool_connections=workers + 4,
            # S3-compatible servers differ in their support of the newer default checksums;
            # every chunk is checked against its BLAKE3 name on read anyway.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            s3={"addressing_style": "path"} if endpoint else {},
        )
        self._client_args = {
            "endpoint_url": endpoint,
            "region_name": region or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
            "config": config,
        }
        self._client  # noqa: B018 (made now: a malformed endpoint fails here, not at a save)
        # The manifests this store committed, or read whole, whose chunks it found all present
        # after they were up: key -> (commit id, chunks), newest last (`_unchecked`).
        self._checked: collections.OrderedDict[str, tuple[str, frozenset[str]]] = (
            collections.OrderedDict()
        )
        self._checked_lock = threading.Lock()

    @functools.cached_property
    def _client(self) -> Any:
        with _SESSION_LOCK:
            return _session().client("s3", **self._client_args)

    def _after_fork(self) -> None:
        # A client's pooled connections are sockets shared with the parent: a forked child
        # that uses the store makes a client of its own, with connections of its own, and a
        # lock of its own over the checked commits (a parent's thread may have held it).
        super()._after_fork()
        self.__dict__.pop("_client", None)
        self._checked_lock = threading.Lock()

    @property
    def url(self) -> str:
        """`s3://bucket/prefix`."""
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _retry(self, what: str, call: Callable[[], T]) -> T:
        deadline = time.monotonic() + self.retry_seconds
        delay = 0.1
        attempt = 0
        while True:
            attempt += 1
            try:
                return call()
            except (bce.ClientError, *_TRANSIENT) as exc:
                if not _is_transient(exc):
                    raise
                pause = delay * (0.5 + random.random())
                if time.monotonic() + pause > deadline:
                    raise StoreUnavailable(
                        f"{self.url}: {what} failed after {attempt} attempts: {exc}"
                    ) from exc
                logger.info("%s: %s failed (%s); retrying in %.2fs", self.url, what, exc, pause)
                time.sleep(pause)
                delay = min(delay * 2, 5.0)

    def _unless_missing(self, what: str, call: Callable[[], T]) -> T | None:
        """Run `call` (retried); its answer, or None if it said its object does not exist."""

        def attempt() -> T | None:
            try:
                return call()
            except bce.ClientError as exc:
                if _is_not_found(exc):
                    return None
                raise

        return self._retry(what, attempt)

    def _head(self, key: str) -> dict[str, Any] | None:
        """The object's HEAD answer, or None when it does not exist."""
        full = self._key(key)
        return self._unless_missing(
            f"head {full}", lambda: self._client.head_object(Bucket=self.bucket, Key=full)
        )

    def _has_chunk(self, chunk: str) -> bool:
        return self._head(self.chunk_key(chunk)) is not None

    def _write_chunk(self, chunk: str, data: memoryview) -> None:
        body = bytes(data)
        key = self._key(self.chunk_key(chunk))
        self._retry(
            f"upload {key}",
            lambda: self._client.put_object(Bucket=self.bucket, Key=key, Body=body),
        )
        return None

    def _sync_chunks(self, chunks: Iterable[str]) -> None:
        # A completed PUT is durable in S3.
        return

    def _commit_manifest(
        self, key: str, data: bytes, new_chunks: Iterable[str], chunks_finished: Wait | None = None
    ) -> None:
        # A save trusts a chunk it found present, and gc may remove that chunk before the
        # manifest is up (a HEAD does not renew a chunk's age, as a local store's touch does).
        # gc puts back what a manifest committed during its sweep names; a manifest committed
        # after the sweep finds the delete done here, and is withdrawn (decision 005).
        if chunks_finished is not None:
            chunks_finished()
        # A completed PUT is durable in S3: nothing to sync before the manifest.
        commit = secrets.token_hex(8)
        self._put_object(key, data, {_COMMIT_META: commit})
        chunks = Manifest.from_json(key, data).chunks()
        new = set(new_chunks)
        reused = self._unchecked([c for c in chunks if c not in new])
        present = self._executor().map(self._has_chunk, reused)
        missing = [chunk for chunk, there in zip(reused, present, strict=True) if not there]
        if missing:
            self._delete([key])
            self._present.difference_update(missing)
            raise StoreError(
                f"{self.url}: gc removed {len(missing)} chunk(s) that {key} reuses (first "
                f"{missing[0]}) while it was being saved; nothing was committed, save again"
            )
        self._remember(key, commit, chunks)

    def _read_whole(self, key: str, commit: str | None, chunks: Collection[str]) -> None:
        # Read after their manifest was up, the chunks were present after it was, which is all
        # the check after a commit shows: a store opened anew (after a migration, say) vouches
        # at its first save for what it restored (decision 005).
        super()._read_whole(key, commit, chunks)
        if commit is not None:
            self._remember(key, commit, chunks)

    def _remember(self, key: str, commit: str, chunks: Collection[str]) -> None:
        """Keep `key`'s commit as one whose chunks were all found present after it was up."""
        with self._checked_lock:
            self._checked.pop(key, None)
            self._checked[key] = (commit, frozenset(chunks))
            while len(self._checked) > _CHECKED_KEPT:
                self._checked.popitem(last=False)

    def _unchecked(self, reused: list[str]) -> list[str]:
        """The reused chunks of a manifest just put that still need a HEAD each: those that no
        earlier checked commit of this store vouches for (decision 005).

        Such a commit names the chunk and, after it was up, found the chunk present. If no gc
        sweep is under way (its trash is empty) and that commit's manifest is still up after
        this one, the chunk is present or its gc puts it back: a gc that deleted it read the
        manifests again after the delete, while that manifest, or this one, was up. The trash
        is listed first: listed after the HEAD, it could miss a sweep that ended in between,
        whose second look read that manifest after it went. One LIST and one HEAD per earlier
        manifest instead of a HEAD per chunk."""
        left = set(reused)
        with self._checked_lock:
            earlier = [
                (key, commit, left & chunks)
                for key, (commit, chunks) in reversed(self._checked.items())
                if not left.isdisjoint(chunks)
            ]
        if not earlier or self._sweeping():
            return reused
        for key, commit, vouched in earlier:
            if left.isdisjoint(vouched):  # a newer commit vouched for them all
                continue
            answer = self._head(key)
            if answer is not None and answer.get("Metadata", {}).get(_COMMIT_META) == commit:
                left -= vouched
        return [chunk for chunk in reused if chunk in left]

    def _read_chunk_into(self, chunk: str, out: memoryview) -> None:
        key = self._key(self.chunk_key(chunk))
        try:
            data, _ = self._get(key)
        except ManifestNotFound:
            raise CorruptChunk(chunk, "missing") from None
        if len(data) != len(out):
            raise CorruptChunk(chunk, f"{len(data)} bytes instead of {len(out)}")
        out[:] = data

    def _get(self, key: str) -> tuple[bytes, dict[str, str]]:
        """The object's bytes and its metadata."""

        def get() -> tuple[bytes, dict[str, str]]:
            try:
                response = self._client.get_object(Bucket=self.bucket, Key=key)
            except bce.ClientError as exc:
                if _is_not_found(exc):
                    raise ManifestNotFound(f"{key} not found in {self.url}") from None
                raise
            # Reading the body is inside the retry: a connection dropped mid-body is retried.
            return response["Body"].read(), response.get("Metadata", {})

        return self._retry(f"download {key}", get)

    def _put_object(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> None:
        full = self._key(key)
        self._retry(
            f"upload {full}",
            lambda: self._client.put_object(
                Bucket=self.bucket,
                Key=full,
                Body=data,
                ContentType="application/json",
                Metadata=metadata or {},
            ),
        )

    def _get_object(self, key: str) -> bytes:
        return self._get(self._key(key))[0]

    def _get_manifest(self, key: str) -> tuple[bytes, str | None]:
        data, metadata = self._get(self._key(key))
        return data, metadata.get(_COMMIT_META)

    def _pages(self, prefix: str, delimiter: str | None = None) -> Iterator[dict[str, Any]]:
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._key(prefix)}
            if delimiter:
                kwargs["Delimiter"] = delimiter
            if token:
                kwargs["ContinuationToken"] = token
            page: dict[str, Any] = self._retry(
                f"list {prefix}", functools.partial(self._client.list_objects_v2, **kwargs)
            )
            yield page
            if not page.get("IsTruncated"):
                return
            token = page["NextContinuationToken"]

    def _strip(self, key: str) -> str:
        return key[len(self.prefix) + 1 :] if self.prefix else key

    def _list(self, prefix: str) -> list[str]:
        keys = []
        for page in self._pages(prefix, "/"):
            keys += [self._strip(obj["Key"]) for obj in page.get("Contents", [])]
        return keys

    def _list_dirs(self, prefix: str) -> list[str]:
        names = []
        for page in self._pages(prefix, "/"):
            for common in page.get("CommonPrefixes", []):
                names.append(self._strip(common["Prefix"])[len(prefix) :].strip("/"))
        return names

    def _delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):
            batch = [{"Key": self._key(k)} for k in keys[start : start + 1000]]
            response: dict[str, Any] = self._retry(
                "delete",
                functools.partial(
                    self._client.delete_objects,
                    Bucket=self.bucket,
                    Delete={"Objects": batch, "Quiet": True},
                ),
            )
            errors = [
                e for e in response.get("Errors", []) if e.get("Code") not in _NOT_FOUND_CODES
            ]
            if errors:
                first = errors[0]
                raise StoreError(f"{self.url}: could not delete {first.get('Key')}: {first}")

    def _copy(self, source: str, target: str) -> bool:
        """Copy an object inside the bucket; False if `source` does not exist."""
        copied = self._unless_missing(
            f"copy {source}",
            lambda: self._client.copy_object(
                Bucket=self.bucket,
                Key=self._key(target),
                CopySource={"Bucket": self.bucket, "Key": self._key(source)},
            ),
        )
        return copied is not None

    def _sweeping(self) -> bool:
        """Whether a gc sweep is under way, or died half-way: its trash holds chunks."""
        page: dict[str, Any] = self._retry(
            f"list {_TRASH}",
            lambda: self._client.list_objects_v2(
                Bucket=self.bucket, Prefix=self._key(_TRASH), MaxKeys=1
            ),
        )
        return bool(page.get("Contents"))

    def _sweep_chunks(self, listed: dict[str, float], recycle_bytes: int) -> tuple[list[str], int]:
        # S3 has no rename, so a save can reuse a listed chunk until the very delete. Each
        # chunk is copied to this sweep's trash folder before it is deleted; then the manifests
        # are read again, and a chunk that one of them names now (a save that committed
        # meanwhile) is put back. A save that commits later finds the delete done when it
        # checks its reused chunks (`_commit_manifest`). The trash goes last.
        self._put_back_abandoned_trash()
        pool = self._executor()
        trash = f"{_TRASH}{int(time.time()):010d}-{secrets.token_hex(4)}/"
        chunks = list(listed)
        copied = pool.map(lambda c: self._copy(self.chunk_key(c), trash + c), chunks)
        trashed = [chunk for chunk, there in zip(chunks, copied, strict=True) if there]
        try:
            self._delete([self.chunk_key(chunk) for chunk in trashed])
            named = {chunk for _, names in self._named_chunks() for chunk in names}
        except BaseException:
            named = set(trashed)  # not known what a save committed meanwhile: all go back
            raise
        finally:
            back = [chunk for chunk in trashed if chunk in named]
            list(pool.map(lambda c: self._copy(trash + c, self.chunk_key(c)), back))
            self._delete([trash + chunk for chunk in trashed])
        return [chunk for chunk in trashed if chunk not in named], 0

    def _put_back_abandoned_trash(self) -> None:
        """Put back the chunks of sweeps that died before they finished (their trash folders
        are older than `_TRASH_ABANDONED_S`): the next sweep decides about them again."""
        now = time.time()
        abandoned = []
        for page in self._pages(_TRASH):
            for obj in page.get("Contents", []):
                key = self._strip(obj["Key"])
                started = key[len(_TRASH) :].split("-", 1)[0]
                if not started.isdigit() or now - int(started) >= _TRASH_ABANDONED_S:
                    abandoned.append(key)
        if not abandoned:
            return
        for key in abandoned:
            self._copy(key, self.chunk_key(key.rsplit("/", 1)[-1]))
        self._delete(abandoned)
        logger.warning("%s: put back %d chunks of an unfinished gc", self.url, len(abandoned))

    def _remove_job_folders(self, job: str) -> None:
        # S3 has no folders, but servers that speak its API over a file system may keep them
        # (SeaweedFS does) until the folder's own key is deleted, which takes only an empty
        # one; on S3 these keys name nothing and deleting them changes nothing.
        self._delete(list(job_folders(job)))

    def _iter_chunks(self) -> Iterator[tuple[str, int, float]]:
        for page in self._pages("chunks/"):
            for obj in page.get("Contents", []):
                name = obj["Key"].rsplit("/", 1)[-1]
                yield name, int(obj["Size"]), obj["LastModified"].timestamp()

    def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist (local S3 servers, tests, first start)."""
        try:
            self._retry("head bucket", lambda: self._client.head_bucket(Bucket=self.bucket))
        except bce.ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if not _is_not_found(exc) and code != "NoSuchBucket":
                raise
            self._retry("create bucket", lambda: self._client.create_bucket(Bucket=self.bucket))
