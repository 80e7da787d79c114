"""A client for GTP engines (GNU Go, our own `python -m training.gtp`, KataGo, ...).

`GtpClient(argv)` starts the engine as a subprocess and talks GTP version 2 over its pipes:
`send("genmove black")` writes one command (with a numeric id) and returns the text of the
success reply (`= D4` -> "D4"); a failure reply (`? illegal move`) raises `GtpError`, and an
engine that exits, garbles the protocol or does not finish its reply within the timeout raises
`GtpEngineError` naming the engine and its command line (the process is then killed). Use it
as a context manager, or call `close()`, which sends `quit`, waits a little and kills the
process if it is still there.

An engine is not trusted to be sane: a reply line is at most `MAX_LINE_CHARS` characters and a
reply at most `MAX_REPLY_LINES` lines, the whole reply (not each line) must come within the
timeout, and at most `QUEUED_LINES` lines wait unread (an engine that writes without end
blocks on its pipe), so memory and time stay bounded whatever it writes.

`GtpError` is the protocol's failure reply on both sides: `GtpClient` raises it, and our engine
(`training.gtp`) and its players (`training.play.players`) raise it to answer `? message`.

GNU Go lives in Debian's games folder, off PATH: `find_gnugo()` looks there too.

It must not: import anything but the standard library (the engine and its players import
`GtpError` from here without importing each other), or know a board or the rules of Go.
"""

from __future__ import annotations

import queue
import shlex
import shutil
import subprocess
import threading
import time
from pathlib import Path

MAX_LINE_CHARS = 65_536
"""The longest reply line an engine may send (a `list_commands` or a board is far shorter)."""
MAX_REPLY_LINES = 4_096
"""The most lines of one reply."""
QUEUED_LINES = 256
"""Lines read ahead of the caller before the reader stops reading the engine's pipe."""


class GtpError(RuntimeError):
    """A GTP failure reply (`? message`), on either side of the protocol.

    An engine's command raises `GtpError(message)` to answer `? message` (our engine,
    `training.gtp`, replies with `str(e)`: the message alone). `GtpClient` raises it when an
    engine answers a command with a failure, naming the engine and the command.
    """

    def __init__(self, message: str, *, engine: str | None = None, command: str | None = None):
        self.message = message
        self.engine = engine
        self.command = command
        super().__init__(message if engine is None else f"{engine}: {command!r} failed: {message}")


class GtpEngineError(RuntimeError):
    """The engine died, broke the protocol, or did not answer in time."""


def find_gnugo() -> str | None:
    """Path of the GNU Go binary (PATH first, then /usr/games), or None."""
    found = shutil.which("gnugo")
    if found:
        return found
    debian = Path("/usr/games/gnugo")
    return str(debian) if debian.exists() else None


