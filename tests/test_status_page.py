"""The run page, status.json and Prometheus /metrics (`distributed.status_page`): rendered,
parsed by Prometheus' own parser, served by a real HTTP server on loopback, written by the
coach into the run folder."""

from __future__ import annotations

import json
import os
import pathlib
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from distributed.status import StatusSnapshot, WorkerRow, WorkerState
from distributed.status_page import StatusServer, render_html, render_json, render_prometheus


def _snapshot() -> StatusSnapshot:
    return StatusSnapshot(
        games_per_s=3.5, workers_active=1, workers_total=2, model_sync_s=1.25,
        network_mb_per_min=0.5, generation=7, window_games=300, window_positions=12000,
        staleness_generations=1.5, last_loss=2.25, elo=None, run_hours=0.75, hours_limit=2.0,
        updated="2026-01-01 00:00:00",
        workers=[
            WorkerRow("worker1", "localhost", WorkerState.ACTIVE, "cpu", 7, 250, 1.5, 1.0, 0.6,
                      0.4, 0, "", 260),
            WorkerRow("evil\"name", "10.0.0.2", WorkerState.ERROR, "0", 6, 50, 0.0, 1.0, 0.4,
                      12.0, 3, "<script>alert(1)</script>\x1b[31m red", None),
        ])


def test_the_page_shows_the_run_and_escapes_what_a_worker_sent():
    page = render_html(_snapshot(), ["progress.png"], ["strength_games/x/gen7_vs.sgf"])
    assert '<meta http-equiv="refresh"' in page
    assert "<td>7/2</td>" not in page and "<td>1/2</td>" in page  # workers active
    assert "\U0001F7E2 Active" in page and "\U0001F534 Error" in page
    assert "<script>" not in page and "&lt;script&gt;" in page and "\x1b" not in page
    assert '<img src="progress.png"' in page
    assert "<td>0.75 h of 2 h</td>" in page  # run time against --hours
    assert '<a href="strength_games/x/gen7_vs.sgf">gen7_vs.sgf</a>' in page


def test_metrics_parse_with_prometheus_own_parser():
    families = {f.name: f for f in text_string_to_metric_families(
        render_prometheus(_snapshot()))}
    assert families["azgo_generation"].samples[0].value == 7
    assert families["azgo_games_per_second"].samples[0].value == 3.5
    elo = families["azgo_elo"].samples[0].value
    assert elo != elo  # unknown: NaN
    assert families["azgo_run_hours"].samples[0].value == 0.75
    assert families["azgo_run_hours_limit"].samples[0].value == 2.0
    states = {(s.labels["worker"], s.labels["state"]): s.value
              for s in families["azgo_worker_state"].samples}
    assert states[("worker1", "Active")] == 1 and states[("worker1", "Error")] == 0
    assert states[('evil"name', "Error")] == 1  # the quote survives the label escaping
    ages = {s.labels["worker"]: s.value
            for s in families["azgo_worker_heartbeat_age_seconds"].samples}
    assert ages == {"worker1": 0.4, 'evil"name': 12.0}
    assert families["azgo_worker_games"].type == "counter"  # the parser drops "_total"


def test_status_json_round_trips_the_numbers():
    d = json.loads(render_json(_snapshot()))
    assert d["generation"] == 7 and d["workers"][1]["state"] == "Error"


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""


def test_the_server_serves_the_page_and_nothing_else(tmp_path):
    (tmp_path / "index.html").write_text("<html>page</html>")
    (tmp_path / "progress.png").write_bytes(b"\x89PNG fake")
    (tmp_path / "secret.txt").write_text("key")
    (tmp_path / "config.yaml").write_text("workers: []")
    games = tmp_path / "strength_games" / "20260101T000000Z"
    games.mkdir(parents=True)
    (games / "g1.sgf").write_text("(;SZ[9])")
    os.symlink("/etc/passwd", tmp_path / "link.html")
    server = StatusServer(tmp_path, 0, _snapshot)
    try:
        port = server.port
        assert _get(port, "/") == (200, b"<html>page</html>")
        assert _get(port, "/progress.png")[0] == 200
        assert _get(port, "/strength_games/20260101T000000Z/g1.sgf") == (200, b"(;SZ[9])")
        status, body = _get(port, "/metrics")
        assert status == 200 and "azgo_generation 7.0" in body.decode()
        assert json.loads(_get(port, "/status.json")[1])["workers_total"] == 2
        for path in ("/secret.txt", "/config.yaml", "/link.html", "/../../etc/passwd",
                     "/%2e%2e/secret.txt", "/strength_games/../secret.txt", "/models/x.png"):
            assert _get(port, path)[0] == 404, path
    finally:
        server.stop()


