"""The net server: one process owns the net, search processes send leaves through shared memory.

Real processes, real shared memory and eventfds: the server is `python -m training.serve`
(`ServerProcess`), clients are this test process or small `python -c` processes attached to
their own slot. No assert depends on speed: bounds are generous, and batching is shown by
counts (a server told to wait for every live client runs one batch for two requests).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tests.conftest import REPO, wait_until
from training.go.features import num_planes
from training.search import net_server
from training.search.net_server import (
    C_BATCHES, C_MAX_BATCH_SEEN, C_POSITIONS, FREE, S_STATE, NetClient, SlotLayout, StandInNet,
)
from training.serve import ServerError, ServerProcess

BOARD, HISTORY = 5, 2
CHANNELS = num_planes(HISTORY, False)
MOVES = BOARD * BOARD + 1


def _batch(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    planes = (rng.random((n, CHANNELS, BOARD, BOARD)) < 0.3).astype(np.float32)
    legal = rng.random((n, MOVES)) < 0.7
    legal[:, -1] = True
    return planes, legal


def _layout(slots: int = 2, max_batch: int = 16) -> SlotLayout:
    return SlotLayout(slots, max_batch, CHANNELS, BOARD)


@pytest.fixture
def servers(tmp_path):
    """ServerProcess factory; every server made is stopped at the end."""
    made: list[ServerProcess] = []

    def make(layout: SlotLayout, **kw) -> ServerProcess:
        server = ServerProcess(layout, stderr_path=tmp_path / f"server{len(made)}.log", **kw)
        made.append(server)
        server.start(timeout_s=120)
        return server

    yield make
    for server in made:
        server.stop()


CLIENT = textwrap.dedent("""
    import json, sys, numpy as np
    from training.search.net_server import (NetClient, SharedSlots, Signals, SlotLayout,
                                            live_clients)
    name, layout, signals, slot, calls, batch, wait_for = sys.argv[1:8]
    slots = SharedSlots.attach(name, SlotLayout.from_text(layout))
    client = NetClient(slots, int(slot), Signals.from_text(signals))
    while len(live_clients(slots)) < int(wait_for):
        pass
    rng = np.random.default_rng(int(slot))
    c, n = slots.layout.channels, slots.layout.board_size
    for i in range(int(calls)):
        planes = (rng.random((int(batch), c, n, n)) < 0.3).astype(np.float32)
        legal = rng.random((int(batch), n * n + 1)) < 0.7
        legal[:, -1] = True
        priors, values = client.evaluate(planes, legal)
        from training.search.net_server import StandInNet
        want_p, want_v = StandInNet()(planes.astype(np.uint8), legal)
        ok = bool(np.array_equal(priors, want_p) and np.array_equal(values, want_v))
        print(json.dumps({"call": i, "ok": ok, "generation": client.generation}), flush=True)
