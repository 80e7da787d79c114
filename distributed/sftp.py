"""The SFTP side of a transfer: a client whose every reply is bounded, and atomic put/get.

This module owns:
  - upload (`put_file`: temporary name, size check, then OpenSSH's posix-rename) and
    download (`get_file`: `.partial` name, size + sha256 check, then `os.replace`; at most 16
    replies of 32 KiB held, each checked against its request, the deadline checked while
    each arrives; a server that answers in dribs is refused),
  - the SFTP session whose every reply is bounded in bytes and time and checked field by
    field before paramiko parses it (a count past the bytes left is refused), whose
    handshake has a deadline and whose stderr is capped (`BoundedSFTPClient`, `open_sftp` on
    the caller's transport, `sftp_deadline` for a block of requests).

paramiko: `BoundedSFTPClient` overrides paramiko's private `SFTPClient._read_all` and
`_read_packet` (and `listdir_iter`), `_Replies` stands in for `SFTPFile` as the receiver of
`_async_response`, and `_read_bounded` calls `_async_request`, `_read_response` and
`_convert_status`; `_StderrCap` replaces a channel's stderr `BufferedPipe`. Written against
paramiko 3.4 to 5.1 (setup.cfg asks `paramiko>=3.4`); tests/test_bounded_sftp.py pins every
private signature used here, so a paramiko release that changes one fails that test first.

The local side (atomic writes, compression, checksums, `TransferStats`, `TransferResult`,
the error classes) is `distributed.transfer`.

It must not: know about Go, torch or workers' meaning; open SSH connections itself (the caller
passes an open `paramiko.Transport` or `paramiko.SFTPClient`; `ssh_connector` owns
connections).
"""

from __future__ import annotations

import collections
import hashlib
import logging
import os
import posixpath
import socket
import stat
import struct
import time
from pathlib import Path
from typing import Any, Callable

import paramiko
from paramiko.buffered_pipe import BufferedPipe
from paramiko.sftp import (CMD_ATTRS, CMD_CLOSE, CMD_DATA, CMD_HANDLE, CMD_NAME, CMD_OPENDIR,
                           CMD_READ, CMD_READDIR, CMD_STATUS, CMD_VERSION, int64)
from paramiko.sftp_attr import SFTPAttributes

from distributed.transfer import (DeadlineError, TransferError, TransferResult, TransferStats,
                                  VerifyError, file_kind, sha256_file)

log = logging.getLogger(__name__)

READS_IN_FLIGHT = 16
"""READ requests a download keeps in flight; their replies are the only ones it holds."""
READ_BYTES = 32 << 10
"""Bytes one READ request asks for (what every SFTP server serves whole). A download holds at
most READS_IN_FLIGHT replies of at most this many bytes: 512 KiB, enough for a WAN link."""
MAX_SFTP_PACKET = (256 << 10) + 1024
"""The longest SFTP reply the coach reads (OpenSSH's own limit, 256 KiB, and a header); a
longer one is refused from its length word, before a byte of it is read."""
SHORT_REPLIES_FREE = 8
"""Replies shorter than their READ (before the file's listed end) a download takes before it
asks them to bring SHORT_REPLY_MIN_BYTES each on average: sftp-server answers a regular file's
reads whole, and a server answering one byte at a time would keep a download busy (one round
trip of Python per byte) for its whole deadline."""
SHORT_REPLY_MIN_BYTES = 1024
"""(A server that answers half of every read, and half of the rest, averages 2 KiB.)"""
STDERR_MAX_BYTES = 64 << 10
"""Bytes of stderr an SFTP session takes (nobody reads them); past it the session is closed,
so a server that writes stderr without end costs no memory beyond this."""
# paramiko errors that mean "the connection or the remote file system failed"
_NET_ERRORS = (paramiko.SSHException, EOFError, OSError)
_SFTP_ERRORS = (*_NET_ERRORS, paramiko.SFTPError)  # and a reply paramiko could not parse


class ProtocolError(VerifyError):
    """The SFTP server broke the protocol (a reply longer than its request or than any reply
    may be, a reply of the wrong kind): the session is closed, the transfer not retried."""


