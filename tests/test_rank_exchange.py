"""Training ranks exchange tensors only: rank 0 never unpickles what another rank sends, and
relays only files of its own list, whatever a peer asks for.

Two real processes in a real gloo process group (torch.multiprocessing, loopback TCP store).
Rank 0 runs the trainer's own `node_relay.relay_files` / `ddp.all_gather_json` with the unpickler of
torch.distributed replaced by one that fails the test; rank 1 is honest in the first test and
hostile in the second (it speaks the wire protocol itself, asks for every file it can and
sends garbage), and reports what it received.
"""

from __future__ import annotations

import hashlib
import json
import os
from datetime import timedelta
from pathlib import Path

import pytest

from distributed.sshd_hosts import free_port

SECRET = b"TOKEN=do-not-send\n"


def _forbid_unpickling() -> None:
    import torch.distributed.distributed_c10d as c10d

    def refuse(*args, **kwargs):
        raise AssertionError("rank 0 unpickled data sent by another rank")

    c10d._unpickler = refuse  # what all_gather_object / gather_object use on receipt


def _rank(rank: int, port: int, folder: str, hostile: bool) -> None:
    import torch
    import torch.distributed as dist

    from training.train import ddp, node_relay
    from training.learn.training_error import TrainingError

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=30))
    ctx = ddp.DistContext(rank=rank, world_size=2, backend="gloo")
    root = Path(folder)
    report: dict = {}
    try:
        if rank == 0:
            _forbid_unpickling()
            src = root / "run" / "replay"
            sent = node_relay.relay_files(ctx, src, ["a.npz.zst", "b.npz.zst"], None)
            report["sent"] = sent
            try:
                report["gathered"] = ddp.all_gather_json({"rank": 0}, ctx)
            except TrainingError as e:
                report["gather_refused"] = str(e)
        elif not hostile:
            dest = root / "node" / "replay"
            dest.mkdir(parents=True)
            (dest / "b.npz.zst").write_bytes((root / "run" / "replay" / "b.npz.zst").read_bytes())
            node_relay.relay_files(ctx, root / "nowhere", ["a.npz.zst", "b.npz.zst"], dest)
            report["received"] = sorted(p.name for p in dest.iterdir())
            report["gathered"] = ddp.all_gather_json({"rank": 1}, ctx)
        else:
            # Ask for everything (garbage values included), then take whatever comes: the
            # only names rank 0 may act on are its own, so the secret beside them never
            # leaves. Then send rank 0 a "JSON" that is deeply nested.
            mask = torch.tensor([7, -3], dtype=torch.int32)
            dist.all_reduce(mask, op=dist.ReduceOp.MAX)
            got = []
            for _ in range(int((mask > 0).sum())):
                size, digest = ddp.broadcast_json(None, ctx)
                t = torch.empty(size, dtype=torch.uint8)
                dist.broadcast(t, src=0)
                got.append(bytes(t.numpy()))
            report["received_sha256"] = [hashlib.sha256(g).hexdigest() for g in got]
            report["secret_seen"] = any(SECRET in g for g in got)
            # JSON nested past any parser's recursion limit, framed as `ddp.all_gather_json` does
            data = b"[" * 200_000 + b"]" * 200_000
            sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(2)]
            dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64))
            width = max(int(t.item()) for t in sizes)
            mine = torch.zeros(width, dtype=torch.uint8)
            mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            dist.all_gather([torch.empty(width, dtype=torch.uint8) for _ in range(2)], mine)
    except Exception as e:  # noqa: BLE001 - reported to the test
        report["error"] = f"{type(e).__name__}: {e}"
    finally:
        (root / f"rank{rank}.json").write_text(json.dumps(report))
        dist.destroy_process_group()


def _run(tmp_path: Path, hostile: bool) -> tuple[dict, dict]:
    import torch.multiprocessing as mp

    replay = tmp_path / "run" / "replay"
    replay.mkdir(parents=True)
    (replay / "a.npz.zst").write_bytes(b"a" * 1000)
    (replay / "b.npz.zst").write_bytes(b"b" * 2000)
    (tmp_path / "run" / "secret.txt").write_bytes(SECRET)
    (replay / "secret.txt").write_bytes(SECRET)  # beside the batches, not in rank 0's list
    mp.spawn(_rank, args=(free_port(), str(tmp_path), hostile), nprocs=2, join=True)
    return tuple(json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))


@pytest.mark.slow
def test_rank_0_relays_what_a_peer_lacks_without_unpickling(tmp_path):
    r0, r1 = _run(tmp_path, hostile=False)
    assert "error" not in r0, r0["error"]
    assert "error" not in r1, r1["error"]
    assert r0["sent"] == 1000, "only the file the node lacked is sent"
    assert r1["received"] == ["a.npz.zst", "b.npz.zst"]
    assert (tmp_path / "node" / "replay" / "a.npz.zst").read_bytes() == b"a" * 1000
    assert r0["gathered"] == [{"rank": 0}, {"rank": 1}]


@pytest.mark.slow
def test_hostile_peer_gets_only_rank_0s_own_files_and_cannot_make_it_unpickle(tmp_path):
    r0, r1 = _run(tmp_path, hostile=True)
    assert "error" not in r0, r0["error"]
    assert r0["sent"] == 1000, r0  # names[0] of its own list: the garbage -3 asks for nothing
    assert not r1["secret_seen"]
    assert r1["received_sha256"] == [hashlib.sha256(b"a" * 1000).hexdigest()]
    assert "unreadable data from rank 1" in r0["gather_refused"]
    print("hostile case=rank_peer files_sent=rank0_list_only secret_sent=0 unpickled=0")
