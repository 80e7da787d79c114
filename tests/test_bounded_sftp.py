"""The SFTP client's defences against a hostile server, and the paramiko internals they rest on.

`BoundedSFTPClient` (distributed/sftp.py) overrides paramiko's private `_read_all` and
`_read_packet` and its `listdir_iter`, calls `_request`, `_async_request`, `_read_response`,
`_convert_status` and `_adjust_cwd`, fills in `SFTPAttributes`, and replaces a Channel's
`in_stderr_buffer`. setup.cfg asks only paramiko>=3.4, so the first tests pin the names,
parameters and behaviour relied on: an upgrade that changes them fails here, not silently in
a coach.

The other tests run a real paramiko SSH server on a socket pair (as a worker host whose sshd
is hostile: OpenSSH's own drops a subsystem's stderr, and cannot be made to send malformed
SFTP without a relay, see tests/hostile_sftp.py) whose sftp subsystem channel is scripted
byte by byte: attributes that announce 2^32-1 extended pairs, fields past a reply's end, a
handshake never answered, a flood of stderr.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import queue
import socket
import struct
import threading
import time

import paramiko
import pytest
from paramiko.buffered_pipe import BufferedPipe
from paramiko.message import Message
from paramiko.sftp import (CMD_ATTRS, CMD_DATA, CMD_FSTAT, CMD_HANDLE, CMD_INIT, CMD_LSTAT,
                           CMD_NAME, CMD_OPEN, CMD_OPENDIR, CMD_READ, CMD_READDIR, CMD_STAT,
                           CMD_STATUS, CMD_VERSION, BaseSFTP, int64)
from paramiko.sftp_attr import SFTPAttributes
from paramiko.sftp_file import SFTPFile

from distributed import sftp
from distributed.sftp import STDERR_MAX_BYTES, BoundedSFTPClient, ProtocolError, open_sftp
from distributed.transfer import DeadlineError

HOST_KEY = paramiko.ECDSAKey.generate()
ENDLESS_ATTRS = struct.pack(">II", SFTPAttributes.FLAG_EXTENDED, 0xFFFFFFFF)


# ----------------------------------------------------------------------------- paramiko


def _params(fn) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


E = inspect.Parameter.empty


@pytest.mark.parametrize("owner,name,expected", [
    (BaseSFTP, "_read_all", [("self", E), ("n", E)]),
    (BaseSFTP, "_read_packet", [("self", E)]),
    (BaseSFTP, "_send_version", [("self", E)]),
    (paramiko.SFTPClient, "__init__", [("self", E), ("sock", E)]),
    (paramiko.SFTPClient, "_request", [("self", E), ("t", E), ("args", E)]),
    (paramiko.SFTPClient, "_async_request", [("self", E), ("fileobj", E), ("t", E),
                                             ("args", E)]),
    (paramiko.SFTPClient, "_read_response", [("self", E), ("waitfor", None)]),
    (paramiko.SFTPClient, "_convert_status", [("self", E), ("msg", E)]),
    (paramiko.SFTPClient, "_adjust_cwd", [("self", E), ("path", E)]),
    (paramiko.SFTPClient, "listdir_iter", [("self", E), ("path", "."), ("read_aheads", 50)]),
    (SFTPFile, "_async_response", [("self", E), ("t", E), ("msg", E), ("num", E)]),
    (paramiko.Transport, "open_session", [("self", E), ("window_size", None),
                                          ("max_packet_size", None), ("timeout", None)]),
    (BufferedPipe, "feed", [("self", E), ("data", E)]),
    (BufferedPipe, "close", [("self", E)]),
    (Message, "get_remainder", [("self", E)]),
])
def test_paramiko_internals_we_override_or_call_keep_their_signatures(owner, name, expected):
    assert _params(getattr(owner, name)) == expected, (
        f"paramiko {paramiko.__version__} changed {owner.__name__}.{name}; "
        "distributed/sftp.py's BoundedSFTPClient relies on it")


def test_our_overrides_match_paramikos_signatures():
    for name in ("_read_all", "_read_packet", "listdir_iter"):
        ours, theirs = getattr(BoundedSFTPClient, name), getattr(paramiko.SFTPClient, name)
        assert ours is not theirs and _params(ours) == _params(theirs), name


def test_paramiko_attribute_and_channel_fields_we_fill_in_exist():
    a = SFTPAttributes()
    for field in ("st_size", "st_uid", "st_gid", "st_mode", "st_atime", "st_mtime", "_flags"):
        assert hasattr(a, field), field
    assert a.attr == {}
    assert (SFTPAttributes.FLAG_SIZE, SFTPAttributes.FLAG_UIDGID,
            SFTPAttributes.FLAG_PERMISSIONS, SFTPAttributes.FLAG_AMTIME,
            SFTPAttributes.FLAG_EXTENDED) == (1, 2, 4, 8, 0x80000000)
    chan = paramiko.Channel(0)
    assert isinstance(chan.in_buffer, BufferedPipe)
    assert isinstance(chan.in_stderr_buffer, BufferedPipe)


def _attrs_bytes() -> bytes:
    a = SFTPAttributes()
    a.st_size, a.st_uid, a.st_gid, a.st_mode = 123456789012, 1000, 1001, 0o100600
    a.st_atime, a.st_mtime = 1700000000, 1700000001
    a.attr = {b"k1": b"v1", b"key two": b""}
    m = Message()
    a._pack(m)
    return m.asbytes()


def test_honest_attributes_parse_as_paramiko_parses_them():
    data = _attrs_bytes()
    ours = sftp._parse_attrs(sftp._Fields(data, "ATTRS"))
    theirs = SFTPAttributes._from_msg(Message(data))
    for field in ("st_size", "st_uid", "st_gid", "st_mode", "st_atime", "st_mtime"):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.attr == {b"k1": b"v1", b"key two": b""}
    # paramiko's `attr[get_string()] = get_string()` reads the value first: its extended
    # pairs come out reversed (nothing in the project reads them)
    assert theirs.attr in (ours.attr, {v: k for k, v in ours.attr.items()})
    sftp.check_reply(CMD_ATTRS, struct.pack(">I", 7) + data)  # whole: accepted


@pytest.mark.parametrize("cut", [1, 4, 9])
def test_attributes_cut_short_are_refused_where_paramiko_pads_them(cut):
    data = struct.pack(">I", 7) + _attrs_bytes()[:-cut]
    SFTPAttributes._from_msg(Message(data[4:]))  # paramiko: zeros for the missing bytes
    with pytest.raises(ProtocolError, match="ATTRS reply ends .* short"):
        sftp.check_reply(CMD_ATTRS, data)


def test_stderr_past_the_cap_is_dropped_and_ends_the_stdout_stream():
    chan = paramiko.Channel(0)
    cap = sftp._StderrCap(chan, STDERR_MAX_BYTES)
    for _ in range(256):
        cap.feed(b"e" * 4096)  # 1 MiB
    assert len(cap) <= STDERR_MAX_BYTES and cap.overflowed
    assert chan.in_buffer.read(10, timeout=0) == b""  # closed: the reader sees its end


# ----------------------------------------------------------------------------- server


class _Server(paramiko.ServerInterface):
    def __init__(self):
        self.channels: queue.Queue = queue.Queue()

    def get_allowed_auths(self, username):
        return "none"

    def check_auth_none(self, username):
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED

    def check_channel_subsystem_request(self, channel, name):
        self.channels.put(channel)
        return name == "sftp"


def _read(chan, n: int) -> bytes:
    out = b""
    while len(out) < n:
        x = chan.recv(n - len(out))
        if not x:
            raise EOFError
        out += x
    return out


def read_request(chan) -> tuple[int, int, bytes]:
    """(type, request id, the rest) of the client's next packet (INIT: id is its version)."""
    body = _read(chan, struct.unpack(">I", _read(chan, 4))[0])
    return body[0], struct.unpack(">I", body[1:5])[0], body[5:]


