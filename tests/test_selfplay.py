"""Self-play, arena matches and the GTP player, with stand-in evaluators and one real net."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from configs import override
from training.go.coords import BLACK, WHITE, from_gtp
from training.go.rules import Position
from training.play.players import MctsPlayer
from training.search.selfplay import (
    SelfPlay,
    false_resignation_rate,
    game_seed,
    play_match,
)
from tests.test_mcts import black_to_move, hashed, uniform, winning_point
from tests.conftest import REPO


def white_wins(planes: np.ndarray, legal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Uniform priors; every position is lost for black (value -0.99 / +0.99)."""
    priors, _ = uniform(planes, legal)
    return priors, np.where(black_to_move(planes), -0.99, 0.99).astype(np.float32)


def loves_pass(planes: np.ndarray, legal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nearly all prior on PASS, value 0."""
    priors = legal * np.float32(1e-4)
    priors[:, -1] = 1.0
    return priors / priors.sum(1, keepdims=True), np.zeros(len(planes), np.float32)


def replay(record, max_moves: int) -> Position:
    """The record's game through the reference rules; fails on an illegal move."""
    pos = Position(record.board_size, record.komi, max_moves)
    for m in record.moves:
        pos.play(int(m))
    return pos


def check_record(record, cfg) -> None:
    n = cfg.go.board_size
    t = record.num_moves
    assert record.board_size == n and record.komi == cfg.go.komi
    assert record.moves.dtype == np.int16 and record.moves.shape == (t,)
    assert record.visits.dtype == np.uint16 and record.visits.shape == (t, n * n + 1)
    assert record.values.dtype == np.float16 and record.values.shape == (t,)
    assert np.all(np.abs(record.values.astype(np.float32)) <= 1.0)
    assert (record.visits.sum(1) >= record.simulations).all()
    pos = replay(record, cfg.go.move_cap)
    if record.resigned:
        assert math.isnan(record.score) and record.result in (BLACK, WHITE)
    else:
        assert pos.is_over()
        assert record.score == pos.score()
        assert record.result == int(np.sign(record.score))


def test_games_finish_legal_with_visit_targets_and_scores(tiny_cfg):
    sp = SelfPlay(uniform, tiny_cfg.go, tiny_cfg.mcts, tiny_cfg.self_play, history=2, seed=3)
    records = sp.play(max_games=20)
    assert len(records) == 20 and sp.games_finished >= 20
    for r in records:
        check_record(r, tiny_cfg)
        assert r.generation == 0 and r.simulations == tiny_cfg.mcts.simulations
        # the policy target is a visit distribution, not a one-hot of the move played
        assert (np.count_nonzero(r.visits, axis=1) > 1).mean() > 0.5
    assert len({r.seed for r in records}) == 20
    assert {r.seed for r in records} <= {game_seed(3, k) for k in range(sp.games_started)}


def test_resignation_and_resign_disabled_games(tiny_cfg):
    cfg = override(tiny_cfg, {"self_play.resign_disabled_fraction": 0.5})
    sp = SelfPlay(white_wins, cfg.go, cfg.mcts, cfg.self_play, history=2, seed=0)
    # resigning games end at once; play until a few resign-disabled ones were played out
    records: list = []
    sp.play(
        should_stop=lambda: sum(not r.resigned for r in records) >= 3, on_game=records.append
    )
    resigned = [r for r in records if r.resigned]
    played_out = [r for r in records if not r.resigned]
    assert resigned and played_out
    for r in resigned:  # black resigns at its 3rd move below the threshold, not its 1st
        check_record(r, cfg)
        assert r.result == WHITE and not r.resign_disabled
        assert r.num_moves == 2 * (cfg.self_play.resign_moves - 1) == 4
    for r in played_out:
        check_record(r, cfg)
        assert r.resign_disabled and r.would_resign_as == BLACK
    black_won = sum(r.result == BLACK for r in played_out)
    assert false_resignation_rate(records) == black_won / len(played_out)
    assert false_resignation_rate(resigned) is None


def test_with_the_score_utility_resignation_still_reads_the_values_alone(tiny_cfg):
    """Scores that lift each of black's utilities by about 0.38 (margin / N of 5 at static
    0.5): the win rate resignation reads stays the value, -0.99, so black resigns where it
    does without the utility (with it, its utility of about -0.61 would never resign)."""

    def white_wins_black_ahead(planes, legal):
        priors, values = white_wins(planes, legal)
        return priors, values, np.where(black_to_move(planes), 5.0, -5.0).astype(np.float32)

    cfg = override(tiny_cfg, {"mcts.score_utility_static": 0.5,
                              "self_play.resign_disabled_fraction": 0.0})
    sp = SelfPlay(white_wins_black_ahead, cfg.go, cfg.mcts, cfg.self_play, history=2, seed=0)
    records = sp.play(max_games=6)
    assert len(records) >= 6
    for r in records:
        check_record(r, cfg)
        assert r.resigned and r.result == WHITE
        assert r.num_moves == 2 * (cfg.self_play.resign_moves - 1)


def test_soft_resignation_plays_decided_games_out_with_fast_searches(tiny_cfg):
    """KataGo's soft resignation: no game ends early; from the move where black would have
    resigned (its 3rd own move below the threshold) every search is a fast one (no policy
    target), and every game measures false resignations."""
    cfg = override(tiny_cfg, {"self_play.soft_resign": True, "mcts.full_search_fraction": 1.0,
                              "self_play.resign_disabled_fraction": 0.0})
    records = SelfPlay(white_wins, cfg.go, cfg.mcts, cfg.self_play, history=2,
                       seed=0).play(max_games=4)
    decided_at = 2 * (cfg.self_play.resign_moves - 1)  # black's 3rd move, as a resignation
    for r in records:
        assert not r.resigned and r.resign_disabled and r.would_resign_as == BLACK
        assert not math.isnan(r.score) and r.num_moves > decided_at + 2
        # the move where it is decided was searched in full; every later one fast
        assert r.full_search[:decided_at + 1].all()
        assert not r.full_search[decided_at + 1:].any()
    assert false_resignation_rate(records) == sum(r.result == BLACK for r in records) / 4
    # off (the default), the same games resign at that move
    cfg = override(cfg, {"self_play.soft_resign": False})
    resigned = SelfPlay(white_wins, cfg.go, cfg.mcts, cfg.self_play, history=2,
                        seed=0).play(max_games=4)
    assert all(r.resigned and r.num_moves == decided_at for r in resigned)


def test_resign_moves_is_the_own_moves_in_a_row_below_the_threshold(tiny_cfg):
    for moves in (1, 2, 5):
        cfg = override(tiny_cfg, {"self_play.resign_disabled_fraction": 0.0,
                                  "self_play.resign_moves": moves})
        sp = SelfPlay(white_wins, cfg.go, cfg.mcts, cfg.self_play, history=2, seed=0)
        assert {r.num_moves for r in sp.play(max_games=3)} == {2 * (moves - 1)}


def test_no_resignation_at_threshold_minus_one(tiny_cfg):
    cfg = override(tiny_cfg, {"self_play.resign_threshold": -1.0})
    sp = SelfPlay(white_wins, cfg.go, cfg.mcts, cfg.self_play, history=2, seed=0)
    records = sp.play(max_games=4)
    assert not any(r.resigned or r.would_resign_as for r in records)


def test_a_game_depends_on_its_seed_not_on_the_games_beside_it(tiny_cfg):
    wide = dataclasses.replace(tiny_cfg.self_play, parallel_games=4, batch_size=3)
    narrow = dataclasses.replace(tiny_cfg.self_play, parallel_games=1, batch_size=1)
    a = SelfPlay(hashed, tiny_cfg.go, tiny_cfg.mcts, wide, history=2, seed=11).play(8)
    b = SelfPlay(hashed, tiny_cfg.go, tiny_cfg.mcts, narrow, history=2, seed=11).play(4)
    by_seed = {r.seed: r for r in a}
    common = [r for r in b if r.seed in by_seed]
    assert len(common) >= 3
    for r in common:
        np.testing.assert_array_equal(r.moves, by_seed[r.seed].moves)
        np.testing.assert_array_equal(r.visits, by_seed[r.seed].visits)
        assert r.result == by_seed[r.seed].result


def test_new_model_applies_to_games_started_after_it(tiny_cfg):
    sp = SelfPlay(uniform, tiny_cfg.go, tiny_cfg.mcts, tiny_cfg.self_play, history=2)
    sp.step()
    sp.set_evaluator(hashed, generation=5)
    records = sp.play(max_games=tiny_cfg.self_play.parallel_games + 8)
    started_before = {game_seed(0, k) for k in range(tiny_cfg.self_play.parallel_games)}
    assert {r.generation for r in records if r.seed in started_before} == {0}
    assert {r.generation for r in records if r.seed not in started_before} == {5}


def test_an_offered_model_goes_in_at_the_next_network_call_within_a_step(tiny_cfg):
    """A model offered (from another thread, here from inside a network call) is used by
    the very next call, before the step that was under way ends."""
    calls: list[str] = []
    sp = SelfPlay(uniform, tiny_cfg.go, tiny_cfg.mcts, tiny_cfg.self_play, history=2)

    def old(planes, legal):
        calls.append("old")
        if len(calls) == 2:
            sp.offer_evaluator(new, 7)
        return uniform(planes, legal)

    def new(planes, legal):
        calls.append("new")
        return uniform(planes, legal)

    sp.set_evaluator(old, 0)
    sp.step()  # one move of every game: several network calls (tiny_cfg searches 8 times)
    assert calls[:3] == ["old", "old", "new"] and set(calls[3:]) == {"new"}
    assert sp.generation == 7 and sp.evaluate is new
    started = sp.games_started
    sp.play(max_games=tiny_cfg.self_play.parallel_games + 4)
    newer = sp.play(max_games=4)
    assert sp.games_started > started and all(r.generation == 7 for r in newer)


def test_discard_unfinished_counts_games_in_progress(tiny_cfg):
    sp = SelfPlay(uniform, tiny_cfg.go, tiny_cfg.mcts, tiny_cfg.self_play, history=2)
    sp.step()
    sp.step()
    assert sp.discard_unfinished() == tiny_cfg.self_play.parallel_games
    assert sp.discard_unfinished() == 0
    assert all(r.num_moves > 0 for r in sp.play(max_games=2))


def test_match_alternates_colours_and_asks_the_side_to_move(tiny_cfg):
    results = play_match(
        uniform, loves_pass, 4, tiny_cfg.go, tiny_cfg.mcts, seed=1, history=2, opening_moves=0
    )
    assert [a_black for _, a_black in results] == [True, False, True, False]
    for record, a_black in results:
        check_record(record, tiny_cfg)
        b_moves = record.moves[1::2] if a_black else record.moves[0::2]
        a_moves = record.moves[0::2] if a_black else record.moves[1::2]
        assert (b_moves == 25).all()  # B only ever passes
        assert (a_moves != 25).any()


def test_match_games_differ_by_their_opening_seed(tiny_cfg):
    results = play_match(uniform, uniform, 4, tiny_cfg.go, tiny_cfg.mcts, seed=2, history=2)
    openings = {tuple(r.moves[:4]) for r, _ in results}
    assert len(openings) > 1


def test_mcts_player_finds_the_winning_point_and_passes_when_over(tiny_cfg):
    point = from_gtp("C3", 5)
    player = MctsPlayer(winning_point(point), tiny_cfg.go, tiny_cfg.mcts, 48, history=2)
    assert player.genmove([], komi=0.5) == point
    assert player.genmove([25, 25], komi=0.5) == 25
    with pytest.raises(ValueError, match="illegal"):
        player.genmove([3, 3], komi=0.5)


def test_self_play_with_a_real_network(tiny_cfg):
    torch = pytest.importorskip("torch")
    from training.learn.net import make_evaluator, net_from_config

    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny batches: more threads only contend on a shared machine
    try:
        net = net_from_config(tiny_cfg.net, tiny_cfg.go.board_size)
        evaluate = make_evaluator(net, "cpu", jit=False)
        sp_cfg = dataclasses.replace(tiny_cfg.self_play, parallel_games=4, batch_size=4)
        sp = SelfPlay(
            evaluate, tiny_cfg.go, tiny_cfg.mcts, sp_cfg, history=tiny_cfg.net.history, seed=5
        )
        for r in sp.play(max_games=2):
            check_record(r, tiny_cfg)
    finally:
        torch.set_num_threads(threads)


def test_compact_planes_play_the_same_games_with_a_real_network(tiny_cfg):
    """uint8 planes (`planes_dtype`, as the worker plays) reach the net as the float32 ones:
    the same seed plays the same moves with the same visits."""
    torch = pytest.importorskip("torch")
    from training.learn.net import make_evaluator, net_from_config

    torch.manual_seed(0)
    net = net_from_config(tiny_cfg.net, tiny_cfg.go.board_size)
    evaluate = make_evaluator(net, "cpu", jit=False)
    sp_cfg = dataclasses.replace(tiny_cfg.self_play, parallel_games=3, batch_size=3)
    seen = []

    def planes_of(dtype):
        def spy(planes, legal):
            seen.append(planes.dtype)
            return evaluate(planes, legal)
        return spy

    games = [SelfPlay(planes_of(dtype), tiny_cfg.go, tiny_cfg.mcts, sp_cfg,
                      history=tiny_cfg.net.history, seed=9, planes_dtype=dtype).play(3)
             for dtype in (np.float32, np.uint8)]
    assert {np.dtype(d) for d in seen} == {np.dtype(np.float32), np.dtype(np.uint8)}
    assert len(games[0]) == len(games[1]) == 3
    for a, b in zip(games[0], games[1]):
        np.testing.assert_array_equal(a.moves, b.moves)
        np.testing.assert_array_equal(a.visits, b.visits)


def test_the_breakdown_accounts_for_the_wall_time_on_the_tiny_config():
    """benchmarks/selfplay.py --breakdown: the worker's own evaluator, its phases timed (the
    timed evaluator gives the same priors), shares that add up to the wall time."""
    torch = pytest.importorskip("torch")
    from benchmarks.selfplay import BREAKDOWN, breakdown
    from configs import load_config
    from training.learn.net import make_evaluator, net_from_config

    cfg = load_config(REPO / "configs" / "tiny.yaml")
    net = net_from_config(cfg.net, cfg.go.board_size).eval()
    timings: dict = {}
    planes = np.random.default_rng(0).random((5, net.in_planes, 5, 5)).astype(np.float32)
    legal = np.ones((5, 26), bool)
    legal[:, 3] = False
    p0, v0 = make_evaluator(net, jit="trace")(planes, legal)
    p1, v1 = make_evaluator(net, jit="trace", timings=timings, max_batch=2)(planes, legal)
    np.testing.assert_allclose(p1, p0, atol=1e-6)
    np.testing.assert_allclose(v1, v0, atol=1e-6)
    assert set(timings) == {"copy_in", "net", "copy_out"} and timings["net"] > 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        b = breakdown(str(REPO / "configs" / "tiny.yaml"), 1.0, torch.device("cpu"))
    finally:
        torch.set_num_threads(threads)
    assert set(b["shares"]) == set(BREAKDOWN)
    assert sum(b["shares"].values()) == pytest.approx(1.0)
    assert b["shares"]["net"] > 0.01 and b["shares"]["search"] > 0.01
    assert b["shares"]["features"] > 0 and b["positions_per_s"] > 0


def test_the_benchmark_measures_a_tiny_setting():
    """benchmarks/selfplay.py's machinery on a 5x5 board with a 1-block net (not a timing)."""
    torch = pytest.importorskip("torch")
    from benchmarks.selfplay import Setting, make_net, network_limit, selfplay_speed
    from training.learn.net import compile_for_inference, make_evaluator

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        s = Setting(5, 1, 8, 4, 4, 0.0)
        device = torch.device("cpu")
        net = make_net(s, device)
        limit, batch = network_limit(
            compile_for_inference(net, device, "trace"), net, device, [4, 8], 0.01
        )
        assert limit > 0 and batch in (4, 8)
        sp = selfplay_speed(s, make_evaluator(net, device))
        assert sp["moves"] == 4 and sp["moves_per_s"] > 0
        assert 0.0 <= sp["outside_net_share"] <= 1.0
        assert 4 <= sp["evals_per_move"] <= 5  # 4 simulations, plus a fresh root's evaluation
    finally:
        torch.set_num_threads(threads)


def test_the_leaf_benchmark_measures_this_tree_and_reads_another_commit(tmp_path, monkeypatch,
                                                                          capsys):
    """benchmarks/leaf_cpu.py: a child on the tiny config gives a figure (not a timing); a
    commit to compare with is unpacked from git, and one that is not a commit is refused."""
    import json
    import tempfile

    from benchmarks import leaf_cpu

    assert leaf_cpu.main(["--configs", "configs/tiny.yaml", "--rounds", "1", "--warmup", "1",
                          "--chunks", "1", "--chunk-steps", "1"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["configs/tiny.yaml"]["after"] > 0
    assert "before" not in result["configs/tiny.yaml"]
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    tree = leaf_cpu.unpack("HEAD")
    assert tree.parent == tmp_path and (tree / "training" / "search" / "mcts.py").is_file()
    assert leaf_cpu.unpack("HEAD") == tree  # kept, with its numba cache
    with pytest.raises(SystemExit, match="no-such-rev.*is not a commit"):
        leaf_cpu.unpack("no-such-rev")


# ------------------------------------------------------------------------------ Gumbel


def gumbel_cfg(cfg, **extra):
    return override(cfg, {"mcts.algorithm": "gumbel", **extra})


def mild(planes: np.ndarray, legal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`hashed` priors with values in [-0.05, 0.05]: close values, a soft improved policy."""
    priors, values = hashed(planes, legal)
    return priors, values * np.float32(0.05)


def test_gumbel_self_play_stores_the_improved_policy_and_passes_the_batch_checks(tiny_cfg):
    from distributed.transfer import compress_bytes
    from training.go.records import POLICY_SCALE, BatchMeta, decode_batch, encode_batch

    cfg = gumbel_cfg(tiny_cfg, **{"self_play.resign_threshold": -1.0})
    sp = SelfPlay(mild, cfg.go, cfg.mcts, cfg.self_play, history=2, seed=3)
    records = sp.play(max_games=6)
    for r in records:
        replay(r, cfg.go.move_cap)
        sums = r.visits.sum(axis=1, dtype=np.int64)
        # round(p * POLICY_SCALE) per move: the sum is POLICY_SCALE up to rounding
        assert (np.abs(sums - POLICY_SCALE) <= cfg.go.board_size**2 + 1).all()
        assert (r.visits[np.arange(r.num_moves), r.moves] >= 1).all()
        # the improved policy keeps mass on the legal moves the 8 simulations never visited:
        # on the empty board every point (self-play does not pass first)
        assert np.count_nonzero(r.visits[0]) == cfg.go.board_size**2 > cfg.mcts.simulations
    raw = encode_batch(records, BatchMeta.from_records("w1", records))
    back = decode_batch(compress_bytes(raw)).records  # the reference replay and range checks
    for a, b in zip(records, back):
        np.testing.assert_array_equal(a.visits, b.visits)


def test_gumbel_self_play_samples_only_in_the_temperature_moves(tiny_cfg):
    # after temperature_moves the move is the search's choice without noise: two games with
    # different seeds can differ early (noise) but a position decides the move later on
    cfg = gumbel_cfg(tiny_cfg, **{"self_play.temperature_moves": 0,
                                  "self_play.resign_threshold": -1.0})
    sp = SelfPlay(hashed, cfg.go, cfg.mcts, cfg.self_play, history=2, seed=1)
    a = sp.play(max_games=4)
    openings = {tuple(r.moves[:2]) for r in a}
    cfg8 = override(cfg, {"self_play.temperature_moves": 8})
    b = SelfPlay(hashed, cfg8.go, cfg8.mcts, cfg8.self_play, history=2, seed=1).play(4)
    assert len({tuple(r.moves[:2]) for r in b}) > len(openings)


def test_gumbel_match_games_differ_by_their_opening_seed(tiny_cfg):
    cfg = gumbel_cfg(tiny_cfg)
    results = play_match(hashed, hashed, 4, cfg.go, cfg.mcts, seed=2, history=2)
    assert len({tuple(r.moves[:4]) for r, _ in results}) > 1
    again = play_match(hashed, hashed, 4, cfg.go, cfg.mcts, seed=2, history=2,
                       opening_moves=0)
    assert len({tuple(r.moves) for r, _ in again}) == 1  # no noise: one game, four times
    for record, _ in results:
        assert replay(record, cfg.go.move_cap).is_over()


def test_gumbel_mcts_player_finds_the_winning_point_with_few_simulations(tiny_cfg):
    point = from_gtp("C3", 5)
    cfg = gumbel_cfg(tiny_cfg, **{"mcts.gumbel_max_considered": 32})
    player = MctsPlayer(winning_point(point), cfg.go, cfg.mcts, 26, history=2)
    assert player.genmove([], komi=0.5) == point  # 26 simulations: every move once
    assert player.genmove([25, 25], komi=0.5) == 25


def test_a_simulation_ramp_grows_full_searches_from_fast_to_full(tiny_cfg):
    """self_play.simulations_ramp: MiniZero's progressive simulation over the generations."""
    cfg = override(tiny_cfg, {"self_play.simulations_ramp": 10, "mcts.simulations": 24,
                              "mcts.fast_simulations": 4})
    sp = SelfPlay(uniform, cfg.go, cfg.mcts, cfg.self_play, history=2, seed=1)
    seen = {}
    for gen in (0, 5, 10, 30):
        sp.set_evaluator(uniform, gen)
        seen[gen] = sp.full_simulations
    assert seen == {0: 4, 5: 14, 10: 24, 30: 24}
    sp.set_evaluator(uniform, 5)
    records = sp.play(max_games=3)
    assert {r.simulations for r in records} == {14} and all(r.num_moves > 0 for r in records)
    flat = SelfPlay(uniform, tiny_cfg.go, tiny_cfg.mcts, tiny_cfg.self_play, history=2, seed=1)
    assert flat.full_simulations == tiny_cfg.mcts.simulations  # 0 = off