class _Fields:
    """The fields of one SFTP reply, read in order. A field that would run past the end of the
    reply, or a count of items more than the bytes left could hold, is a ProtocolError:
    paramiko's Message pads a short reply with zeros and trusts every count, so that a 17-byte
    reply announcing 2^32-1 extended attributes is an hour of CPU."""

    def __init__(self, data: bytes, what: str):
        self.data, self.pos, self.what = data, 0, what

    def _short(self, need: int) -> ProtocolError:
        return ProtocolError(f"the SFTP server's {self.what} reply ends "
                             f"{need - (len(self.data) - self.pos)} bytes short of its fields; "
                             "refused, session closed")

    def uint32(self) -> int:
        if self.pos + 4 > len(self.data):
            raise self._short(4)
        self.pos += 4
        return struct.unpack_from(">I", self.data, self.pos - 4)[0]

    def uint64(self) -> int:
        if self.pos + 8 > len(self.data):
            raise self._short(8)
        self.pos += 8
        return struct.unpack_from(">Q", self.data, self.pos - 8)[0]

    def string(self) -> bytes:
        n = self.uint32()
        if self.pos + n > len(self.data):
            raise self._short(n)
        self.pos += n
        return self.data[self.pos - n:self.pos]

    def skip_string(self) -> None:
        n = self.uint32()
        if self.pos + n > len(self.data):
            raise self._short(n)
        self.pos += n

    def count(self, min_bytes_each: int, of: str) -> int:
        """A count of items that take at least `min_bytes_each` bytes each."""
        n = self.uint32()
        left = len(self.data) - self.pos
        if n * min_bytes_each > left:
            raise ProtocolError(f"the SFTP server's {self.what} reply announces {n} {of} in "
                                f"{left} bytes; refused, session closed")
        return n

    @property
    def left(self) -> int:
        return len(self.data) - self.pos


def _parse_attrs(f: _Fields) -> SFTPAttributes:
    """SFTP v3 ATTRS (draft-ietf-secsh-filexfer-02, 5), each count checked against the bytes
    left, as the SFTPAttributes paramiko would build."""
    a = SFTPAttributes()
    flags = a._flags = f.uint32()
    if flags & SFTPAttributes.FLAG_SIZE:
        a.st_size = f.uint64()
    if flags & SFTPAttributes.FLAG_UIDGID:
        a.st_uid, a.st_gid = f.uint32(), f.uint32()
    if flags & SFTPAttributes.FLAG_PERMISSIONS:
        a.st_mode = f.uint32()
    if flags & SFTPAttributes.FLAG_AMTIME:
        a.st_atime, a.st_mtime = f.uint32(), f.uint32()
    if flags & SFTPAttributes.FLAG_EXTENDED:
        for _ in range(f.count(8, "extended attributes")):  # two strings of 4 bytes or more
            key = f.string()
            a.attr[key] = f.string()
    return a


def _parse_names(f: _Fields) -> list[SFTPAttributes]:
    """The entries of a NAME reply after its id (count, then name, long name and ATTRS)."""
    out = []
    for _ in range(f.count(12, "names")):  # two strings and the flags: 12 bytes or more
        name, longname = f.string(), f.string()
        a = _parse_attrs(f)
        a.filename = name.decode("utf-8", "replace")  # a name that is not UTF-8 matches none
        a.longname = longname.decode("utf-8", "replace")
        out.append(a)
    return out


def check_reply(t: int, data: bytes) -> None:
    """Raise ProtocolError unless the SFTP reply of type `t` with body `data` (after the type
    byte) holds every field its type has, every count within the bytes left. A reply that
    passes can be parsed by paramiko without a zero-padded read, in time bounded by its
    length."""
    f = _Fields(data, {CMD_VERSION: "VERSION", CMD_STATUS: "STATUS", CMD_HANDLE: "HANDLE",
                       CMD_DATA: "DATA", CMD_NAME: "NAME", CMD_ATTRS: "ATTRS"}.get(t, str(t)))
    if t == CMD_VERSION:
        f.uint32()
        while f.left:  # extension pairs
            f.skip_string()
            f.skip_string()
    elif t == CMD_STATUS:
        f.uint32()
        f.uint32()  # id, code; the message and language may be left out
        if f.left:
            f.skip_string()
        if f.left:
            f.skip_string()
    elif t in (CMD_HANDLE, CMD_DATA):
        f.uint32()
        f.skip_string()
    elif t == CMD_NAME:
        f.uint32()
        _parse_names(f)
    elif t == CMD_ATTRS:
        f.uint32()
        _parse_attrs(f)


