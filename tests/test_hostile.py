"""Hostile input: every bad batch, name, host key, shell string and config is refused clearly.

Batches go through the REAL collection path: `training.fleet.collector.Collector` with the coach's
validator (`validate_with_records`), from a local worker's outbox (`LocalSource`) and over SFTP
from a real loopback sshd (tests/sshd.py) through the source the coach's SSH fleet collects
with: `SSHFleet(...).backend(name).source()`, an `SSHSource` on the worker's own outbox
`<remote_dir>/workers/<name>/outbox`, with its connector, size cap and deadlines. For each
hostile batch the test checks: rejected with a reason naming the file, its bytes in
quarantine (`Collector.quarantine_path`) with a `.reason.txt` beside, a `rejected` ledger line
counted against the worker that listed it (`Collector.tally`), nothing in `replay/`, and the
worker's copy removed; `records.read_batch` gives the expected `BatchError.kind`.
Files that are not regular files, grow, trickle or crash the validator, names owned by another
worker, and floods of junk are in the second half (bounded time, bytes and memory).

Every case prints one line `hostile case=<case> kind=<kind> rejected=1 ingested=0`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from configs import Config, ConfigError, WorkerSpec, load_config
from distributed.remote import WorkerPaths
from distributed.transfer import compress_bytes, write_atomic
from tests.sshd import keygen, make_config, sshd_server  # noqa: F401 - sshd_server: fixture
from training.go import records
from training.fleet.collector import (
    MAX_BATCH_BYTES,
    Collector,
    LocalSource,
    SourceError,
)
from training.fleet.validation import game_key, validate_with_records

REPO = Path(__file__).resolve().parent.parent
N, KOMI = 5, 0.5  # configs/tiny.yaml
WORKER = "w1"


# ----------------------------------------------------------------------------- batch makers


def _games(n: int = 3, *, seed: int = 0, generation: int = 0) -> list[records.GameRecord]:
    rng = np.random.default_rng(seed)
    return [records.random_record(N, KOMI, rng, generation=generation, simulations=8, seed=i)
            for i in range(n)]


def _arrays(recs: list[records.GameRecord], worker: str = WORKER) -> dict[str, np.ndarray]:
    meta = records.BatchMeta.from_records(worker, recs)
    with np.load(io.BytesIO(records.encode_batch(recs, meta)), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _write_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    write_atomic(path, compress_bytes(buf.getvalue()))


def _good(outbox: Path, seq: int, *, worker: str = WORKER, generation: int = 0,
          seed: int | None = None) -> str:
    """A valid batch; its games differ from every other `seed`'s (default: the seq)."""
    recs = _games(seed=seq if seed is None else seed, generation=generation)
    name = records.batch_name(worker, generation, seq)
    records.write_batch(outbox / name, recs, records.BatchMeta.from_records(worker, recs))
    return name


def _mutated(fn: Callable[[dict[str, np.ndarray]], None]) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        a = _arrays(_games())
        fn(a)
        _write_arrays(path, a)
    return make


def _illegal_move(a: dict) -> None:
    moves = a["moves"].copy()
    moves[1] = moves[0]  # the second move on the first move's (occupied) point
    a["moves"] = moves
    a["visits"][1, moves[1]] += 1


def _nan_visits(a: dict) -> None:
    v = a["visits"].astype(np.float32)
    v[2, 0] = np.nan
    a["visits"] = v


def _negative_visits(a: dict) -> None:
    v = a["visits"].astype(np.int32)
    v[0, 3] = -5
    a["visits"] = v


def _wrong_shape(a: dict) -> None:
    a["visits"] = a["visits"][:, :-1]  # P-1 policy entries


def _wrong_dtype(a: dict) -> None:
    a["moves"] = a["moves"].astype(np.float64)


def _result_vs_score(a: dict) -> None:
    r = a["result"].copy()
    r[0] = -r[0] if r[0] != 0 else 1
    a["result"] = r


def _pickle_payload(path: Path) -> None:
    """An npz member that is a pickled object array (np.load would run its code if allowed)."""
    a = _arrays(_games())
    a["moves"] = np.array([os.system, "touch /tmp/azgo_pwned"], dtype=object)
    buf = io.BytesIO()
    np.savez(buf, **a)  # object arrays are pickled by np.save
    write_atomic(path, compress_bytes(buf.getvalue()))


def _zstd_bomb(path: Path) -> None:
    """300 MB of zeros in a ~10 KB zstd frame without a declared content size."""
    import zstandard  # HACK: only transfer.py uses zstandard in the product; a test makes bombs

    cobj = zstandard.ZstdCompressor(level=1, write_content_size=False).compressobj()
    chunk = bytes(1 << 20)
    parts = [cobj.compress(chunk) for _ in range(300)]
    parts.append(cobj.flush())
    write_atomic(path, b"".join(parts))


