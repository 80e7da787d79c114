"""Local behaviour of distributed/transfer.py: atomic writes, compression limits, stats.

The SFTP half (put_file/get_file against a real sshd) is in tests/test_ssh_connector.py.
"""

from __future__ import annotations

import json
import multiprocessing
import time

import numpy as np
import pytest

from distributed.transfer import (
    DecompressionLimitError,
    TransferError,
    TransferStats,
    compress_bytes,
    compress_file,
    decompress_bytes,
    decompress_file,
    fan_out,
    sha256_file,
    write_atomic,
    write_json_atomic,
)


def _realistic_weights(nbytes: int) -> bytes:
    rng = np.random.default_rng(0)
    return (rng.standard_normal(nbytes // 4) * 0.05).astype(np.float32).tobytes()


def test_write_atomic_writes_bytes_and_text(tmp_path):
    write_atomic(tmp_path / "a.bin", b"\x00\x01")
    write_atomic(tmp_path / "b.txt", "héllo")
    assert (tmp_path / "a.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "b.txt").read_text(encoding="utf-8") == "héllo"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "b.txt"]


def test_write_json_atomic_round_trips(tmp_path):
    write_json_atomic(tmp_path / "x.json", {"b": 1, "a": [1, 2]})
    assert json.loads((tmp_path / "x.json").read_text()) == {"a": [1, 2], "b": 1}


def _write_forever(path):
    big = b"x" * (8 << 20)
    while True:
        write_atomic(path, big)


def test_interrupted_write_leaves_the_old_file_whole(tmp_path):
    target = tmp_path / "model.bin"
    write_atomic(target, b"old" * 1000)
    proc = multiprocessing.get_context("fork").Process(target=_write_forever, args=(target,))
    proc.start()
    time.sleep(0.3)
    proc.kill()  # SIGKILL mid-write: no cleanup code runs
    proc.join()
    data = target.read_bytes()
    assert data in (b"old" * 1000, b"x" * (8 << 20)), "a reader saw a partial file"
    # whatever the killed writer left behind is a *.tmp name readers skip
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "model.bin"]
    assert all(n.endswith(".tmp") for n in leftovers)


def test_write_atomic_failure_keeps_old_file_and_removes_temp(tmp_path):
    target = tmp_path / "f.txt"
    write_atomic(target, "old")
    with pytest.raises(TypeError):
        write_atomic(target, 123)  # type: ignore[arg-type]
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_compress_round_trip_bytes_and_files(tmp_path):
    data = _realistic_weights(1 << 20)
    packed = compress_bytes(data, level=3)
    assert decompress_bytes(packed, max_bytes=len(data)) == data
    src, zst, out = tmp_path / "w.bin", tmp_path / "w.bin.zst", tmp_path / "w.out"
    src.write_bytes(data)
    csize = compress_file(src, zst, level=3)
    assert csize == zst.stat().st_size < len(data)
    assert decompress_file(zst, out, max_bytes=len(data)) == len(data)
    assert sha256_file(out) == sha256_file(src)
    print(f"float32 weights compression ratio at level 3: {len(data) / csize:.3f}")


def test_decompression_bomb_is_refused(tmp_path):
    bomb = compress_bytes(b"\0" * (64 << 20), level=3)  # ~2 KB that expand to 64 MB
    assert len(bomb) < 10_000
    with pytest.raises(DecompressionLimitError):
        decompress_bytes(bomb, max_bytes=1 << 20)
    (tmp_path / "bomb.zst").write_bytes(bomb)
    (tmp_path / "out").write_bytes(b"previous")
    with pytest.raises(DecompressionLimitError):
        decompress_file(tmp_path / "bomb.zst", tmp_path / "out", max_bytes=1 << 20)
    assert (tmp_path / "out").read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bomb.zst", "out"]


def test_corrupt_zstd_raises_transfer_error(tmp_path):
    with pytest.raises(TransferError):
        decompress_bytes(b"not zstd at all", max_bytes=100)
    (tmp_path / "bad.zst").write_bytes(compress_bytes(b"abc" * 1000)[:-5] + b"junk!")
    with pytest.raises(TransferError):
        decompress_file(tmp_path / "bad.zst", tmp_path / "out", max_bytes=1 << 20)
    assert not (tmp_path / "out").exists()


def test_transfer_stats_window_and_throughput():
    stats = TransferStats(window_s=60)
    stats.record(30_000_000, 1.5, sent=True)
    stats.record(15_600_000, 0.5, sent=False)
    assert stats.bytes_sent == 30_000_000 and stats.bytes_received == 15_600_000
    assert stats.net_mb_per_min() == pytest.approx(45.6)
    assert stats.mb_per_s() == pytest.approx(45.6 / 2)
    short = TransferStats(window_s=0.05)
    short.record(1_000_000, 0.1, sent=True)
    time.sleep(0.1)
    assert short.net_mb_per_min() == 0.0


def test_fan_out_returns_results_and_exceptions_per_name():
    def action(name):
        if name == "bad":
            raise TransferError(f"{name}: broken")
        time.sleep(0.2)
        return name.upper()

    t0 = time.perf_counter()
    res = fan_out(action, ["a", "bad", "c", "d"])
    dt = time.perf_counter() - t0
    assert list(res) == ["a", "bad", "c", "d"]
    assert res["a"] == "A" and res["d"] == "D"
    assert isinstance(res["bad"], TransferError)
    assert dt < 0.5, f"fan-out ran serially: {dt:.2f}s"


def test_truncated_zstd_is_an_error_not_a_silent_prefix(tmp_path):
    # zstandard's stream_reader ends cleanly on a cut frame; a cut transfer must not look whole.
    import os as _os

    from distributed.transfer import TransferError, compress_bytes, decompress_bytes, decompress_file

    data = _os.urandom(60_000) + b"a" * 60_000
    blob = compress_bytes(data, 3)
    assert decompress_bytes(blob, 10**6) == data
    for cut in (5, len(blob) // 2, len(blob) - 1):
        with pytest.raises(TransferError, match="truncated"):
            decompress_bytes(blob[:cut], 10**6)
    src = tmp_path / "cut.zst"
    src.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(TransferError, match="truncated"):
        decompress_file(src, tmp_path / "out", 10**6)
    assert not (tmp_path / "out").exists()