class _StderrCap(BufferedPipe):
    """The stderr buffer of an SFTP channel: at most STDERR_MAX_BYTES are kept (paramiko's
    keeps all, and a server need not respect the channel's window). Past it the channel's
    stdout buffer is closed, so the reader sees the end of the stream at once and closes the
    session (`BoundedSFTPClient`). Fed by paramiko's transport thread."""

    def __init__(self, chan: paramiko.Channel, limit: int):
        super().__init__()
        self._chan, self.limit, self.total = chan, limit, 0

    def feed(self, data) -> None:
        self.total += len(data)
        if self.total > self.limit:
            self._chan.in_buffer.close()  # no network I/O here: safe in the transport thread
            return
        super().feed(data)

    @property
    def overflowed(self) -> bool:
        return self.total > self.limit


class BoundedSFTPClient(paramiko.SFTPClient):
    """An SFTP client whose every reply is bounded in bytes, in parsing and, while `deadline`
    (a `time.monotonic()` value) is set, in time.

    paramiko's reader accepts a reply of up to 16 MiB and reads it whole, however slowly it
    comes, then parses it trusting every count. Here a reply longer than `MAX_SFTP_PACKET` is
    refused from its length word; a reply still arriving at the deadline is DeadlineError
    (checked between the receives of one reply, so a trickle is cut); every reply is checked
    against its type's layout (`check_reply`: a field past its end, or a count the bytes left
    cannot hold, is ProtocolError) before paramiko parses it; `listdir_iter` takes only NAME
    replies to its own reads. The handshake (INIT, VERSION) runs under `timeout_s`. Each error
    leaves the stream mid-reply or the server untrusted: the session is closed (`open_sftp`
    makes a new one). `where` (a worker and host) opens every error message."""

    deadline: float | None = None
    where: str = ""
    _stderr: _StderrCap | None = None

    def __init__(self, sock: paramiko.Channel, *, timeout_s: float | None = None,
                 where: str = ""):
        self.where = where
        stderr = getattr(sock, "in_stderr_buffer", None)
        self._stderr = stderr if isinstance(stderr, _StderrCap) else None
        if timeout_s is not None:  # the handshake's deadline: INIT is sent in __init__
            sock.settimeout(timeout_s)
            self.deadline = time.monotonic() + timeout_s
        try:
            super().__init__(sock)
        except DeadlineError as e:  # the session is closed (`_read_all`)
            raise self._refused(DeadlineError, "the SFTP server did not finish the handshake "
                                f"(INIT, VERSION) within {timeout_s:g}s; session closed"
                                ) from e
        finally:
            self.deadline = None

    def _refused(self, cls: type[TransferError], message: str) -> TransferError:
        return cls(f"{self.where}: {message}" if self.where else message)

    def _read_all(self, n: int) -> bytes:
        out = bytearray()
        chan = self.sock
        try:
            while len(out) < n:
                if self._stderr is not None and self._stderr.overflowed:
                    raise self._refused(ProtocolError, "the SFTP server wrote over "
                                        f"{self._stderr.limit} bytes to stderr; session closed")
                if self.deadline is not None:
                    left = self.deadline - time.monotonic()
                    if left <= 0:
                        raise self._refused(DeadlineError, "an SFTP reply was still arriving at "
                                            f"the deadline ({len(out)} of its {n} bytes: "
                                            "trickled); refused")
                    chan.settimeout(left)
                try:
                    x = chan.recv(n - len(out))
                except socket.timeout:
                    if self.deadline is not None and time.monotonic() >= self.deadline:
                        raise self._refused(DeadlineError, "no whole SFTP reply by the deadline "
                                            f"({len(out)} of {n} bytes: withheld or "
                                            "trickled); refused") from None
                    raise
                if not x:
                    if self._stderr is not None and self._stderr.overflowed:
                        continue  # its stdout was closed for it: said at the loop's top
                    raise EOFError()
                out += x
        except TransferError:
            self.close()
            raise
        return bytes(out)

    def _read_packet(self) -> tuple[int, bytes]:
        size = struct.unpack(">I", self._read_all(4))[0]
        if size > MAX_SFTP_PACKET:
            self.close()
            raise self._refused(ProtocolError, f"the SFTP server sent a reply of {size} bytes, "
                                f"over the {MAX_SFTP_PACKET} any reply may be; session closed")
        if size == 0:
            return 0, b""
        data = self._read_all(size)
        try:
            check_reply(data[0], data[1:])
        except ProtocolError as e:
            self.close()
            raise self._refused(ProtocolError, str(e)) from None
        return data[0], data[1:]

    def listdir_iter(self, path: str = ".", read_aheads: int = 50):
        """paramiko's `listdir_iter` (SFTPAttributes with `filename` and `longname`, without
        "." and ".."), reading one READDIR reply at a time (`read_aheads` is accepted and not
        used: stopping early leaves no reply unread) and taking only a NAME reply to that
        read (paramiko's parses any reply, a STATUS to another request included, as NAME)."""
        path = self._adjust_cwd(path)
        t, msg = self._request(CMD_OPENDIR, path)
        if t != CMD_HANDLE:
            raise paramiko.SFTPError("Expected handle")
        handle = msg.get_string()
        while True:
            try:
                t, msg = self._request(CMD_READDIR, handle)
            except EOFError:
                self._request(CMD_CLOSE, handle)
                return
            if t != CMD_NAME:
                self.close()
                raise self._refused(ProtocolError, "the SFTP server answered a folder read with "
                                    f"a reply of type {t}; session closed")
            for attr in _parse_names(_Fields(msg.get_remainder(), "NAME")):
                if attr.filename not in (".", ".."):
                    yield attr


