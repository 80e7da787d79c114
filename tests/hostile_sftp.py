"""A hostile SFTP server for tests: the real sftp-server, with its READ replies tampered with.

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
CMD_READ, CMD_STATUS, CMD_DATA = 5, 101, 103


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
    lock = threading.Lock()

    def client_to_server() -> None:
        try:
            while True:
                body = read_packet(0)
                if body[0] == CMD_READ:
                    rid = struct.unpack(">I", body[1:5])[0]
                    hlen = struct.unpack(">I", body[5:9])[0]
                    offset = struct.unpack(">Q", body[9 + hlen:17 + hlen])[0]
                    with lock:
                        reads[rid] = offset
                write_all(server_in_w, packet(body))
        except (EOFError, OSError):
            os.close(server_in_w)

    threading.Thread(target=client_to_server, daemon=True).start()
    first_sent = False
    try:
        while True:
            body = read_packet(server_out_r)
            if body[0] == CMD_DATA:
                rid = struct.unpack(">I", body[1:5])[0]
                with lock:
                    offset = reads.pop(rid, None)
                data = body[9:]
                if mode == "withhold" and offset == 0:
                    continue
                if mode == "shrink" and offset is not None and offset >= 65536:
                    eof = struct.pack(">I", 1) + struct.pack(">I", 0) * 2  # EOF, "", ""
                    write_all(1, packet(bytes([CMD_STATUS]) + body[1:5] + eof))
                    continue
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
                        write_all(1, whole[i:i + 1])
                        time.sleep(0.02)
                    continue
            write_all(1, packet(body))
    except (EOFError, OSError):
        pass


if __name__ == "__main__":
    main()
