"""Replay window: growth rule, recency, symmetries, a stable validation split, features equal
to a replay through the reference rules, and sidecars that survive a restart."""

from __future__ import annotations

import json
import math
import mmap
import pickle
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from configs import ReplayConfig
from training.go import features
from training.go.rules import Position
from tests.conftest import REPO
from training.go.records import (
    BatchMeta,
    GameRecord,
    batch_name,
    load_batch,
    random_record,
    replay_boards,
    write_batch,
)
from training.learn import replay_buffer, sidecars
from training.learn.replay_buffer import TARGETS, ReplayWindow, symmetry_permutations
from training.learn.sidecars import SIDECAR_VERSION, is_validation_game, sidecar_dir, write_sidecar
from training.learn.window_shares import window_size

N = 5
KOMI = 0.5
H = 3


def _cfg(**kw) -> ReplayConfig:
    base = dict(min_positions=100, max_positions=100_000, growth=0.75, validation_fraction=0.0)
    base.update(kw)
    return ReplayConfig(**base)


def _write(folder: Path, games: list[GameRecord], worker: str = "w1", seq: int = 0) -> Path:
    meta = BatchMeta.from_records(worker, games)
    path = folder / batch_name(worker, meta.generation, seq)
    write_batch(path, games, meta)
    return path


def _fill(folder: Path, generations: int, games_per_batch: int = 6, seed: int = 0,
          first: int = 0) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for gen in range(first, generations):
        games = [random_record(N, KOMI, rng, generation=gen, seed=gen * 100 + i)
                 for i in range(games_per_batch)]
        _write(folder, games, seq=gen)
        out.append(games)
    return out


@pytest.fixture
def replay(run_dir) -> Path:
    d = run_dir / "replay"
    d.mkdir()
    return d


# ------------------------------------------------------------------------------ window size


def test_window_size_follows_the_growth_rule():
    assert window_size(50, 100, 1000, 0.75) == 50  # fewer than min: everything
    assert window_size(100, 100, 1000, 0.75) == 100
    assert window_size(1600, 100, 1000, 0.75) == 800  # 100 * 16**0.75
    assert window_size(10**6, 100, 1000, 0.75) == 1000  # capped at max
    assert window_size(5000, 100, 10**6, 1.0) == 5000  # growth 1: all of it
    assert window_size(5000, 100, 10**6, 0.0) == 100  # growth 0: a fixed window


def test_the_window_grows_with_the_run_and_keeps_the_newest_games(replay):
    cfg = _cfg(min_positions=60, max_positions=100_000, growth=0.5)
    _fill(replay, 2)
    w = ReplayWindow(replay, cfg, history=H, seed=0)
    first = w.stats()
    assert first.positions >= window_size(first.total_positions, 60, 100_000, 0.5)
    _fill(replay, 8, seed=1, first=2)
    assert w.refresh() == 6
    second = w.stats()
    target = window_size(second.total_positions, 60, 100_000, 0.5)
    assert second.total_positions > first.total_positions
    assert target <= second.positions < target + 2 * N * N + 1  # whole games, one extra at most
    assert second.positions > first.positions
    assert second.generation_max == 7
    # the newest games: everything newer than the oldest generation in the window is in it
    older = sum(int(c.info["positions"]) for c in w._sidecars
                if int(c.info["generation"]) > second.generation_min)
    assert second.positions >= older


def test_a_small_window_holds_only_the_newest_generation(replay):
    _fill(replay, 5)
    w = ReplayWindow(replay, _cfg(min_positions=20, max_positions=20, growth=1.0), history=H)
    s = w.stats()
    assert s.generation_min == s.generation_max == 4
    assert s.staleness_mean == 0 and s.staleness_max == 0
    assert s.positions >= 20 and s.positions < 20 + 2 * N * N + 1
    assert (w.generation_of(np.arange(len(w))) == 4).all()
    assert w.stats(current_generation=6).staleness_mean == 2.0


