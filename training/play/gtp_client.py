"""A client for GTP engines (GNU Go, our own `python -m training.gtp`, KataGo, ...).

`GtpClient(argv)` starts the engine as a subprocess and talks GTP version 2 over its pipes:
`send("genmove black")` writes one command (with a numeric id) and returns the text of the
success reply (`= D4` -> "D4"); a failure reply (`? illegal move`) raises `GtpError`, and an
engine that exits, garbles the protocol or stays silent longer than the timeout raises
`GtpEngineError` (the process is then killed). Use it as a context manager, or call
`close()`, which sends `quit` and reaps the process.

`GtpError` is the protocol's failure reply on both sides: `GtpClient` raises it, and our engine
(`training.gtp`) and its players (`training.play.players`) raise it to answer `? message`.

GNU Go lives in Debian's games folder, off PATH: `find_gnugo()` looks there too.

It must not: import anything but the standard library (the engine and its players import
`GtpError` from here without importing each other), or know a board or the rules of Go.
"""

from __future__ import annotations

import queue
import shutil
import subprocess
import threading
from pathlib import Path


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
        self.timeout_s = timeout_s
        try:
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                text=True, bufsize=1, cwd=cwd,
            )
        except OSError as e:
            raise GtpEngineError(f"{self.name}: could not start {argv!r}: {e}") from e
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read_stdout, daemon=True)
        self._reader.start()
        self._next_id = 1

    def _read_stdout(self) -> None:
        # A thread turns the blocking pipe into a queue that `send` can wait on with a timeout.
        with self._proc.stdout:
            for line in self._proc.stdout:
                self._lines.put(line)
        self._lines.put(None)  # end of stream

    def _readline(self, command: str, timeout_s: float) -> str:
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            self.kill()
            raise GtpEngineError(
                f"{self.name}: no answer to {command!r} within {timeout_s:g} s (killed it)"
            ) from None
        if line is None:
            code = self._proc.poll()
            raise GtpEngineError(f"{self.name}: exited (code {code}) during {command!r}")
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
        except (BrokenPipeError, OSError) as e:
            raise GtpEngineError(f"{self.name}: cannot send {commands[0]!r}: {e}") from e
        return [self._read_reply(c, first_id + i, timeout_s) for i, c in enumerate(commands)]

    def _read_reply(self, command: str, cmd_id: int, timeout_s: float) -> str | GtpError:
        head = self._readline(command, timeout_s)
        while head == "":  # tolerate blank lines left over before a reply
            head = self._readline(command, timeout_s)
        lines = [head]
        while True:
            line = self._readline(command, timeout_s)
            if line == "":
                break
            lines.append(line)
        status, rest = head[0], head[1:]
        if status not in "=?":
            raise GtpEngineError(f"{self.name}: bad reply to {command!r}: {head!r}")
        got_id, _, first = rest.partition(" ") if rest[:1].isdigit() else ("", "", rest)
        if got_id and int(got_id) != cmd_id:
            raise GtpEngineError(f"{self.name}: reply id {got_id} to command id {cmd_id}")
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
        self._reader.join(timeout=5)  # it closes stdout at end of stream

    @property
    def returncode(self) -> int | None:
        return self._proc.poll()

    def __enter__(self) -> "GtpClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
