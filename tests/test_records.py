"""Game records: batch files round-trip, every kind of corrupt batch is rejected with its own
error naming the file and game, names are strict, and SGF reads back through sgfmill."""

from __future__ import annotations

import io
import json
import math
import pickle
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from sgfmill import boards as sgf_boards
from sgfmill import sgf

from configs import override
from distributed.transfer import compress_bytes
from training.go.coords import from_gtp
from training.go.rules import Position
from training.go.records import (
    BatchError,
    BatchMeta,
    GameRecord,
    batch_name,
    encode_batch,
    load_batch,
    parse_batch_name,
    random_record,
    read_batch,
    replay_boards,
    write_batch,
)
from training.go.sgf import from_sgf, result_text, to_sgf

N = 5
KOMI = 0.5


def _games(count: int = 4, n: int = N, komi: float = KOMI, seed: int = 0, gen: int = 2):
    rng = np.random.default_rng(seed)
    return [random_record(n, komi, rng, generation=gen, seed=seed * 100 + i)
            for i in range(count)]


def _meta(**kw) -> BatchMeta:
    base = dict(worker="w1", generation=2, board_size=N, komi=KOMI, simulations=16)
    base.update(kw)
    return BatchMeta(**base)


def _resigned(rec: GameRecord) -> GameRecord:
    """The same game cut short: the side to move resigns before the two final passes."""
    keep = len(rec.moves) - 2
    pos = Position(rec.board_size, rec.komi)
    for m in rec.moves[:keep].tolist():
        pos.play(m)
    assert not pos.is_over()
    return replace(rec, moves=rec.moves[:keep], visits=rec.visits[:keep],
                   values=rec.values[:keep], resigned=True, score=float("nan"),
                   result=-pos.to_play)


def _arrays(records, meta) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(encode_batch(records, meta)), allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


def _write_arrays(path: Path, arrays: dict, *, allow_pickle: bool = False) -> Path:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    path.write_bytes(compress_bytes(buf.getvalue()))
    return path


def _reject(path: Path, kind: str, game: int | None = None, **kw) -> BatchError:
    with pytest.raises(BatchError) as info:
        read_batch(path, **kw)
    err = info.value
    assert err.kind == kind, str(err)
    assert path.name in str(err)
    if game is not None:
        assert err.game == game and f"game {game}" in str(err), str(err)
    return err


# ------------------------------------------------------------------------------ round trip


def test_batch_round_trips_every_field(run_dir):
    games = _games(5)
    games[1] = _resigned(games[1])
    games[2] = replace(games[2], resign_disabled=True, would_resign_as=-1)
    path = run_dir / batch_name("w1", 2, 7)
    size = write_batch(path, games, _meta())
    assert size == path.stat().st_size > 0
    assert not list(run_dir.glob("*.tmp"))
    meta, back = read_batch(path, max_generation=2)
    assert meta.worker == "w1" and meta.generation == 2 and meta.board_size == N
    assert meta.rules == "tromp-taylor-positional-superko" and meta.version == 1
    assert len(back) == len(games)
    for a, b in zip(games, back):
        assert b.moves.dtype == np.int16 and b.visits.dtype == np.uint16
        assert b.values.dtype == np.float16
        np.testing.assert_array_equal(a.moves, b.moves)
        np.testing.assert_array_equal(a.visits, b.visits)
        np.testing.assert_array_equal(a.values, b.values)
        for key in ("board_size", "komi", "result", "resigned", "resign_disabled",
                    "would_resign_as", "generation", "seed", "simulations"):
            assert getattr(a, key) == getattr(b, key), key
        assert (math.isnan(a.score) and math.isnan(b.score)) or a.score == b.score


def test_load_batch_boards_match_the_reference_replay(run_dir):
    games = _games(3)
    path = write_batch_to(run_dir, games)
    batch = load_batch(path)
    for rec, boards in zip(batch.records, batch.boards):
        assert boards.shape == (len(rec.moves) + 1, N * N) and boards.dtype == np.int8
        np.testing.assert_array_equal(boards, replay_boards(rec))
        assert not boards[0].any()