def test_the_coach_writes_the_page_into_the_run_folder(tiny_cfg, run_dir):
    from tests.test_coach import _coach

    coach = _coach(tiny_cfg, run_dir, ["worker1", "worker2"])
    coach._write_status()
    page = (run_dir / "index.html").read_text()
    assert "worker1" in page and "worker2" in page and "\U0001F7E2 Active" in page


@pytest.mark.parametrize("port", [0])
def test_start_main_offers_the_server_flag(port):
    import start_main

    assert start_main.parse_args(["--serve-status", str(port)]).serve_status == port


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _browser() -> str:
    import shutil

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed; .ci/install.sh installs it")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return browser


def test_the_run_page_renders_in_a_real_headless_browser(tmp_path):
    """Chromium (headless) loads the page from the run folder with no server: the table and
    the plot are drawn (a screenshot with many colours), and a worker's text stays text."""
    import subprocess

    from training.run import metrics

    browser = _browser()
    for g in range(1, 6):
        metrics.record_metrics(tmp_path, g, loss=3.0 - 0.2 * g, games_per_s=2.0 + 0.1 * g,
                               elo=40.0 * g)
    metrics.plot_progress(tmp_path)
    (tmp_path / "index.html").write_text(render_html(_snapshot(), ["progress.png"]),
                                         encoding="utf-8")
    url = (tmp_path / "index.html").as_uri()
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
              f"--user-data-dir={tmp_path / 'profile'}"]
    shot = pathlib.Path(os.environ.get("AZGO_PAGE_SHOT", tmp_path / "page.png"))
    run = subprocess.run([*common, f"--screenshot={shot}", "--window-size=1100,1300", url],
                         capture_output=True, text=True, timeout=120)
    assert shot.exists(), run.stderr[-2000:]
    data = shot.read_bytes()
    assert _png_size(data) == (1100, 1300)
    from matplotlib import image

    pixels = image.imread(str(shot))[..., :3].reshape(-1, 3)
    colours = len({tuple(p) for p in (pixels * 255).astype(int)[::7]})
    assert colours > 50, f"a blank page ({colours} colours)"
    dom = subprocess.run([*common, "--dump-dom", url], capture_output=True, text=True,
                         timeout=120).stdout
    assert "worker1" in dom and "\U0001F534 Error" in dom and "&lt;script&gt;" in dom
    assert '<img src="progress.png"' in dom
    print(f"headless chromium: screenshot 1100x1300, {colours} colours in a sample")


def _finished_run(tiny_cfg, tmp_path, **values):
    """A coach that runs (no workers) until it stops; returns its run folder."""
    from configs import override
    from training.coach import Coach
    from training.fleet.local_workers import LocalFleet

    run_dir = tmp_path / "run"
    cfg = override(tiny_cfg, {"run.dir": str(run_dir), "logging.dir": str(tmp_path / "logs"),
                              "distributed.poll_interval_s": 0.1, **values})
    coach = Coach(cfg, status_path=run_dir / "status.txt", watch_config=False)
    coach._make_fleet = lambda: LocalFleet(coach.cfg, run_dir, coach.run_config_path,
                                           lambda c: [])
    return coach