def test_every_position_is_tagged_with_its_generation(replay):
    _fill(replay, 3)
    w = ReplayWindow(replay, _cfg(min_positions=10**6, max_positions=10**6), history=H)
    gens = w.generation_of(np.arange(len(w)))
    assert set(gens.tolist()) == {0, 1, 2}
    assert (np.diff(gens) >= 0).all()  # oldest first
    s = w.stats()
    assert s.positions == s.total_positions == len(w)
    assert s.files == 3 and s.games == 18


# ------------------------------------------------------------------------------ samples


def _reference_planes(rec: GameRecord, t: int, history: int,
                      liberties: bool = False) -> np.ndarray:
    """Planes of position t of `rec` by replaying with go.Position, as self-play sees them."""
    pos = Position(rec.board_size, rec.komi)
    for m in rec.moves[:t].tolist():
        pos.play(m)
    return features.planes(pos, history, liberties)


@pytest.mark.parametrize("liberties", [False, True])
def test_features_equal_a_replay_with_the_reference_rules(replay, liberties):
    batches = _fill(replay, 2, games_per_batch=3)
    w = ReplayWindow(replay, _cfg(min_positions=10**6, max_positions=10**6), history=H,
                     augment=False, liberties=liberties)
    games = [g for batch in batches for g in batch]
    i = 0
    for rec in games:
        for t in range(rec.num_moves):
            planes, policy, value = w[i]
            np.testing.assert_array_equal(planes, _reference_planes(rec, t, H, liberties),
                                          err_msg=f"{i}")
            expected = rec.visits[t].astype(np.float64) / rec.visits[t].sum()
            np.testing.assert_allclose(policy, expected, rtol=1e-6)
            assert policy.dtype == np.float32 and abs(policy.sum() - 1) < 1e-5
            to_play = 1 if t % 2 == 0 else -1
            assert value == rec.result * to_play and value.dtype == np.float32
            i += 1
    assert i == len(w)


@pytest.mark.parametrize("liberties", [False, True])
def test_the_eight_symmetries_are_those_of_features(replay, liberties):
    perms = symmetry_permutations(N)
    assert len({tuple(p) for p in perms}) == 8
    board = np.arange(N * N).reshape(N, N)
    np.testing.assert_array_equal(board.ravel()[perms[0]], board.ravel())
    np.testing.assert_array_equal(board.ravel()[perms[1]], np.rot90(board).ravel())
    _fill(replay, 1)
    w = ReplayWindow(replay, _cfg(min_positions=10**6, max_positions=10**6), history=H,
                     liberties=liberties)
    idx = np.arange(len(w))
    p0, q0, v0 = w.batch(idx, symmetries=np.zeros(len(idx), np.int64))
    for s in range(8):
        ps, qs, vs = w.batch(idx, symmetries=np.full(len(idx), s))
        np.testing.assert_array_equal(ps, features.transform_planes(p0, s))
        np.testing.assert_array_equal(qs, features.transform_policy(q0, s))
        np.testing.assert_array_equal(vs, v0)
        np.testing.assert_array_equal(features.inverse_transform_policy(qs, s), q0)


def _transformed(rec: GameRecord, perm: np.ndarray) -> GameRecord:
    """The same game played on a rotated/reflected board (the rules are symmetric)."""
    a = rec.board_size**2
    inverse = np.empty(a, np.int64)
    inverse[perm] = np.arange(a)  # a stone at point q lands on inverse[q]
    moves = np.where(rec.moves == a, a, inverse[np.minimum(rec.moves, a - 1)]).astype(np.int16)
    visits = rec.visits.copy()
    visits[:, :a] = rec.visits[:, :a][:, perm]
    return replace(rec, moves=moves, visits=visits)


