"""Hostile input: every bad batch, name, host key, shell string and config is refused clearly.

Batches go through the REAL collection path: `training.collector.Collector` with the coach's
validator (`validate_with_records`) and a `LocalSource` outbox, and over SFTP from a real
loopback sshd (`SftpOutbox` below, a source built on `SSHConnector.listdir/get/remove` until
the coach's SSH source lands). For each hostile batch the test checks: rejected with a reason
naming the file, moved to `quarantine/` with `<name>.reason.txt`, a `rejected` ledger line
counted against its worker (`Collector.tally`), nothing in `replay/`, and the worker's copy
removed; `records.read_batch` gives the expected `BatchError.kind`.

Every case prints one line `hostile case=<case> kind=<kind> rejected=1 ingested=0`.
"""

from __future__ import annotations

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

from configs import ConfigError, WorkerSpec, load_config
from distributed.transfer import compress_bytes, write_atomic
from training import records
from training.collector import Collector, LocalSource, validate_with_records

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
          seed: int = 0) -> str:
    recs = _games(seed=seed, generation=generation)
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
                     worker: str = WORKER) -> str:
    assert res.rejected == [name] and res.ingested == [], (res.rejected, res.ingested)
    assert os.listdir(run_dir / "replay") == [], "a hostile batch reached the replay folder"
    assert (run_dir / "quarantine" / name).exists()
    reason = (run_dir / "quarantine" / f"{name}.reason.txt").read_text()
    assert name in reason and word in reason, reason
    lines = [e for e in _ledger(run_dir) if e["name"] == name]
    assert len(lines) == 1 and lines[0]["status"] == "rejected" and lines[0]["worker"] == worker
    assert col.tally[worker].rejected == 1 and col.tally[worker].batches == 0
    assert _collector(run_dir).tally[worker].rejected == 1  # counted again from the ledger
    return reason


@pytest.fixture
def outbox(tmp_path: Path) -> Path:
    d = tmp_path / "worker" / "outbox"
    d.mkdir(parents=True)
    return d


# ----------------------------------------------------------------------------- batches


def test_good_batch_is_ingested_as_control(run_dir, outbox):
    name = _good(outbox, 0)
    col = _collector(run_dir)
    res = col.collect(WORKER, LocalSource(outbox))
    assert res.ingested == [name] and res.rejected == [] and res.games == 3
    assert (run_dir / "replay" / name).exists() and os.listdir(outbox) == []


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_batch_is_rejected_quarantined_and_counted(case, run_dir, outbox):
    make, kinds, word = CASES[case]
    name = records.batch_name(WORKER, 0, 7)
    make(outbox / name)
    with pytest.raises(records.BatchError) as err:
        records.read_batch(outbox / name)
    assert err.value.kind in kinds, (err.value.kind, str(err.value))
    col = _collector(run_dir)
    res = col.collect(WORKER, LocalSource(outbox))
    _assert_rejected(run_dir, col, res, name, word)
    assert os.listdir(outbox) == [], "the worker's copy of a rejected batch must be removed"
    assert not Path("/tmp/azgo_pwned").exists()
    print(f"hostile case={case} kind={err.value.kind} rejected=1 ingested=0")


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
    col = _collector(run_dir)
    assert col.collect(WORKER, LocalSource(outbox)).ingested == [name]
    _good(outbox, 0, seed=9)  # same name again, even with other games
    res = col.collect(WORKER, LocalSource(outbox))
    assert res.ingested == [] and res.duplicates == 1 and os.listdir(outbox) == []
    _good(outbox, 0)
    res = _collector(run_dir).collect(WORKER, LocalSource(outbox))  # after a coach restart
    assert res.ingested == [] and res.duplicates == 1
    assert [e["name"] for e in _ledger(run_dir)] == [name]
    assert col.tally[WORKER].batches == 1
    print("hostile case=duplicate_name ingested=1 offered=3 duplicates_ingested=0")


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


# ----------------------------------------------------------------------------- over SFTP

from tests.sshd import make_config, sshd_server  # noqa: E402,F401 - fixture


class SftpOutbox:
    """A `BatchSource` over `SSHConnector` (stand-in for the coach's SSH source)."""

    def __init__(self, conn, worker: str, outbox: str):
        self.conn, self.worker, self.outbox = conn, worker, outbox

    def list_batches(self) -> list[str]:
        return [n for n in self.conn.listdir(self.worker, self.outbox)
                if n.endswith(records.BATCH_SUFFIX) and not n.startswith(".")]

    def fetch(self, name: str, dest: Path) -> int:
        return self.conn.get(self.worker, f"{self.outbox}/{name}", dest).size

    def delete(self, name: str) -> None:
        self.conn.remove(self.worker, f"{self.outbox}/{name}")


@pytest.fixture
def sftp(sshd_server, tmp_path):
    from distributed.ssh_connector import SSHConnector

    root = tmp_path / "remote"
    spec = WorkerSpec(host=sshd_server.addr, user=sshd_server.user, name=WORKER,
                      port=sshd_server.port, key_path=str(sshd_server.client_key),
                      remote_dir=str(root))
    conn = SSHConnector(make_config([spec], sshd_server.known_hosts))
    outbox = root / "outbox"
    outbox.mkdir(parents=True)
    try:
        yield conn, outbox
    finally:
        conn.close()


@pytest.mark.ssh
def test_hostile_batches_over_sftp_are_rejected_and_good_ones_ingested(sftp, run_dir):
    conn, outbox = sftp
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
    res = col.collect(WORKER, SftpOutbox(conn, WORKER, str(outbox)))
    assert res.ingested == [good]
    assert sorted(res.rejected) == sorted([*bad, odd])
    assert os.listdir(run_dir / "replay") == [good]
    assert col.tally[WORKER].rejected == 5 and col.tally[WORKER].batches == 1
    assert os.listdir(outbox) == [], "collected and rejected batches are removed on the worker"
    assert not list(outbox.parent.rglob("PWNED*"))
    print(f"hostile case=sftp rejected={len(res.rejected)} ingested={len(res.ingested)}")


@pytest.mark.ssh
def test_changed_host_key_refuses_collection_with_both_fingerprints(sshd_server, tmp_path,
                                                                    run_dir):
    from distributed.sandbox import keygen
    from distributed.ssh_connector import HostKeyError, SSHConnector

    other = keygen(tmp_path / "impostor")
    pub = Path(f"{other}.pub").read_text().split()
    host = sshd_server.known_hosts_line().split()[0]
    known = tmp_path / "known_hosts"
    known.write_text(f"{host} {pub[0]} {pub[1]}\n")
    real = sshd_server.known_hosts_line().split()
    spec = WorkerSpec(host=sshd_server.addr, user=sshd_server.user, name=WORKER,
                      port=sshd_server.port, key_path=str(sshd_server.client_key),
                      remote_dir=str(tmp_path / "remote"))
    conn = SSHConnector(make_config([spec], known), accept_new_host_keys=True)
    try:
        with pytest.raises(HostKeyError) as err:
            _collector(run_dir).collect(WORKER, SftpOutbox(conn, WORKER, "outbox"))
    finally:
        conn.close()
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


@pytest.mark.parametrize("name", ["w1;rm -rf ~", "$(id)", "w 1", "w1/../x", "w\n1", "`x`"])
def test_shell_metacharacters_in_worker_name_are_refused(name, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("distributed:\n  workers:\n    - {host: h, user: u, name: %s}\n"
                   % json.dumps(name))
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert "name" in str(err.value) and str(cfg) in str(err.value)


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