def _npz_bomb(path: Path) -> None:
    """A small zstd layer over a zip whose deflated member inflates to 300 MB."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        with zf.open("moves.npy", "w", force_zip64=True) as f:
            header = io.BytesIO()
            np.lib.format.write_array_header_1_0(
                header, {"descr": "<i2", "fortran_order": False, "shape": (150 << 20,)})
            f.write(header.getvalue())
            chunk = bytes(1 << 20)
            for _ in range(300):
                f.write(chunk)
    write_atomic(path, compress_bytes(buf.getvalue()))


def _not_zstd(path: Path) -> None:
    write_atomic(path, b"#!/bin/sh\nrm -rf /\n")


def _truncated(path: Path) -> None:
    recs = _games()
    data = compress_bytes(records.encode_batch(recs, records.BatchMeta.from_records(WORKER, recs)))
    write_atomic(path, data[: len(data) // 2])


CASES: dict[str, tuple[Callable[[Path], None], set[str], str]] = {
    # case: (maker, acceptable BatchError kinds, a word the reason must hold)
    "illegal_move": (_mutated(_illegal_move), {"illegal_move"}, "move 1"),
    "nan_visits": (_mutated(_nan_visits), {"visits_nan"}, "NaN"),
    "negative_visits": (_mutated(_negative_visits), {"visits_negative"}, "negative"),
    "wrong_shape": (_mutated(_wrong_shape), {"shape"}, "visits"),
    "wrong_dtype": (_mutated(_wrong_dtype), {"dtype"}, "moves"),
    "result_vs_score": (_mutated(_result_vs_score), {"result_mismatch", "score_mismatch"},
                        "game 0"),
    "pickle_payload": (_pickle_payload, {"pickle"}, "pickle"),
    "zstd_bomb": (_zstd_bomb, {"too_large"}, "decompress"),
    "npz_bomb": (_npz_bomb, {"too_large"}, "limit"),
    "not_zstd": (_not_zstd, {"corrupt_zstd"}, "zstd"),
    "truncated": (_truncated, {"corrupt_zstd"}, "zstd"),
}


# ----------------------------------------------------------------------------- helpers


def _collector(run_dir: Path, newest_generation: int = 0) -> Collector:
    """The collector as the coach builds it (newest published generation: 0)."""
    return Collector(run_dir, validate_with_records(
        N, KOMI, max_generation=lambda: newest_generation))


def _ledger(run_dir: Path) -> list[dict]:
    path = run_dir / "ledger.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _assert_rejected(run_dir: Path, col: Collector, res, name: str, word: str,
                     worker: str = WORKER, *, kept: bool = True, ingested: int = 0) -> str:
    """`name` rejected with `word` in its reason, counted once; `ingested` batches before."""
    assert res.rejected == [name] and res.ingested == [], (res.rejected, res.ingested)
    assert len(os.listdir(run_dir / "replay")) == ingested, "a hostile batch reached replay/"
    where = col.quarantine_path(worker, name)
    assert where.exists() == kept, (where, kept)
    reason = where.with_name(where.name + ".reason.txt").read_text()
    shown = repr(name)[1:-1]
    assert (name in reason or shown[:40] in reason) and word in reason, reason
    lines = [e for e in _ledger(run_dir) if name in (e["name"], e.get("listed_name"))]
    assert len(lines) == 1 and lines[0]["status"] == "rejected" and lines[0]["worker"] == worker
    rejected = sum(e["status"] == "rejected" for e in _ledger(run_dir))
    assert col.tally[worker].rejected == rejected and col.tally[worker].batches == ingested
    assert _collector(run_dir).tally[worker].rejected == rejected  # counted from the ledger
    return reason


@pytest.fixture
def outbox(tmp_path: Path) -> Path:
    d = tmp_path / "worker" / "outbox"
    d.mkdir(parents=True)
    return d


def _ssh_fleet(cfg: Config, srv, tmp_path: Path, known_hosts: Path | None = None, **dist):
    """The coach's SSH fleet for worker `WORKER` on the loopback sshd `srv`, its folder under
    `tmp_path/remote` (short timeouts: `tests.sshd.make_config`). Nothing is started."""
    from training.fleet.ssh_workers import SSHFleet

    spec = WorkerSpec(host=srv.addr, user=srv.user, name=WORKER, port=srv.port,
                      key_path=str(srv.client_key), remote_dir=str(tmp_path / "remote"))
    dist_cfg = make_config([spec], known_hosts or srv.known_hosts, **dist)
    coach = tmp_path / "coach"
    coach.mkdir(exist_ok=True)
    return SSHFleet(dataclasses.replace(cfg, distributed=dist_cfg), coach,
                    coach / "config.yaml")


@pytest.fixture
def ssh_worker(sshd_server, tiny_cfg, tmp_path):
    """(the worker's `SSHBackend`, its outbox as a local path): the outbox the backend's
    `source()` lists, fetches from and deletes in over SFTP."""
    fleet = _ssh_fleet(tiny_cfg, sshd_server, tmp_path)
    outbox = Path(WorkerPaths(str(tmp_path / "remote"), WORKER).outbox)
    outbox.mkdir(parents=True)
    try:
        yield fleet.backend(WORKER), outbox
    finally:
        fleet.close()


@pytest.fixture(params=["local", pytest.param("ssh", marks=pytest.mark.ssh)])
def outbox_source(request, tmp_path):
    """(kind, outbox folder, the source the coach collects it with): a local worker's
    `LocalSource`, and an SSH worker's `SSHSource` from its backend."""
    if request.param == "local":
        d = tmp_path / "worker" / "outbox"
        d.mkdir(parents=True)
        yield "local", d, LocalSource(d)
    else:
        backend, d = request.getfixturevalue("ssh_worker")
        yield "ssh", d, backend.source()


# ----------------------------------------------------------------------------- batches


def test_good_batch_is_ingested_as_control(run_dir, outbox):
    name = _good(outbox, 0)
    col = _collector(run_dir)
    res = col.collect(WORKER, LocalSource(outbox))
    assert res.ingested == [name] and res.rejected == [] and res.games == 3
    assert (run_dir / "replay" / name).exists() and os.listdir(outbox) == []


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_batch_is_rejected_quarantined_and_counted(case, run_dir, outbox_source):
    kind, outbox, source = outbox_source
    make, kinds, word = CASES[case]
    name = records.batch_name(WORKER, 0, 7)
    make(outbox / name)
    with pytest.raises(records.BatchError) as err:
        records.read_batch(outbox / name)
    assert err.value.kind in kinds, (err.value.kind, str(err.value))
    col = _collector(run_dir)
    res = col.collect(WORKER, source)
    _assert_rejected(run_dir, col, res, name, word)
    assert os.listdir(outbox) == [], "the worker's copy of a rejected batch must be removed"
    assert not Path("/tmp/azgo_pwned").exists()
    print(f"hostile case={case} source={kind} kind={err.value.kind} rejected=1 ingested=0")


def test_bad_batch_does_not_stop_the_good_ones_around_it(run_dir, outbox):
    good = [_good(outbox, 0), _good(outbox, 2, seed=1)]
    bad = records.batch_name(WORKER, 0, 1)
    _mutated(_illegal_move)(outbox / bad)
    col = _collector(run_dir)
    res = col.collect(WORKER, LocalSource(outbox))
    assert res.ingested == good and res.rejected == [bad]
    assert sorted(os.listdir(run_dir / "replay")) == good
    assert col.tally[WORKER].batches == 2 and col.tally[WORKER].rejected == 1


def test_other_board_size_or_komi_is_rejected(run_dir, outbox):
    rng = np.random.default_rng(3)
    recs = [records.random_record(7, KOMI, rng, simulations=8)]
    name = records.batch_name(WORKER, 0, 0)
    records.write_batch(outbox / name, recs, records.BatchMeta.from_records(WORKER, recs))
    col = _collector(run_dir)
    reason = _assert_rejected(run_dir, col, col.collect(WORKER, LocalSource(outbox)), name,
                              "7x7")
    assert "check the worker's config" in reason


def test_duplicate_name_offered_again_is_ingested_once(run_dir, outbox):
    name = _good(outbox, 0)
    kept = (outbox / name).read_bytes()
    col = _collector(run_dir)
    assert col.collect(WORKER, LocalSource(outbox)).ingested == [name]
    (outbox / name).write_bytes(kept)  # the same file again (the coach died before its delete)
    res = col.collect(WORKER, LocalSource(outbox))
    assert res.ingested == [] and res.duplicates == 1 and os.listdir(outbox) == []
    (outbox / name).write_bytes(kept)
    res = _collector(run_dir).collect(WORKER, LocalSource(outbox))  # after a coach restart
    assert res.ingested == [] and res.duplicates == 1
    assert [e["name"] for e in _ledger(run_dir)] == [name]
    assert col.tally[WORKER].batches == 1
    print("hostile case=duplicate_name ingested=1 offered=3 duplicates_ingested=0")


def test_other_bytes_under_a_known_name_are_quarantined_not_deleted_unread(run_dir, outbox):
    """A wiped worker host starts its batch numbers again: its new games under an old name
    are kept in quarantine with the reason, never silently deleted as "already ingested"."""
    name = _good(outbox, 0)
    col = _collector(run_dir)
    assert col.collect(WORKER, LocalSource(outbox)).ingested == [name]
    original = (run_dir / "replay" / name).read_bytes()
    _good(outbox, 0, seed=9)  # same name, other games
    fresh = (outbox / name).read_bytes()
    res = col.collect(WORKER, LocalSource(outbox))
    assert res.rejected == [name] and res.duplicates == 0 and os.listdir(outbox) == []
    assert (run_dir / "replay" / name).read_bytes() == original
    kept = list((run_dir / "quarantine" / "reused" / WORKER).glob("*.bin"))
    assert [k.read_bytes() for k in kept] == [fresh]
    reason = kept[0].with_name(kept[0].name + ".reason.txt").read_text()
    assert name in reason and "--min-seq" in reason
    assert col.tally[WORKER].rejected == 1 and _collector(run_dir).tally[WORKER].rejected == 1


def test_name_of_another_worker_is_rejected(run_dir, outbox):
    """A worker may only deliver batches under its own name (no impersonation)."""
    name = _good(outbox, 0, worker="w2")
    col = _collector(run_dir)
    _assert_rejected(run_dir, col, col.collect(WORKER, LocalSource(outbox)), name, "w1")


ODD_NAMES = [
    "w1;touch PWNED_000000_00000001.npz.zst",
    "w1 x_000000_00000002.npz.zst",
    "w1\nx_000000_00000003.npz.zst",
    "wörker_000000_00000004.npz.zst",
    "w1_000000_00000005.npz.zst.sh.npz.zst",
    "$(touch PWNED)_000000_00000006.npz.zst",
    "w1_0_1.npz.zst",
    "-rf_000000_00000007.npz.zst",
]


@pytest.mark.parametrize("odd", ODD_NAMES, ids=lambda s: ascii(s)[1:25])
def test_odd_file_name_in_outbox_is_rejected(odd, run_dir, outbox, tmp_path):
    _good(outbox, 0)
    os.replace(outbox / records.batch_name(WORKER, 0, 0), outbox / odd)
    col = _collector(run_dir)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        res = col.collect(WORKER, LocalSource(outbox))
    finally:
        os.chdir(cwd)
    _assert_rejected(run_dir, col, res, odd, "not a batch name")
    assert not list(tmp_path.rglob("PWNED*")), "a name ran as a command"
    print(f"hostile case=odd_name name={odd!r} rejected=1 ingested=0")


class _ListingSource(LocalSource):
    """A worker (or a compromised SFTP server) whose listing holds names with folders."""

    def __init__(self, outbox: Path, extra: list[str]):
        super().__init__(outbox)
        self.extra = extra

    def list_batches(self) -> list[str]:
        return super().list_batches() + self.extra


TRAVERSAL = ["../../escaped_000000_00000000.npz.zst", "/tmp/abs_000000_00000000.npz.zst",
             "sub/w1_000000_00000009.npz.zst"]


@pytest.mark.parametrize("evil", TRAVERSAL)
def test_path_traversal_name_writes_nothing_outside_the_run(evil, tmp_path):
    """A listed name with a folder part must not be fetched from or written outside the
    worker's outbox and the run's quarantine."""
    run_dir = tmp_path / "a" / "b" / "run"
    run_dir.mkdir(parents=True)
    outbox = tmp_path / "a" / "b" / "worker" / "outbox"
    outbox.mkdir(parents=True)
    (outbox / "sub").mkdir()
    target = (outbox / evil) if not evil.startswith("/") else Path(evil)
    target.parent.mkdir(parents=True, exist_ok=True)
    _good(target.parent, 0)
    os.replace(target.parent / records.batch_name(WORKER, 0, 0), target)
    before = {p for p in tmp_path.rglob("*")}
    col = _collector(run_dir)
    res = col.collect(WORKER, _ListingSource(outbox, [evil]))
    after = {p for p in tmp_path.rglob("*")}
    created = sorted(str(p.relative_to(tmp_path)) for p in after - before
                     if run_dir not in p.parents or p.parent == run_dir)
    allowed = {str((run_dir / d).relative_to(tmp_path)) for d in
               ("replay", "quarantine", "incoming", "ledger.jsonl")}
    assert set(created) <= allowed, f"files created outside the run's folders: {created}"
    assert res.ingested == [] and os.listdir(run_dir / "replay") == []
    assert target.exists(), "the collector deleted a file outside the worker's outbox"
    if evil.startswith("/"):
        target.unlink()


def test_generation_newer_than_exists_is_rejected(run_dir, outbox):
    """A batch claiming a model generation the coach never published is not trainable."""
    name = _good(outbox, 0, generation=99)
    with pytest.raises(records.BatchError) as err:
        records.read_batch(outbox / name, max_generation=0)
    assert err.value.kind == "generation_too_new"
    col = _collector(run_dir)
    res = col.collect(WORKER, LocalSource(outbox), current_generation=0)
    _assert_rejected(run_dir, col, res, name, "newer")


# ----------------------------------------------------------------------------- valid-looking data


RULES = records.BatchRules(move_cap=2 * N * N, max_simulations=16, max_games=5,
                           early_pass=False, cpu_budget_s=30.0)


def _ruled_collector(run_dir: Path, rules: records.BatchRules = RULES) -> Collector:
    return Collector(run_dir, validate_with_records(N, KOMI, max_generation=lambda: 0,
                                                    rules=rules))


def _write(outbox: Path, seq: int, recs: list[records.GameRecord], **meta) -> str:
    name = records.batch_name(WORKER, 0, seq)
    m = dataclasses.replace(records.BatchMeta.from_records(WORKER, recs), **meta)
    records.write_batch(outbox / name, recs, m)
    return name


def _honest(n: int, seed: int) -> list[records.GameRecord]:
    """Random games as the run's self-play ends them: a side passes first only when every
    legal point would fill one of its own single-point eyes."""
    from training.go.rules import Position, neighbors

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        pos = Position(N, KOMI)
        while not pos.is_over():
            real = [q for q in range(N * N) if pos.board[q] == 0 and pos.is_legal(q)
                    and not all(pos.board[r] == pos.to_play for r in neighbors(N)[q])]
            pos.play(int(rng.choice(real)) if real and pos.passes == 0 else N * N)
        t, score = len(pos.moves), pos.score()
        out.append(records.GameRecord(
            board_size=N, komi=KOMI, moves=np.array(pos.moves, np.int16),
            visits=np.eye(N * N + 1, dtype=np.uint16)[pos.moves] * 8,
            result=int((score > 0) - (score < 0)), score=float(score), resigned=False,
            resign_disabled=False, would_resign_as=0, generation=0, seed=1000 * seed + i,
            simulations=8, values=np.zeros(t, np.float16), full_search=np.ones(t, np.bool_)))
    return out


@pytest.mark.parametrize("created", [float("inf"), float("nan"), 4e9, -1.0, 10**400],
                         ids=["inf", "nan", "year2096", "negative", "huge_int"])
def test_batch_time_that_is_no_time_is_refused(created, run_dir, outbox):
    name = _write(outbox, 0, _games(), created=created)
    col = _collector(run_dir)
    _assert_rejected(run_dir, col, col.collect(WORKER, LocalSource(outbox)), name, "created")


def test_same_bytes_under_a_new_name_are_refused(run_dir, outbox):
    first = _good(outbox, 0)
    col = _collector(run_dir)
    assert col.collect(WORKER, LocalSource(outbox)).ingested == [first]
    again = records.batch_name(WORKER, 0, 1)
    (outbox / again).write_bytes((run_dir / "replay" / first).read_bytes())
    res = col.collect(WORKER, LocalSource(outbox))
    assert "same bytes as " + first in _assert_rejected(run_dir, col, res, again, again,
                                                        ingested=1)
    # after a restart the ledger still knows the content
    third = records.batch_name(WORKER, 0, 2)
    (outbox / third).write_bytes((run_dir / "replay" / first).read_bytes())
    col = _collector(run_dir)
    _assert_rejected(run_dir, col, col.collect(WORKER, LocalSource(outbox)), third, "same bytes",
                     ingested=1)


def _stored_keys(path: Path) -> list[str]:
    """The game keys of the games a stored batch file holds."""
    return [game_key(g.moves) for g in records.read_batch(path)[1]]


def test_a_repeated_game_is_dropped_and_the_rest_of_its_batch_ingested(run_dir, outbox):
    """An honest worker plays the same short game twice now and then: the repeat costs that
    game, counted in the ledger and the tally, not the batch, and not the worker's budget."""
    games = _games(4, seed=5)
    first = _write(outbox, 0, games[:2])
    col = _collector(run_dir)
    assert col.collect(WORKER, LocalSource(outbox)).ingested == [first]
    mixed = _write(outbox, 1, [games[2], games[1]])  # one new game, one seen
    sent = hashlib.sha256((outbox / mixed).read_bytes()).hexdigest()
    res = col.collect(WORKER, LocalSource(outbox))
    assert res.ingested == [mixed] and res.rejected == [] and res.repeats == 1
    assert res.games == 1 and res.positions == games[2].num_moves
    assert _stored_keys(run_dir / "replay" / mixed) == [game_key(games[2].moves)]
    twice = _write(outbox, 2, [games[3], games[3]])  # within one batch: the first is kept
    res = col.collect(WORKER, LocalSource(outbox))
    assert res.ingested == [twice] and res.repeats == 1 and res.games == 1
    assert _stored_keys(run_dir / "replay" / twice) == [game_key(games[3].moves)]
    line = {e["name"]: e for e in _ledger(run_dir)}
    assert (line[mixed]["repeats"], line[mixed]["games"]) == (1, 1)
    assert line[mixed]["game_keys"] == [game_key(games[2].moves)]
    assert line[mixed]["sha256"] == sent  # the worker's bytes, not the rewritten file's
    assert line[mixed]["size"] == (run_dir / "replay" / mixed).stat().st_size
    for c in (col, _collector(run_dir)):  # counted from the ledger after a restart too
        t = c.tally[WORKER]
        assert (t.batches, t.games, t.repeats, t.rejected) == (3, 4, 2, 0)
    assert not os.listdir(outbox)


def test_a_batch_of_nothing_but_repeats_is_refused(run_dir, outbox):
    games = _games(2, seed=5)
    first = _write(outbox, 0, games)
    col = _collector(run_dir)
    assert col.collect(WORKER, LocalSource(outbox)).ingested == [first]
    again = _write(outbox, 1, [games[1], games[0]])
    reason = _assert_rejected(run_dir, col, col.collect(WORKER, LocalSource(outbox)), again,
                              "every game repeats", ingested=1)
    assert "game 0 repeats a game of " + first in reason


def test_a_dropped_repeat_leaves_a_sidecar_of_the_games_kept(run_dir, outbox):
    """The trainer reads the sidecar the coach writes at ingest: it holds the kept games."""
    from training.learn.replay_buffer import sidecar_dir

    games = _games(3, seed=8)
    cache = sidecar_dir(run_dir / "replay")
    col = Collector(run_dir, validate_with_records(N, KOMI, sidecar_dir=cache,
                                                   max_generation=lambda: 0))
    _write(outbox, 0, games[:1])
    assert len(col.collect(WORKER, LocalSource(outbox)).ingested) == 1
    mixed = _write(outbox, 1, [games[0], games[1], games[2]])
    assert col.collect(WORKER, LocalSource(outbox)).ingested == [mixed]
    info = json.loads((cache / mixed.removesuffix(records.BATCH_SUFFIX) / "info.json")
                      .read_text())
    assert (info["games"], info["positions"]) == (2, games[1].num_moves + games[2].num_moves)


def test_the_same_moves_under_a_new_seed_are_a_repeat(run_dir, outbox):
    """A game's key is its moves: the seed a worker writes does not make a game new."""
    games = _games(3, seed=6)
    first = _write(outbox, 0, games[:2])
    col = _collector(run_dir)
    assert col.collect(WORKER, LocalSource(outbox)).ingested == [first]
    reseeded = _write(outbox, 1, [dataclasses.replace(games[1], seed=games[1].seed + 12345)])
    _assert_rejected(run_dir, col, col.collect(WORKER, LocalSource(outbox)), reseeded,
                     "repeats a game of " + first, ingested=1)
    twice = _write(outbox, 2, [games[2], dataclasses.replace(games[2], seed=99)])
    res = col.collect(WORKER, LocalSource(outbox))
    assert res.ingested == [twice] and res.repeats == 1 and res.games == 1


def test_a_meta_of_megabytes_is_refused_from_its_header(tmp_path):
    """A `meta` of two million characters (valid JSON) is refused from its npy header: it is
    never decoded into a string nor parsed."""
    arrays = _arrays(_games(1, seed=3))
    meta = json.loads(str(arrays["meta"]))
    meta["worker"] = "w" * 2_000_000
    arrays["meta"] = np.array(json.dumps(meta))
    path = tmp_path / records.batch_name(WORKER, 0, 0)
    _write_arrays(path, arrays)
    raw = path.read_bytes()
    with _peak_python_memory() as unpacked:  # the zstd layer alone: the floor
        records.decompress_bytes(raw, records.DEFAULT_MAX_BYTES)
    with _peak_python_memory() as peak:
        with pytest.raises(records.BatchError, match="characters, more than 4096") as err:
            records.decode_batch(raw, path, rules=RULES)
    assert err.value.kind == "bad_meta"
    assert peak["mb"] < 1.1 * unpacked["mb"], (peak["mb"], unpacked["mb"])


def test_the_zstd_layer_is_decompressed_no_further_than_the_rules_allow(run_dir, outbox):
    """A batch whose zstd layer unpacks to more than any batch of the run can hold (here an
    extra array of 4 MB of zeros beside 5x5 games) is refused while streaming, before it is
    held in memory, not after 256 MiB."""
    bound = records.decompressed_bound(RULES, N)
    arrays = _arrays(_games(2, seed=4))
    arrays["padding"] = np.zeros(4 << 20, np.uint8)
    name = records.batch_name(WORKER, 0, 0)
    _write_arrays(outbox / name, arrays)
    assert bound < 4 << 20 < records.DEFAULT_MAX_BYTES
    col = _ruled_collector(run_dir)
    _assert_rejected(run_dir, col, col.collect(WORKER, LocalSource(outbox)), name,
                     "cannot decompress within bounds")


def test_the_decompressed_bound_holds_the_largest_honest_batch():
    """The bound is no tighter than what the rules allow, and not loose: `max_games` games
    at the move cap, every optional array present (configs/config.yaml's 9x9 rules), fill it
    but for the room kept for headers."""
    n, rules = 9, records.BatchRules(move_cap=162, max_games=164)
    rng = np.random.default_rng(0)
    rec = records.random_record(n, 7.0, rng, simulations=8, seed=0)
    t = rules.move_cap  # every game's arrays padded to the move cap: the largest a batch is
    rec = dataclasses.replace(
        rec, moves=np.resize(rec.moves, t), visits=np.resize(rec.visits, (t, n * n + 1)),
        values=np.zeros(t, np.float16), full_search=np.ones(t, np.bool_),
        surprise=np.zeros(t, np.float16))
    recs = [rec] * rules.max_games
    size = len(records.encode_batch(recs, records.BatchMeta.from_records(WORKER, recs)))
    bound = records.decompressed_bound(rules, n)
    assert size <= bound < size + (1 << 20) + (64 << 10), (size, bound)


def test_games_per_batch_is_checked_before_the_arrays_are_decoded(tmp_path):
    """A batch of 100,000 games (the run holds 5 a batch) is refused from its arrays'
    headers: the decoded arrays never sit in memory beside the decompressed bytes."""
    arrays = _arrays(_games(1, seed=3))
    g = 100_000
    arrays["offsets"] = np.arange(g + 1, dtype=np.int64)
    for key in ("moves", "values", "full_search", "surprise"):
        arrays[key] = np.resize(arrays[key], g)
    arrays["visits"] = np.resize(arrays["visits"], (g, arrays["visits"].shape[1]))
    for key in ("result", "score", "resigned", "resign_disabled", "would_resign_as",
                "board_size", "komi", "generation", "seed", "simulations"):
        arrays[key] = np.resize(arrays[key], g)
    path = tmp_path / records.batch_name(WORKER, 0, 0)
    _write_arrays(path, arrays)
    raw = path.read_bytes()
    with _peak_python_memory() as unpacked:  # the zstd layer alone: the floor
        size = len(records.decompress_bytes(raw, records.DEFAULT_MAX_BYTES))
    with _peak_python_memory() as peak:
        with pytest.raises(records.BatchError, match="100000 games, more than") as err:
            records.decode_batch(raw, path, rules=RULES)
    assert err.value.kind == "too_many_games"
    print(f"games check: decompressed={size / 1e6:.1f} MB, peak of the zstd layer "
          f"{unpacked['mb']:.1f} MB, of the refusal {peak['mb']:.1f} MB")
    assert peak["mb"] < 1.1 * unpacked["mb"], (peak["mb"], unpacked["mb"])
    long = _arrays(_games(1, seed=3))  # 5 games' worth of offsets, 10^5 moves
    long["offsets"] = np.array([0, 1, 2, 3, 4, g], np.int64)
    for key in ("moves", "values", "full_search", "surprise"):
        long[key] = np.resize(long[key], g)
    long["visits"] = np.resize(long["visits"], (g, long["visits"].shape[1]))
    _write_arrays(path, long)
    with pytest.raises(records.BatchError, match="moves in moves, more than 5 games"):
        records.decode_batch(path.read_bytes(), path, rules=RULES)


def test_one_game_batches_sent_fast_are_paced_and_the_rest_wait(run_dir, tmp_path):
    """After a partial batch, the worker's next batch waits `partial_interval_s`: 20
    one-game batches sent at once cost one ingest per interval, the rest wait in the outbox
    (counted as deferred), and another worker is collected meanwhile as usual."""
    flood, honest = tmp_path / "flood", tmp_path / "honest"
    flood.mkdir()
    honest.mkdir()
    games = _games(20, seed=11)
    for seq, game in enumerate(games):
        records.write_batch(flood / records.batch_name("w9", 0, seq), [game],
                            records.BatchMeta.from_records("w9", [game]))
    full = _good(honest, 0, worker="w2", seed=12)
    col = Collector(run_dir, validate_with_records(N, KOMI), partial_interval_s=60.0,
                    full_batch_games=3)
    res = col.collect("w9", LocalSource(flood))
    assert len(res.ingested) == 1 and res.paced == res.deferred == 19
    assert col.deferred["w9"] == 19 and len(os.listdir(flood)) == 19
    again = col.collect("w9", LocalSource(flood))
    assert again.ingested == [] and again.deferred == 19
    assert col.collect("w2", LocalSource(honest)).ingested == [full]
    assert col.deferred["w2"] == 0
    last = col.collect("w9", LocalSource(flood), paced=False)  # a stopped worker's last
    assert len(last.ingested) == 19 and col.deferred["w9"] == 0


@pytest.mark.parametrize("case, word", [
    ("move_cap", "move cap of 500"),
    ("games", "more than this run's batches hold (5)"),
    ("simulations", "simulations, more than this run allows (16)"),
    ("early_pass", "passes first while"),
    ("cpu", "CPU seconds"),
])
def test_batch_is_held_to_the_runs_rules_not_its_own(case, word, run_dir, outbox):
    """The move cap, simulations, games per batch and passes come from the run's config."""
    rules = RULES
    if case == "move_cap":
        name = _write(outbox, 0, _honest(2, 1), max_moves=500)
    elif case == "games":
        name = _write(outbox, 0, _honest(6, 2))
    elif case == "simulations":
        name = _write(outbox, 0, _honest(2, 3), simulations=10_000)
    elif case == "early_pass":  # a "game" of two passes: black wins nothing, white by komi
        rec = records.GameRecord(
            board_size=N, komi=KOMI, moves=np.array([N * N, N * N], np.int16),
            visits=np.eye(N * N + 1, dtype=np.uint16)[[N * N, N * N]], result=-1, score=-KOMI,
            resigned=False, resign_disabled=False, would_resign_as=0, generation=0,
            seed=4, simulations=8, values=np.zeros(2, np.float16),
            full_search=np.ones(2, np.bool_))
        name = _write(outbox, 0, [rec])
    else:
        rules = dataclasses.replace(RULES, cpu_budget_s=0.0)
        name = _write(outbox, 0, _honest(2, 5))
    records.read_batch(outbox / name)  # valid by its own meta
    col = _ruled_collector(run_dir, rules)
    _assert_rejected(run_dir, col, col.collect(WORKER, LocalSource(outbox)), name, word)
    control = _write(outbox, 1, _honest(3, 6))
    assert _ruled_collector(run_dir).collect(WORKER, LocalSource(outbox)).ingested == [control]


def test_no_worker_owns_the_window_by_sending_more(tmp_path):
    """A worker with ten times the games of the other holds at most 1.5 x its equal share."""
    from training.learn.replay_buffer import ReplayWindow

    replay = tmp_path / "replay"
    replay.mkdir()
    seq = 0
    for worker, batches in (("w1", 2), ("w2", 20)):
        for _ in range(batches):
            recs = _honest(4, 100 + seq)
            records.write_batch(replay / records.batch_name(worker, 0, seq), recs,
                                records.BatchMeta.from_records(worker, recs))
            seq += 1
    cfg = dataclasses.replace(Config().replay, min_positions=400, max_positions=400)
    plain = ReplayWindow(replay, cfg, 1, N)
    capped = ReplayWindow(replay, cfg, 1, N, worker_weights={}, share_slack=1.5)

    def share(window) -> float:
        segs = np.concatenate([window._segments, window.validation._segments])
        own = [window._sidecars[int(c)].name.startswith("w2") for c in segs[:, 0]]
        lengths = segs[:, 2] - segs[:, 1]
        return float(lengths[np.array(own)].sum() / lengths.sum())

    assert share(plain) == 1.0  # the newest 400 positions are all w2's
    assert share(capped) <= 0.75 + 0.05 and capped.stats().positions >= 400
    print(f"window share of the flooding worker: {share(plain):.2f} uncapped, "
          f"{share(capped):.2f} capped")


def _flood_replay(replay: Path, *, honest_generation: int = 0, flood_generation: int = 0,
                  flood_factor: int = 50, honest_fast: bool = False) -> None:
    """An honest worker's batch of 4 games beside a flooding worker's 50 times as many
    positions (the same 4 games again under new names: the window itself does not dedupe)."""
    recs = _games(4, seed=7, generation=honest_generation)
    if honest_fast:  # playout cap randomization: every other move a fast search
        recs = [dataclasses.replace(r, full_search=np.arange(r.num_moves) % 2 == 0)
                for r in recs]
    records.write_batch(replay / records.batch_name("honest", honest_generation, 0), recs,
                        records.BatchMeta.from_records("honest", recs))
    flood = _games(4, seed=8, generation=flood_generation)
    for seq in range(flood_factor):
        records.write_batch(replay / records.batch_name("flood", flood_generation, seq), flood,
                            records.BatchMeta.from_records("flood", flood))


def _row_shares(window) -> dict[str, float]:
    """Each worker's share of the rows the window samples (what training draws)."""
    _, files, _ = window._locate(np.arange(len(window)))
    owners = np.array([records.parse_batch_name(window._sidecars[int(f)].name).worker
                       for f in files])
    return {w: float((owners == w).mean()) for w in sorted(set(owners))}


@pytest.mark.parametrize("case", ["fresh", "stale", "fast_rows"])
def test_a_50x_flood_holds_at_most_its_share_of_the_rows_the_window_holds(case, tmp_path):
    """Shares are measured on what the window holds, in sampled rows: a worker with 50x the
    other's data holds at most 1.5 x its equal share (75%) of the window trained on, also when
    the other's newest batch is 11 generations old (it keeps its share of older data; the
    flood, alone among the recent workers, is not uncapped) and when the other's fast
    searches are sampled half as often (the flood marks every move a full search)."""
    from training.learn.replay_buffer import ReplayWindow

    replay = tmp_path / "replay"
    replay.mkdir()
    _flood_replay(replay, flood_generation=11 if case == "stale" else 0,
                  honest_fast=case == "fast_rows")
    cfg = dataclasses.replace(Config().replay, min_positions=1000, max_positions=10**6,
                              validation_fraction=0.0,
                              fast_search_weight=0.5 if case == "fast_rows" else 1.0)
    plain = ReplayWindow(replay, cfg, 1, N)
    capped = ReplayWindow(replay, cfg, 1, N, worker_weights={}, share_slack=1.5)
    before, after = _row_shares(plain)["flood"], _row_shares(capped)["flood"]
    print(f"window share case={case} flood 50x: {before:.3f} uncapped, {after:.3f} capped")
    longest = max(r.num_moves for r in _games(4, seed=8))
    assert after <= 0.75 + longest / len(capped), _row_shares(capped)
    assert _row_shares(capped)["honest"] >= 0.2, "the honest worker keeps its share"


def test_a_lone_worker_takes_the_whole_window_and_a_weight_moves_the_share(tmp_path):
    """Alone on disk, a worker's games fill the window (nobody else has data); with
    `worker_weights` {flood: 3.0} its share is 1.5 x 3/4 = capped at 1 (all it can take)."""
    from training.learn.replay_buffer import ReplayWindow, select_newest

    replay = tmp_path / "replay"
    replay.mkdir()
    flood = _games(4, seed=8)
    for seq in range(5):
        records.write_batch(replay / records.batch_name("flood", 0, seq), flood,
                            records.BatchMeta.from_records("flood", flood))
    cfg = dataclasses.replace(Config().replay, min_positions=1000, max_positions=10**6)
    alone = ReplayWindow(replay, cfg, 1, N, worker_weights={}, share_slack=1.5)
    assert alone.stats().positions == alone.total_positions
    units = [("a", 10)] * 5 + [("b", 10)] * 100
    held = select_newest(units, 10**6, {"b": 3.0}, 1.5)
    assert len(held) == 105  # b's fraction is min(1, 1.5 * 3/4): no cap
    held = select_newest(units, 10**6, {}, 1.5)
    assert sum(1 for i in held if units[i][0] == "b") == 15  # 3 x a's 50 positions


def test_window_order_is_the_coachs_ingest_order_not_the_batchs_clock(tmp_path):
    from training.learn.replay_buffer import ReplayWindow

    replay = tmp_path / "replay"
    replay.mkdir()
    names = []
    for seq, created in enumerate((1.7e9, 1e9)):  # the first claims a later time
        recs = _honest(2, 200 + seq)
        meta = dataclasses.replace(records.BatchMeta.from_records(WORKER, recs),
                                   created=created)
        names.append(records.batch_name(WORKER, 0, seq))
        records.write_batch(replay / names[-1], recs, meta)
        os.utime(replay / names[-1], ns=(10**18 + seq, 10**18 + seq))
    window = ReplayWindow(replay, Config().replay, 1, N)
    assert window.names() == names  # ingested first = oldest
    follower = ReplayWindow(replay, Config().replay, 1, N, files=names[::-1])
    assert follower.names() == names[::-1], "given files keep the order the chooser sent"


# ----------------------------------------------------------------------------- over SFTP


@pytest.mark.ssh
def test_hostile_batches_over_sftp_are_rejected_and_good_ones_ingested(
        ssh_worker, run_dir, tmp_path):
    backend, outbox = ssh_worker
    good = _good(outbox, 0)
    bad = {}
    for seq, case in enumerate(["illegal_move", "pickle_payload", "zstd_bomb", "nan_visits"], 1):
        name = records.batch_name(WORKER, 0, seq)
        CASES[case][0](outbox / name)
        bad[name] = case
    odd = "w1;touch PWNED_000000_00000009.npz.zst"
    _good(outbox, 99)
    os.replace(outbox / records.batch_name(WORKER, 0, 99), outbox / odd)
    col = _collector(run_dir)
    res = col.collect(WORKER, backend.source())
    assert res.ingested == [good]
    assert sorted(res.rejected) == sorted([*bad, odd])
    assert os.listdir(run_dir / "replay") == [good]
    assert col.tally[WORKER].rejected == 5 and col.tally[WORKER].batches == 1
    assert os.listdir(outbox) == [], "collected and rejected batches are removed on the worker"
    assert not list((tmp_path / "remote").rglob("PWNED*"))
    print(f"hostile case=sftp rejected={len(res.rejected)} ingested={len(res.ingested)}")


@pytest.mark.ssh
def test_changed_host_key_refuses_collection_with_both_fingerprints(sshd_server, tiny_cfg,
                                                                    tmp_path, run_dir):
    from distributed.ssh_connector import HostKeyError

    other = keygen(tmp_path / "impostor")
    pub = Path(f"{other}.pub").read_text().split()
    host = sshd_server.known_hosts_line().split()[0]
    known = tmp_path / "known_hosts"
    known.write_text(f"{host} {pub[0]} {pub[1]}\n")
    real = sshd_server.known_hosts_line().split()
    fleet = _ssh_fleet(tiny_cfg, sshd_server, tmp_path, known, accept_new_host_keys=True)
    try:
        with pytest.raises(SourceError) as err:  # the SSH source's error, caused by:
            _collector(run_dir).collect(WORKER, fleet.backend(WORKER).source())
    finally:
        fleet.close()
    assert isinstance(err.value.__cause__, HostKeyError)
    msg = str(err.value)
    import base64
    import hashlib

    def fp(b64: str) -> str:
        digest = hashlib.sha256(base64.b64decode(b64)).digest()
        return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")

    assert fp(pub[1]) in msg and fp(real[2]) in msg, msg
    assert known.read_text().split()[2] == pub[1], "a changed key must never be overwritten"
    print("hostile case=changed_host_key refused=1 fingerprints_shown=2")


@pytest.mark.ssh
@pytest.mark.parametrize("evil", ["127.0.0.1;touch PWNED", "$(touch PWNED)", "`touch PWNED`",
                                  "127.0.0.1 -oProxyCommand=touch PWNED",
                                  "-oProxyCommand=touch PWNED", "127.0.0.1\ntouch PWNED"])
def test_shell_metacharacters_in_host_are_harmless(evil, sshd_server, tmp_path, monkeypatch):
    """A host string is never given to a shell: connecting fails as ConnectError naming the
    worker, and no command ran (it would have made PWNED in the current folder)."""
    from distributed.ssh_connector import ConnectError, SSHConnector

    monkeypatch.chdir(tmp_path)
    spec = WorkerSpec(host=evil, user=sshd_server.user, name=WORKER,
                      port=sshd_server.port, key_path=str(sshd_server.client_key))
    conn = SSHConnector(make_config([spec], sshd_server.known_hosts, retries=0))
    try:
        with pytest.raises(ConnectError) as err:
            conn.run(WORKER, "true")
    finally:
        conn.close()
    assert WORKER in str(err.value)
    assert not list(tmp_path.rglob("PWNED*")), "an injected command ran"


@pytest.mark.ssh
def test_host_with_overlong_label_is_a_connect_error(sshd_server):
    from distributed.ssh_connector import ConnectError, SSHConnector

    spec = WorkerSpec(host="$(touch " + "x" * 70 + ")", user=sshd_server.user, name=WORKER,
                      port=sshd_server.port, key_path=str(sshd_server.client_key))
    conn = SSHConnector(make_config([spec], sshd_server.known_hosts, retries=0))
    try:
        with pytest.raises(ConnectError):
            conn.run(WORKER, "true")
    finally:
        conn.close()


@pytest.mark.ssh
@pytest.mark.parametrize("evil_dir", ["{t}/a;touch {p}", "{t}/$(touch {p})", "{t}/`touch {p}`",
                                      "{t}/a b'\"c", "{t}/a\nb"])
def test_shell_metacharacters_in_remote_dir_are_harmless(evil_dir, sshd_server, tmp_path):
    from distributed.ssh_connector import SSHConnector

    marker = tmp_path / "PWNED"
    root = evil_dir.format(t=tmp_path, p=marker)
    spec = WorkerSpec(host=sshd_server.addr, user=sshd_server.user, name=WORKER,
                      port=sshd_server.port, key_path=str(sshd_server.client_key),
                      remote_dir=root)
    conn = SSHConnector(make_config([spec], sshd_server.known_hosts))
    try:
        src = tmp_path / "f.bin"
        src.write_bytes(b"x" * 100)
        conn.put(WORKER, src, "outbox/f.bin")
        assert conn.listdir(WORKER, "outbox") == ["f.bin"]
        conn.run(WORKER, ["ls", "-la", root])
    finally:
        conn.close()
    assert Path(root, "outbox", "f.bin").read_bytes() == b"x" * 100
    assert not marker.exists(), "an injected command ran"


@pytest.mark.parametrize("name", ["w1;rm -rf ~", "$(id)", "w 1", "w1/../x", "w\n1", "`x`",
                                  "wörker", "w.1", "-w1", "_w1", "x" * 65])
def test_shell_metacharacters_in_worker_name_are_refused(name, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("distributed:\n  workers:\n    - {host: h, user: u, name: %s}\n"
                   % json.dumps(name))
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert "name" in str(err.value) and str(cfg) in str(err.value)


@pytest.mark.parametrize("name", ["w1", "gpu-box_2", "A", "x" * 64, "0node"])
def test_every_worker_name_the_config_accepts_makes_valid_batch_names(name, tmp_path):
    """One rule: a worker the config accepts never crash-loops on its own batch names."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("distributed:\n  workers:\n    - {host: h, user: u, name: %s}\n"
                   % json.dumps(name))
    spec = load_config(cfg).distributed.workers[0]
    assert records.parse_batch_name(records.batch_name(spec.name, 3, 7)).worker == name


# ----------------------------------------------------------------------------- configs

BAD_CONFIGS = {
    "unknown_key": ("go:\n  board_sise: 9\n", "board_sise"),
    "unknown_section": ("gpu:\n  n: 1\n", "gpu"),
    "wrong_type": ("go:\n  board_size: nine\n", "go.board_size"),
    "bool_for_int": ("mcts:\n  simulations: true\n", "mcts.simulations"),
    "float_for_int": ("self_play:\n  parallel_games: 2.5\n", "self_play.parallel_games"),
    "negative": ("training:\n  lr: -0.1\n", "training.lr"),
    "zero_batch": ("distributed:\n  batch_size: 0\n", "distributed.batch_size"),
    "nan": ("training:\n  lr: .nan\n", "training.lr"),
    "inf_timeout": ("distributed:\n  connect_timeout_s: .inf\n", "connect_timeout_s"),
    "huge_board": ("go:\n  board_size: 1000\n", "go.board_size"),
    "bad_choice": ("training:\n  lr_scaling: cubic\n", "lr_scaling"),
    "list_for_section": ("go: [1, 2]\n", "go"),
    "workers_not_list": ("distributed:\n  workers: {host: h}\n", "distributed.workers"),
    "worker_missing_user": ("distributed:\n  workers:\n    - {host: h}\n", "user"),
    "worker_bad_port": ("distributed:\n  workers:\n    - {host: h, user: u, port: 70000}\n",
                        "port"),
    "worker_bad_gpu": ("distributed:\n  workers:\n    - {host: h, user: u, gpu_id: -3}\n",
                       "gpu_id"),
    "empty_host": ("distributed:\n  workers:\n    - {host: '', user: u}\n", "host"),
    "weight_unknown_worker": ("distributed:\n  worker_weights: {ghost: 2.0}\n", "ghost"),
    "weight_negative": ("distributed:\n  workers:\n    - {host: h, user: u, name: a}\n"
                        "  worker_weights: {a: -1}\n", "worker_weights"),
    "not_yaml": ("go: [\n", "yaml"),
    "top_level_list": ("- 1\n- 2\n", "mapping"),
    "string_for_bool": ("distributed:\n  compression: maybe\n", "distributed.compression"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_value_is_a_config_error_naming_the_key(case, tmp_path):
    text, word = BAD_CONFIGS[case]
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert str(path) in msg and word.lower() in msg.lower(), msg


@pytest.mark.parametrize("case", [
    "unknown_key", "nan", "worker_bad_port", "weight_unknown_worker",
    "not_yaml"])
def test_start_main_bad_config_is_one_line_and_exit_code_2(case, tmp_path):
    text, word = BAD_CONFIGS[case]
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    proc = subprocess.run([sys.executable, str(REPO / "start_main.py"), "--config", str(path)],
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    err_lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in proc.stderr
    assert len(err_lines) == 1 and err_lines[0].startswith("error: "), proc.stderr
    assert path.name in err_lines[0] and word.lower() in err_lines[0].lower()
    assert not (tmp_path / "runs").exists(), "a bad config must not create a run folder"


def test_start_main_missing_config_file_is_exit_code_2(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "start_main.py"), "--config",
                           str(tmp_path / "nope.yaml")], cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "nope.yaml" in proc.stderr


# ----------------------------------------------------------------------------- bounded input
# Files that are not batches (links, FIFOs, growing or huge files), validator crashes, names
# owned by another worker, floods of junk: each is a counted rejection within bounded time,
# bytes and memory, and never blocks the worker's good batches.

import contextlib  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402

from distributed.transfer import (  # noqa: E402
    DeadlineError,
    VerifyError,
    copy_file,
)
from training.fleet.collector import SLOW_FETCH_TRIES  # noqa: E402


@contextlib.contextmanager
def _peak_python_memory():
    """Peak of Python-allocated memory (tracemalloc) inside the block, in MB."""
    out = {"mb": 0.0}
    tracemalloc.start()
    try:
        yield out
    finally:
        out["mb"] = tracemalloc.get_traced_memory()[1] / 1e6
        tracemalloc.stop()


def _timed_collect(col: Collector, worker: str, source, limit_s: float = 30.0, **kw):
    """`collect` in a thread: a hang or an endless read fails the test, not the suite."""
    out: dict = {}

    def go() -> None:
        try:
            out["res"] = col.collect(worker, source, **kw)
        except BaseException as e:  # noqa: BLE001 - handed to the test below
            out["err"] = e

    t0 = time.monotonic()
    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(limit_s)
    assert not t.is_alive(), f"collect still running after {limit_s}s (reading without end?)"
    if "err" in out:
        raise out["err"]
    return out["res"], time.monotonic() - t0


@pytest.mark.parametrize("special", ["symlink_dev_zero", "fifo", "symlink_outside"])
def test_non_regular_file_named_like_a_batch_is_refused_unread(special, outbox_source,
                                                               run_dir, tmp_path):
    kind, outbox, source = outbox_source
    name = records.batch_name(WORKER, 0, 0)
    if special == "symlink_dev_zero":
        os.symlink("/dev/zero", outbox / name)
    elif special == "fifo":
        os.mkfifo(outbox / name)
    else:
        secret = tmp_path / "secret.npz.zst"
        _good(tmp_path, 9)
        os.replace(tmp_path / records.batch_name(WORKER, 0, 9), secret)
        os.symlink(secret, outbox / name)
    good = _good(outbox, 1)
    col = _collector(run_dir)
    res, dt = _timed_collect(col, WORKER, source)
    assert res.rejected == [name] and res.ingested == [good], res
    reason = col.quarantine_path(WORKER, name).with_name(f"{name}.reason.txt").read_text()
    assert ("symlink" if "symlink" in special else "FIFO") in reason, reason
    assert not col.quarantine_path(WORKER, name).exists(), "no byte of it is kept"
    assert list((run_dir / "incoming").iterdir()) == []
    assert not os.path.lexists(outbox / name), "the link or FIFO itself is removed"
    assert col.tally[WORKER].rejected == 1 and col.tally[WORKER].batches == 1
    print(f"hostile case={special} source={kind} refused_in_s={dt:.2f} bytes_read=0")


def test_batch_file_over_the_size_cap_is_refused_unread(outbox_source, run_dir):
    """A file named as a batch but larger than any batch may be (`MAX_BATCH_BYTES`; sparse
    here, so it costs no disk) is refused from its size alone: no byte read or kept."""
    kind, outbox, source = outbox_source
    name = records.batch_name(WORKER, 0, 0)
    with open(outbox / name, "wb") as f:
        f.truncate(MAX_BATCH_BYTES + 1)
    good = _good(outbox, 1)
    col = _collector(run_dir)
    res, dt = _timed_collect(col, WORKER, source)
    assert res.rejected == [name] and res.ingested == [good], res
    reason = col.quarantine_path(WORKER, name).with_name(f"{name}.reason.txt").read_text()
    assert "over the limit" in reason, reason
    assert not col.quarantine_path(WORKER, name).exists(), "no byte of it is kept"
    assert list((run_dir / "incoming").iterdir()) == []
    assert not (outbox / name).exists(), "the worker's copy is removed"
    assert col.tally[WORKER].rejected == 1 and col.tally[WORKER].batches == 1
    print(f"hostile case=oversized source={kind} refused_in_s={dt:.2f} bytes_read=0")


def test_file_growing_while_read_is_cut_at_its_listed_size(tmp_path):
    """A file that grows after its lstat (or a symlink swapped in) is read no further than
    the size seen: more data is a refusal, and the partial file never passes that size."""
    src = tmp_path / "grows.bin"
    src.write_bytes(b"x" * (1 << 20))
    stop = threading.Event()

    def grow() -> None:
        with open(src, "ab") as f:
            while not stop.is_set():
                f.write(b"y" * 4096)
                f.flush()

    t = threading.Thread(target=grow, daemon=True)
    t.start()
    try:
        time.sleep(0.05)
        with pytest.raises(VerifyError, match="more data than"):
            copy_file(src, tmp_path / "dest", max_bytes=1 << 30)
    finally:
        stop.set()
        t.join()
    assert not (tmp_path / "dest").exists() and not (tmp_path / "dest.partial").exists()


@pytest.mark.ssh
def test_sftp_file_growing_or_over_the_cap_is_refused(ssh_worker, tmp_path):
    backend, outbox = ssh_worker
    conn = backend.connector  # the connector the worker's source downloads with
    big = outbox / "big.bin"
    with open(big, "wb") as f:
        f.truncate(64 << 20)  # 64 MiB, sparse
    with pytest.raises(VerifyError, match="over the limit"):
        conn.get(WORKER, str(big), tmp_path / "big", max_bytes=1 << 20)
    assert not list(tmp_path.glob("big*"))
    grows = outbox / "grows.bin"
    grows.write_bytes(b"x" * (4 << 20))
    stop = threading.Event()

    def grow() -> None:
        with open(grows, "ab") as f:
            while not stop.is_set():
                f.write(b"y" * 65536)
                f.flush()
                time.sleep(0.001)

    t = threading.Thread(target=grow, daemon=True)
    t.start()
    try:
        time.sleep(0.05)
        with pytest.raises(VerifyError, match="more data than"):
            conn.get(WORKER, str(grows), tmp_path / "grows", max_bytes=1 << 30)
    finally:
        stop.set()
        t.join()
    assert not list(tmp_path.glob("grows*")), "a partial file was left"


@pytest.mark.ssh
def test_sftp_download_past_its_deadline_stops_and_drops_the_link(ssh_worker, tmp_path):
    backend, outbox = ssh_worker
    conn = backend.connector  # the connector the worker's source downloads with
    big = outbox / "slow.bin"
    big.write_bytes(os.urandom(1 << 20) * 48)  # 48 MiB: far more than 0.05 s of loopback SFTP
    t0 = time.monotonic()
    with pytest.raises(DeadlineError):
        conn.get(WORKER, str(big), tmp_path / "slow", max_bytes=1 << 30, timeout_s=0.05)
    dt = time.monotonic() - t0
    assert dt < 5.0, dt
    assert not list(tmp_path.glob("slow*"))
    assert WORKER not in conn._conns, "the connection still carries the abandoned reads"
    assert conn.listdir(WORKER, str(outbox)) == ["slow.bin"]  # and the next call reconnects
    print(f"hostile case=sftp_deadline stopped_after_s={dt:.2f} partial_left=0")


def test_too_slow_fetch_is_retried_then_rejected(run_dir, outbox):
    name = _good(outbox, 0)
    slow = LocalSource(outbox, timeout_s=0.0)  # every read is past its deadline
    col = _collector(run_dir)
    for _ in range(SLOW_FETCH_TRIES - 1):
        with pytest.raises(SourceError):
            col.collect(WORKER, slow)
        assert (outbox / name).exists() and col.tally.get(WORKER) is None
    res = col.collect(WORKER, slow)
    assert res.rejected == [name] and not (outbox / name).exists()
    assert "tries" in col.quarantine_path(WORKER, name).with_name(
        f"{name}.reason.txt").read_text()


@pytest.mark.ssh
def test_fifo_as_heartbeat_is_refused_at_once(ssh_worker, tmp_path):
    backend, _ = ssh_worker
    conn = backend.connector  # the connector the worker's supervisor reads heartbeats with
    hb = Path(WorkerPaths(str(tmp_path / "remote"), WORKER).heartbeat)
    os.mkfifo(hb)
    t0 = time.monotonic()
    with pytest.raises(VerifyError, match="not a regular file"):
        conn.read_heartbeat(WORKER)
    dt = time.monotonic() - t0
    assert dt < 3.0, f"{dt:.1f}s: the FIFO was opened"
    assert conn.run(WORKER, "echo alive").stdout.strip() == "alive"
    print(f"hostile case=fifo_heartbeat refused_in_s={dt:.2f}")


# validator crashes: not BatchError, yet every one must become a counted rejection


def _nested_json(path: Path) -> None:
    a = _arrays(_games())
    a["meta"] = np.array("[" * 2000 + "]" * 2000)  # within the meta cap, past the recursion limit
    _write_arrays(path, a)


def _npz_members(arrays: dict[str, np.ndarray], override: dict[str, bytes] | None = None,
                 method: int | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for k, v in arrays.items():
            b = io.BytesIO()
            np.lib.format.write_array(b, v, allow_pickle=False)
            zf.writestr(k + ".npy", (override or {}).get(k, b.getvalue()))
    raw = bytearray(buf.getvalue())
    if method is not None:  # patch the method of every local and central header but meta's
        assert next(iter(arrays)) == "meta"  # the first member: its header is read first
        for sig, off in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):
            i = raw.find(sig, raw.find(sig) + 4)
            while i >= 0:
                raw[i + off : i + off + 2] = method.to_bytes(2, "little")
                i = raw.find(sig, i + 4)
    return bytes(raw)


def _huge_shape(path: Path) -> None:
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<i2", "fortran_order": False, "shape": (1 << 42,)})
    data = _npz_members(_arrays(_games()), {"moves": header.getvalue() + bytes(64)})
    write_atomic(path, compress_bytes(data))


def _unknown_zip_method(path: Path) -> None:
    write_atomic(path, compress_bytes(_npz_members(_arrays(_games()), method=99)))


CRASHES = {"nested_json": (_nested_json, "RecursionError"),
           "huge_shape": (_huge_shape, "MemoryError"),
           "unknown_zip_method": (_unknown_zip_method, "NotImplementedError")}


@pytest.mark.parametrize("case", sorted(CRASHES))
def test_validator_crash_is_a_counted_rejection_and_not_fetched_again(case, run_dir, outbox):
    make, error = CRASHES[case]
    bad = records.batch_name(WORKER, 0, 0)
    make(outbox / bad)
    with pytest.raises(BaseException) as raw:  # what the validator itself raises
        records.read_batch(outbox / bad)
    assert type(raw.value).__name__ == error or error in type(raw.value).__mro__.__repr__()
    good = _good(outbox, 1)
    col = _collector(run_dir)
    res = col.collect(WORKER, LocalSource(outbox))
    assert res.ingested == [good], "a crashing batch blocked the worker's next batch"
    assert res.rejected == [bad] and col.quarantine_path(WORKER, bad).exists()
    reason = (run_dir / "quarantine" / f"{bad}.reason.txt").read_text()
    assert "validation failed" in reason and error in reason, reason
    assert [e["status"] for e in _ledger(run_dir) if e["name"] == bad] == ["rejected"]
    assert os.listdir(outbox) == []
    again = col.collect(WORKER, LocalSource(outbox))
    assert again.rejected == [] and col.tally[WORKER].rejected == 1
    print(f"hostile case={case} error={error} rejected=1 fetched_again=0")


def test_247_byte_name_is_rejected_once_without_enametoolong(run_dir, outbox):
    name = "x" * 239 + records.BATCH_SUFFIX
    assert len(name.encode()) == 247
    (outbox / name).write_bytes(b"junk")
    col = _collector(run_dir)
    res = col.collect(WORKER, LocalSource(outbox))
    _assert_rejected(run_dir, col, res, name, "not a batch name")
    assert all(len(p.name) <= 64 for p in (run_dir / "quarantine").rglob("*"))
    assert col.collect(WORKER, LocalSource(outbox)).rejected == []


# ownership


def test_batch_named_after_another_workers_sequence_is_rejected_under_the_lister(run_dir,
                                                                                 tmp_path):
    """w2 lists a batch named as w1's NEXT batch: it is w2's rejection, and w1's real batch of
    that name is ingested afterwards (it used to be deleted as a duplicate)."""
    box1, box2 = tmp_path / "w1" / "outbox", tmp_path / "w2" / "outbox"
    box1.mkdir(parents=True)
    box2.mkdir(parents=True)
    squat = _good(box2, 5, worker="w1", seed=4)  # a valid w1 batch, in w2's outbox
    col = _collector(run_dir)
    res = col.collect("w2", LocalSource(box2))
    assert res.rejected == [squat] and not col.is_known(squat)
    assert col.tally["w2"].rejected == 1 and "w1" not in col.tally
    assert not (run_dir / "quarantine" / squat).exists()
    real = _good(box1, 5, worker="w1")
    assert real == squat
    res = col.collect("w1", LocalSource(box1))
    assert res.ingested == [real] and res.duplicates == 0
    assert (run_dir / "replay" / real).exists() and col.next_seq("w1") == 6
    assert col.next_seq("w2") == 0, "a foreign name moved w2's sequence floor"
    print("hostile case=name_squatting squatter_rejected=1 owner_ingested=1 owner_lost=0")


# budgets


class _CountingSource(LocalSource):
    def __init__(self, outbox: Path):
        super().__init__(outbox)
        self.lists = self.fetches = 0

    def list_batches(self) -> list[str]:
        self.lists += 1
        return super().list_batches()

    def fetch(self, name: str, dest: Path) -> int:
        self.fetches += 1
        return super().fetch(name, dest)


def test_rejection_budget_stops_collecting_from_that_worker_and_says_why(run_dir, tmp_path):
    box1, box2 = tmp_path / "w1" / "outbox", tmp_path / "w2" / "outbox"
    box1.mkdir(parents=True)
    box2.mkdir(parents=True)
    for i in range(30):
        (box1 / f"junk{i:03d}.npz.zst").write_bytes(b"junk" * 100)
    good2 = _good(box2, 0, worker="w2")
    col = Collector(run_dir, validate_with_records(N, KOMI), max_rejected=5, names_per_pass=10)
    src = _CountingSource(box1)
    res = col.collect(WORKER, src)
    assert len(res.rejected) == 5 and res.deferred == 25
    assert "max_rejected_batches" in res.over_budget and WORKER in res.over_budget
    assert col.over_budget[WORKER] == res.over_budget
    again = col.collect(WORKER, src)
    assert again.over_budget and src.lists == 1 and src.fetches == 5, "it was listed again"
    assert col.collect("w2", LocalSource(box2)).ingested == [good2], "w2 must not be affected"
    col.resume(WORKER)
    assert len(col.collect(WORKER, src).rejected) == 5
    print("hostile case=rejection_budget rejected=5 then_stopped=1 listed_after_stop=0")


def test_5000_junk_files_are_handled_a_bounded_number_per_pass(run_dir, outbox):
    for i in range(5000):
        (outbox / f"junk{i:05d}.npz.zst").write_bytes(b"j")
    good = _good(outbox, 0)
    col = Collector(run_dir, validate_with_records(N, KOMI), max_rejected=10**6,
                    names_per_pass=64)
    t0 = time.monotonic()
    res = col.collect(WORKER, LocalSource(outbox))
    dt = time.monotonic() - t0
    assert res.ingested == [good], "the worker's own batch goes first"
    assert len(res.rejected) == 63 and res.deferred == 5000 - 63
    assert dt < 10.0, dt
    print(f"hostile case=junk_flood files=5000 pass_s={dt:.2f} handled=64 "
          f"deferred={res.deferred}")


def test_flooded_outbox_stops_collection_with_that_reason(outbox_source, run_dir,
                                                          monkeypatch):
    """Past the listing cap (of entries of any kind) the listing stops, nothing is fetched,
    and the worker is over its budget (state Error) with the reason, until it is resumed."""
    import training.fleet.collector as collector
    import training.fleet.ssh_workers as ssh_workers

    monkeypatch.setattr(collector, "MAX_LISTED", 300)
    monkeypatch.setattr(ssh_workers, "MAX_LISTED", 300)
    kind, outbox, source = outbox_source
    good = _good(outbox, 0)
    col = _collector(run_dir)
    for i in range(299):
        (outbox / f"junk{i:05d}").write_bytes(b"j")
    assert col.collect(WORKER, source).ingested == [good]  # 299 + 1 entries: under the cap
    (outbox / "one-more").write_bytes(b"j")
    (outbox / "two-more").write_bytes(b"j")
    later = _good(outbox, 1)
    res = col.collect(WORKER, source)
    assert res.ingested == [] and res.rejected == [] and "flooded" in res.over_budget
    assert "more than 300 entries" in col.over_budget[WORKER] and (outbox / later).exists()
    for junk in outbox.glob("junk*"):
        junk.unlink()
    col.resume(WORKER)
    assert col.collect(WORKER, source).ingested == [later]  # the link still works
    print(f"hostile case=outbox_flood source={kind} cap=300 stopped=1")


def test_quarantine_keeps_reasons_but_not_bytes_past_its_budget(run_dir, outbox):
    names = [f"junk{i}.npz.zst" for i in range(3)]
    for n in names:
        (outbox / n).write_bytes(os.urandom(3000))
    col = Collector(run_dir, validate_with_records(N, KOMI), quarantine_max_bytes=4000)
    res = col.collect(WORKER, LocalSource(outbox))
    assert sorted(res.rejected) == names
    kept = [n for n in names if col.quarantine_path(WORKER, n).exists()]
    assert len(kept) == 1
    for n in names:
        p = col.quarantine_path(WORKER, n)
        assert p.with_name(p.name + ".reason.txt").exists()
    assert sum(1 for e in _ledger(run_dir) if e.get("kept") is False) == 2
    size = sum(p.stat().st_size for p in (run_dir / "quarantine").rglob("*.bin"))
    assert size <= 4000


def test_zstd_bomb_is_refused_within_bounded_time_and_memory(run_dir, outbox):
    name = records.batch_name(WORKER, 0, 0)
    CASES["zstd_bomb"][0](outbox / name)
    col = _collector(run_dir)
    t0 = time.monotonic()
    with _peak_python_memory() as peak:
        res = col.collect(WORKER, LocalSource(outbox))
    dt = time.monotonic() - t0
    grown_mb = peak["mb"]
    assert res.rejected == [name] and dt < 10.0
    assert grown_mb < 64, f"peak memory grew by {grown_mb:.0f} MB"
    print(f"hostile case=zstd_bomb_bounded seconds={dt:.2f} peak_rss_growth_mb={grown_mb:.0f}")


# the ledger


def test_torn_ledger_line_does_not_fuse_with_the_next(run_dir, outbox):
    first = _good(outbox, 0)
    _collector(run_dir).collect(WORKER, LocalSource(outbox))
    ledger = run_dir / "ledger.jsonl"
    ledger.write_bytes(ledger.read_bytes() + b'{"name": "w1_000000_0000')  # crash mid-append
    second = _good(outbox, 1)
    col = _collector(run_dir)
    col.collect(WORKER, LocalSource(outbox), current_generation=7)
    lines = ledger.read_text().splitlines()
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except ValueError:
            pass
    byname = {e["name"]: e for e in parsed}
    assert set(byname) == {first, second}
    assert byname[second]["coach_generation"] == 7, "the line was rebuilt, not read"
    assert _collector(run_dir).tally[WORKER].batches == 2


# remote command output


@pytest.mark.ssh
def test_noisy_remote_command_output_is_capped(ssh_worker):
    from distributed.ssh_connector import COMMAND_OUTPUT_MAX_BYTES

    backend, _ = ssh_worker
    conn = backend.connector
    conn.run(WORKER, "true")  # connected before measuring
    t0 = time.monotonic()
    with _peak_python_memory() as peak:
        res = conn.run(WORKER, "head -c 200000000 /dev/zero | tr '\\0' x; echo tail-line",
                       timeout_s=120)
    dt = time.monotonic() - t0
    grown_mb = peak["mb"]
    assert len(res.stdout) <= COMMAND_OUTPUT_MAX_BYTES + 100
    assert res.stdout.rstrip().endswith("tail-line"), "the tail (where errors are) is kept"
    assert res.dropped_bytes >= 200_000_000 - COMMAND_OUTPUT_MAX_BYTES
    assert grown_mb < 60, f"peak memory grew by {grown_mb:.0f} MB for 200 MB of output"
    print(f"hostile case=noisy_shell output_mb=200 kept_mb=1 seconds={dt:.1f} "
          f"peak_rss_growth_mb={grown_mb:.0f}")


# the deploy archive


def _tracked_project(tmp_path: Path, rel: str, text: str) -> Path:
    """A git repository `tmp_path/proj` whose one tracked file is `rel` holding `text`."""
    root = tmp_path / "proj"
    (root / rel).parent.mkdir(parents=True)
    (root / rel).write_text(text)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", rel], check=True)
    return root


def test_deploy_wheel_holds_only_tracked_files(tmp_path):
    import zipfile

    from distributed.remote import ProjectInfo, build_wheel

    root = _tracked_project(tmp_path, "pkg/__init__.py", "X = 1\n")
    (root / ".env").write_text("TOKEN=secret\n")  # untracked, not ignored
    (root / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (root / "runs" / "main").mkdir(parents=True)
    (root / "runs" / "main" / "ledger.jsonl").write_text("{}\n")
    wheel = build_wheel(ProjectInfo("proj", "0.1", root), tmp_path / "out")
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if not n.startswith("proj-0.1.dist-info/")]
    assert names == ["pkg/__init__.py"], names


def test_deploy_wheel_ships_configs_without_hosts_users_or_keys(tmp_path):
    import zipfile

    import yaml

    from distributed.remote import ProjectInfo, build_wheel

    root = _tracked_project(tmp_path, "configs/config.yaml", "go:\n  board_size: 9\n")
    # the user's edit of the tracked file, as the guide tells them to make it
    (root / "configs" / "config.yaml").write_text(
        "go:\n  board_size: 9\ndistributed:\n  enabled: true\n  workers:\n"
        "    - host: secret-host.example\n      user: alice\n"
        "      key_path: ~/.ssh/alice_secret_key\n      gpu_id: 0\n"
        "  worker_weights: {worker1: 2.0}\n  master_addr: 10.1.2.3\n")
    wheel = build_wheel(ProjectInfo("proj", "0.1", root), tmp_path / "out")
    with zipfile.ZipFile(wheel) as zf:
        shipped = zf.read("configs/config.yaml").decode()
    for secret in ("secret-host", "alice", "10.1.2.3"):
        assert secret not in shipped, shipped
    data = yaml.safe_load(shipped)
    assert data["go"] == {"board_size": 9} and data["distributed"]["enabled"] is True
    assert data["distributed"]["workers"] == [] and data["distributed"]["master_addr"] is None


def test_remote_text_never_forges_a_log_line_or_an_escape(tmp_path):
    """The coach's log as start_main.py configures it: one line per event, whatever a worker
    host put in its error text (newlines, terminal escapes, Unicode line separators)."""
    import logging

    from training.run.logsetup import configure_logging

    restore = logging_root_state()
    try:
        configure_logging(tmp_path / "coach.log", "INFO", stderr=False)
        hostile = "disk full\n2026-01-01 00:00:00,000 INFO coach: all fine\x1b[2J\x1b[31m\u2028!"
        logging.getLogger("training.fleet.fleet").warning("worker %s: %s", "w1", hostile)
        for h in logging.getLogger().handlers:
            h.flush()
        text = (tmp_path / "coach.log").read_text(encoding="utf-8")
    finally:
        restore()
    lines = text.splitlines()
    assert len(lines) == 1 and "\x1b" not in text and "\u2028" not in text, text
    assert "disk full\\n2026-01-01" in lines[0] and "\\x1b[2J" in lines[0]


def test_the_stderr_log_follows_sys_stderr_and_never_writes_to_a_closed_one(monkeypatch):
    """The stderr handler writes to the sys.stderr of when a record comes: after stderr is
    replaced (and the old one closed), records reach the new one, and logging never fails
    with "I/O operation on closed file"."""
    import io
    import logging

    from training.run.logsetup import configure_logging

    first, second = io.StringIO(), io.StringIO()
    restore = logging_root_state()
    failures = []
    monkeypatch.setattr(logging, "raiseExceptions", True)
    monkeypatch.setattr(logging.Handler, "handleError",
                        lambda self, record: failures.append(record.getMessage()))
    try:
        monkeypatch.setattr(sys, "stderr", first)
        configure_logging(None, "INFO")
        logging.getLogger("training.worker").info("to the first")
        monkeypatch.setattr(sys, "stderr", second)
        first.close()
        logging.getLogger("training.worker").info("to the second")
    finally:
        restore()
    assert not failures, failures
    assert "to the second" in second.getvalue() and "to the first" not in second.getvalue()


def test_fresh_holds_the_run_lock_while_it_moves_the_folder_aside(tmp_path, monkeypatch):
    """No coach can start on the old folder between the check and the rename."""
    import start_main
    from training.run.run_lock import RunFolderBusy, RunLock

    run_dir = tmp_path / "run"
    (run_dir / "replay").mkdir(parents=True)
    config = tmp_path / "c.yaml"
    config.write_text(f"run:\n  dir: {run_dir}\nlogging:\n  dir: {tmp_path / 'logs'}\n"
                      "distributed:\n  enabled: true\n")  # stops right after the move
    seen = []
    real_rename = Path.rename

    def rename(self, target):
        if self == run_dir:
            try:
                RunLock(self).acquire().release()
                seen.append("free")
            except RunFolderBusy:
                seen.append("held")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    root = logging_root_state()
    try:
        assert start_main.main(["--config", str(config), "--fresh"]) == 2
    finally:
        root()
    assert seen == ["held"] and not run_dir.exists()
    assert [p.name.startswith("run.old-") for p in tmp_path.iterdir() if p.name != "c.yaml"
            and p.name != "logs"] == [True]


def logging_root_state():
    """Save the root logger's handlers and level; the returned function restores them."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level

    def restore() -> None:
        for h in list(root.handlers):
            root.removeHandler(h)
            h.close()
        for h in handlers:
            root.addHandler(h)
        root.setLevel(level)

    return restore


@pytest.mark.ssh
def test_two_runs_never_share_a_worker_folder(ssh_worker, tmp_path, monkeypatch):
    """A worker folder's lease: a second run's coach is refused with the holder named; the
    holder renews it; it frees itself once its coach stops renewing."""
    import training.fleet.ssh_workers as ssh_workers
    from training.fleet.fleet import WorkerFault

    backend, outbox = ssh_worker
    conn = backend.connector
    first, second = "main-node:/runs/a", "main-node:/runs/b"
    ssh_workers.take_lease(conn, WORKER, first)
    with pytest.raises(WorkerFault, match="used by another run .main-node:/runs/a"):
        ssh_workers.take_lease(conn, WORKER, second)
    ssh_workers.take_lease(conn, WORKER, first)  # the same run renews (or resumes)
    lease = json.loads((outbox.parent / "lease.json").read_text())
    assert lease["run"] == first and (outbox.parent / "lease.json").stat().st_mode & 0o077 == 0
    later = time.time() + ssh_workers.LEASE_TTL_S + 1
    ssh_workers.take_lease(conn, WORKER, second, now=later)  # the first coach is gone
    with pytest.raises(WorkerFault, match="runs/b"):
        ssh_workers.take_lease(conn, WORKER, first, now=later)
    # the coach's backend takes it as part of bringing the worker up
    assert backend.run == ssh_workers.run_identity(tmp_path / "coach")
    with pytest.raises(WorkerFault):
        backend.prepare()


# concurrent supervisors


def test_concurrent_collect_calls_ingest_every_batch_exactly_once(run_dir, tmp_path):
    """One supervisor thread per worker (and a second, racing caller for each): downloads and
    validation run in parallel, yet every batch has exactly one ledger line and one file."""
    workers = [f"w{i}" for i in range(1, 7)]
    boxes = {}
    expected = set()
    for i, w in enumerate(workers):
        boxes[w] = tmp_path / w / "outbox"
        boxes[w].mkdir(parents=True)
        for seq in range(4):
            expected.add(_good(boxes[w], seq, worker=w, seed=10 * i + seq))
    col = _collector(run_dir)
    barrier = threading.Barrier(2 * len(workers))
    errors = []

    def supervise(w: str) -> None:
        try:
            barrier.wait()
            for _ in range(3):
                col.collect(w, LocalSource(boxes[w]))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=supervise, args=(w,)) for w in workers for _ in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    names = [e["name"] for e in _ledger(run_dir)]
    assert sorted(names) == sorted(expected), "a batch was lost or written twice"
    assert set(os.listdir(run_dir / "replay")) == expected
    assert list((run_dir / "incoming").iterdir()) == []
    assert all(col.tally[w].batches == 4 for w in workers)
    assert _collector(run_dir).tally == col.tally


def test_download_and_replay_rename_are_fsynced_before_the_ledger_line_and_the_delete(
        run_dir, outbox, monkeypatch):
    """The order that makes a crash at any point safe: the downloaded bytes are on disk, then
    the rename into replay/ is, then the ledger line, and only then the worker's copy goes.
    (os.fsync is wrapped to record what it syncs; every call still goes through.)"""
    name = _good(outbox, 0)
    events: list[tuple[str, str]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    class Recording(LocalSource):
        def delete(self, n: str) -> None:
            events.append(("delete", n))
            super().delete(n)

    col = _collector(run_dir)
    monkeypatch.setattr(os, "fsync", fsync)
    assert col.collect(WORKER, Recording(outbox)).ingested == [name]
    monkeypatch.undo()

    def first(kind: str, end: str) -> int:
        return next(i for i, (k, p) in enumerate(events) if k == kind and p.endswith(end))

    download = first("fsync", f"incoming/{name}.partial")
    replay = first("fsync", "/replay")
    ledger = first("fsync", "ledger.jsonl")
    delete = first("delete", name)
    assert download < replay < ledger < delete, events