@pytest.mark.parametrize("sym", range(8))
def test_a_symmetry_transforms_planes_and_policy_consistently(run_dir, sym):
    """Sample i under symmetry s equals sample i of the same games played on a transformed
    board: planes and policy move together, and the transformed games are legal."""
    rng = np.random.default_rng(sym)
    games = [random_record(N, KOMI, rng, generation=1, seed=i) for i in range(3)]
    perm = symmetry_permutations(N)[sym]
    (run_dir / "a").mkdir()
    (run_dir / "b").mkdir()
    _write(run_dir / "a", games)
    _write(run_dir / "b", [_transformed(g, perm) for g in games])  # replays legally
    cfg = _cfg(min_positions=10**6, max_positions=10**6)
    wa = ReplayWindow(run_dir / "a", cfg, history=H)
    wb = ReplayWindow(run_dir / "b", cfg, history=H)
    assert len(wa) == len(wb) > 0
    idx = np.arange(len(wa))
    pa, qa, va = wa.batch(idx, symmetries=np.full(len(idx), sym))
    pb, qb, vb = wb.batch(idx, symmetries=np.zeros(len(idx), np.int64))
    np.testing.assert_array_equal(pa, pb)
    np.testing.assert_array_equal(qa, qb)
    np.testing.assert_array_equal(va, vb)
    # the auxiliary targets (ownership, the opponent's reply) move with the planes too
    sa = wa.samples(idx, symmetries=np.full(len(idx), sym))
    sb = wb.samples(idx, symmetries=np.zeros(len(idx), np.int64))
    assert set(sa) == set(sb) == {"planes", "policy", "value", *TARGETS,
                                  *(f"{t}_mask" for t in TARGETS)}
    for key in sa:
        np.testing.assert_array_equal(sa[key], sb[key], err_msg=key)
    assert np.abs(sa["ownership"]).sum() > 0


def test_auxiliary_targets_come_from_the_replayed_end_of_each_game(replay):
    batches = _fill(replay, 1, games_per_batch=4, seed=3)
    w = ReplayWindow(replay, _cfg(min_positions=10**6, max_positions=10**6), history=H,
                     augment=False)
    got = w.samples(np.arange(len(w)))
    i = 0
    for rec in batches[0]:
        owner = features.area_ownership(replay_boards(rec)[-1], N)
        for t in range(rec.num_moves):
            to_play = 1 if t % 2 == 0 else -1
            np.testing.assert_array_equal(got["ownership"][i], owner * to_play)
            assert got["score"][i] == pytest.approx(rec.score * to_play / N)
            assert got["ownership_mask"][i] == got["score_mask"][i] == 1
            if t + 1 < rec.num_moves:  # the opponent's reply: the next move's policy target
                nxt = rec.visits[t + 1] / rec.visits[t + 1].sum()
                np.testing.assert_allclose(got["opponent_policy"][i], nxt, rtol=1e-6)
                assert got["opponent_policy_mask"][i] == 1
            else:  # the last move has no reply
                assert got["opponent_policy_mask"][i] == 0
                assert not got["opponent_policy"][i].any()
            i += 1
    assert i == len(w)


def _record(moves: list[int], *, resigned: bool = False, komi: float = KOMI) -> GameRecord:
    """A hand-made game with the move played as its only visit (score by the rules)."""
    pos = Position(N, komi)
    for m in moves:
        pos.play(m)
    visits = np.zeros((len(moves), N * N + 1), np.uint16)
    visits[np.arange(len(moves)), moves] = 1
    score = math.nan if resigned else pos.score()
    result = -pos.to_play if resigned else int(np.sign(score))
    return GameRecord(N, komi, np.array(moves, np.int16), visits, result, score, resigned,
                      False, 0, 1, 0, 8, np.zeros(len(moves), np.float16))


def test_score_and_ownership_targets_take_the_side_to_moves_view_with_komi(replay):
    passes = N * N
    white_by_komi = _record([passes, passes])  # empty board: white wins by komi 0.5
    black_owns_all = _record([12, passes, passes])  # one black stone owns the board
    _write(replay, [white_by_komi, black_owns_all])
    w = ReplayWindow(replay, _cfg(min_positions=10**6, max_positions=10**6), history=H,
                     augment=False)
    got = w.samples(np.arange(5))
    # black to move, white to move; then black, white, black in the second game
    np.testing.assert_allclose(got["score"], np.array([-0.5, 0.5, 24.5, -24.5, 24.5]) / N)
    assert not got["ownership"][:2].any()  # the empty board is nobody's
    for i, to_play in ((2, 1), (3, -1), (4, 1)):
        np.testing.assert_array_equal(got["ownership"][i], np.full(N * N, to_play))