def send(chan, t: int, body: bytes) -> None:
    chan.sendall(struct.pack(">IB", len(body) + 1, t) + body)


def string(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + b


def version(chan) -> None:
    assert read_request(chan)[0] == CMD_INIT
    send(chan, CMD_VERSION, struct.pack(">I", 3))


@contextlib.contextmanager
def scripted_sftp(script):
    """A real SSH link over a socket pair: the server's sftp subsystem channel runs
    `script(chan)` in a thread. Yields the client's Transport."""
    a, b = socket.socketpair()
    server = paramiko.Transport(a)
    server.add_server_key(HOST_KEY)
    iface = _Server()
    server.start_server(event=threading.Event(), server=iface)
    client = paramiko.Transport(b)
    client.start_client(timeout=20)
    client.auth_none("coach")

    def run() -> None:
        try:
            script(iface.channels.get(timeout=20))
        except (EOFError, OSError, queue.Empty):
            pass  # the client closed the session

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield client
    finally:
        client.close()
        server.close()
        t.join(10)
        a.close()
        b.close()


def _endless_attrs_server(chan) -> None:
    version(chan)
    while True:
        t, rid, _ = read_request(chan)
        if t in (CMD_OPEN, CMD_OPENDIR):
            send(chan, CMD_HANDLE, struct.pack(">I", rid) + string(b"h"))
        elif t in (CMD_STAT, CMD_LSTAT, CMD_FSTAT):
            send(chan, CMD_ATTRS, struct.pack(">I", rid) + ENDLESS_ATTRS)
        elif t == CMD_READDIR:
            send(chan, CMD_NAME, struct.pack(">II", rid, 1) + string(b"a") + string(b"a")
                 + ENDLESS_ATTRS)


@pytest.mark.parametrize("call", [
    lambda s: s.stat("x"),
    lambda s: s.lstat("x"),
    lambda s: list(s.listdir_iter("d")),
    lambda s: s.listdir_attr("d"),
    lambda s: s.open("x").stat(),
], ids=["stat", "lstat", "listdir_iter", "listdir_attr", "fstat"])
def test_every_attributes_reply_is_checked_before_paramiko_parses_it(call):
    """A 17-byte ATTRS reply announcing 2^32-1 extended pairs (an hour of paramiko's CPU)
    is refused from its count, whichever call asked for it."""
    with scripted_sftp(_endless_attrs_server) as t:
        sftp = open_sftp(t, timeout_s=20, where="w1 (host)")
        cpu0 = time.thread_time()
        with pytest.raises(ProtocolError, match="^w1 \\(host\\): .*4294967295 extended attr"):
            call(sftp)
        assert time.thread_time() - cpu0 < 1.0
        assert sftp.get_channel().closed, "the session was left open"


def test_a_reply_to_no_request_is_skipped_and_replies_reach_their_reader():
    """paramiko's `_read_response` drops a reply to no request and hands a reply to
    `_async_request`'s `fileobj._async_response(t, msg, num)` (the download's reader)."""
    def script(chan) -> None:
        version(chan)
        t, rid, _ = read_request(chan)
        assert t == CMD_READ
        send(chan, CMD_STATUS, struct.pack(">III", 999, 0, 0) + string(b""))  # to nothing
        send(chan, CMD_DATA, struct.pack(">I", rid) + string(b"abc"))

    got = []

    class Reader:
        def _async_response(self, t, msg, num):
            got.append((t, msg.get_string(), num))

    with scripted_sftp(script) as t:
        sftp = open_sftp(t, timeout_s=20)
        reader = Reader()  # paramiko holds it weakly
        num = sftp._async_request(reader, CMD_READ, b"h", int64(0), 3)
        sftp._read_response()
        sftp._read_response()
    assert got == [(CMD_DATA, b"abc", num)]


def test_a_handshake_never_answered_ends_at_its_deadline():
    def script(chan) -> None:
        read_request(chan)  # the INIT, never answered
        chan.recv(1)  # until the client goes

    with scripted_sftp(script) as t:
        t0 = time.monotonic()
        with pytest.raises(DeadlineError, match="^w1 \\(host\\): .*handshake"):
            open_sftp(t, timeout_s=0.5, where="w1 (host)")
        assert time.monotonic() - t0 < 10
        assert not [c for c in t._channels.values() if not c.closed], "a channel was left"


def test_a_stderr_flood_on_the_sftp_channel_is_capped_and_closes_the_session():
    """sshd is the worker host's own here (root): 1 MiB of stderr on the SFTP channel, which
    paramiko would buffer whole (and a server ignoring the window, without end)."""
    def script(chan) -> None:
        assert read_request(chan)[0] == CMD_INIT
        chan.sendall_stderr(b"e" * (1 << 20))
        send(chan, CMD_VERSION, struct.pack(">I", 3))
        chan.recv(1)

    with scripted_sftp(script) as t:
        with pytest.raises(ProtocolError, match="^w1 \\(host\\): .* bytes to stderr"):
            open_sftp(t, timeout_s=20, where="w1 (host)")
        chans = list(t._channels.values())
    assert all(len(c.in_stderr_buffer) <= STDERR_MAX_BYTES for c in chans)


def test_remote_tmp_name_is_hidden_and_beside_target():
    name = sftp.remote_tmp_name("/srv/models/model_000001.pt.zst")
    assert name.startswith("/srv/models/.model_000001.pt.zst.") and name.endswith(".tmp")
    assert os.path.dirname(name) == "/srv/models"