""")


def _client(server: ServerProcess, slot: int, calls: int, batch: int,
            wait_for: int = 1) -> subprocess.Popen:
    """A client process on `slot`: `calls` calls of `batch` positions, each checked against
    the stand-in net called directly; one JSON line per call."""
    layout, signals = server.layout.to_args()[0], server.signals.to_args()[0]
    return subprocess.Popen(
        [sys.executable, "-c", CLIENT, server.slots.name, layout, signals, str(slot),
         str(calls), str(batch), str(wait_for)],
        stdout=subprocess.PIPE, text=True, cwd=REPO, pass_fds=server.client_fds(slot))


def _lines(proc: subprocess.Popen, timeout_s: float = 120) -> list[dict]:
    out, _ = proc.communicate(timeout=timeout_s)
    return [json.loads(line) for line in out.splitlines() if line.strip()]


# ------------------------------------------------------------------------ the protocol


def test_two_clients_leaves_are_served_in_one_batch_with_the_nets_own_results(servers):
    # the server waits up to 60 s for every live client: the two requests make one batch
    server = servers(_layout(), stand_in_latency_s=0.0, gather_wait_s=60.0)
    a = _client(server, 0, calls=1, batch=5, wait_for=2)
    b = _client(server, 1, calls=1, batch=7, wait_for=2)
    for proc in (a, b):
        lines = _lines(proc)
        assert proc.returncode == 0
        assert lines == [{"call": 0, "ok": True, "generation": 0}]
    ctl = server.slots.ctl  # counted after the answers
    wait_until(lambda: ctl[C_MAX_BATCH_SEEN] > 0, 30, "the batch counted")
    assert (ctl[C_BATCHES], ctl[C_POSITIONS], ctl[C_MAX_BATCH_SEEN]) == (1, 12, 12)


@pytest.mark.parametrize("gather_wait_s", [0.0, 30.0])
def test_the_gather_wait_holds_a_request_for_the_clients_still_searching_or_not(
        servers, gather_wait_s):
    # another client is attached and searching (no request): with a wait the server holds
    # this request for it, with none (self_play.gather_wait_ms: 0) it runs it at once
    server = servers(_layout(), stand_in_latency_s=0.0, gather_wait_s=gather_wait_s)
    searching = NetClient(server.slots, 1, server.signals)
    client = NetClient(server.slots, 0, server.signals, call_timeout_s=3.0)
    planes, legal = _batch(5, seed=1)
    if gather_wait_s:
        with pytest.raises(net_server.NetServerUnavailable, match="no answer"):
            client.evaluate(planes, legal)
        assert server.slots.ctl[C_BATCHES] == 0
        searching.evaluate(*_batch(3, seed=2))  # the held request goes in the same batch
        want = 8
    else:
        priors, _ = client.evaluate(planes, legal)
        np.testing.assert_array_equal(priors, StandInNet()(planes.astype(np.uint8), legal)[0])
        want = 5
    ctl = server.slots.ctl  # the server counts a batch after it has answered its clients
    wait_until(lambda: ctl[C_MAX_BATCH_SEEN] > 0, 30, "the batch counted")  # written last
    assert (ctl[C_BATCHES], ctl[C_POSITIONS]) == (1, want)
    searching.detach()
    client.detach()


def _in_turn(hdr, call) -> tuple:
    """`call(0)` on a thread, and once client 0's request is in the net (TAKEN) `call(1)` on
    another; returns both threads."""
    import threading

    first = threading.Thread(target=call, args=(0,))
    first.start()
    wait_until(lambda: hdr[0][S_STATE] == net_server.TAKEN, 30, "client 0's request taken",
               interval_s=0.001)
    second = threading.Thread(target=call, args=(1,))
    second.start()
    return first, second


@pytest.mark.parametrize("lanes", [1, 2])
def test_a_second_lane_takes_a_request_while_the_first_lanes_batch_is_in_the_net(
        servers, lanes):
    # a stand-in net of 4 s a call: client 0's request goes in; then client 1's. With one
    # lane it waits in its slot (READY) until the first batch is answered; with two, the
    # second lane takes it while the first batch is still in the net (both TAKEN at once)
    server = servers(_layout(), stand_in_latency_s=4.0, gather_wait_s=0.0, lanes=lanes)
    hdr = server.slots.hdr
    clients = [NetClient(server.slots, k, server.signals) for k in (0, 1)]
    batches = [_batch(3 + k, seed=k) for k in (0, 1)]
    answers: dict[int, tuple] = {}

    def call(k: int) -> None:
        answers[k] = clients[k].evaluate(*batches[k])

    first, second = _in_turn(hdr, call)
    both_taken = False
    while hdr[0][S_STATE] == net_server.TAKEN:  # until the first batch is answered
        both_taken |= bool(hdr[1][S_STATE] == net_server.TAKEN
                           and hdr[0][S_STATE] == net_server.TAKEN)
        time.sleep(0.001)
    first.join(60)
    second.join(60)
    assert both_taken == (lanes == 2)
    for k in (0, 1):  # each lane's answers are the net's own
        planes, legal = batches[k]
        want_p, want_v = StandInNet()(planes.astype(np.uint8), legal)
        np.testing.assert_array_equal(answers[k][0], want_p)
        np.testing.assert_array_equal(answers[k][1], want_v)
    ctl = server.slots.ctl
    wait_until(lambda: ctl[C_BATCHES] == 2, 30, "both batches counted")
    assert ctl[C_POSITIONS] == 7
    for client in clients:
        client.detach()


def test_with_two_lanes_a_request_waits_for_the_others_only_while_a_batch_is_in_the_net(
        servers):
    # a gather wait of 30 s, a stand-in net of 2 s a call, a third client attached and
    # searching (it never sends). Client 0's request runs at once: no batch is in the net,
    # waiting would idle it. Client 1's, sent while that batch is in the net, waits in its
    # slot (READY) for the searching client, then runs when the net is free, long before 30 s
    server = servers(_layout(slots=3), stand_in_latency_s=2.0, gather_wait_s=30.0, lanes=2)
    hdr = server.slots.hdr
    searching = NetClient(server.slots, 2, server.signals)
    clients = [NetClient(server.slots, k, server.signals, call_timeout_s=20.0) for k in (0, 1)]
    answers: dict[int, object] = {}

    def call(k: int) -> None:
        try:
            answers[k] = clients[k].evaluate(*_batch(2, seed=k))[1]
        except Exception as e:  # noqa: BLE001 - the assert below names it
            answers[k] = e

    first, second = _in_turn(hdr, call)
    wait_until(lambda: hdr[1][S_STATE] != net_server.IDLE, 10, "client 1's request sent",
               interval_s=0.001)
    held = True
    while hdr[0][S_STATE] == net_server.TAKEN:  # client 0's batch is in the net
        held &= bool(hdr[1][S_STATE] == net_server.READY)
        time.sleep(0.001)
    first.join(30)
    second.join(30)
    assert held, "client 1's request was taken while the other batch was in the net"
    assert all(isinstance(answers[k], np.ndarray) for k in (0, 1)), answers
    ctl = server.slots.ctl
    wait_until(lambda: ctl[C_BATCHES] == 2, 30, "both batches counted")
    for client in (*clients, searching):
        client.detach()


def test_the_lanes_of_a_server_are_one_to_sixteen():
    from training.serve import parse_args

    base = ["--shm", "x", "--layout", "1,1,1,5", "--signals", "3:4",
            "--stand-in-latency-ms", "1"]
    assert parse_args(base).lanes == 1
    assert parse_args([*base, "--lanes", "2"]).lanes == 2
    with pytest.raises(SystemExit):
        parse_args([*base, "--lanes", "0"])


def test_a_client_in_this_process_gets_exactly_the_stand_in_nets_results(servers):
    server = servers(_layout(max_batch=8), stand_in_latency_s=0.0)
    client = NetClient(server.slots, 0, server.signals)
    planes, legal = _batch(19, seed=3)  # more than a slot holds: sent in three parts
    priors, values = client.evaluate(planes, legal)
    want_p, want_v = StandInNet()(planes.astype(np.uint8), legal)
    np.testing.assert_array_equal(priors, want_p)
    np.testing.assert_array_equal(values, want_v)
    assert (client.calls, client.positions) == (3, 19)
    with pytest.raises(ValueError, match="planes must be"):
        client.evaluate(planes[:, :2], legal)
    client.detach()


def test_a_client_killed_mid_call_leaves_the_others_served_and_its_slot_freed(servers):
    server = servers(_layout(), stand_in_latency_s=0.2, gather_wait_s=0.0)
    doomed = _client(server, 0, calls=1000, batch=4)
    client = NetClient(server.slots, 1, server.signals)
    header = server.slots.hdr[0]
    wait_until(lambda: header[net_server.S_STATE] in (net_server.READY, net_server.TAKEN),
               timeout_s=120, what="the doomed client's first request", interval_s=0.001)
    doomed.kill()  # in the middle of a call: its request is in its slot
    doomed.communicate()
    planes, legal = _batch(3, seed=1)
    for _ in range(3):
        priors, _ = client.evaluate(planes, legal)
    np.testing.assert_array_equal(priors, StandInNet()(planes.astype(np.uint8), legal)[0])
    wait_until(lambda: header[S_STATE] == FREE, timeout_s=30, what="the dead client's slot freed")
    # another process takes the freed slot and is served
    again = _client(server, 0, calls=2, batch=4)
    assert [ln["ok"] for ln in _lines(again)] == [True, True]
    client.detach()


def test_a_killed_server_is_restarted_and_its_clients_calls_go_on(servers):
    server = servers(_layout(), stand_in_latency_s=0.05, gather_wait_s=0.0)
    proc = _client(server, 0, calls=60, batch=4)
    first_pid = server.pid
    wait_until(lambda: server.slots.ctl[C_BATCHES] >= 5, timeout_s=120,
               what="a few batches served", interval_s=0.01)
    os.kill(first_pid, signal.SIGKILL)
    wait_until(lambda: not server.is_alive(), timeout_s=30, what="the server's death")
    assert server.restart_if_dead()
    assert server.pid != first_pid and server.restarts == 1
    lines = _lines(proc)
    assert proc.returncode == 0
    assert len(lines) == 60 and all(ln["ok"] for ln in lines)


def test_a_client_gives_up_with_a_clear_error_when_no_server_answers(servers):
    server = servers(_layout(), stand_in_latency_s=0.0)
    client = NetClient(server.slots, 0, server.signals, call_timeout_s=0.5)
    os.kill(server.pid, signal.SIGKILL)
    wait_until(lambda: not server.is_alive(), timeout_s=30, what="the server's death")
    with pytest.raises(net_server.NetServerUnavailable, match="slot 0"):
        client.evaluate(*_batch(2, seed=0))


# ------------------------------------------------------------------------- a real net


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    """Two model files of one small net config (5x5, history 2), generations 1 and 2."""
    import torch

    from training.learn.net import PolicyValueNet, save_model

    folder = tmp_path_factory.mktemp("models")
    paths = []
    for gen in (1, 2):
        torch.manual_seed(gen)
        net = PolicyValueNet(BOARD, blocks=1, filters=8, history=HISTORY, value_hidden=8)
        paths.append(folder / f"model_{gen:06d}.pt")
        save_model(paths[-1], net, generation=gen)
    return paths


def _direct(path, planes, legal):
    from training.learn.net import load_model, make_evaluator

    net, _ = load_model(path)
    return make_evaluator(net, "cpu", jit="trace")(planes, legal)


@pytest.mark.parametrize("lanes", [1, 2])
def test_a_real_net_on_the_cpu_serves_what_it_gives_directly_and_switches_models(
        servers, two_models, tmp_path, lanes):
    first, second = two_models
    server = servers(_layout(max_batch=32), model=first, jit="trace", lanes=lanes)
    client = NetClient(server.slots, 0, server.signals)
    planes, legal = _batch(20, seed=5)
    priors, values = client.evaluate(planes, legal)
    want_p, want_v = _direct(first, planes, legal)
    np.testing.assert_allclose(priors, want_p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(values, want_v, rtol=1e-5, atol=1e-6)
    assert client.generation == 1 and server.generation == 1

    # a model switch while a client keeps calling: taken between two batches
    asked = time.monotonic()
    assert server.load_model(second) == 2
    taken_s = time.monotonic() - asked
    want_p, want_v = _direct(second, planes, legal)
    for _ in range(4):  # every lane has switched before load_model returns
        priors, values = client.evaluate(planes, legal)
        assert client.generation == 2
        np.testing.assert_allclose(priors, want_p, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(values, want_v, rtol=1e-5, atol=1e-6)
    assert taken_s < 30, f"the switch took {taken_s:.1f}s"  # measured ~0.1-0.3 s here
    print(f"model switch taken in {taken_s:.2f}s")

    # a file that is not a model is refused by name; the old model keeps serving
    bad = tmp_path / "model_000003.pt"
    bad.write_bytes(b"not a model")
    with pytest.raises(ServerError, match="model_000003.pt"):
        server.load_model(bad)
    client.evaluate(planes, legal)
    assert client.generation == 2 and server.is_alive()
    client.detach()


def test_a_server_that_cannot_load_its_model_says_why(tmp_path):
    bad = tmp_path / "model_000001.pt"
    bad.write_bytes(b"garbage")
    server = ServerProcess(_layout(), model=bad, stderr_path=tmp_path / "server.log")
    try:
        with pytest.raises(ServerError, match="exited with code 2.*model_000001.pt"):
            server.start(timeout_s=120)
    finally:
        server.stop()


def test_the_bucket_form_agrees_with_the_plain_evaluator_on_the_cpu(two_models):
    """The GPU form's buckets, padding and output packing, run eagerly on the CPU."""
    from training.learn.net import load_model, make_evaluator
    from training.serve import BucketEvaluator

    net, _ = load_model(two_models[0])
    form = BucketEvaluator(net, "cpu", dtype="float32", max_positions=128, graphs=True)
    assert form.buckets == [64, 128] and form.mode == "buckets"  # no graphs without CUDA
    plain = make_evaluator(net, "cpu", jit="eager")
    for n in (1, 63, 64, 65, 200):  # 200: two calls of the largest bucket
        planes, legal = _batch(n, seed=n)
        got_p, got_v = form(planes.astype(np.uint8), legal)
        want_p, want_v = plain(planes, legal)
        np.testing.assert_allclose(got_p, want_p, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got_v, want_v, rtol=1e-5, atol=1e-6)
    net2, _ = load_model(two_models[1])
    form.load_weights(net2)
    planes, legal = _batch(10, seed=0)
    np.testing.assert_allclose(form(planes.astype(np.uint8), legal)[0],
                               make_evaluator(net2, "cpu", jit="eager")(planes, legal)[0],
                               rtol=1e-5, atol=1e-6)