def test_a_resigned_game_trains_no_ownership_or_score(replay):
    resigned = _record([12, 6], resigned=True)  # black resigns after white's move: W won
    _write(replay, [resigned, _record([12, N * N, N * N])])
    w = ReplayWindow(replay, _cfg(min_positions=10**6, max_positions=10**6), history=H,
                     augment=False)
    got = w.samples(np.arange(len(w)))
    np.testing.assert_array_equal(got["ownership_mask"], [0, 0, 1, 1, 1])
    np.testing.assert_array_equal(got["score_mask"], [0, 0, 1, 1, 1])
    assert np.isfinite(got["score"]).all() and not got["ownership"][:2].any()
    np.testing.assert_array_equal(got["opponent_policy_mask"], [1, 0, 1, 1, 0])


def test_a_sidecar_from_before_the_auxiliary_targets_is_rebuilt(replay):
    """Batch files hold no ownership: a window from an older version rebuilds its sidecars
    from the batches and gets every target."""
    _fill(replay, 1)
    w = ReplayWindow(replay, _cfg(min_positions=10**6, max_positions=10**6), H)
    folder = next(p for p in sidecar_dir(replay).iterdir() if p.is_dir())
    info = json.loads((folder / "info.json").read_text())
    info["version"] = SIDECAR_VERSION - 1
    (folder / "info.json").write_text(json.dumps(info))
    (folder / "ownership.npy").unlink()
    (folder / "scores.npy").unlink()
    again = ReplayWindow(replay, _cfg(min_positions=10**6, max_positions=10**6), H)
    assert len(again) == len(w)
    got = again.samples(np.arange(len(again)))
    assert got["ownership_mask"].all() and np.abs(got["ownership"]).sum() > 0


def test_symmetries_are_drawn_per_sample_seeded_and_per_epoch(replay):
    _fill(replay, 2)
    cfg = _cfg(min_positions=10**6, max_positions=10**6)
    w1 = ReplayWindow(replay, cfg, history=H, seed=7)
    w2 = ReplayWindow(replay, cfg, history=H, seed=7)
    idx = np.arange(len(w1))
    s1 = w1.symmetries(idx)
    assert set(s1.tolist()) == set(range(8))
    np.testing.assert_array_equal(s1, w2.symmetries(idx))
    for i in (0, 5, len(w1) - 1):  # __getitem__ applies the drawn symmetry
        planes, policy, _ = w1[i]
        p, q, _ = w1.batch([i], symmetries=[s1[i]])
        np.testing.assert_array_equal(planes, p[0])
        np.testing.assert_array_equal(policy, q[0])
    w1.set_epoch(1)
    assert (w1.symmetries(idx) != s1).mean() > 0.5
    assert not ReplayWindow(replay, cfg, history=H, seed=8).symmetries(idx).tolist() == \
        s1.tolist()
    assert (w1.validation.symmetries(idx) == 0).all()  # no augmentation for validation


# ------------------------------------------------------------------------------ validation


def test_validation_split_is_stable_across_restarts_and_growth(replay):
    cfg = _cfg(min_positions=10**6, max_positions=10**6, validation_fraction=0.25)
    _fill(replay, 4, games_per_batch=8)
    w = ReplayWindow(replay, cfg, history=H)
    assert 0 < len(w.validation) and 0 < len(w)
    assert len(w) + len(w.validation) == w.stats().positions

    def held_out(window) -> set:
        return {(window._sidecars[int(c)].name, int(s)) for c, s, *_ in
                window.validation._segments}

    before = held_out(w)
    again = ReplayWindow(replay, cfg, history=H)  # a restart
    assert held_out(again) == before
    rng = np.random.default_rng(99)
    _write(replay, [random_record(N, KOMI, rng, generation=9) for _ in range(8)], seq=9)
    again.refresh()
    assert before <= held_out(again)
    train = {(again._sidecars[int(c)].name, int(s)) for c, s, *_ in again._segments}
    assert not train & held_out(again)


def test_validation_share_is_close_to_the_fraction():
    held = sum(is_validation_game(f"w_{k:06d}_00000000.npz.zst", g, 0.1)
               for k in range(50) for g in range(100))
    assert 400 < held < 600  # 5000 games, expect 500
    assert not any(is_validation_game("x", g, 0.0) for g in range(100))


