"""Worker states, the worker's heartbeat file, and `distributed/status.txt`.

Vocabulary:
  - `WorkerState`: Active (generating games), Syncing (fetching/loading a model), Error (the
    worker reported a failure or could not be started), Offline (no fresh heartbeat: the
    host or the daemon is unreachable or silent for `offline_after_s`).
  - heartbeat: `Heartbeat`, the small JSON file (`status.json`) a worker daemon rewrites
    every few seconds and the coach reads over SFTP. Both sides use `write_heartbeat` /
    `parse_heartbeat`, so the format lives here only.
  - status snapshot: `StatusSnapshot`, what `distributed/status.txt` shows; a header with the
    user guide's metrics one per line (`Games/second: 145.2`, `Workers active: 4/4`,
    `Model sync time: 12.3s`, `Network usage: 45.6 MB/min`, ...), then a fixed-width table
    with one row per worker. Once the run has finished, a `Finished:` line under the title
    says when, after what (`run.hours`, `run.iterations`, Ctrl-C) and its newest generation;
    the table then shows the workers as they were stopped. While the trainer keeps failing,
    a `Trainer error:` line says how often, its exit and its log's last error line.
    `render_status` and `parse_status_text` are inverses (up to the rounding shown), so
    tests and tools read the file back.

It must not: open connections, decide states by itself beyond `HeartbeatTracker`, or know
about Go or torch. All writes go through `transfer.write_atomic`.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from distributed.transfer import file_kind, write_atomic, write_json_atomic

HEARTBEAT_NAME = "status.json"
DEFAULT_STATUS_PATH = Path("distributed", "status.txt")
"""Relative to the folder the coach runs in, where the guide's `watch cat distributed/status.txt`
looks (not beside an installed package)."""


class WorkerState(str, enum.Enum):
    """Lifecycle state of one worker as the status file shows it."""

    ACTIVE = "Active"
    SYNCING = "Syncing"
    ERROR = "Error"
    OFFLINE = "Offline"

    def __str__(self) -> str:
        return self.value

    @property
    def indicator(self) -> str:
        """The user guide's mark of the state: green, yellow, red and white circles."""
        return _INDICATORS[self]


_INDICATORS = {WorkerState.ACTIVE: "\U0001F7E2", WorkerState.SYNCING: "\U0001F7E1",
               WorkerState.ERROR: "\U0001F534", WorkerState.OFFLINE: "\u26AA"}


class StatusFormatError(ValueError):
    """A heartbeat or status.txt could not be parsed; the message says which line or key."""


# ----------------------------------------------------------------------------- heartbeat


@dataclass(frozen=True)
class Heartbeat:
    """What a worker daemon reports about itself (`status.json` in its worker folder)."""

    name: str
    state: WorkerState
    pid: int
    generation: int = -1  # model generation in use, -1 before the first model
    games_done: int = 0  # finished games since the daemon started
    games_per_s: float = 0.0
    positions_per_s: float = 0.0
    outbox_backlog: int = 0  # batch files waiting to be collected
    paused: bool = False
    last_error: str = ""
    time: float = 0.0  # unix time the heartbeat was written (the worker's clock)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["state"] = self.state.value
        return d


HEARTBEAT_MAX_BYTES = 1 << 16  # a real heartbeat is about 300 bytes
_MAX_TEXT = 1000  # characters kept of a heartbeat's strings
_FIELD_TYPES = {"name": str, "pid": int, "generation": int, "games_done": int,
                "games_per_s": float, "positions_per_s": float, "outbox_backlog": int,
                "paused": bool, "last_error": str, "time": float}


def _typed(key: str, value: object) -> object:
    """`value` as the heartbeat field `key` expects, or StatusFormatError naming the key."""
    want = _FIELD_TYPES[key]
    ok = (isinstance(value, bool) if want is bool
          else isinstance(value, str) if want is str
          else isinstance(value, int) and not isinstance(value, bool) if want is int
          else isinstance(value, (int, float)) and not isinstance(value, bool))
    if not ok:
        raise StatusFormatError(f"heartbeat key {key!r} must be {want.__name__}, got "
                                f"{type(value).__name__} {value!r:.60}")
    if want is float:
        value = float(value)
        if value != value or value in (float("inf"), float("-inf")):
            raise StatusFormatError(f"heartbeat key {key!r} must be finite, got {value}")
    if want is str:
        value = value[:_MAX_TEXT]
    return value