class GtpClient:
    """One GTP engine subprocess; `send` one command at a time."""

    def __init__(self, argv: list[str], timeout_s: float = 30.0, name: str | None = None,
                 cwd: str | None = None, stderr=subprocess.DEVNULL):
        self.name = name or Path(argv[0]).name
        self.command = shlex.join(argv)
        self.timeout_s = timeout_s
        try:
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                text=True, encoding="utf-8", errors="replace", bufsize=1, cwd=cwd,
            )
        except OSError as e:
            raise GtpEngineError(f"{self.name}: could not start {argv!r}: {e}") from e
        self._lines: queue.Queue[str | None] = queue.Queue(maxsize=QUEUED_LINES)
        self._closing = threading.Event()
        self._reader = threading.Thread(target=self._read_stdout, daemon=True)
        self._reader.start()
        self._next_id = 1

    def _read_stdout(self) -> None:
        # A thread turns the blocking pipe into a queue that `send` can wait on with a timeout;
        # a line is read at most MAX_LINE_CHARS + 1 characters at a time, and a full queue
        # stops the reading (the engine then blocks on its pipe) until the caller reads or
        # closes.
        with self._proc.stdout:
            while not self._closing.is_set():
                line = self._proc.stdout.readline(MAX_LINE_CHARS + 1)
                if not line or not self._put(line):
                    break
        self._put(None)  # end of stream

    def _put(self, item: str | None) -> bool:
        while not self._closing.is_set():
            try:
                self._lines.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _fail(self, message: str) -> GtpEngineError:
        """Kill the engine (the stream is of no further use) and the error to raise."""
        self.kill()
        return GtpEngineError(f"{self.name}: {message} (engine command: {self.command})")

    def _readline(self, command: str, deadline: float, timeout_s: float) -> str:
        try:
            line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise self._fail(f"no answer to {command!r} within {timeout_s:g} s "
                             "(killed it)") from None
        if line is None:
            code = self._proc.poll()
            raise self._fail(f"exited (code {code}) during {command!r}")
        if len(line) > MAX_LINE_CHARS:
            raise self._fail(f"answered {command!r} with a line longer than {MAX_LINE_CHARS} "
                             "characters (killed it)")
        return line.rstrip("\r\n")

    def send(self, command: str, timeout_s: float | None = None) -> str:
        """Send one command; return the reply text, or raise GtpError / GtpEngineError."""
        reply = self.send_many([command], timeout_s)[0]
        if isinstance(reply, GtpError):
            raise reply
        return reply

    def send_many(self, commands: list[str], timeout_s: float | None = None
                  ) -> list[str | GtpError]:
        """Pipeline commands (write all, then read all replies, in order).

        Returns one entry per command: the reply text, or the GtpError of a `?` reply.
        Much faster than one `send` per command when asking many questions (`is_legal`).
        """
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        first_id = self._next_id
        self._next_id += len(commands)
        text = "".join(f"{first_id + i} {c}\n" for i, c in enumerate(commands))
        try:
            self._proc.stdin.write(text)
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError) as e:  # ValueError: stdin closed
            raise self._fail(f"cannot send {commands[0]!r}: {e}") from e
        # each reply must be whole within the timeout, however the engine spaces its lines
        return [self._read_reply(c, first_id + i, timeout_s) for i, c in enumerate(commands)]

    def _read_reply(self, command: str, cmd_id: int, timeout_s: float) -> str | GtpError:
        deadline = time.monotonic() + timeout_s
        head = self._readline(command, deadline, timeout_s)
        blanks = 0
        while head == "":  # tolerate blank lines left over before a reply
            blanks += 1
            if blanks > MAX_REPLY_LINES:
                raise self._fail(f"sent only blank lines in reply to {command!r}")
            head = self._readline(command, deadline, timeout_s)
        lines = [head]
        while True:
            line = self._readline(command, deadline, timeout_s)
            if line == "":
                break
            lines.append(line)
            if len(lines) > MAX_REPLY_LINES:
                raise self._fail(f"answered {command!r} with more than {MAX_REPLY_LINES} "
                                 "lines (killed it)")
        status, rest = head[0], head[1:]
        if status not in "=?":
            raise self._fail(f"bad reply to {command!r}: {head[:80]!r}")
        got_id, _, first = rest.partition(" ") if rest[:1].isdigit() else ("", "", rest)
        if got_id and (not got_id.isdigit() or int(got_id) != cmd_id):
            raise self._fail(f"reply id {got_id[:20]} to command id {cmd_id}")
        if len(lines) == 1:
            text = first.strip()
        else:
            text = "\n".join([first.rstrip()] + lines[1:])
        if status == "?":
            return GtpError(text.strip(), engine=self.name, command=command)
        return text

    def close(self, timeout_s: float = 5.0) -> None:
        """Send `quit` and wait for the process; kill it if it does not go."""
        if self._proc.poll() is None:
            try:
                self.send("quit", timeout_s=timeout_s)
            except (GtpError, GtpEngineError):
                pass
            try:
                self._proc.stdin.close()  # an engine that waits for more input sees its end
            except OSError:
                pass
            try:
                self._proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_pipes()

    def kill(self) -> None:
        """Kill the engine process now."""
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._close_pipes()

    def _close_pipes(self) -> None:
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        if self._proc.poll() is not None:
            self._closing.set()  # the reader stops waiting on a full queue
        self._reader.join(timeout=5)  # it closes stdout at end of stream

    @property
    def returncode(self) -> int | None:
        return self._proc.poll()

    def __enter__(self) -> "GtpClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