# ------------------------------------------------------------------------------ files


def test_sidecars_are_memory_mapped_and_survive_a_restart(replay, monkeypatch):
    """Arrays above IN_MEMORY_BYTES are mapped; smaller ones are read into memory."""
    _fill(replay, 2)
    cfg = _cfg(min_positions=10**6, max_positions=10**6)
    w = ReplayWindow(replay, cfg, history=H)
    cache = replay / ".window"
    folders = sorted(p for p in cache.iterdir() if p.is_dir())
    assert len(folders) == 2 and not list(cache.glob(".*tmp"))
    mtimes = {p: (p / "boards.npy").stat().st_mtime_ns for p in folders}
    w[0]
    assert not _is_memory_mapped(w._sidecars[0].array("boards"))  # a few KB: in memory
    monkeypatch.setattr(sidecars, "IN_MEMORY_BYTES", 0)
    w = ReplayWindow(replay, cfg, history=H)
    w[0]
    assert _is_memory_mapped(w._sidecars[0].array("boards"))
    ref = w.batch(np.arange(len(w)), symmetries=np.zeros(len(w), np.int64))
    again = ReplayWindow(replay, cfg, history=H)  # a restart: no rebuild
    assert {p: (p / "boards.npy").stat().st_mtime_ns for p in folders} == mtimes
    for a, b in zip(ref, again.batch(np.arange(len(w)), symmetries=np.zeros(len(w), np.int64))):
        np.testing.assert_array_equal(a, b)
    # a lost or half-written sidecar is rebuilt
    (folders[0] / "visits.npy").unlink()
    (folders[1] / "info.json").unlink()
    rebuilt = ReplayWindow(replay, cfg, history=H)
    assert len(rebuilt) == len(w)
    assert (folders[0] / "visits.npy").exists() and (folders[1] / "info.json").exists()


def _is_memory_mapped(arr: np.ndarray) -> bool:
    base = arr
    while base is not None and not isinstance(base, mmap.mmap):
        base = getattr(base, "base", None)
    return isinstance(base, mmap.mmap)


def test_a_window_pickles_without_its_data(replay):
    _fill(replay, 3, games_per_batch=10)
    w = ReplayWindow(replay, _cfg(min_positions=10**6, max_positions=10**6), history=H)
    w[0]
    blob = pickle.dumps(w)
    assert len(blob) < 20_000
    copy = pickle.loads(blob)
    np.testing.assert_array_equal(copy[3][0], w[3][0])


def test_getitems_gives_the_batch_as_three_arrays(replay):
    _fill(replay, 1)
    w = ReplayWindow(replay, _cfg(min_positions=10**6, max_positions=10**6), H, N)  # trainer's call
    planes, policy, value = w.__getitems__([0, 2, 1])
    assert planes.shape == (3, 2 * H + 1, N, N) and planes.dtype == np.float32
    assert policy.shape == (3, N * N + 1) and value.shape == (3,)
    for k, i in enumerate([0, 2, 1]):
        np.testing.assert_array_equal(planes[k], w[i][0])


def test_a_bad_batch_is_skipped_with_its_reason(replay):
    _fill(replay, 2)
    bad = replay / batch_name("w2", 1, 0)
    bad.write_bytes(b"\x28\xb5\x2f\xfd garbage")
    (replay / "notes.txt").write_text("not a batch")
    w = ReplayWindow(replay, _cfg(min_positions=10**6, max_positions=10**6), history=H)
    assert list(w.skipped) == [bad.name] and bad.name in w.skipped[bad.name]
    assert w.stats().files == 2 and w.stats().skipped_files == 1


def test_add_file_takes_in_a_new_batch(replay):
    _fill(replay, 1)
    cfg = _cfg(min_positions=10**6, max_positions=10**6)
    w = ReplayWindow(replay, cfg, history=H)
    n = len(w)
    rng = np.random.default_rng(5)
    path = _write(replay, [random_record(N, KOMI, rng, generation=3)], seq=1)
    assert w.add_file(path)
    assert len(w) > n and w.stats().generation_max == 3
    with pytest.raises(ValueError, match="not in the replay folder"):
        w.add_file(replay.parent / "elsewhere.npz.zst")