def test_a_finished_run_says_so_in_status_txt_and_on_the_page_in_a_browser(tiny_cfg,
                                                                          tmp_path):
    """A run that reached its hours limit: status.txt and the run page (read by headless
    Chromium) say it finished, when, after what and its newest generation, with the time
    they were written; a run stopped by Ctrl-C says that."""
    import re
    import signal
    import subprocess

    from distributed.status import parse_status_text

    browser = _browser()
    coach = _finished_run(tiny_cfg, tmp_path, **{"run.hours": 0.0002})  # 0.72 s
    coach.run()
    run_dir = tmp_path / "run"
    snap = parse_status_text((run_dir / "status.txt").read_text())
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", snap.finished), snap.finished
    assert snap.finished_after == "the hours limit (run.hours 0.0002)"
    assert snap.updated >= snap.finished
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                          f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
                          (run_dir / "index.html").as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    text = " ".join(re.sub(r"<[^>]+>", " ", dom).split())
    assert (f"Finished {snap.finished} UTC after the hours limit (run.hours 0.0002); "
            "newest generation 0.") in text, text[:600]
    assert f"Updated {snap.updated} UTC" in text and "Updated - UTC" not in text

    coach = _finished_run(tiny_cfg, tmp_path)
    coach._on_signal(signal.SIGINT)  # as Ctrl-C does: the loop ends at once
    coach.run()
    snap = parse_status_text((run_dir / "status.txt").read_text())
    assert snap.finished_after == "Ctrl-C (SIGINT)" and snap.generation == 0


def test_a_finished_runs_workers_read_stopped_not_offline_at_no_speed():
    snap = _snapshot()
    snap.finished, snap.finished_after = "2026-01-01 01:00:00", "2 iterations (run.iterations)"
    snap.workers[0].state = WorkerState.OFFLINE
    page = render_html(snap)
    assert "<td>Stopped with the run</td>" in page and "\u26AA Offline" not in page
    assert "Finished</strong> 2026-01-01 01:00:00 UTC after 2 iterations" in page
    assert "<td>1.50</td>" not in page  # no games/s for a finished run


def _raw_get(port: int, host: str | None) -> int:
    """The status code of `GET /status.json` with this Host header (None: none sent)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("GET", "/status.json", skip_host=True)
        if host is not None:
            conn.putheader("Host", host)
        conn.endheaders()
        return conn.getresponse().status
    finally:
        conn.close()


def test_the_server_refuses_a_host_header_it_was_not_given(tmp_path):
    """DNS rebinding: a web page re-points its own name at 127.0.0.1 and reads the run; the
    browser still sends that name as Host, which the server refuses."""
    server = StatusServer(tmp_path, 0, _snapshot, hosts=["Status.Example:443"])
    try:
        port = server.port
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", "localhost:8080",
                     f"[::1]:{port}", "status.example", None):
            assert _raw_get(port, host) == 200, host
        for host in (f"evil.example:{port}", "attacker.test", "127.0.0.1.evil.example",
                     "localhost.evil.example:80", ""):
            assert _raw_get(port, host) == 421, host
    finally:
        server.stop()


def test_a_slow_client_is_cut_at_the_deadline_and_others_are_served(tmp_path):
    """One client sends its request a byte at a time, another sends nothing: each is cut at
    the connection's deadline; a client beyond the connection cap is closed at once; a
    normal request is answered meanwhile."""
    import socket
    import time

    server = StatusServer(tmp_path, 0, _snapshot, deadline_s=1.0, max_connections=3)
    try:
        port = server.port
        silent = socket.create_connection(("127.0.0.1", port), timeout=10)
        trickle = socket.create_connection(("127.0.0.1", port), timeout=10)
        t0 = time.monotonic()
        assert _raw_get(port, "localhost") == 200  # the third slot
        cut_at = None
        for byte in b"GET / HTTP/1.1\r\nX-Pad: " + b"a" * 100:
            try:
                trickle.sendall(bytes([byte]))
            except OSError:
                cut_at = time.monotonic() - t0
                break
            time.sleep(0.05)
        assert cut_at is not None and cut_at < 4.0, f"trickling client still held: {cut_at}"
        assert silent.recv(100) == b"" and time.monotonic() - t0 < 4.0
        # with the slots full, one more connection is closed unanswered
        held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(3)]
        time.sleep(0.2)
        extra = socket.create_connection(("127.0.0.1", port), timeout=10)
        t1 = time.monotonic()
        assert extra.recv(100) == b"" and time.monotonic() - t1 < 0.9
        for s in [silent, trickle, extra, *held]:
            s.close()
    finally:
        server.stop()