def test_an_empty_batch_round_trips(run_dir):
    path = write_batch_to(run_dir, [])
    meta, games = read_batch(path)
    assert games == [] and meta.worker == "w1"


def write_batch_to(folder: Path, games, meta: BatchMeta | None = None, seq: int = 1) -> Path:
    meta = meta or _meta()
    path = folder / batch_name(meta.worker, meta.generation, seq)
    write_batch(path, games, meta)
    return path


# ------------------------------------------------------------------------------ names


def test_batch_name_is_sortable_and_parses_back():
    name = batch_name("gpu_box-2", 13, 42)
    assert name == "gpu_box-2_000013_00000042.npz.zst"
    assert parse_batch_name(name) == ("gpu_box-2", 13, 42)
    assert batch_name("w", 1, 2) < batch_name("w", 1, 10) < batch_name("w", 2, 0)


@pytest.mark.parametrize("bad", [
    "../w1_000001_00000001.npz.zst",
    "sub/w1_000001_00000001.npz.zst",
    "w1_000001_00000001.npz",
    "w1_000001_00000001.npz.zst.tmp",
    "w1_000001_00000001.npz.zst.partial",
    "w 1_000001_00000001.npz.zst",
    ".._000001_00000001.npz.zst",
    "w1_1_00000001.npz.zst",
    "w1_000001_1.npz.zst",
    "_000001_00000001.npz.zst",
    "w1;rm_000001_00000001.npz.zst",
])
def test_parse_batch_name_rejects_anything_else(bad):
    with pytest.raises(ValueError, match="batch file name"):
        parse_batch_name(bad)


def test_batch_name_refuses_a_bad_worker_name():
    with pytest.raises(ValueError):
        batch_name("../evil", 1, 1)


# ------------------------------------------------------------------------------ corrupt files


def test_truncated_zstd_is_rejected(run_dir):
    path = write_batch_to(run_dir, _games(3))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    _reject(path, "corrupt_zstd")


def test_a_file_that_is_not_zstd_is_rejected(run_dir):
    path = run_dir / batch_name("w1", 2, 1)
    path.write_bytes(b"PK\x03\x04 not zstd at all" * 10)
    _reject(path, "corrupt_zstd")


def test_a_missing_file_is_rejected_by_name(run_dir):
    _reject(run_dir / batch_name("w1", 2, 1), "unreadable")


def test_a_pickle_payload_is_rejected_without_unpickling(run_dir):
    path = run_dir / batch_name("w1", 2, 1)
    # unpickling this would raise RuntimeError from inside the reader
    payload = pickle.dumps({"games": [1, 2, 3], "evil": _Boom()})
    path.write_bytes(compress_bytes(payload))
    err = _reject(path, "pickle")
    assert "pickle" in str(err)


class _Boom:
    def __reduce__(self):
        return (RuntimeError, ("unpickled!",))


def test_an_object_array_inside_the_npz_is_rejected_as_a_pickle(run_dir):
    arrays = _arrays(_games(2), _meta())
    arrays["moves"] = np.array([_Boom()], dtype=object)
    path = _write_arrays(run_dir / batch_name("w1", 2, 1), arrays)
    _reject(path, "pickle")


def test_a_decompression_bomb_is_stopped_at_the_limit(run_dir):
    path = run_dir / batch_name("w1", 2, 1)
    path.write_bytes(compress_bytes(bytes(64 << 20), level=1))  # 64 MiB of zeros, a few KB
    assert path.stat().st_size < 100_000
    err = _reject(path, "too_large", max_bytes=4 << 20)
    assert str(4 << 20) in str(err)


def test_a_batch_within_the_limit_but_larger_than_max_bytes_is_rejected(run_dir):
    path = write_batch_to(run_dir, _games(3))
    _reject(path, "too_large", max_bytes=1000)


def test_plain_garbage_inside_zstd_is_not_an_npz(run_dir):
    path = run_dir / batch_name("w1", 2, 1)
    path.write_bytes(compress_bytes(b"hello " * 100))
    _reject(path, "not_npz")


