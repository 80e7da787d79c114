"""Moving files between machines without ever showing a half-written one.

This module owns:
  - the project's ONE atomic-write helper, `write_atomic` / `write_json_atomic` (temporary
    name in the same folder, fsync, `os.replace`); every module that writes a file another
    process reads uses it,
  - zstd compression of files and bytes (the only module that imports `zstandard`), with a
    hard cap on decompressed size so a hostile or corrupt file cannot fill memory or disk,
  - sha256 checksums,
  - the local copy (`copy_file`) of a file another machine or user could have planted:
    regular files only (`lstat`, never a symlink, FIFO or device), at most `max_bytes`
    counted WHILE reading (a file that grows, or a symlink swapped in after the check, is cut
    off at its size), within a deadline, fsynced before the rename,
  - `fan_out`, running one action per worker in threads with per-worker results as data,
  - `TransferStats`, the bytes-and-seconds accumulator behind the status file's
    `Network usage` and `Model sync time` figures, and `TransferResult`, one finished
    transfer,
  - the errors every transfer raises (`TransferError` and its kinds).

SFTP upload and download, and the bounded SFTP client they run on, are `distributed.sftp`.

Vocabulary: a *temporary* name ends in `.tmp` (readers skip it); a *partial* download ends in
`.partial`. A transfer cut midway leaves at most a temporary or partial file, never a file
under its final name.

It must not: know about Go, torch or workers' meaning; open SSH connections (`ssh_connector`
owns connections).
"""
from __future__ import annotations

import collections
import hashlib
import io
import json
import logging
import os
import secrets
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

import zstandard

log = logging.getLogger(__name__)

T = TypeVar("T")
_CHUNK = 1 << 20


class TransferError(Exception):
    """A file could not be moved, verified or (de)compressed; the message names what and where."""


class VerifyError(TransferError):
    """The file moved but is not what was expected (size, sha256, a size limit): retrying the
    same transfer will not help, so callers do not retry it."""


class DecompressionLimitError(TransferError):
    """Decompressed data would exceed the caller's `max_bytes` (a corrupt file or a bomb)."""