@pytest.fixture
def scoring_model(tmp_path):
    """A model file of a small net with a score head (its output is not constant)."""
    import torch

    from training.learn.net import PolicyValueNet, save_model

    torch.manual_seed(3)
    net = PolicyValueNet(BOARD, blocks=1, filters=8, history=HISTORY, value_hidden=8,
                         score_head=True)
    with torch.no_grad():
        net.score_fc.weight.mul_(10.0)
    path = tmp_path / "scoring" / "model_000001.pt"
    save_model(path, net, generation=1)
    return path


def test_a_client_that_asks_for_scores_gets_the_score_head_and_others_do_not(servers,
                                                                           scoring_model):
    from training.learn.net import load_model, make_evaluator

    server = servers(_layout(max_batch=32), model=scoring_model, jit="trace")
    scored = NetClient(server.slots, 0, server.signals, score=True)
    plain = NetClient(server.slots, 1, server.signals)
    planes, legal = _batch(20, seed=7)
    priors, values, scores = scored.evaluate(planes, legal)
    want = make_evaluator(load_model(scoring_model)[0], "cpu", jit="eager", score=True)(
        planes, legal)
    for got, expected in zip((priors, values, scores), want):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert np.ptp(scores) > 1e-3
    assert len(plain.evaluate(planes, legal)) == 2
    scored.detach()
    plain.detach()