def open_sftp(transport: paramiko.Transport, *, timeout_s: float | None = None,
              where: str = "") -> BoundedSFTPClient:
    """A new SFTP session on `transport` whose replies are bounded (`BoundedSFTPClient`): the
    channel's timeout is `timeout_s` and the handshake must be done within it (a server that
    never answers INIT is DeadlineError, the channel closed); its stderr is capped
    (STDERR_MAX_BYTES)."""
    chan = transport.open_session(timeout=timeout_s)
    try:
        chan.settimeout(timeout_s)
        chan.in_stderr_buffer = _StderrCap(chan, STDERR_MAX_BYTES)
        chan.invoke_subsystem("sftp")
        return BoundedSFTPClient(chan, timeout_s=timeout_s, where=where)
    except BaseException:
        chan.close()
        raise


class sftp_deadline:
    """`with sftp_deadline(sftp, timeout_s):` every reply read inside the block must be whole
    by the deadline (a `BoundedSFTPClient`; any other client keeps its channel timeout)."""

    def __init__(self, sftp: paramiko.SFTPClient, timeout_s: float | None):
        self.sftp = sftp
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def __enter__(self) -> float | None:
        self._old = getattr(self.sftp, "deadline", None)
        self._timeout = self.sftp.get_channel().gettimeout()
        if isinstance(self.sftp, BoundedSFTPClient) and self.deadline is not None:
            self.sftp.deadline = self.deadline
        return self.deadline

    def __exit__(self, *exc) -> None:
        if isinstance(self.sftp, BoundedSFTPClient):
            self.sftp.deadline = self._old
        self.sftp.get_channel().settimeout(self._timeout)


def remote_tmp_name(remote_path: str, tag: str = "upload") -> str:
    """The temporary name an upload to `remote_path` by uploader `tag` (the connector passes
    the worker's name) uses before its rename: the same for every upload of that name by that
    uploader, so a cut upload's leftover is overwritten by its next one and nothing needs a
    listing to find it, while two uploaders of one file (two workers of a host share the
    root's config.yaml) never write the same temporary file. One coach serves a worker
    folder (its lease)."""
    folder, base = posixpath.split(remote_path)
    return posixpath.join(folder, f".{base}.{tag}.tmp")