def _corrupt(run_dir: Path, change, games=None, meta=None) -> Path:
    games = games if games is not None else _games(4)
    arrays = _arrays(games, meta or _meta())
    change(arrays)
    return _write_arrays(run_dir / batch_name("w1", 2, 1), arrays)


def _set(key, fn):
    def change(a):
        a[key] = fn(a[key])
    return change


def test_missing_array_is_rejected(run_dir):
    _reject(_corrupt(run_dir, lambda a: a.pop("values")), "missing_array")


def test_unexpected_array_is_rejected(run_dir):
    _reject(_corrupt(run_dir, lambda a: a.update(extra=np.zeros(3))), "unexpected_array")


def test_wrong_dtype_is_rejected(run_dir):
    err = _reject(_corrupt(run_dir, _set("visits", lambda v: v.astype(np.int32))), "dtype")
    assert "visits" in str(err) and "uint16" in str(err)


def test_wrong_moves_dtype_is_rejected(run_dir):
    err = _reject(_corrupt(run_dir, _set("moves", lambda v: v.astype(np.int64))), "dtype")
    assert "moves" in str(err)


def test_wrong_visits_shape_is_rejected(run_dir):
    err = _reject(_corrupt(run_dir, _set("visits", lambda v: v[:, :-1].copy())), "shape")
    assert "visits" in str(err)


def test_two_dimensional_moves_are_rejected_as_a_shape_error(run_dir):
    _reject(_corrupt(run_dir, _set("moves", lambda v: v.reshape(1, -1))), "shape")


def test_wrong_per_game_shape_is_rejected(run_dir):
    _reject(_corrupt(run_dir, _set("result", lambda v: v[:-1].copy())), "shape")


def test_bad_offsets_are_rejected(run_dir):
    _reject(_corrupt(run_dir, _set("offsets", lambda v: v[::-1].copy())), "offsets")


def _row_of(arrays, game: int, t: int) -> int:
    return int(arrays["offsets"][game]) + t


def test_nan_visits_are_rejected(run_dir):
    def change(a):
        v = a["visits"].astype(np.float32)
        v[_row_of(a, 2, 3), 0] = np.nan
        a["visits"] = v
    err = _reject(_corrupt(run_dir, change), "visits_nan", game=2)
    assert "move 3" in str(err)


def test_negative_visits_are_rejected(run_dir):
    def change(a):
        v = a["visits"].astype(np.int32)
        v[_row_of(a, 1, 0), 4] = -5
        a["visits"] = v
    _reject(_corrupt(run_dir, change), "visits_negative", game=1)


def test_overflowing_visits_are_rejected(run_dir):
    def change(a):
        v = a["visits"].astype(np.int32)
        v[_row_of(a, 3, 1), 4] = 70_000
        a["visits"] = v
    _reject(_corrupt(run_dir, change), "visits_overflow", game=3)


def test_a_policy_with_no_visits_is_rejected(run_dir):
    def change(a):
        a["visits"][_row_of(a, 1, 2)] = 0
    _reject(_corrupt(run_dir, change), "empty_policy", game=1)


def test_a_move_without_visits_is_rejected(run_dir):
    def change(a):
        r = _row_of(a, 2, 0)
        a["visits"][r, int(a["moves"][r])] = 0
        a["visits"][r, -1] += 5  # the policy still sums to > 0
    _reject(_corrupt(run_dir, change), "unvisited_move", game=2)


def test_visits_on_an_occupied_point_are_rejected(run_dir):
    games = _games(4)
    rec = games[1]
    first = int(rec.moves[0])
    assert first != N * N
    rec.visits[3, first] = 7  # the first stone is still there at move 3, unless captured
    boards = replay_boards(rec)
    assert boards[3, first] != 0
    _reject(write_batch_to(run_dir, games), "visits_on_occupied", game=1)


def test_a_move_off_the_board_is_rejected(run_dir):
    def change(a):
        a["moves"][_row_of(a, 0, 5)] = N * N + 3
    _reject(_corrupt(run_dir, change), "move_range", game=0)