def test_a_server_net_without_scores_gives_a_scoring_client_zeros(servers):
    server = servers(_layout(max_batch=8), stand_in_latency_s=0.0)
    client = NetClient(server.slots, 0, server.signals, score=True)
    planes, legal = _batch(11, seed=4)
    priors, values, scores = client.evaluate(planes, legal)
    want_p, want_v = StandInNet()(planes.astype(np.uint8), legal)
    np.testing.assert_array_equal(priors, want_p)
    np.testing.assert_array_equal(values, want_v)
    np.testing.assert_array_equal(scores, 0.0)
    client.detach()


def test_the_bucket_form_returns_the_score_head_when_asked(scoring_model):
    from training.learn.net import load_model, make_evaluator
    from training.serve import BucketEvaluator

    net, _ = load_model(scoring_model)
    form = BucketEvaluator(net, "cpu", dtype="float32", max_positions=64, score=True)
    plain = make_evaluator(net, "cpu", jit="eager", score=True)
    for n in (3, 64, 70):
        planes, legal = _batch(n, seed=n)
        got = form(planes.astype(np.uint8), legal)
        want = plain(planes, legal)
        assert len(got) == 3
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert len(BucketEvaluator(net, "cpu", dtype="float32", max_positions=64)(
        planes.astype(np.uint8), legal)) == 2