def put_file(
    sftp: paramiko.SFTPClient,
    local_path: str | os.PathLike,
    remote_path: str,
    *,
    where: str = "remote",
    stats: TransferStats | None = None,
    sha256: str | None = None,
    tmp_tag: str = "upload",
) -> TransferResult:
    """Upload `local_path` to `remote_path` atomically.

    The file goes to its temporary name beside the target (`remote_tmp_name(remote_path,
    tmp_tag)`); its size is checked with stat, its mode set to 0600; then OpenSSH's
    posix-rename replaces the target in one step. A failed upload removes its temporary
    file; one the link cut before it could is overwritten by the next upload of the same
    name with the same tag (no folder is listed). `where` (e.g. "worker1 (host)") names the
    destination in errors. Raises TransferError.
    """
    local_path = Path(local_path)
    size = local_path.stat().st_size
    digest = sha256 or sha256_file(local_path)
    tmp = remote_tmp_name(remote_path, tmp_tag)
    t0 = time.perf_counter()
    try:
        sftp.put(str(local_path), tmp, confirm=False)
        got = sftp.stat(tmp).st_size
        if got != size:
            raise VerifyError(
                f"{where}: upload of {local_path} to {tmp} stored {got} of {size} bytes "
                "(remote disk full?)"
            )
        sftp.chmod(tmp, 0o600)  # the user's alone, whatever the SFTP server's umask
        sftp.posix_rename(tmp, remote_path)
    except TransferError as e:
        _remove_quietly(sftp, tmp)
        if tmp in str(e):
            raise
        raise type(e)(f"{where}: upload of {local_path} to {remote_path}: "  # the client's:
                      f"{str(e).removeprefix(where + ': ')}") from e            # name the file
    except _NET_ERRORS as e:
        _remove_quietly(sftp, tmp)
        raise TransferError(
            f"{where}: upload of {local_path} to {remote_path} failed: "
            f"{type(e).__name__}: {e}"
        ) from e
    dt = time.perf_counter() - t0
    if stats is not None:
        stats.record(size, dt, sent=True)
    log.debug("put %s -> %s:%s %d bytes in %.2fs", local_path, where, remote_path, size, dt)
    return TransferResult(remote_path, size, digest, dt)


class _Replies:
    """The replies of one download's READ requests, as paramiko's reader hands them over:
    each checked against its request's length as it arrives, at most the requests in flight
    held at once."""

    def __init__(self, what: str):
        self.what = what
        self.asked: dict[int, int] = {}  # request number -> bytes asked for
        self.got: dict[int, tuple[int, bytes | paramiko.Message]] = {}

    def _async_response(self, t: int, msg: paramiko.Message, num: int) -> None:
        asked = self.asked.pop(num, None)
        if asked is None:
            raise ProtocolError(f"{self.what}: a reply to no request of this download")
        if t == CMD_DATA:
            data = msg.get_string()
            if len(data) > asked:
                raise ProtocolError(f"{self.what}: the server answered a read of {asked} "
                                    f"bytes with {len(data)}; refused")
            self.got[num] = (t, data)
        elif t == CMD_STATUS:
            self.got[num] = (t, msg)
        else:
            raise ProtocolError(f"{self.what}: the server answered a read with a reply of "
                                f"type {t}; refused")


