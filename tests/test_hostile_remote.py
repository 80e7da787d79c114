"""A compromised worker account against the coach's SSH path: downloads, listings, remote JSON.

The worker host runs a real sshd; its authorized_keys entry for the coach's key forces a
command (`tests/hostile_sftp.py`), as a worker account without root can: OpenSSH's own
sftp-server behind a relay that withholds the reply to the READ at offset 0, pads every reply
far past its request, sends one reply that announces 15 MiB, or answers one byte at a time.
The coach's download (`SSHSource.fetch`, as the collector calls it) must hold little memory
(tracemalloc's peak, under 20 MB, where it held 25 MB and more before) and end with a clear
error within its deadline. Attributes that announce 2^32-1 extended pairs cost under a second
of CPU, not an hour; a server silent in the SFTP handshake, or one that answers a REMOVE, STAT
or CLOSE with replies to no request, holds a call no longer than its deadline, and `close()`
frees a thread still in the handshake. Listings of the worker's folders are bounded or not
made at all, and remote JSON that Python cannot take (a 400-digit float, brackets nested
2,000 deep, a missing key) is a clear worker error, never a bare exception.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from configs import WorkerSpec
from distributed.remote import WorkerPaths
from distributed.ssh_connector import RemoteCommandError
from distributed.sftp import BoundedSFTPClient
from tests.conftest import require_tool
from tests.sshd import SSHServer, make_config, require_sshd
from training.fleet.collector import BatchRefused, FetchTooSlow
from training.fleet.fleet import WorkerFault

WORKER = "w1"
SCRIPT = Path(__file__).with_name("hostile_sftp.py")
DEADLINE_S = 3.0
MEMORY_MB = 20.0

pytestmark = pytest.mark.ssh


@pytest.fixture(scope="module")
def hostile_sshd():
    """A loopback sshd whose one key runs the relay; `.mode` is the file that picks its
    behaviour for the next SFTP session."""
    require_sshd()
    require_tool("OpenSSH's sftp-server", os.path.exists("/usr/lib/openssh/sftp-server"),
                 "apt-get install openssh-sftp-server (.ci/install.sh installs it)")
    tmp = Path(tempfile.mkdtemp(prefix="azgo-hostile-sshd-"))
    srv = SSHServer(tmp)
    srv.mode = tmp / "mode"
    srv.mode.write_text("honest")
    pub = Path(str(srv.client_key) + ".pub").read_text().strip()
    (tmp / "authorized_keys").write_text(
        f'command="{sys.executable} {SCRIPT} {srv.mode}" {pub}\n')
    srv.start()
    try:
        yield srv
    finally:
        srv.kill()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def worker(hostile_sshd, tiny_cfg, tmp_path):
    """(the coach's SSHBackend of worker `w1` on the hostile host, its worker folder)."""
    from training.fleet.ssh_workers import SSHFleet

    srv = hostile_sshd
    srv.mode.write_text("honest")
    spec = WorkerSpec(host=srv.addr, user=srv.user, name=WORKER, port=srv.port,
                      key_path=str(srv.client_key), remote_dir=str(tmp_path / "remote"))
    dist = make_config([spec], srv.known_hosts, transfer_timeout_s=DEADLINE_S)
    coach = tmp_path / "coach"
    coach.mkdir()
    fleet = SSHFleet(dataclasses.replace(tiny_cfg, distributed=dist), coach,
                     coach / "config.yaml")
    folder = Path(WorkerPaths(str(tmp_path / "remote"), WORKER).worker_dir)
    (folder / "outbox").mkdir(parents=True)
    (folder / "models").mkdir()
    try:
        yield fleet.backend(WORKER), folder
    finally:
        fleet.close()


def _measured(fn):
    """(what `fn()` raised or returned, seconds, tracemalloc peak in MB), in a thread so a
    download that never ends fails the test instead of hanging it."""
    out: dict = {}

    def go() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["value"] = e

    tracemalloc.start()
    t0 = time.monotonic()
    try:
        t = threading.Thread(target=go, daemon=True)
        t.start()
        t.join(60)
        assert not t.is_alive(), "the download did not end within 60 s"
        peak = tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()
    return out["value"], time.monotonic() - t0, peak


BATCH = "w1_g000000_s000000.npz.zst"


@pytest.mark.parametrize("mode,error,word", [
    ("withhold", FetchTooSlow, "deadline"),
    ("overlong", BatchRefused, "answered a read of 32768 bytes with"),
    ("huge", BatchRefused, "over the"),
    ("trickle", FetchTooSlow, "deadline"),
    ("shrink", BatchRefused, "shrank"),
    ("grow", BatchRefused, "more data than"),
    ("dribble", BatchRefused, "shorter than their reads"),
])
def test_hostile_sftp_download_holds_little_memory_and_ends_with_a_clear_error(
        mode, error, word, worker, tmp_path):
    backend, folder = worker
    size = (24 if mode == "withhold" else 4) << 20  # 24 MiB: 768 reads of 32 KiB
    size += 1000 if mode == "grow" else 0  # the last read is short
    (folder / "outbox" / BATCH).write_bytes(os.urandom(size))
    source = backend.source()
    source.list_batches()  # connected before the server turns hostile
    _set_mode(backend, mode)
    dest = tmp_path / "got"
    err, dt, peak = _measured(lambda: source.fetch(BATCH, dest))
    print(f"hostile case=sftp_{mode} peak_mb={peak:.1f} seconds={dt:.2f} error={err}")
    assert isinstance(err, error), err
    assert word in str(err) and WORKER in str(err), err
    assert peak < MEMORY_MB, f"the download held {peak:.1f} MB"
    assert dt < 2 * DEADLINE_S + 2, f"ended after {dt:.1f}s, deadline {DEADLINE_S}s"
    assert not list(tmp_path.glob("got*")), "a partial file was left"
    _set_mode(backend, "honest")
    assert source.fetch(BATCH, dest) == size  # the next session works
    assert dest.read_bytes() == (folder / "outbox" / BATCH).read_bytes()


def _set_mode(backend, mode: str) -> None:
    """The relay reads its mode per SFTP session: end the coach's session so that the next
    call opens one with the new mode."""
    srv_mode = Path(backend.connector.spec(WORKER).key_path).parent / "mode"
    srv_mode.write_text(mode)
    for conn in list(backend.connector._conns.values()):
        conn.close_sftp()


def test_short_replies_are_asked_for_again_and_the_file_is_whole(worker, tmp_path):
    """A server may answer a read with fewer bytes than asked (legal SFTP): the rest is asked
    for again, in order, and the download is whole and verified."""
    from distributed import sftp as bounded

    backend, folder = worker
    data = os.urandom(300_000)
    (folder / "outbox" / BATCH).write_bytes(data)
    conn = backend.connector
    sftp = conn._sftp(conn._connection(WORKER))
    real = sftp._async_request

    def halve(fileobj, t, *args):  # ask for half of what the reader wants: short replies
        if t == bounded.CMD_READ and isinstance(fileobj, bounded._Replies):
            handle, off, n = args
            return real(fileobj, t, handle, off, max(1, n // 2))
        return real(fileobj, t, *args)

    sftp._async_request = halve
    try:
        res = bounded.get_file(sftp, str(folder / "outbox" / BATCH), tmp_path / "b",
                               timeout_s=DEADLINE_S)
    finally:
        del sftp._async_request
    assert res.size == len(data) and (tmp_path / "b").read_bytes() == data


def _timed(fn, limit_s: float = 30.0):
    """(what `fn()` raised or returned, wall seconds, CPU seconds of the thread that ran it):
    in a thread, so a call that never ends fails the test instead of hanging it."""
    out: dict = {}

    def go() -> None:
        cpu0 = time.thread_time()
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["value"] = e
        out["cpu"] = time.thread_time() - cpu0

    t0 = time.monotonic()
    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(limit_s)
    assert not t.is_alive(), f"the call did not end within {limit_s:g} s"
    return out["value"], time.monotonic() - t0, out["cpu"]


@pytest.mark.parametrize("op", ["fetch", "listing", "heartbeat", "upload"])
def test_attributes_announcing_2_32_extended_pairs_are_refused_in_little_cpu(op, worker,
                                                                             tmp_path):
    """Every stat, lstat and listed entry answered with attributes that announce 2^32-1
    extended pairs in 17 bytes (paramiko's parser loops over the count, padding the missing
    bytes with zeros: about an hour of CPU per reply, past any deadline): a clear error
    naming the worker, in well under a second of the calling thread's CPU."""
    backend, folder = worker
    (folder / "outbox" / BATCH).write_bytes(os.urandom(100_000))
    (folder / "status.json").write_text(json.dumps(
        {"name": WORKER, "state": "Active", "pid": 1, "time": 1.0}))
    local = tmp_path / "model.bin"
    local.write_bytes(b"model")
    source = backend.source()
    source.list_batches()  # connected before the server turns hostile
    calls = {
        "fetch": lambda: source.fetch(BATCH, tmp_path / "got"),
        "listing": source.list_batches,
        "heartbeat": backend.read_heartbeat,
        "upload": lambda: backend.connector.put(WORKER, local, "models/model.bin"),
    }
    _set_mode(backend, "attrs")
    err, dt, cpu = _timed(calls[op])
    print(f"hostile case=attrs_{op} cpu_s={cpu:.3f} seconds={dt:.2f} error={err}")
    assert isinstance(err, Exception), err
    assert "extended attributes" in str(err) and WORKER in str(err), err
    assert cpu < 1.0, f"the {op} took {cpu:.2f} s of CPU"
    _set_mode(backend, "honest")
    assert calls[op]() is not None or op == "heartbeat"  # the next session works


@pytest.mark.parametrize("fresh", [True, False], ids=["connect", "new_session"])
def test_sftp_server_that_never_answers_the_handshake_is_left_at_the_deadline(fresh, worker):
    """The SFTP subsystem reads INIT and never answers (nor anything later): the handshake
    is under the transfer deadline, so the thread is free by then with a clear error, not
    blocked for good."""
    backend, _ = worker
    if fresh:
        _set_mode(backend, "silent-init")
        call = lambda: backend.connector.paths(WORKER)  # noqa: E731 - connects, handshake
    else:
        source = backend.source()
        source.list_batches()  # connected, then a new session is opened
        _set_mode(backend, "silent-init")
        call = source.list_batches
    err, dt, _ = _timed(call)
    print(f"hostile case=silent_init_{'connect' if fresh else 'session'} seconds={dt:.2f} "
          f"error={err}")
    assert isinstance(err, Exception), err
    assert "handshake" in str(err) and WORKER in str(err), err
    assert dt < 2 * DEADLINE_S + 2, f"freed after {dt:.1f}s, deadline {DEADLINE_S}s"
    _set_mode(backend, "honest")
    assert backend.source().list_batches() == []  # the next session works


def test_closing_the_connector_frees_a_thread_in_the_sftp_handshake(hostile_sshd, tmp_path):
    """A connection still in its SFTP handshake (the server silent, the deadline far off) is
    the connector's: `close()` (the supervisor's abort) ends it, and its thread is free."""
    from distributed.ssh_connector import ConnectError, SSHConnector

    srv = hostile_sshd
    seen = Path(f"{srv.mode}.init")
    seen.unlink(missing_ok=True)
    srv.mode.write_text("silent-init")
    spec = WorkerSpec(host=srv.addr, user=srv.user, name=WORKER, port=srv.port,
                      key_path=str(srv.client_key), remote_dir=str(tmp_path / "remote"))
    connector = SSHConnector(make_config([spec], srv.known_hosts, transfer_timeout_s=600.0))
    out: dict = {}

    def connect() -> None:
        try:
            out["value"] = connector.paths(WORKER)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["value"] = e

    t = threading.Thread(target=connect, daemon=True)
    t.start()
    try:
        for _ in range(400):  # the INIT reached the server: the thread waits in the handshake
            if seen.exists() or not t.is_alive():
                break
            time.sleep(0.05)
        assert seen.exists(), "the client never sent INIT"
        t0 = time.monotonic()
        connector.close()
        t.join(30)
        dt = time.monotonic() - t0
        print(f"hostile case=silent_init_abort seconds={dt:.2f} error={out.get('value')}")
        assert not t.is_alive(), "close() did not free the thread in the handshake"
        assert isinstance(out["value"], ConnectError) and WORKER in str(out["value"])
        assert "closed while connecting" in str(out["value"])
    finally:
        srv.mode.write_text("honest")
        connector.close()


@pytest.mark.parametrize("mode", ["stall-remove", "stall-stat", "stall-close"])
def test_unsolicited_replies_do_not_hold_a_call_past_its_deadline(mode, worker, tmp_path):
    """The server never answers a REMOVE (a STAT, a CLOSE) and sends a reply to no request
    every 0.2 s instead, so the channel is never idle for its timeout: the delete (the
    upload's folder check, the download's final close) ends by the transfer deadline."""
    backend, folder = worker
    data = os.urandom(100_000)
    (folder / "outbox" / BATCH).write_bytes(data)
    local = tmp_path / "model.bin"
    local.write_bytes(b"model")
    source = backend.source()
    source.list_batches()
    call = {"stall-remove": lambda: source.delete(BATCH),
            "stall-stat": lambda: backend.connector.put(WORKER, local, "models/model.bin"),
            "stall-close": lambda: source.fetch(BATCH, tmp_path / "got")}[mode]
    _set_mode(backend, mode)
    err, dt, _ = _timed(call)
    print(f"hostile case={mode} seconds={dt:.2f} result={err}")
    assert dt < 2 * DEADLINE_S + 2, f"ended after {dt:.1f}s, deadline {DEADLINE_S}s"
    if mode == "stall-close":  # read whole and verified: only its handle's close is lost
        assert err == len(data) and (tmp_path / "got").read_bytes() == data
    else:
        assert isinstance(err, Exception), err
        assert "deadline" in str(err) and WORKER in str(err), err


# ----------------------------------------------------------------------------- listings


def test_flooded_models_folder_is_a_worker_error_after_a_bounded_listing(worker, tmp_path,
                                                                         monkeypatch):
    """models/ with more entries than any honest one holds: the push is refused as
    WorkerFault naming the folder, after reading at most the cap (as a flooded outbox)."""
    import training.fleet.ssh_workers as ssh_workers
    from training.run import model_store

    backend, folder = worker
    monkeypatch.setattr(ssh_workers, "MODELS_MAX_LISTED", 300, raising=False)
    for i in range(3000):
        (folder / "models" / f"junk{i:05d}").write_bytes(b"")
    local = tmp_path / "models"
    local.mkdir()
    manifest = _publish(local, 1)
    listed = []
    real = BoundedSFTPClient.listdir_iter

    def counting(self, *a, **kw):
        for attr in real(self, *a, **kw):
            listed.append(attr.filename)
            yield attr

    monkeypatch.setattr(BoundedSFTPClient, "listdir_iter", counting)
    err, dt, peak = _measured(lambda: backend.push_model(local, manifest))
    print(f"hostile case=models_flood entries=3000 cap=300 read={len(listed)} "
          f"seconds={dt:.2f} peak_mb={peak:.1f}")
    assert isinstance(err, WorkerFault), err
    assert "models" in str(err) and "more than 300 entries" in str(err), err
    assert 300 <= len(listed) <= 300 + 200, "the listing went on past the cap"
    assert (folder / "models" / model_store.stale_files(1)[0]).exists()  # pushed first
    for junk in (folder / "models").glob("junk*"):
        junk.unlink()
    cut = folder / "models" / f".model_000000.pt.zst.{WORKER}.tmp"  # an upload the link cut
    cut.write_bytes(b"half a model")
    backend.push_model(local, manifest)  # emptied: the push goes through again
    assert not cut.exists(), "the cut upload's leftover was not removed"
    assert sorted(p.name for p in (folder / "models").iterdir()) == [
        "model_000001.json", "model_000001.pt.zst"]


def _publish(folder: Path, generation: int):
    from training.run import model_store

    stem = model_store.model_stem(generation)
    (folder / f"{stem}.pt.zst").write_bytes(b"model")
    manifest = model_store.Manifest(generation=generation, sha256="0" * 64, size=5,
                                    created=0.0)
    (folder / f"{stem}.json").write_text("{}")
    return manifest


def test_uploads_list_no_folder_and_overwrite_a_cut_uploads_leftover(worker, monkeypatch):
    """An upload (the lease renewed every 20 s, a model, a config) lists no folder of the
    worker, however full: the temporary name is the same for every upload of a name by one
    worker's connector, so a cut upload's leftover is overwritten by the next, not looked
    for."""
    import training.fleet.ssh_workers as ssh_workers

    backend, folder = worker
    for i in range(3000):
        (folder / f"junk{i:05d}").write_bytes(b"")
    leftover = folder / f".lease.json.{WORKER}.tmp"
    leftover.write_bytes(b"half an upload")
    calls = []
    for name in ("listdir", "listdir_attr", "listdir_iter"):
        real = getattr(BoundedSFTPClient, name)
        monkeypatch.setattr(BoundedSFTPClient, name,
                            lambda self, *a, _n=name, _r=real, **kw: (calls.append(_n),
                                                                      _r(self, *a, **kw))[1])
    ssh_workers.take_lease(backend.connector, WORKER, "main-node:/runs/a")
    assert calls == [], f"an upload listed a folder: {calls}"
    assert json.loads((folder / "lease.json").read_text())["run"] == "main-node:/runs/a"
    assert not leftover.exists()


# ----------------------------------------------------------------------------- remote JSON


def test_heartbeat_with_a_400_digit_number_is_a_worker_error(worker):
    backend, folder = worker
    hb = {"name": WORKER, "state": "Active", "pid": 1, "time": 1.0}
    text = json.dumps(hb)[:-1] + ', "games_per_s": ' + "9" * 400 + "}"
    (folder / "status.json").write_text(text)
    with pytest.raises(WorkerFault, match="status.json.*OverflowError"):
        backend.read_heartbeat()


def test_local_heartbeat_with_a_400_digit_number_is_a_worker_error(tiny_cfg, tmp_path):
    """The same file from a local worker (its folder is the coach's, its process is not)."""
    from training.fleet.local_workers import LocalBackend

    backend = LocalBackend(tiny_cfg, WORKER, tmp_path, "cpu", tmp_path / "config.yaml")
    hb = {"name": WORKER, "state": "Active", "pid": 1, "time": 1.0}
    (tmp_path / "status.json").write_text(
        json.dumps(hb)[:-1] + ', "games_per_s": ' + "9" * 400 + "}")
    with pytest.raises(WorkerFault, match="status.json.*OverflowError"):
        backend.read_heartbeat()


def test_lease_nested_2000_deep_is_unreadable_and_taken_over(worker, caplog):
    import training.fleet.ssh_workers as ssh_workers

    backend, folder = worker
    (folder / "lease.json").write_text("[" * 2000 + "]" * 2000)
    ssh_workers.take_lease(backend.connector, WORKER, "main-node:/runs/a")
    assert json.loads((folder / "lease.json").read_text())["run"] == "main-node:/runs/a"
    assert "unreadable" in caplog.text and "RecursionError" in caplog.text
    (folder / "lease.json").write_text(json.dumps(
        {"run": "other:/run", "pid": 1, "time": int("9" * 400)}))
    ssh_workers.take_lease(backend.connector, WORKER, "main-node:/runs/a")  # no OverflowError
    assert json.loads((folder / "lease.json").read_text())["run"] == "main-node:/runs/a"


@pytest.mark.parametrize("output,word", [
    ('{"project_version": null, "torch": null, "cuda": false, "gpus": [], '
     '"free_disk_gb": 10}', "lacks 'python'"),
    ("[" * 2000 + "]" * 2000, "unreadable output"),
    ('{"python": "3.11.7", "project_version": null, "torch": null, "cuda": false, '
     '"gpus": [], "free_disk_gb": ' + "9" * 400 + "}", "finite"),
    ('{"python": "3.11.7", "project_version": null, "torch": null, "cuda": false, '
     '"gpus": "all", "free_disk_gb": 10}', "'gpus'"),
], ids=["no_python", "nested_2000", "disk_400_digits", "gpus_not_a_list"])
def test_preflight_output_the_coach_cannot_take_is_a_worker_error(output, word, worker,
                                                                    tmp_path):
    """The preflight runs the worker's `python`; whatever it prints is a RemoteCommandError
    (WorkerFault for the supervisor) naming what is wrong, never a KeyError."""
    from training.fleet.ssh_workers import translate

    backend, _ = worker
    fake = tmp_path / "python"
    (tmp_path / "out.txt").write_text(output + "\n")
    fake.write_text(f"#!/bin/sh\ncat {tmp_path / 'out.txt'}\n")
    fake.chmod(0o755)
    conn = backend.connector
    conn.cfg = dataclasses.replace(conn.cfg, python=str(fake))
    with pytest.raises(RemoteCommandError, match=word) as e:
        conn.preflight(WORKER, with_torch=False)
    assert WORKER in str(e.value)
    assert isinstance(translate(e.value), WorkerFault)


def test_daemon_commands_printing_nonsense_are_a_worker_error(worker):
    """The worker's shell answers `is the daemon running` and `start` with nonsense (a forced
    command, a noisy rc file): a RemoteCommandError (WorkerFault) naming the output, never a
    bare ValueError from int()."""
    backend, _ = worker
    backend.connector.paths(WORKER)  # connected while the shell is honest
    (Path(backend.connector.spec(WORKER).key_path).parent / "mode").write_text("garbage-shell")
    with pytest.raises(WorkerFault, match="unexpected output"):
        backend.is_running()
    with pytest.raises(WorkerFault, match="unexpected output"):
        backend.start(0)