# ------------------------------------------------------------------ search processes


def test_search_processes_play_games_through_one_server_and_survive_deaths(tiny_cfg, tmp_path):
    from training.go.records import BatchMeta, encode_batch
    from training.search_processes import SearchProcesses

    cfg = tiny_cfg
    layout = SlotLayout(2, cfg.self_play.batch_size, num_planes(cfg.net.history,
                        cfg.net.liberties), cfg.go.board_size)
    server = ServerProcess(layout, stand_in_latency_s=0.0, stderr_path=tmp_path / "s.log")
    server.start(timeout_s=120)
    pool = SearchProcesses(cfg, server, processes=2, seed=7, stderr_path=tmp_path / "p.log")
    try:
        records: list = []

        def play(n: int) -> None:
            deadline = time.monotonic() + 180
            want = len(records) + n
            while len(records) < want and time.monotonic() < deadline:
                records.extend(pool.step())
            assert len(records) >= want, f"{len(records)} games, wanted {want}"

        play(4)
        # a search process killed: the other plays on, a new one takes its slot
        os.kill(pool.pids()[0], signal.SIGKILL)
        play(4)
        wait_until(lambda: (pool.step() is not None) and pool.restarts >= 1 and all(pool.pids()),
                   timeout_s=60, what="the search process restarted")
        # the server killed: restarted by step(), the searches go on
        os.kill(server.pid, signal.SIGKILL)
        wait_until(lambda: not server.is_alive(), timeout_s=30, what="the server's death")
        play(4)
        assert server.restarts == 1
        assert all(r.generation == 0 for r in records)
        assert len({r.seed for r in records}) == len(records)  # no game played twice
        # the records are well formed: a batch of them encodes (the coach replays them)
        encode_batch(records, BatchMeta.from_records("w", records))
    finally:
        late = pool.close()
    assert isinstance(late, list)
    assert not server.is_alive()