def heartbeat_from_dict(d: dict) -> Heartbeat:
    """Build a Heartbeat from its JSON dict, each known key checked for its type (the file
    comes from another host: untrusted); unknown keys are ignored (newer workers)."""
    if "state" not in d or "name" not in d or "pid" not in d:
        raise StatusFormatError(f"heartbeat lacks {sorted({'name', 'state', 'pid'} - set(d))}")
    try:
        state = WorkerState(d["state"])
    except (ValueError, TypeError) as e:
        raise StatusFormatError(f"heartbeat key 'state' must be one of "
                                f"{[s.value for s in WorkerState]}, got {d['state']!r:.60}") from e
    kwargs = {k: _typed(k, d[k]) for k in _FIELD_TYPES if k in d}
    return Heartbeat(state=state, **kwargs)


def parse_heartbeat(data: bytes | str, source: str = "heartbeat") -> Heartbeat:
    """Parse the bytes of a `status.json` file (as read over SFTP); `source` names it in the
    error of a value Python cannot take."""
    try:
        d = json.loads(data)
    except (ValueError, RecursionError) as e:  # JSON and Unicode errors, and ints too long
        raise StatusFormatError(f"heartbeat is not JSON: {type(e).__name__}: {e}"[:200]) from e
    if not isinstance(d, dict):
        raise StatusFormatError(f"heartbeat is not a JSON object: {d!r:.100}")
    try:
        return heartbeat_from_dict(d)
    except StatusFormatError:
        raise
    except (ValueError, TypeError, ArithmeticError, RecursionError) as e:
        # e.g. a 400-digit games_per_s (OverflowError as a float): the file is bad, which is
        # the worker's fault, not a bug of the coach
        raise StatusFormatError(f"{source}: {type(e).__name__}: {e}"[:200]) from e


def write_heartbeat(path: str | os.PathLike, hb: Heartbeat) -> None:
    """Atomically write `hb` as JSON to `path` (the worker side)."""
    write_json_atomic(path, hb.to_dict())


def read_heartbeat(path: str | os.PathLike, max_bytes: int = HEARTBEAT_MAX_BYTES) -> Heartbeat:
    """Read a local heartbeat file: a regular file only (a FIFO, device or symlink is refused
    without opening it), at most `max_bytes` read. FileNotFoundError before the first one."""
    name = Path(path).name  # short: the reason shows in one status.txt cell
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise StatusFormatError(f"{name} is not a regular file ({file_kind(st.st_mode)})")
    if st.st_size > max_bytes:
        raise StatusFormatError(f"{name} is {st.st_size} bytes, over {max_bytes}")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the lstat
            raise StatusFormatError(f"{name} is not a regular file")
        with os.fdopen(fd, "rb") as f:
            fd = -1
            data = f.read(max_bytes + 1)
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > max_bytes:
        raise StatusFormatError(f"{name} grew over {max_bytes} bytes while read")
    return parse_heartbeat(data, name)


class HeartbeatTracker:
    """Ages heartbeats by the reader's clock, immune to skew between the hosts' clocks.

    The worker's own `time` is never compared with the coach's clock (they differ by the
    clock difference between the hosts). This remembers, per worker, when (by the coach's
    clock) its heartbeat last changed: a worker is Offline when none was ever read (`hb`
    None) or its heartbeat has not changed for `offline_after_s`. The coach's one ageing rule.
    """

    def __init__(self, offline_after_s: float):
        self.offline_after_s = offline_after_s
        self._last: dict[str, tuple[float, float]] = {}  # name -> (hb.time, seen at)

    def observe(self, name: str, hb: Heartbeat | None,
                now: float | None = None) -> tuple[WorkerState, float | None]:
        """The worker's state and heartbeat age in seconds (None if never seen)."""
        now = time.monotonic() if now is None else now
        if hb is not None:
            prev = self._last.get(name)
            if prev is None or prev[0] != hb.time:
                self._last[name] = (hb.time, now)
        seen = self._last.get(name)
        age = None if seen is None else now - seen[1]
        if hb is None or age is None or age > self.offline_after_s:
            return WorkerState.OFFLINE, age
        return hb.state, age

    def forget(self, name: str) -> None:
        self._last.pop(name, None)