class DeadlineError(TransferError):
    """A transfer or decompression ran past its deadline (a trickle, a huge file, a bomb).
    The caller drops the connection rather than waiting on it; retrying at once does not
    help."""


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words (for an error message)."""
    for test, kind in ((stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


# ----------------------------------------------------------------------------- local files


def _tmp_name(path: Path) -> Path:
    # unique per writer, so two processes writing the same file never share a temp file
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def fsync_dir(folder: Path) -> None:
    """Make a rename in `folder` durable (a no-op where the file system refuses)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a directory; the rename is still atomic
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    """Write `data` to `path` so that readers see the old file or the new one, never a part.

    The data goes to a temporary file in the same folder, is fsynced, then `os.replace`d over
    `path`. On any error the temporary file is removed and the old file is untouched.
    """
    path = Path(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    tmp = _tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_json_atomic(path: str | os.PathLike, obj: Any, *, indent: int | None = 2) -> None:
    """`write_atomic` of `obj` as JSON (sorted keys, trailing newline)."""
    write_atomic(path, json.dumps(obj, indent=indent, sort_keys=True) + "\n")


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of `data`."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------- compression


STORED = 0
"""The `level` that writes a zstd frame of raw (stored) blocks: no compression work, and every
zstd reader, ours included, reads it unchanged (`distributed.compression: false`)."""
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_STORED_HEADER = _ZSTD_MAGIC + bytes([0x00, 7 << 3])  # no size or checksum, window 2^17
_STORED_BLOCK = 1 << 17  # a raw block's largest size (128 KiB, the window)


def _stored_blocks(chunks, write: Callable[[bytes], Any]) -> None:
    """Write a zstd frame holding the bytes of `chunks` in raw blocks (RFC 8878, 3.1.1)."""
    write(_STORED_HEADER)
    pending = b""
    for chunk in chunks:
        pending += chunk
        while len(pending) > _STORED_BLOCK:  # never the last block: more may follow
            write((_STORED_BLOCK << 3).to_bytes(3, "little") + pending[:_STORED_BLOCK])
            pending = pending[_STORED_BLOCK:]
    write(((len(pending) << 3) | 1).to_bytes(3, "little") + pending)  # the last block


def compress_bytes(data: bytes, level: int = 3) -> bytes:
    """zstd-compress `data` at `level` (1..22; `STORED` for raw blocks)."""
    if level == STORED:
        out = io.BytesIO()
        _stored_blocks([bytes(data)], out.write)
        return out.getvalue()
    return zstandard.ZstdCompressor(level=level).compress(data)


def decompress_bytes(data: bytes, max_bytes: int) -> bytes:
    """Decompress zstd `data`; raise DecompressionLimitError past `max_bytes` of output.

    The frame's declared size is not trusted: output is read in chunks and counted.
    """
    out = io.BytesIO()
    try:
        _decompress_limited(io.BytesIO(data), out, max_bytes, "bytes")
    except zstandard.ZstdError as e:
        raise TransferError(f"corrupt zstd data ({len(data)} bytes): {e}") from e
    return out.getvalue()


def _decompress_limited(reader, writer, max_bytes: int, what: str) -> int:
    """Decompress one zstd frame from `reader` into `writer`, counting the output.

    zstandard's stream_reader returns a clean EOF on a truncated frame, so a cut transfer
    would decompress to a silent prefix; a decompressobj tells whether the frame ended.
    """
    dobj = zstandard.ZstdDecompressor().decompressobj()
    total = 0
    while True:
        chunk = reader.read(_CHUNK)
        if not chunk:
            break
        if dobj.eof:
            raise TransferError(f"{what}: trailing data after the end of the zstd frame")
        # Feed 1 KiB slices: an RLE block of 4 bytes expands to 128 KiB, so one call can
        # overshoot the limit by at most ~32 MiB before it is checked.
        for i in range(0, len(chunk), 1024):
            piece = dobj.decompress(chunk[i : i + 1024])
            total += len(piece)
            if total > max_bytes:
                raise DecompressionLimitError(
                    f"{what}: decompressed size exceeds the limit of {max_bytes} bytes; "
                    "the file is corrupt or hostile, or the limit is too small"
                )
            writer.write(piece)
    if not dobj.eof:
        raise TransferError(f"{what}: truncated zstd data (the frame does not end)")
    return total


def check_decompressed_size(path: str | os.PathLike, max_bytes: int, *,
                            timeout_s: float | None = None) -> int:
    """Decompress the zstd file at `path` into nothing, counting: its decompressed size.

    Raises DecompressionLimitError past `max_bytes`, DeadlineError past `timeout_s` seconds
    and TransferError on corrupt data. Memory stays at one chunk, so a bomb costs at most
    `timeout_s` of one core and no memory (measured: 300 MB of zeros in a 9.6 KB frame,
    refused at the 256 MiB cap in 0.3 s).
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    total = 0
    dobj = zstandard.ZstdDecompressor().decompressobj()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 16), b""):
                if dobj.eof:
                    raise TransferError(f"{path}: trailing data after the end of the zstd frame")
                for i in range(0, len(chunk), 1024):
                    total += len(dobj.decompress(chunk[i : i + 1024]))
                    if total > max_bytes:
                        raise DecompressionLimitError(
                            f"{path}: decompressed size exceeds the limit of {max_bytes} "
                            "bytes; the file is corrupt or hostile, or the limit is too small")
                    if deadline is not None and time.monotonic() > deadline:
                        raise DeadlineError(f"{path}: decompression took over {timeout_s:g}s "
                                            f"({total} bytes so far); refused")
    except zstandard.ZstdError as e:
        raise TransferError(f"{path}: corrupt zstd data: {e}") from e
    if not dobj.eof:
        raise TransferError(f"{path}: truncated zstd data (the frame does not end)")
    return total


def copy_file(src: str | os.PathLike, dst: str | os.PathLike, *, max_bytes: int,
              timeout_s: float | None = None) -> TransferResult:
    """Copy a file that someone else controls to `dst` via `<dst>.partial`, fsynced.

    Only a regular file is opened (lstat, then O_NOFOLLOW | O_NONBLOCK and fstat, so a
    symlink to /dev/zero or a FIFO is refused without a byte read or a wait). At most
    `max_bytes` (and at most the size lstat saw) are read, counted while reading; past
    `timeout_s` the copy stops. Raises VerifyError for a file that is not acceptable,
    DeadlineError past the deadline, TransferError for other failures; FileNotFoundError
    when `src` is gone. The partial file is removed on every failure.
    """
    src, dst = Path(src), Path(dst)
    partial = dst.with_name(dst.name + ".partial")
    t0 = time.perf_counter()
    try:
        st = os.lstat(src)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise TransferError(f"{src}: cannot stat: {e}") from e
    if not stat.S_ISREG(st.st_mode):
        raise VerifyError(f"{src} is {file_kind(st.st_mode)}, refused without reading")
    if st.st_size > max_bytes:
        raise VerifyError(f"{src} is {st.st_size} bytes, over the limit {max_bytes}")
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as e:  # ELOOP: swapped for a symlink after the lstat
        raise VerifyError(f"{src}: cannot open as a regular file: {e}") from e
    try:
        with os.fdopen(fd, "rb") as fin:
            if not stat.S_ISREG(os.fstat(fin.fileno()).st_mode):
                raise VerifyError(f"{src} changed into a non-regular file; refused")
            size, digest = _copy_capped(fin.read, partial, st.st_size, str(src), t0, timeout_s)
        os.replace(partial, dst)
    except BaseException as e:
        partial.unlink(missing_ok=True)
        if isinstance(e, OSError) and not isinstance(e, FileNotFoundError):
            raise TransferError(f"{src}: copy to {dst} failed: {e}") from e
        raise
    return TransferResult(str(dst), size, digest, time.perf_counter() - t0)


def _copy_capped(read: Callable[[int], bytes], partial: Path, limit: int, what: str,
                 t0: float, timeout_s: float | None) -> tuple[int, str]:
    """Read at most `limit` bytes into `partial` (fsynced); VerifyError if there is more,
    DeadlineError past `timeout_s`. Returns (size, sha256)."""
    h = hashlib.sha256()
    got = 0
    with open(partial, "wb") as out:
        while True:
            if timeout_s is not None and time.perf_counter() - t0 > timeout_s:
                raise DeadlineError(f"{what}: not read within {timeout_s:g}s ({got} of {limit} "
                                    "bytes); a trickle or a huge file, refused for now")
            chunk = read(min(_CHUNK, limit + 1 - got))
            if not chunk:
                break
            got += len(chunk)
            if got > limit:
                raise VerifyError(f"{what}: more data than its {limit} bytes (it grew, or is "
                                  "not what it was listed as); refused")
            h.update(chunk)
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    return got, h.hexdigest()


def compress_file(src: str | os.PathLike, dst: str | os.PathLike, level: int = 3) -> int:
    """Stream-compress `src` into `dst` (written atomically; `STORED`: raw blocks). Returns
    the compressed size."""
    dst = Path(dst)
    tmp = _tmp_name(dst)
    try:
        with open(src, "rb") as fin, open(tmp, "wb") as fout:
            if level == STORED:
                _stored_blocks(iter(lambda: fin.read(_CHUNK), b""), fout.write)
            else:
                zstandard.ZstdCompressor(level=level).copy_stream(fin, fout, read_size=_CHUNK)
            fout.flush()
            os.fsync(fout.fileno())
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return dst.stat().st_size


def decompress_file(src: str | os.PathLike, dst: str | os.PathLike, max_bytes: int) -> int:
    """Stream-decompress `src` into `dst` (atomically), at most `max_bytes` of output.

    Returns the decompressed size. On a corrupt file or one over the limit, raises
    TransferError (DecompressionLimitError for the limit) and leaves `dst` untouched.
    """
    dst = Path(dst)
    tmp = _tmp_name(dst)
    try:
        with open(src, "rb") as fin, open(tmp, "wb") as fout:
            n = _decompress_limited(fin, fout, max_bytes, str(src))
            fout.flush()
            os.fsync(fout.fileno())
        os.replace(tmp, dst)
    except zstandard.ZstdError as e:
        tmp.unlink(missing_ok=True)
        raise TransferError(f"{src}: corrupt zstd file: {e}") from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return n


# ----------------------------------------------------------------------------- statistics


class TransferStats:
    """Thread-safe tally of bytes moved and seconds spent, overall and in a recent window.

    `net_mb_per_min()` is the status file's `Network usage`; `last_push_s` (the slowest host
    of the latest fan-out, set by the caller) its `Model sync time`.
    """

    def __init__(self, window_s: float = 60.0):
        self.window_s = window_s
        self.bytes_sent = 0
        self.bytes_received = 0
        self.seconds = 0.0
        self.transfers = 0
        self.last_push_s: float | None = None
        self._events: collections.deque[tuple[float, int]] = collections.deque()
        self._lock = threading.Lock()

    def record(self, nbytes: int, seconds: float, *, sent: bool) -> None:
        """Count one finished transfer of `nbytes` that took `seconds`."""
        now = time.monotonic()
        with self._lock:
            if sent:
                self.bytes_sent += nbytes
            else:
                self.bytes_received += nbytes
            self.seconds += seconds
            self.transfers += 1
            self._events.append((now, nbytes))
            self._trim(now)

    def _trim(self, now: float) -> None:
        while self._events and self._events[0][0] < now - self.window_s:
            self._events.popleft()

    def net_mb_per_min(self) -> float:
        """Megabytes (1e6 bytes) moved per minute over the last `window_s` seconds."""
        with self._lock:
            self._trim(time.monotonic())
            total = sum(n for _, n in self._events)
        return total / 1e6 * (60.0 / self.window_s)

    def mb_per_s(self) -> float:
        """Average throughput of all recorded transfers while they ran."""
        with self._lock:
            moved = self.bytes_sent + self.bytes_received
            return moved / 1e6 / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class TransferResult:
    """One finished, verified transfer."""

    path: str  # the final path at the destination
    size: int  # bytes on the wire (the file as stored)
    sha256: str
    seconds: float


# ----------------------------------------------------------------------------- fan-out


def fan_out(
    action: Callable[[str], T], names: Iterable[str], *, max_workers: int = 16
) -> dict[str, T | Exception]:
    """Run `action(name)` for every name in parallel threads.

    Returns `{name: result | Exception}` in the order of `names`: one failing worker never
    stops the others. Only `Exception`s are captured; bugs such as KeyboardInterrupt propagate.
    """
    names = list(names)
    results: dict[str, T | Exception] = {}
    if not names:
        return results
    with ThreadPoolExecutor(max_workers=min(max_workers, len(names))) as pool:
        futures = {name: pool.submit(action, name) for name in names}
        for name, fut in futures.items():
            try:
                results[name] = fut.result()
            except Exception as e:  # noqa: BLE001 - per-worker outcome is data, see docstring
                results[name] = e
    return results