def test_planes_of_the_search_are_zeros_and_ones():
    """The slots carry planes as uint8: exact only for 0/1 planes, which the features are."""
    from training.go import fastgo
    from training.go.features import write_planes

    boards = fastgo.new_boards(1, BOARD)
    fastgo.reset(boards, 0)
    out = np.full((num_planes(HISTORY, True), BOARD, BOARD), 7.0, np.float32)
    seen: set[float] = set()
    for move in (6, 7, 12, 8, 18, 13, 11):  # chains of 1, 2 and 3+ liberties on both sides
        fastgo.play(boards, 0, move)
        write_planes(boards, 0, HISTORY, out)
        seen |= set(np.unique(out).tolist())
    assert seen == {0.0, 1.0}


# ------------------------------------------------------------------ the worker daemon


def test_config_net_server_takes_true_false_or_auto(tiny_cfg):
    from configs import ConfigError, dump_config, load_config_text

    text = dump_config(tiny_cfg)
    assert "net_server: auto" in text
    for word, want in (("true", True), ("false", False), ("auto", "auto")):
        cfg = load_config_text(text.replace("net_server: auto", f"net_server: {word}"))
        assert cfg.self_play.net_server == want
    with pytest.raises(ConfigError, match="self_play.net_server must be true, false or auto"):
        load_config_text(text.replace("net_server: auto", "net_server: maybe"))


def test_a_worker_with_the_net_server_plays_switches_models_and_stops_cleanly(tiny_cfg,
                                                                              run_dir):
    """The daemon's contract for the coach (models in, batches out, heartbeat, states) with
    two search processes and a net server on the CPU."""
    import threading

    from configs import override
    from distributed.status import WorkerState, read_heartbeat
    from tests.test_worker import _publish
    from training.go.records import outbox_batches, read_batch
    from training.search.net_server import pid_alive
    from training.worker import Worker

    cfg = override(tiny_cfg, {"run.dir": str(run_dir), "distributed.heartbeat_interval_s": 0.2,
                              "self_play.net_server": True, "self_play.search_processes": 2,
                              "self_play.gather_wait_ms": 5.0,
                              "distributed.max_outbox_batches": 10_000})
    folder = run_dir / "workers" / "w1"
    _publish(cfg, folder, 0)
    worker = Worker(cfg, "w1", folder)
    assert worker.uses_net_server()
    t = threading.Thread(target=worker.run, kwargs={"max_games": 100_000})
    t.start()
    try:
        wait_until(lambda: worker.generation == 0 and worker.games_done >= 10, 180,
                   "generation 0 plays through the server")
        server = worker._server
        assert server.gather_wait_s == 0.005  # self_play.gather_wait_ms reaches the server
        assert server.lanes == 1  # self_play.server_lanes 0: one lane on a CPU
        searchers = worker._selfplay.pids()
        assert server.is_alive() and len(searchers) == 2 and all(searchers)
        _publish(cfg, folder, 1, seed=1)
        wait_until(lambda: worker.generation == 1, 60, "generation 1 in use")
        done = worker.games_done  # games in progress (2 x 16) end first, with generation 0
        wait_until(lambda: worker.games_done >= done + 100, 300, "games of generation 1")
        assert read_heartbeat(folder / "status.json").generation == 1
    finally:
        worker.stop()
        t.join(timeout=120)
    assert not t.is_alive()
    assert not server.is_alive() and not any(pid_alive(p) for p in searchers)
    hb = read_heartbeat(folder / "status.json")
    assert hb.state == WorkerState.OFFLINE and hb.generation == 1
    records = [r for n in outbox_batches(folder / "outbox")
               for r in read_batch(folder / "outbox" / n)[1]]  # validated by replay
    assert len(records) == worker.games_done
    assert {r.generation for r in records} == {0, 1}
    assert len({r.seed for r in records}) == len(records)