def _read_bounded(sftp: paramiko.SFTPClient, handle: bytes, size: int,
                  write: Callable[[bytes], Any], what: str, deadline: float | None) -> int:
    """Read the open file `handle` from offset 0 up to `size` bytes, in order, into `write`.

    At most READS_IN_FLIGHT READ requests of READ_BYTES are outstanding, so at most that many
    replies are held; each reply is checked against its request's length; the deadline is
    checked before every reply (a withheld reply ends at the deadline, not never). A short
    reply is asked for again from where it ended; past SHORT_REPLIES_FREE of them before
    `size`, short replies must bring SHORT_REPLY_MIN_BYTES each on average (ProtocolError
    otherwise: one byte per reply is a busy loop to the deadline). One more byte is asked
    for past `size`: a file that grew is VerifyError. Returns the bytes read (less than
    `size`: the file shrank). Raises ProtocolError, DeadlineError, VerifyError, or paramiko's errors; after
    any of them replies may still be in flight, so the caller closes the session."""
    replies = _Replies(what)
    pending: collections.deque[tuple[int, int, int]] = collections.deque()  # offset, n, num
    next_off, end, got = 0, size + 1, 0
    shorts, short_bytes = 0, 0  # replies shorter than their read before `size`, their bytes
    chan = sftp.get_channel()

    def ask(off: int, n: int) -> int:
        num = sftp._async_request(replies, CMD_READ, handle, int64(off), int(n))
        replies.asked[num] = n
        return num

    while True:
        while len(pending) < READS_IN_FLIGHT and next_off < end:
            n = min(READ_BYTES, end - next_off)
            pending.append((next_off, n, ask(next_off, n)))
            next_off += n
        if not pending:
            return got
        off, n, num = pending[0]
        while num not in replies.got:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DeadlineError(f"{what}: not read by its deadline ({got} of {size} "
                                        "bytes; a trickle, a withheld reply or a huge file)")
                chan.settimeout(left)
            try:
                sftp._read_response()  # one reply, handed to `replies`
            except socket.timeout:
                if deadline is not None and time.monotonic() >= deadline:
                    raise DeadlineError(f"{what}: no reply by its deadline ({got} of {size} "
                                        "bytes; the server withholds it)") from None
                raise
        pending.popleft()
        t, reply = replies.got.pop(num)
        if t == CMD_STATUS:
            try:
                sftp._convert_status(reply)
            except EOFError:
                if pending:  # replies still in flight: the caller closes the session
                    raise VerifyError(f"{what}: the file ended at {got} of its {size} bytes "
                                      "(it shrank while read); refused") from None
                return got
            raise ProtocolError(f"{what}: the server answered a read with OK, no data")
        if not reply:
            if off >= size:
                continue  # an empty reply past the end: as EOF
            raise ProtocolError(f"{what}: the server answered a read at {off} with no data")
        if off + len(reply) > size:
            raise VerifyError(f"{what}: more data than its {size} bytes (it grew, or is "
                              "not what it was listed as); refused")
        write(reply)
        got += len(reply)
        if len(reply) < n:  # a short read: ask for the rest before anything later
            rest = off + len(reply)
            if rest < size:
                shorts, short_bytes = shorts + 1, short_bytes + len(reply)
                if shorts > SHORT_REPLIES_FREE and short_bytes < shorts * SHORT_REPLY_MIN_BYTES:
                    raise ProtocolError(f"{what}: {shorts} replies shorter than their reads "
                                        f"({short_bytes} bytes in all) before the file's "
                                        f"listed {size} bytes; a server answers a regular "
                                        "file's reads whole; refused")
            pending.appendleft((rest, n - len(reply), ask(rest, n - len(reply))))