def test_add_files_takes_in_several_batches_with_one_selection(replay, monkeypatch):
    """What the long-lived trainer does with a poll's admissions: every batch in, the window
    selected once; a batch gone from the folder is skipped and the others still come in."""
    _fill(replay, 1)
    w = ReplayWindow(replay, _cfg(min_positions=10**6, max_positions=10**6), history=H)
    n = len(w)
    rng = np.random.default_rng(6)
    paths = [_write(replay, [random_record(N, KOMI, rng, generation=g)], seq=g) for g in (3, 4)]
    gone = replay / batch_name("w1", 4, 9)
    selections = []
    real_select = ReplayWindow._select
    monkeypatch.setattr(ReplayWindow, "_select", lambda self: (selections.append(1),
                                                                 real_select(self)))
    assert w.add_files([paths[0], gone, paths[1]]) == [True, False, True]
    assert len(selections) == 1
    assert len(w) > n and w.stats().generation_max == 4
    assert "cannot read the file" in w.skipped[gone.name]  # left out, with its reason


def test_a_batch_name_is_parsed_once_in_the_windows_life(replay, monkeypatch):
    """A batch taken in (`add_files`, the long-lived trainer's admissions) and selected is
    parsed once: opening it, its sidecar and its metadata share the one parse, and so do the
    later selections and refreshes that meet it again."""
    from collections import Counter

    _fill(replay, 2)
    parsed: Counter = Counter()
    real = replay_buffer.parse_batch_name

    def counted(name):
        parsed[name] += 1
        return real(name)

    monkeypatch.setattr(replay_buffer, "parse_batch_name", counted)
    w = ReplayWindow(replay, _cfg(min_positions=10**6, max_positions=10**6), history=H,
                     files=sorted(p.name for p in replay.iterdir() if p.is_file()))
    rng = np.random.default_rng(11)
    paths = [_write(replay, [random_record(N, KOMI, rng, generation=g)], seq=g) for g in (3, 4)]
    assert w.add_files(paths) == [True, True]
    w.refresh()
    assert w.stats().files == 4
    assert sorted(parsed) == sorted(w.names()) and set(parsed.values()) == {1}, parsed


def test_an_empty_folder_gives_an_empty_window(replay):
    w = ReplayWindow(replay, _cfg(), history=H, board_size=N)
    assert len(w) == 0 and len(w.validation) == 0 and w.stats().positions == 0
    with pytest.raises(IndexError):
        w[0]


def test_files_can_be_pinned_so_every_rank_builds_the_same_index(replay):
    _fill(replay, 3)
    cfg = _cfg(min_positions=10**6, max_positions=10**6)
    w = ReplayWindow(replay, cfg, history=H)
    names = w.names()
    pinned = ReplayWindow(replay, cfg, history=H, files=names[:2])
    rng = np.random.default_rng(1)
    _write(replay, [random_record(N, KOMI, rng, generation=5)], seq=5)
    pinned.refresh()
    assert pinned.names() == names[:2]
    assert len(pinned) < len(w)


def test_a_sidecar_written_at_ingest_is_used_as_is(replay, run_dir):
    """The coach validates once (load_batch) and writes the sidecar; the window reuses it."""
    incoming = run_dir / "incoming"
    incoming.mkdir()
    path = _write(incoming, [random_record(N, KOMI, np.random.default_rng(3)) for _ in range(4)])
    batch = load_batch(path)
    folder = write_sidecar(batch, path.name, sidecar_dir(replay))
    path.rename(replay / path.name)
    stamp = (folder / "boards.npy").stat().st_mtime_ns
    w = ReplayWindow(replay, _cfg(min_positions=10**6, max_positions=10**6), H)
    assert len(w) == sum(r.num_moves for r in batch.records)
    assert (folder / "boards.npy").stat().st_mtime_ns == stamp