def test_an_illegal_move_is_rejected(run_dir):
    games = _games(3)
    games[2] = _record_from_moves([6, 6, N * N, N * N])  # white plays on black's stone
    err = _reject(write_batch_to(run_dir, games), "illegal_move", game=2)
    assert "move 1" in str(err) and "occupied" in str(err)


def test_suicide_is_rejected_as_an_illegal_move(run_dir):
    # black surrounds A2 (A1, A3, B2 and the edge); white playing A2 is suicide
    moves = [from_gtp(m, N) for m in ("B2", "pass", "A3", "pass", "A1", "A2")]
    rec = _record_from_moves(moves)
    err = _reject(write_batch_to(run_dir, [rec], _meta()), "illegal_move", game=0)
    assert "suicide" in str(err)


def _record_from_moves(moves: list[int], n: int = N, komi: float = KOMI) -> GameRecord:
    t = len(moves)
    visits = np.zeros((t, n * n + 1), np.uint16)
    visits[np.arange(t), moves] = 10
    return GameRecord(n, komi, np.array(moves, np.int16), visits, 1, 1.0, False, False, 0, 2,
                      0, 16, np.zeros(t, np.float16))


def test_a_move_after_two_passes_is_rejected(run_dir):
    rec = _record_from_moves([N * N, N * N, 0])
    err = _reject(write_batch_to(run_dir, [rec]), "after_end", game=0)
    assert "two passes" in str(err)


def test_a_move_after_the_move_cap_is_rejected(run_dir):
    meta = _meta(max_moves=4)
    rec = _record_from_moves([0, 24, 1, 23, N * N])
    _reject(write_batch_to(run_dir, [rec], meta), "after_end", game=0)


def test_an_unfinished_game_is_rejected(run_dir):
    rec = _record_from_moves([0, 24, 1, 23])
    _reject(write_batch_to(run_dir, [rec]), "unfinished", game=0)


def test_a_wrong_result_is_rejected(run_dir):
    games = _games(4)
    games[3] = replace(games[3], result=-games[3].result or 1)
    err = _reject(write_batch_to(run_dir, games), "result_mismatch", game=3)
    assert "replayed score" in str(err)


def test_a_wrong_score_is_rejected(run_dir):
    games = _games(4)
    games[0] = replace(games[0], score=games[0].score + 2)
    _reject(write_batch_to(run_dir, games), "score_mismatch", game=0)


def test_a_result_outside_minus_one_to_one_is_rejected(run_dir):
    def change(a):
        a["result"][1] = 3
    _reject(_corrupt(run_dir, change), "bad_result", game=1)


def test_a_resignation_must_be_won_by_the_player_who_did_not_resign(run_dir):
    games = _games(3)
    games[0] = _resigned(games[0])
    games[0] = replace(games[0], result=-games[0].result)
    err = _reject(write_batch_to(run_dir, games), "result_mismatch", game=0)
    assert "resign" in str(err)


def test_a_resigned_game_must_have_a_nan_score(run_dir):
    games = _games(3)
    games[1] = replace(_resigned(games[1]), score=1.5)
    _reject(write_batch_to(run_dir, games), "bad_score", game=1)


def test_a_resigned_game_cannot_have_resignation_disabled(run_dir):
    games = _games(3)
    games[2] = replace(_resigned(games[2]), resign_disabled=True)
    _reject(write_batch_to(run_dir, games), "resign_flags", game=2)


def test_board_size_mismatch_with_meta_is_rejected(run_dir):
    def change(a):
        a["board_size"][2] = 9
    _reject(_corrupt(run_dir, change), "board_size_mismatch", game=2)


def test_komi_mismatch_with_meta_is_rejected(run_dir):
    def change(a):
        a["komi"][0] = 7.5
    _reject(_corrupt(run_dir, change), "komi_mismatch", game=0)


def test_a_generation_newer_than_the_newest_model_is_rejected(run_dir):
    path = write_batch_to(run_dir, _games(2))
    read_batch(path, max_generation=2)
    err = _reject(path, "generation_too_new", max_generation=1)
    assert "generation 2" in str(err)