def get_file(
    sftp: paramiko.SFTPClient,
    remote_path: str,
    local_path: str | os.PathLike,
    *,
    where: str = "remote",
    stats: TransferStats | None = None,
    expected_sha256: str | None = None,
    expected_size: int | None = None,
    max_bytes: int | None = None,
    timeout_s: float | None = None,
) -> TransferResult:
    """Download `remote_path` to `local_path` via `<local_path>.partial`, verify, rename.

    The remote file must be a regular file (lstat: a symlink, FIFO or device is refused
    without being opened). At most its lstat size, and at most `max_bytes`, are read
    (a file that grows or is swapped for a link to /dev/zero is cut off). The read holds at
    most READS_IN_FLIGHT replies of READ_BYTES (`_read_bounded`: a reply longer than its
    request is ProtocolError); past `timeout_s` seconds, checked while each reply arrives,
    the download stops with DeadlineError. The size is checked against `expected_size` and
    the sha256 against `expected_sha256` when given; the partial file is fsynced before its
    rename. On any failure the partial file is deleted and TransferError raised
    (VerifyError for a file that is not acceptable; FileNotFoundError when the remote file
    does not exist); a failure mid-read closes the SFTP session (replies may be in flight).
    """
    local_path = Path(local_path)
    partial = local_path.with_name(local_path.name + ".partial")
    what = f"{where}: {remote_path}"
    t0 = time.perf_counter()
    reading = False
    h = hashlib.sha256()
    try:
        with sftp_deadline(sftp, timeout_s) as deadline:
            remote_size = _regular_size(sftp, remote_path, where, max_bytes)
            f = sftp.open(remote_path, "rb")
            try:
                with open(partial, "wb") as out:
                    def write(data: bytes) -> None:
                        h.update(data)
                        out.write(data)

                    reading = True
                    size = _read_bounded(sftp, f.handle, remote_size, write, what, deadline)
                    reading = False
                    out.flush()
                    os.fsync(out.fileno())
                digest = h.hexdigest()
            finally:
                if not reading:  # closed within the deadline (after a failed read the
                    try:         # session goes instead: replies may be in flight)
                        f.close()
                    except (*_SFTP_ERRORS, TransferError):
                        pass  # the file was read whole (or the error raised says why not)
    except FileNotFoundError:
        partial.unlink(missing_ok=True)
        raise  # a missing file is an answer, not a failure to retry
    except BaseException as e:
        partial.unlink(missing_ok=True)
        e = _naming_the_file(e, what, where)
        if reading or isinstance(e, DeadlineError):
            _close_quietly(sftp)  # replies may be in flight: the session goes
        if isinstance(e, TransferError):
            raise e from e.__cause__
        if not isinstance(e, _SFTP_ERRORS):
            raise
        raise TransferError(
            f"{where}: download of {remote_path} failed: {type(e).__name__}: {e}"
        ) from e
    problems = _download_problems(size, remote_size, digest, expected_size, expected_sha256)
    if problems:
        partial.unlink(missing_ok=True)
        raise VerifyError(f"{where}: download of {remote_path}: " + "; ".join(problems))
    os.replace(partial, local_path)
    dt = time.perf_counter() - t0
    if stats is not None:
        stats.record(size, dt, sent=False)
    return TransferResult(str(local_path), size, digest, dt)


def _regular_size(sftp: paramiko.SFTPClient, remote_path: str, where: str,
                  max_bytes: int | None) -> int:
    """The lstat size of `remote_path`, which must be a regular file of at most `max_bytes`
    (VerifyError otherwise, before it is opened)."""
    st = sftp.lstat(remote_path)
    if st.st_mode is not None and not stat.S_ISREG(st.st_mode):
        raise VerifyError(f"{where}: {remote_path} is {file_kind(st.st_mode)}, "
                          "refused without reading")
    remote_size = int(st.st_size or 0)
    if max_bytes is not None and remote_size > max_bytes:
        raise VerifyError(
            f"{where}: {remote_path} is {remote_size} bytes, over the limit {max_bytes}"
        )
    return remote_size


def _naming_the_file(e: BaseException, what: str, where: str) -> BaseException:
    """`e`, or for a DeadlineError or ProtocolError raised in the SFTP client (its message
    does not open with `what`) the same error naming the file, with the same cause."""
    if isinstance(e, (DeadlineError, ProtocolError)) and not str(e).startswith(what):
        text = str(e)  # raised in the SFTP client: name the file
        named = type(e)(f"{what}: {text.removeprefix(where + ': ')}")
        named.__cause__ = e.__cause__
        e = named
    return e


def _download_problems(size: int, remote_size: int, digest: str, expected_size: int | None,
                       expected_sha256: str | None) -> list[str]:
    """What is wrong with a finished download of `size` bytes (sha256 `digest`) of a file
    listed at `remote_size`: nothing when it is what was expected."""
    problems = []
    if expected_size is not None and size != expected_size:
        problems.append(f"got {size} bytes, expected {expected_size}")
    if expected_sha256 is not None and digest != expected_sha256:
        problems.append(f"sha256 {digest[:12]}.. differs from expected {expected_sha256[:12]}..")
    if size != remote_size:
        problems.append(f"got {size} bytes, remote has {remote_size}")
    return problems


def _close_quietly(sftp: paramiko.SFTPClient) -> None:
    try:
        sftp.close()
    except _NET_ERRORS:
        pass


def _remove_quietly(sftp: paramiko.SFTPClient, path: str) -> None:
    try:
        sftp.remove(path)
    except _NET_ERRORS:
        pass  # the connection is probably gone; the next upload of that name overwrites it