# ----------------------------------------------------------------------------- status.txt


@dataclass
class WorkerRow:
    """One worker's line in status.txt."""

    name: str
    host: str
    state: WorkerState
    gpu: str = "-"  # "0", "1", "cpu", or a GPU name
    generation: int | None = None
    games: int = 0  # games collected from it (in the run's ledger)
    games_per_s: float = 0.0
    weight: float = 1.0
    share: float = 0.0  # fraction of self-play assigned, 0..1
    heartbeat_age_s: float | None = None
    restarts: int = 0
    last_error: str = ""
    played: int | None = None  # games its daemon finished since it started (heartbeat)


@dataclass
class StatusSnapshot:
    """Everything status.txt shows. Units: seconds, MB (1e6 bytes) per minute."""

    games_per_s: float = 0.0
    workers_active: int = 0
    workers_total: int = 0
    model_sync_s: float | None = None
    network_mb_per_min: float = 0.0
    generation: int | None = None
    window_games: int = 0
    window_positions: int = 0
    staleness_generations: float | None = None
    last_loss: float | None = None
    elo: float | None = None
    training_nodes: str = ""  # "node1 Training; node2 Benched 60s: why" (empty: none set up)
    trainer_error: str = ""  # the last failure of the trainer, while it keeps failing ("": none)
    run_hours: float | None = None  # hours the run has run, resumes included
    hours_limit: float = 0.0  # run.hours: the run stops there (0: no limit)
    batches_deferred: int = 0  # batches left in outboxes at the last listing (paced, per pass)
    games_repeated: int = 0  # games dropped from ingested batches: repeats of games before
    updated: str = ""  # UTC time of writing, "YYYY-MM-DD HH:MM:SS"
    finished: str = ""  # UTC time the run finished ("" while it runs)
    finished_after: str = ""  # why it finished: "run.hours 2", "run.iterations 2", "Ctrl-C"
    workers: list[WorkerRow] = field(default_factory=list)


_TITLE = "AZ-Go distributed status"
_COLUMNS = [  # (header, WorkerRow field)
    ("NAME", "name"),
    ("HOST", "host"),
    ("STATE", "state"),
    ("GPU", "gpu"),
    ("GEN", "generation"),
    ("GAMES", "games"),
    ("PLAYED", "played"),
    ("GAMES/S", "games_per_s"),
    ("WEIGHT", "weight"),
    ("SHARE", "share"),
    ("HEARTBEAT", "heartbeat_age_s"),
    ("RESTARTS", "restarts"),
    ("LAST ERROR", "last_error"),
]
_MAX_ERROR = 160  # room for a daemon's last line of stderr


_ESCAPES = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|.)?")


def printable(text: object, limit: int = 400) -> str:
    """One line of plain text: terminal escape sequences dropped, other control characters
    shown as '?', at most `limit` characters (text from a worker is untrusted).

    For showing text in a table cell or a log line, not for keeping it: the collector's
    reason files escape every control character instead and drop none
    (`training.fleet.collector._escaped`)."""
    text = _ESCAPES.sub("", str(text)).replace("\n", " ").replace("\t", " ")
    return "".join(c if c.isprintable() else "?" for c in text)[:limit]