def test_a_game_newer_than_the_newest_model_is_rejected(run_dir):
    games = _games(3)
    games[1] = replace(games[1], generation=5)
    path = write_batch_to(run_dir, games)
    read_batch(path, max_generation=5)
    _reject(path, "generation_too_new", game=1, max_generation=4)


def test_meta_from_records_names_the_oldest_generation(run_dir):
    games = _games(3, gen=4)
    games[0] = replace(games[0], generation=3, simulations=32)
    meta = BatchMeta.from_records("w9", games, max_moves=0)
    assert (meta.worker, meta.generation, meta.board_size, meta.komi, meta.simulations) == (
        "w9", 3, N, KOMI, 32)
    path = run_dir / batch_name("w9", meta.generation, 1)
    write_batch(path, games, meta)
    assert read_batch(path)[0] == meta


def test_a_name_that_disagrees_with_the_meta_is_rejected(run_dir):
    path = write_batch_to(run_dir, _games(2))
    other = path.with_name(batch_name("w2", 2, 1))
    path.rename(other)
    _reject(other, "name_mismatch")


def test_bad_meta_json_is_rejected(run_dir):
    _reject(_corrupt(run_dir, lambda a: a.update(meta=np.array("{not json"))), "bad_meta")


def test_meta_with_other_rules_is_rejected(run_dir):
    def change(a):
        meta = json.loads(str(a["meta"]))
        meta["rules"] = "japanese"
        a["meta"] = np.array(json.dumps(meta))
    err = _reject(_corrupt(run_dir, change), "bad_meta")
    assert "japanese" in str(err)


def test_each_kind_of_failure_has_its_own_message(run_dir):
    """Different corruptions give different kinds and different reasons."""
    cases = {
        "truncated": lambda p: p.write_bytes(p.read_bytes()[:50]),
        "pickle": lambda p: p.write_bytes(compress_bytes(pickle.dumps([1]))),
        "garbage": lambda p: p.write_bytes(compress_bytes(b"x" * 100)),
    }
    reasons = {}
    for name, corrupt in cases.items():
        path = write_batch_to(run_dir, _games(2), seq=len(reasons) + 1)
        corrupt(path)
        with pytest.raises(BatchError) as info:
            read_batch(path)
        reasons[info.value.kind] = info.value.reason
    assert len(reasons) == len(cases)
    assert len(set(reasons.values())) == len(cases)


# ------------------------------------------------------------------------------ SGF


def _sgfmill_moves(text: str, n: int) -> list[int]:
    game = sgf.Sgf_game.from_string(text)
    assert game.get_size() == n
    out = []
    for node in game.get_main_sequence()[1:]:
        colour, point = node.get_move()
        assert colour == ("b" if len(out) % 2 == 0 else "w")
        if point is None:
            out.append(n * n)
        else:
            row, col = point  # sgfmill: row 0 is the BOTTOM row; ours: row 0 is the top
            out.append((n - 1 - row) * n + col)
    return out


@pytest.mark.parametrize("n", [5, 7, 9, 13, 19])
def test_sgf_reads_back_through_sgfmill_move_for_move(n):
    rng = np.random.default_rng(n)
    for i in range(3 if n < 19 else 1):
        rec = random_record(n, 6.5, rng, generation=4, seed=i, pass_prob=0.05)
        text = to_sgf(rec, player_black="gen4", player_white="gen4 [w]")
        assert _sgfmill_moves(text, n) == rec.moves.tolist()
        game = sgf.Sgf_game.from_string(text)
        root = game.get_root()
        assert game.get_komi() == 6.5
        assert root.get("RE") == result_text(rec)
        assert root.get("RU") == "Tromp-Taylor"
        assert root.get("PW") == "gen4 [w]"
        assert "generation 4" in root.get("C")
        assert game.get_winner() == {1: "b", -1: "w", 0: None}[rec.result]
        # an independent board: sgfmill's captures give the same final position as ours
        board = sgf_boards.Board(n)
        for node in game.get_main_sequence()[1:]:
            colour, point = node.get_move()
            if point is not None:
                board.play(point[0], point[1], colour)
        ours = replay_boards(rec)[-1].reshape(n, n)
        for row in range(n):
            for col in range(n):
                c = board.get(n - 1 - row, col)
                assert {None: 0, "b": 1, "w": -1}[c] == ours[row, col]
        assert from_sgf(text).moves.tolist() == rec.moves.tolist()
        assert from_sgf(text).board_size == n
        # Sabaki's SBKV: black's win rate in percent after each move but the last, taken
        # from the search's value of the next move (side to move's view)
        nodes = game.get_main_sequence()[1:]
        for t, node in enumerate(nodes[:-1]):
            v = float(rec.values[t + 1]) * (1 if (t + 1) % 2 == 0 else -1)
            assert float(node.get("SBKV")) == pytest.approx(100 * (v + 1) / 2, abs=0.006)
        assert not nodes[-1].has_property("SBKV")