def test_cli_prints_the_window(replay):
    _fill(replay, 2)
    proc = subprocess.run([sys.executable, "-m", "training.learn.replay_buffer", str(replay),
                           "--config", str(REPO / "configs" / "tiny.yaml")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "files=2" in proc.stdout and "generation_max=1" in proc.stdout


def _chosen(window) -> set[tuple[str, int]]:
    segs = np.concatenate([window._segments, window.validation._segments])
    return {(window._sidecars[int(c)].name, int(g)) for c, _, _, _, _, g in segs.tolist()}


def test_a_round_opens_only_the_batches_that_can_enter_the_window(replay):
    """80 batches on disk, a window of about 60 positions: a new window (the next round)
    reads the cache folder's index and opens the sidecars of each worker's newest batches
    only, and chooses exactly what a window over every batch chooses."""
    from training.learn.window_shares import select_newest

    rng = np.random.default_rng(4)
    for seq in range(80):
        worker = ("w1", "w2", "w3")[seq % 3 if seq < 60 else 1]  # w2 floods at the end
        _write(replay, [random_record(N, KOMI, rng, generation=seq // 10, seed=seq)],
               worker=worker, seq=seq)
    cfg = _cfg(min_positions=60, max_positions=60, validation_fraction=0.2)
    first = ReplayWindow(replay, cfg, history=H, worker_weights={"w3": 2.0}, share_slack=1.5)
    again = ReplayWindow(replay, cfg, history=H, worker_weights={"w3": 2.0}, share_slack=1.5)
    assert len(again.names()) == 80 and again.total_positions == first.total_positions
    assert len(again._all) < 20, f"opened {len(again._all)} of 80 batches"
    # every batch opened, the rule applied over all their games: the same choice
    names = again.names()
    units, keys = [], []
    for name in names:
        batch = load_batch(replay / name)
        for g, rec in enumerate(batch.records):
            units.append((name.split("_")[0], rec.num_moves))
            keys.append((name, g))
    target = window_size(again.total_positions, 60, 60, cfg.growth)
    expected = {keys[i] for i in select_newest(units, target, {"w3": 2.0}, 1.5)}
    assert _chosen(again) == _chosen(first) == expected


def test_a_pinned_window_takes_in_a_batch_without_a_pass_over_every_name(replay):
    """The long-lived trainer's window (pinned files) after 100,000 admissions: one more
    batch costs the window's size, not a pass over every admitted name (the old batches are
    known from the sidecar index only). Counted in lookups of the names known, and the CPU
    time is printed (`benchmarks/admission.py` measures it at a million)."""
    import time

    old = 100_000
    cache = sidecar_dir(replay)
    cache.mkdir()
    with open(cache / replay_buffer.INDEX_NAME, "w") as index:
        for i in range(old):
            index.write(json.dumps({"name": batch_name("w1", 0, i), "version": SIDECAR_VERSION,
                                    "generation": 0, "positions": 40, "games": 1,
                                    "board_size": N}, sort_keys=True) + "\n")
    rng = np.random.default_rng(8)
    fresh = [_write(replay, [random_record(N, KOMI, rng, generation=1)], seq=old + k)
             for k in range(12)]
    names = [batch_name("w1", 0, i) for i in range(old)]
    w = ReplayWindow(replay, _cfg(min_positions=100, max_positions=300), history=H,
                     board_size=N, files=names + [p.name for p in fresh[:2]])

    class Counted(dict):
        lookups = 0

        def __contains__(self, key):
            Counted.lookups += 1
            return super().__contains__(key)

        def __getitem__(self, key):
            Counted.lookups += 1
            return super().__getitem__(key)

    w._known = Counted(w._known)
    cpu = []
    for path in fresh[2:]:
        t0 = time.process_time()
        assert w.add_files([path]) == [True]
        cpu.append(time.process_time() - t0)
    assert w.names()[-1] == fresh[-1].name and len(w.names()) == old + len(fresh)
    assert w.stats().generation_max == 1 and w.stats().positions >= 300
    per_batch = Counted.lookups / (len(fresh) - 2)
    print(f"admission after {old} names: {1000 * sorted(cpu)[len(cpu) // 2]:.2f} ms CPU, "
          f"{per_batch:.0f} lookups")
    assert per_batch < 1000, "an admission walked every admitted name"
