"""A hostile SFTP server for tests: the real sftp-server, with its replies tampered with.

Run by sshd as the forced command of a key (`command="python3 hostile_sftp.py MODE_FILE"` in
authorized_keys), as a compromised worker account could: a session that asks for the sftp
subsystem gets OpenSSH's sftp-server behind a relay; any other command runs as usual. It
reads the mode from MODE_FILE at the start of each session:

  honest     - replies pass unchanged
  withhold   - the reply to the READ at offset 0 is never sent; every other one is
  overlong   - every DATA reply is padded to PAD bytes
  huge       - the first reply to a READ is a packet that announces 15 MiB (and sends it)
  trickle    - the first reply to a READ is sent one byte every 20 ms
  shrink     - every READ from 64 KiB on is answered with EOF, as if the file were cut there
  grow       - a reply shorter than its request (the end of the file) gets one byte more
  dribble    - every DATA reply is cut to its first byte (legal SFTP, one byte per round trip)
  attrs      - every ATTRS reply (stat, lstat, fstat) and every NAME reply to a READDIR carries
               attributes announcing 2^32-1 extended pairs in 17 bytes (no pair follows)
  silent-init - the INIT is read and never answered (nor any later request); MODE_FILE.init
               is created when the INIT arrives
  stall-remove, stall-stat, stall-close - the reply to every REMOVE (STAT, CLOSE) is never
               sent; instead an unsolicited STATUS (to no request) follows every 0.2 s, so
               the channel is never idle
  garbage-shell - every command (not the sftp subsystem) prints one line of nonsense
"""

from __future__ import annotations

import os
import struct
import sys
import threading
import time

SFTP_SERVER = "/usr/lib/openssh/sftp-server"
PAD = 200 << 10
CMD_INIT, CMD_CLOSE, CMD_READ, CMD_READDIR, CMD_REMOVE, CMD_STAT = 1, 4, 5, 12, 13, 17
CMD_STATUS, CMD_DATA, CMD_NAME, CMD_ATTRS = 101, 103, 104, 105
STALLED = {"stall-remove": CMD_REMOVE, "stall-stat": CMD_STAT, "stall-close": CMD_CLOSE}
FLAG_EXTENDED = 0x80000000
ENDLESS_ATTRS = struct.pack(">II", FLAG_EXTENDED, 0xFFFFFFFF)  # no pair follows
UNSOLICITED_ID = 0x7FFFFFF0


def read_exact(fd: int, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        x = os.read(fd, n - len(out))
        if not x:
            raise EOFError
        out += x
    return bytes(out)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_packet(fd: int) -> bytes:
    size = struct.unpack(">I", read_exact(fd, 4))[0]
    return read_exact(fd, size)


def packet(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def endless(body: bytes, request_type: int | None) -> bytes:
    """`body` (a reply) with attributes that announce 2^32-1 extended pairs, where it has
    attributes the coach parses."""
    if body[0] == CMD_ATTRS:
        return body[:5] + ENDLESS_ATTRS
    if body[0] == CMD_NAME and request_type == CMD_READDIR:
        return (body[:5] + struct.pack(">I", 1) + string(b"w1_g000000_s000001.npz.zst")
                + string(b"-rw------- 1 w w 1 Jan 1 00:00 x") + ENDLESS_ATTRS)
    return body


def main() -> None:
    original = os.environ.get("SSH_ORIGINAL_COMMAND", "")
    with open(sys.argv[1]) as f:
        mode = f.read().strip()
    if original not in ("internal-sftp", SFTP_SERVER, "sftp"):
        if mode == "garbage-shell":
            print("running 12abc")
            sys.exit(0)
        os.execv("/bin/sh", ["sh", "-c", original] if original else ["sh"])
    server_in_r, server_in_w = os.pipe()
    server_out_r, server_out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.dup2(server_in_r, 0)
        os.dup2(server_out_w, 1)
        for fd in (server_in_r, server_in_w, server_out_r, server_out_w):
            os.close(fd)
        os.execv(SFTP_SERVER, [SFTP_SERVER])
    os.close(server_in_r)
    os.close(server_out_w)
    reads: dict[int, int] = {}  # request id -> offset
    types: dict[int, int] = {}  # request id -> request type
    lock = threading.Lock()
    out_lock = threading.Lock()  # the stalling ticker writes to stdout too

    def send(data: bytes) -> None:
        with out_lock:
            write_all(1, data)

    def tick() -> None:  # an unsolicited reply every 0.2 s: the channel is never idle
        status = struct.pack(">III", UNSOLICITED_ID, 0, 0) + struct.pack(">I", 0)
        try:
            while True:
                send(packet(bytes([CMD_STATUS]) + status))
                time.sleep(0.2)
        except OSError:
            pass

    def client_to_server() -> None:
        ticking = False
        try:
            while True:
                body = read_packet(0)
                if mode == "silent-init":
                    if body[0] == CMD_INIT:
                        open(sys.argv[1] + ".init", "w").close()
                    continue  # never answered
                rid = struct.unpack(">I", body[1:5])[0]
                if body[0] == CMD_READ:
                    hlen = struct.unpack(">I", body[5:9])[0]
                    offset = struct.unpack(">Q", body[9 + hlen:17 + hlen])[0]
                    with lock:
                        reads[rid] = offset
                with lock:
                    types[rid] = body[0]
                if STALLED.get(mode) == body[0]:
                    if not ticking:
                        ticking = True
                        threading.Thread(target=tick, daemon=True).start()
                    continue  # the real reply is never sent
                write_all(server_in_w, packet(body))
        except (EOFError, OSError):
            os.close(server_in_w)

    threading.Thread(target=client_to_server, daemon=True).start()
    first_sent = False
    try:
        while True:
            body = read_packet(server_out_r)
            if body[0] != 2:  # not the VERSION: a reply to a request
                with lock:
                    request_type = types.pop(struct.unpack(">I", body[1:5])[0], None)
            if mode == "attrs" and body[0] != 2:
                body = endless(body, request_type)
            if body[0] == CMD_DATA:
                rid = struct.unpack(">I", body[1:5])[0]
                with lock:
                    offset = reads.pop(rid, None)
                data = body[9:]
                if mode == "withhold" and offset == 0:
                    continue
                if mode == "shrink" and offset is not None and offset >= 65536:
                    eof = struct.pack(">I", 1) + struct.pack(">I", 0) * 2  # EOF, "", ""
                    send(packet(bytes([CMD_STATUS]) + body[1:5] + eof))
                    continue
                if mode == "dribble":
                    data = data[:1]
                    body = body[:5] + struct.pack(">I", len(data)) + data
                if mode == "grow" and offset is not None and data and len(data) % 32768:
                    data += b"+"
                    body = body[:5] + struct.pack(">I", len(data)) + data
                if mode == "overlong":
                    data = data + b"\0" * max(0, PAD - len(data))
                    body = body[:5] + struct.pack(">I", len(data)) + data
                elif mode == "huge" and not first_sent:
                    first_sent = True
                    data = b"\0" * (15 << 20)
                    body = body[:5] + struct.pack(">I", len(data)) + data
                elif mode == "trickle" and not first_sent:
                    first_sent = True
                    whole = packet(body)
                    for i in range(len(whole)):
                        send(whole[i:i + 1])
                        time.sleep(0.02)
                    continue
            send(packet(body))
    except (EOFError, OSError):
        pass


if __name__ == "__main__":
    main()
