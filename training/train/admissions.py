"""The admission log: the batches the coach admitted, in order, for the long-lived trainer.

`run_dir/admitted.jsonl` (`RunDir.admissions`) holds one JSON line per admitted batch,
`{"seq": 1, "name": "worker1_000003_00000042.npz.zst", "positions": 812}`, seq counting up
from 1 without gaps. The coach appends (`AdmissionLog.admit`), only after its collector has
validated and ingested the batch into `replay/` (the ledger, quarantine and share caps are the
coach's; the trainer sees admitted batches only); the long-lived trainer reads
(`AdmissionReader.poll`) and records in its checkpoint the last seq it took in, so that a
resumed trainer takes every later line as new data and none before it again.

Atomicity: each line is written with one `write` on a file opened for appending and fsynced;
a write that comes up short (a full disk, a file-size limit) is cut back off and raised, so a
torn line never sits in the middle of the log; a reader takes complete lines only (ending in a
newline), so a line cut by a crash is never read, and the coach cuts such a torn tail off when
it opens the log again.

Bounds: a line is at most `MAX_LINE_BYTES`, a poll reads at most `MAX_POLL_BYTES`; a line
that is not an admission (bad JSON, a seq out of order, a name that is not a batch file
name) is an `AdmissionError` naming the file and the seq.

`TrainerState` is the other direction: what the long-lived trainer's rank 0 says of itself in
`run_dir/trainer.json` (`RunDir.trainer_state`), written atomically when its counters change,
read by the coach when it starts a trainer again (what the last one had reached).

It must not: import torch, read batch files, or decide what is admitted (the coach does).
"""

from __future__ import annotations

import errno
import json
import os
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from distributed.transfer import write_json_atomic
from training.go.records import parse_batch_name

MAX_LINE_BYTES = 4096
MAX_POLL_BYTES = 1 << 20
MAX_STATE_BYTES = 1 << 16


class AdmissionError(Exception):
    """The admission log holds something that is not an admission; names the file."""


@dataclass(frozen=True)
class Admission:
    seq: int
    name: str
    positions: int


def _parse(path: Path, line: bytes, expected_seq: int) -> Admission:
    try:
        obj = json.loads(line)
        adm = Admission(int(obj["seq"]), str(obj["name"]), int(obj["positions"]))
    except (ValueError, KeyError, TypeError) as e:
        raise AdmissionError(f"{path}: line {expected_seq} is not an admission ({e}); the "
                             "coach writes this file: do not edit it") from None
    if adm.seq != expected_seq:
        raise AdmissionError(f"{path}: seq {adm.seq} where {expected_seq} was expected; the "
                             "log is out of order (do not edit it)")
    try:
        parse_batch_name(adm.name)
    except ValueError as e:
        raise AdmissionError(f"{path}: seq {adm.seq}: {e}") from None
    if adm.positions < 0:
        raise AdmissionError(f"{path}: seq {adm.seq}: negative positions {adm.positions}")
    return adm


class AdmissionReader:
    """Reads the admission log from where it left off (the trainer's side)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.offset = 0  # bytes of complete lines read
        self.seq = 0  # the last seq read

    def poll(self, max_bytes: int = MAX_POLL_BYTES) -> list[Admission]:
        """The complete lines written since the last poll (at most about `max_bytes`)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(max_bytes)
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n")
        if end < 0:
            if len(data) > MAX_LINE_BYTES:
                raise AdmissionError(f"{self.path}: a line over {MAX_LINE_BYTES} bytes at "
                                     f"byte {self.offset}; not an admission log")
            return []  # a line still being written
        out = []
        for line in data[:end].split(b"\n"):
            if len(line) > MAX_LINE_BYTES:
                raise AdmissionError(f"{self.path}: a line over {MAX_LINE_BYTES} bytes after "
                                     f"seq {self.seq}; not an admission log")
            adm = _parse(self.path, line, self.seq + 1)
            self.seq = adm.seq
            out.append(adm)
        self.offset += end + 1
        return out


class AdmissionLog:
    """The coach's side: the admitted names, and `admit` to append one."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._cut_torn_tail()
        reader = AdmissionReader(self.path)
        self.names: set[str] = set()
        while batch := reader.poll():
            self.names.update(a.name for a in batch)
        self.seq = reader.seq

    def _cut_torn_tail(self) -> None:
        """A line cut by a crash (no newline at the end) is cut off: it was never read."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return
        if size == 0:
            return
        with open(self.path, "rb+") as f:
            tail = max(0, size - MAX_LINE_BYTES - 1)
            f.seek(tail)
            data = f.read()
            if data.endswith(b"\n"):
                return
            cut = data.rfind(b"\n")
            if cut < 0 and tail > 0:
                raise AdmissionError(f"{self.path}: its last line is over {MAX_LINE_BYTES} "
                                     "bytes; not an admission log (move it aside)")
            f.truncate(tail + cut + 1 if cut >= 0 else 0)

    def admit(self, name: str, positions: int) -> int:
        """Append `name` (a batch now in replay/) with its positions; returns its seq."""
        parse_batch_name(name)  # a bug if not: the collector ingested it under this name
        line = json.dumps({"seq": self.seq + 1, "name": name, "positions": int(positions)},
                          sort_keys=True).encode() + b"\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            end = os.fstat(fd).st_size
            try:
                written = os.write(fd, line)
                if written != len(line):
                    raise OSError(errno.ENOSPC, f"{self.path}: only {written} of {len(line)} "
                                  "bytes of an admission were written (is the disk full?)")
                os.fsync(fd)
            except OSError:
                os.ftruncate(fd, end)  # never leave a torn line for the next one to follow
                raise
        finally:
            os.close(fd)
        self.seq += 1
        self.names.add(name)
        return self.seq


@dataclass(frozen=True)
class TrainerState:
    """trainer.json: the long-lived trainer's generation, global step, last admission taken
    in, the ratio's counters and the ratio, and whether it waits for data or has stopped."""

    generation: int = -1
    global_step: int = 0
    admitted_seq: int = 0
    new_samples: int = 0
    trained_samples: int = 0
    samples_per_new_sample: float = 0.0
    waiting: bool = False
    stopped: bool = False

    def write(self, path: str | os.PathLike) -> None:
        """Atomically, with the time it was written."""
        write_json_atomic(Path(path), {**asdict(self), "time": time.time()})

    @classmethod
    def read(cls, path: str | os.PathLike) -> TrainerState | None:
        """The state at `path`, or None when there is none or it is not one (at most
        `MAX_STATE_BYTES` are read; keys it does not know are left out)."""
        try:
            with open(path, "rb") as f:
                obj = json.loads(f.read(MAX_STATE_BYTES))
            if not isinstance(obj, dict):
                return None
            return cls(**{f.name: type(f.default)(obj[f.name]) for f in fields(cls)
                          if f.name in obj})
        except (OSError, ValueError, TypeError):
            return None