def _opt(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _cell(row: WorkerRow, attr: str) -> str:
    v = getattr(row, attr)
    if attr == "state":
        return f"{v.indicator} {v.value}"
    if attr in ("generation", "played"):
        return _opt(v, "d")
    if attr == "games_per_s":
        return f"{v:.2f}"
    if attr == "weight":
        return f"{v:.2f}"
    if attr == "share":
        return f"{100 * v:.1f}%"
    if attr == "heartbeat_age_s":
        return "-" if v is None else f"{v:.1f}s"
    if attr == "last_error":
        text = " ".join(printable(v).split())  # one line
        return (text[: _MAX_ERROR - 3] + "...") if len(text) > _MAX_ERROR else (text or "-")
    text = " ".join(printable(v).split())
    return text or "-"


_MAX_TRAINER_ERROR = 400


def trainer_error_line(snap: StatusSnapshot) -> str:
    """The trainer's last failure as one line of plain text (at most 400 characters)."""
    text = " ".join(printable(snap.trainer_error, 4 * _MAX_TRAINER_ERROR).split())
    return text[: _MAX_TRAINER_ERROR - 3] + "..." if len(text) > _MAX_TRAINER_ERROR else text


def run_time(snap: StatusSnapshot) -> str:
    """`1.23 h of 2 h` (with a limit), `1.23 h`, or `-` before the coach has counted."""
    if snap.run_hours is None:
        return "-"
    return f"{snap.run_hours:.2f} h" + (f" of {snap.hours_limit:g} h" if snap.hours_limit > 0
                                        else "")


def finish_line(snap: StatusSnapshot) -> str:
    """`2026-11-27 23:10:00 UTC after run.hours 1; newest generation 35` for a finished run."""
    return (f"{snap.finished} UTC after {' '.join(printable(snap.finished_after).split())}; "
            f"newest generation {_opt(snap.generation, 'd')}")


_FINISHED_RE = re.compile(r"^(.*) UTC after (.*); newest generation (\S+)$")
_RUN_TIME_RE = re.compile(r"^(-|([0-9.]+) h( of ([0-9.e+]+) h)?)$")


def render_status(snap: StatusSnapshot) -> str:
    """The text of status.txt for `snap`."""
    updated = snap.updated or time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    lines = [f"{_TITLE} (updated {updated} UTC)"]
    if snap.finished:
        lines.append(f"Finished: {finish_line(snap)}")
    lines += [
        f"Games/second: {snap.games_per_s:.1f}",
        f"Workers active: {snap.workers_active}/{snap.workers_total}",
        "Model sync time: " + ("-" if snap.model_sync_s is None else f"{snap.model_sync_s:.1f}s"),
        f"Network usage: {snap.network_mb_per_min:.1f} MB/min",
        f"Generation: {_opt(snap.generation, 'd')}",
        f"Games in window: {snap.window_games}",
        f"Positions in window: {snap.window_positions}",
        f"Data staleness: {_opt(snap.staleness_generations, '.2f')} generations",
        f"Last loss: {_opt(snap.last_loss, '.4f')}",
        f"Elo: {_opt(snap.elo, '.1f')}",
        f"Run time: {run_time(snap)}",
        f"Batches deferred: {snap.batches_deferred}",
        f"Games repeated: {snap.games_repeated}",
    ]
    if snap.training_nodes:
        lines.append("Training nodes: " + " ".join(snap.training_nodes.split()))
    if snap.trainer_error:
        lines.append("Trainer error: " + trainer_error_line(snap))
    lines.append("")
    table = [[h for h, _ in _COLUMNS]] + [[_cell(r, a) for _, a in _COLUMNS] for r in snap.workers]
    widths = [max(len(row[i]) for row in table) for i in range(len(_COLUMNS))]
    for row in table:
        cells = [c.ljust(w) for c, w in zip(row[:-1], widths)] + [row[-1]]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def write_status(path: str | os.PathLike, snap: StatusSnapshot) -> None:
    """Atomically rewrite status.txt, so `watch cat` never shows half a file."""
    write_atomic(path, render_status(snap))


_HEADER_RE = re.compile(r"^([A-Za-z/ ]+): (.*)$")


def _num(text: str, kind, suffix: str = ""):
    text = text.strip()
    if suffix and text.endswith(suffix):
        text = text[: -len(suffix)].strip()
    if text == "-":
        return None
    return kind(text)


def parse_status_text(text: str) -> StatusSnapshot:
    """Parse the text `render_status` produced back into a StatusSnapshot."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith(_TITLE):
        raise StatusFormatError("status text does not start with its title line")
    snap = StatusSnapshot()
    m = re.search(r"\(updated (.*) UTC\)", lines[0])
    snap.updated = m.group(1) if m else ""
    i = 1
    try:
        while i < len(lines) and lines[i].strip():
            m = _HEADER_RE.match(lines[i])
            if not m:
                raise StatusFormatError(f"line {i + 1}: not 'Key: value': {lines[i]!r}")
            _take_header(snap, m.group(1), m.group(2))
            # unknown header keys are skipped: newer writers may add lines
            i += 1
    except ValueError as e:
        if isinstance(e, StatusFormatError):
            raise
        raise StatusFormatError(f"line {i + 1}: {lines[i]!r}: {e}") from e
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i >= len(lines):
        return snap
    header = lines[i]
    starts = []
    for title, _ in _COLUMNS:
        pos = header.find(title, starts[-1] + 1 if starts else 0)
        if pos < 0:
            raise StatusFormatError(f"line {i + 1}: table header lacks column {title!r}")
        starts.append(pos)
    for n, line in enumerate(lines[i + 1 :], start=i + 2):
        if not line.strip():
            continue
        cells = [
            line[s : (starts[k + 1] if k + 1 < len(starts) else None)].strip()
            for k, s in enumerate(starts)
        ]
        try:
            snap.workers.append(_row_from_cells(cells))
        except ValueError as e:
            raise StatusFormatError(f"line {n}: {line!r}: {e}") from e
    return snap


def _take_header(snap: StatusSnapshot, key: str, value: str) -> None:
    """Set the field of `snap` that header line `key: value` gives (an unknown key is
    skipped: newer writers may add lines); ValueError for a value that does not read."""
    if key == "Games/second":
        snap.games_per_s = float(value)
    elif key == "Workers active":
        a, b = value.split("/")
        snap.workers_active, snap.workers_total = int(a), int(b)
    elif key == "Model sync time":
        snap.model_sync_s = _num(value, float, "s")
    elif key == "Network usage":
        snap.network_mb_per_min = _num(value, float, "MB/min")
    elif key == "Generation":
        snap.generation = _num(value, int)
    elif key == "Games in window":
        snap.window_games = int(value)
    elif key == "Positions in window":
        snap.window_positions = int(value)
    elif key == "Data staleness":
        snap.staleness_generations = _num(value, float, "generations")
    elif key == "Last loss":
        snap.last_loss = _num(value, float)
    elif key == "Elo":
        snap.elo = _num(value, float)
    elif key == "Batches deferred":
        snap.batches_deferred = int(value)
    elif key == "Games repeated":
        snap.games_repeated = int(value)
    elif key == "Training nodes":
        snap.training_nodes = value
    elif key == "Trainer error":
        snap.trainer_error = value
    elif key == "Finished":
        m = _FINISHED_RE.match(value.strip())
        if not m:
            raise ValueError("not 'TIME UTC after WHY; newest generation N'")
        snap.finished, snap.finished_after = m.group(1), m.group(2)
    elif key == "Run time":
        m = _RUN_TIME_RE.match(value.strip())
        if not m:
            raise ValueError("not 'H h', 'H h of LIMIT h' or '-'")
        snap.run_hours = None if m.group(2) is None else float(m.group(2))
        snap.hours_limit = float(m.group(4)) if m.group(4) else 0.0


def _row_from_cells(c: list[str]) -> WorkerRow:
    return WorkerRow(
        name=c[0],
        host=c[1],
        state=WorkerState(c[2].split()[-1] if c[2].split() else c[2]),
        gpu=c[3],
        generation=_num(c[4], int),
        games=int(c[5]),
        played=_num(c[6], int),
        games_per_s=float(c[7]),
        weight=float(c[8]),
        share=float(c[9].rstrip("%")) / 100,
        heartbeat_age_s=_num(c[10], float, "s"),
        restarts=int(c[11]),
        last_error="" if c[12] == "-" else c[12],
    )


def read_status(path: str | os.PathLike) -> StatusSnapshot:
    """Read and parse a status.txt file."""
    with open(path, encoding="utf-8") as f:
        return parse_status_text(f.read())