def test_sgf_corner_is_where_gtp_says():
    # A1 is the bottom-left corner in GTP; in SGF it is "a" + the last row letter
    rec = _record_from_moves([from_gtp("A1", 9), from_gtp("J9", 9), 81, 81], n=9, komi=7.5)
    rec = replace(rec, result=-1, score=-7.5)
    text = to_sgf(rec)
    assert ";B[ai]SBKV[" in text and ";W[ia]SBKV[" in text and ";B[]SBKV[" in text
    assert text.rstrip().endswith(";W[])")  # the last move has no position after it to rate
    assert "RE[W+7.5]" in text and "KM[7.5]" in text and "SZ[9]" in text


def test_sgf_result_texts():
    rec = _record_from_moves([N * N, N * N])
    assert result_text(replace(rec, result=1, score=3.5)) == "B+3.5"
    assert result_text(replace(rec, result=-1, score=float("nan"), resigned=True)) == "W+R"
    assert result_text(replace(rec, result=0, score=0.0)) == "0"


def _uniform_evaluator(planes: np.ndarray, legal: np.ndarray):
    """Uniform priors over legal moves; white to move believes it has lost (so it resigns)."""
    priors = legal.astype(np.float32)
    priors /= priors.sum(axis=1, keepdims=True)
    values = np.where(planes[:, -1, 0, 0] == 0, -0.99, 0.0).astype(np.float32)
    return priors, values


def test_real_selfplay_games_validate(run_dir, tiny_cfg):
    """The contract with training.search.selfplay: its records pass validation unchanged."""
    from training.search.selfplay import SelfPlay

    cfg = override(tiny_cfg, {"self_play.resign_moves": 1})  # resign at once: both kinds
    sp = SelfPlay(_uniform_evaluator, cfg.go, cfg.mcts, cfg.self_play,
                  history=cfg.net.history, generation=3, seed=1)
    games = sp.play(max_games=12)
    assert any(g.resigned for g in games) and any(not g.resigned for g in games)
    meta = BatchMeta.from_records("w1", games, max_moves=cfg.go.max_moves)
    path = run_dir / batch_name("w1", meta.generation, 0)
    write_batch(path, games, meta)
    meta_back, back = read_batch(path, max_generation=3)
    assert meta_back == meta and len(back) == 12
    for a, b in zip(games, back):
        np.testing.assert_array_equal(a.moves, b.moves)
        assert _sgfmill_moves(to_sgf(b), cfg.go.board_size) == b.moves.tolist()


def test_sgf_reader_refuses_nan_komi_and_is_linear_on_unclosed_values():
    import time

    with pytest.raises(ValueError, match="KM"):
        from_sgf("(;SZ[9]KM[nan];B[aa])")
    with pytest.raises(ValueError, match="KM"):
        from_sgf("(;SZ[9]KM[1e308];B[aa])")
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="not closed"):
        from_sgf("(;" + "B[aa" * 200_000)  # 800 KB: a regular expression took minutes
    assert time.perf_counter() - t0 < 5
    with pytest.raises(ValueError, match="over"):
        from_sgf("(;SZ[9]" + ";B[aa];W[bb]" * 200_000)
    game = from_sgf("(;SZ [9] KM [6.5] C[a note \\] B[aa] in brackets];B[cc])")
    assert game.komi == 6.5 and game.moves.tolist() == [2 * 9 + 2]
