"""The run at a glance for people and for monitoring: an HTML page, JSON and Prometheus text.

- `render_html(snap, images, games)`: a self-contained page (inline CSS, no script, refreshing
  itself every 10 s) with the time it was written, the header figures (a finished run says
  when it finished, after what, and its newest generation; its workers read "Stopped with
  the run"; a trainer that keeps failing shows its last error), the worker table with each
  state's indicator, the plots of the run folder (`images`: file names relative to the page)
  and links to the last games' SGF files. The coach writes it as `index.html` in the run folder; a browser opens
  the file directly, with no server.
- `render_json(snap)`: the same snapshot as JSON (`status.json` of the server below).
- `render_prometheus(snap)`: Prometheus' text exposition format: per run `azgo_generation`,
  `azgo_games_per_second`, `azgo_workers_active`, `azgo_window_positions`, `azgo_last_loss`,
  ...; per worker (label `worker`) `azgo_worker_state` (one series per state, 1 for the
  current one), `azgo_worker_games_per_second`, `azgo_worker_heartbeat_age_seconds`,
  `azgo_worker_games_total`, `azgo_worker_restarts_total`.
- `StatusServer(folder, port)`: a read-only HTTP server on 127.0.0.1 serving `/` (the page),
  `/status.json`, `/metrics` and the page's images and SGF files from `folder` (regular files
  directly in it or in `strength_games/`, nothing else); `start_main.py --serve-status PORT`.
  A request whose `Host` header names another host than 127.0.0.1, localhost, [::1] or a
  name it was given (`--status-host`) is refused with 421: a web page cannot read the run
  through a name it re-points at 127.0.0.1 (DNS rebinding). Each connection has
  `REQUEST_DEADLINE_S` in all and at most `MAX_CONNECTIONS` are served at once, so a slow or
  silent client holds nothing for long.

Every text from a worker goes through `printable` (and HTML escaping): a worker host is
untrusted. It must not: import training/ or torch, or listen on anything but loopback.
"""

from __future__ import annotations

import html
import json
import math
import os
import socket
import sys
import threading
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Sequence

from distributed.status import (
    StatusSnapshot,
    WorkerState,
    finish_line,
    printable,
    run_time,
    trainer_error_line,
)

REFRESH_S = 10
REQUEST_DEADLINE_S = 10.0  # one connection's whole time, however slowly its client sends
MAX_CONNECTIONS = 32  # served at once; more are closed unanswered
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def _num(v: float | int | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def render_html(snap: StatusSnapshot, images: Sequence[str] = (),
                games: Sequence[str] = ()) -> str:
    """The page (see the module docstring); `images` and `games` are relative links."""
    e = html.escape
    done = bool(snap.finished)
    header = [
        ("Generation", _num(snap.generation, "d")),
        ("Games/second", "- (finished)" if done else f"{snap.games_per_s:.1f}"),
        ("Workers active", f"{snap.workers_active}/{snap.workers_total}"),
        ("Model sync time", "-" if snap.model_sync_s is None else f"{snap.model_sync_s:.1f} s"),
        ("Network usage", f"{snap.network_mb_per_min:.1f} MB/min"),
        ("Games in window", str(snap.window_games)),
        ("Positions in window", str(snap.window_positions)),
        ("Data staleness", _num(snap.staleness_generations, ".2f") + " generations"),
        ("Last loss", _num(snap.last_loss, ".4f")),
        ("Elo", _num(snap.elo, ".1f")),
        ("Run time", run_time(snap)),
    ]
    rows = "\n".join(
        "<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in (
            printable(w.name, 80), printable(w.host, 80),
            "Stopped with the run" if done and w.state == WorkerState.OFFLINE
            else f"{w.state.indicator} {w.state.value}", printable(w.gpu, 40),
            _num(w.generation, "d"), w.games, _num(w.played, "d"),
            "-" if done else f"{w.games_per_s:.2f}",
            f"{w.weight:.2f}", f"{100 * w.share:.1f}%",
            "-" if w.heartbeat_age_s is None else f"{w.heartbeat_age_s:.1f} s", w.restarts,
            printable(w.last_error, 200) or "-")) + "</tr>"
        for w in snap.workers)
    figures = "\n".join(f'<figure><img src="{e(i, quote=True)}" alt="{e(i)}"></figure>'
                        for i in images)
    links = "\n".join(f'<li><a href="{e(g, quote=True)}">{e(Path(g).name)}</a></li>'
                      for g in games)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{REFRESH_S}">
<title>azgo run{": finished" if done else ""}: generation {e(_num(snap.generation, "d"))}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }}
th {{ background: #f0f0f0; }}
.figures {{ display: flex; flex-wrap: wrap; gap: 1em; }}
img {{ max-width: 640px; }}
</style></head><body>
<h1>azgo run{" (finished)" if done else ""}</h1>
{f'<p id="finished"><strong>Finished</strong> {e(finish_line(snap))}.</p>' if done else ""}
{f'<p id="trainer-error"><strong>Trainer error</strong> {e(trainer_error_line(snap))}</p>'
 if snap.trainer_error else ""}
<p>Updated {e(snap.updated or "-")} UTC; this page reloads every {REFRESH_S} s.</p>
<table id="header">
{"".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in header)}
</table>
<table id="workers">
<tr><th>Name</th><th>Host</th><th>State</th><th>GPU</th><th>Gen</th><th>Games</th>
<th>Played</th><th>Games/s</th><th>Weight</th><th>Share</th><th>Heartbeat</th>
<th>Restarts</th><th>Last error</th></tr>
{rows}
</table>
<div class="figures">
{figures}
</div>
{"<h2>Last games</h2><ul>" + links + "</ul>" if games else ""}
</body></html>
"""


def render_json(snap: StatusSnapshot) -> str:
    d = asdict(snap)
    for w in d["workers"]:
        w["state"] = str(w["state"])
    return json.dumps(d, indent=1)


def _metric(v: float | int | None) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "NaN"
    return repr(float(v))


def _label(value: str) -> str:
    return printable(value, 80).replace("\\", "\\\\").replace('"', '\\"')


def render_prometheus(snap: StatusSnapshot) -> str:
    """Prometheus' text exposition format (version 0.0.4)."""
    out: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: list[tuple[str, object]]) -> None:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            out.append(f"{name}{labels} {_metric(value)}")

    family("azgo_generation", "gauge", "Newest published generation.", [("", snap.generation)])
    family("azgo_games_per_second", "gauge", "Self-play games per second, last minute.",
           [("", snap.games_per_s)])
    family("azgo_workers_active", "gauge", "Workers in state Active.",
           [("", snap.workers_active)])
    family("azgo_workers", "gauge", "Workers configured.", [("", snap.workers_total)])
    family("azgo_model_sync_seconds", "gauge", "Time of the last model push to all workers.",
           [("", snap.model_sync_s)])
    family("azgo_network_megabytes_per_minute", "gauge", "Transfer to and from workers.",
           [("", snap.network_mb_per_min)])
    family("azgo_window_games", "gauge", "Games in the training window.",
           [("", snap.window_games)])
    family("azgo_window_positions", "gauge", "Positions in the training window.",
           [("", snap.window_positions)])
    family("azgo_staleness_generations", "gauge",
           "Mean age of the window's positions in generations.",
           [("", snap.staleness_generations)])
    family("azgo_last_loss", "gauge", "Training loss of the newest round.",
           [("", snap.last_loss)])
    family("azgo_elo", "gauge", "Chained arena Elo of the newest generation.", [("", snap.elo)])
    family("azgo_run_hours", "gauge", "Hours the run has run, resumes included.",
           [("", snap.run_hours)])
    family("azgo_run_hours_limit", "gauge", "run.hours: where the run stops (0: no limit).",
           [("", snap.hours_limit)])
    states = [(f'{{worker="{_label(w.name)}",state="{s.value}"}}', int(w.state == s))
              for w in snap.workers for s in WorkerState]
    family("azgo_worker_state", "gauge", "1 for the worker's current state.", states)

    def per_worker(attr: str) -> list[tuple[str, object]]:
        return [(f'{{worker="{_label(w.name)}"}}', getattr(w, attr)) for w in snap.workers]

    family("azgo_worker_games_per_second", "gauge", "A worker's self-play games per second.",
           per_worker("games_per_s"))
    family("azgo_worker_heartbeat_age_seconds", "gauge", "Seconds since its last heartbeat.",
           per_worker("heartbeat_age_s"))
    family("azgo_worker_games_total", "counter", "Games collected from the worker.",
           per_worker("games"))
    family("azgo_worker_restarts_total", "counter", "Restarts of the worker's daemon.",
           per_worker("restarts"))
    return "\n".join(out) + "\n"


def host_name(header: str | None) -> str | None:
    """The host name of a `Host` header, lower case, without its port (None: no header)."""
    if header is None:
        return None
    name = header.strip().lower()
    if name.startswith("["):  # [::1]:8080
        return name[: name.find("]") + 1] if "]" in name else name
    return name.rsplit(":", 1)[0] if ":" in name else name


class _BoundedServer(ThreadingHTTPServer):
    """A thread per connection, at most `max_connections` at once (more are closed)."""

    daemon_threads = True

    def __init__(self, address, handler, max_connections: int):
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, handler)

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            return  # a client that went away, or one cut at its deadline
        super().handle_error(request, client_address)


class StatusServer:
    """A read-only HTTP server on 127.0.0.1 (see the module docstring); `stop()` ends it.

    `hosts`: more names a `Host` header may give (a name this machine is reached by through
    a tunnel or a proxy), beside the loopback ones."""

    SERVED_SUFFIXES = (".html", ".png", ".sgf")

    def __init__(self, folder: str | os.PathLike, port: int,
                 snapshot: Callable[[], StatusSnapshot | None], *,
                 hosts: Sequence[str] = (), deadline_s: float = REQUEST_DEADLINE_S,
                 max_connections: int = MAX_CONNECTIONS):
        self.folder = Path(folder).resolve()
        self.snapshot = snapshot
        self.hosts = {*LOOPBACK_NAMES, *(host_name(h) for h in hosts)}
        server = self

        class Handler(BaseHTTPRequestHandler):
            timeout = deadline_s  # each read and write of the socket

            def setup(self) -> None:
                super().setup()
                # the whole connection: a client that sends a byte now and then is cut too
                self._cut = threading.Timer(deadline_s, self._shut)
                self._cut.daemon = True
                self._cut.start()

            def _shut(self) -> None:
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

            def finish(self) -> None:
                self._cut.cancel()
                try:
                    super().finish()
                except OSError:  # the deadline cut the connection
                    pass

            def do_GET(self) -> None:  # noqa: N802 - the http.server name
                server._get(self)

            def log_message(self, *args) -> None:  # no line per request on stderr
                pass

        self.httpd = _BoundedServer(("127.0.0.1", port), Handler, max_connections)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="status-http",
                                       daemon=True)
        self.thread.start()

    def _get(self, req: BaseHTTPRequestHandler) -> None:
        name = host_name(req.headers.get("Host"))
        if name is not None and name not in self.hosts:
            # a browser always sends Host: another name is a page that re-pointed its own
            # name at this machine (DNS rebinding) or a proxy nobody named
            self._send(req, 421, b"misdirected request: this server answers to 127.0.0.1 and "
                       b"localhost (start_main.py --status-host NAME adds a name)\n",
                       "text/plain")
            return
        path = req.path.split("?", 1)[0]
        snap = self.snapshot() or StatusSnapshot()
        if path == "/metrics":
            self._send(req, 200, render_prometheus(snap).encode(),
                       "text/plain; version=0.0.4; charset=utf-8")
            return
        if path == "/status.json":
            self._send(req, 200, render_json(snap).encode(), "application/json")
            return
        if path in ("/", "/index.html"):
            path = "/index.html"
        file = self._file(path)
        if file is None:
            self._send(req, 404, b"not found\n", "text/plain")
            return
        kinds = {".html": "text/html; charset=utf-8", ".png": "image/png",
                 ".sgf": "application/x-go-sgf"}
        self._send(req, 200, file.read_bytes(), kinds[file.suffix])

    def _file(self, path: str) -> Path | None:
        """A regular file of the folder (or of strength_games/ below it) with a served
        suffix; None for anything else (no traversal, no links, no other suffix)."""
        parts = [p for p in path.split("/") if p]
        if not parts or any(p in ("", ".", "..") or p.startswith(".") for p in parts):
            return None
        if len(parts) > 1 and parts[0] != "strength_games":
            return None
        file = self.folder.joinpath(*parts)
        if file.suffix not in self.SERVED_SUFFIXES or file.is_symlink() or not file.is_file():
            return None
        try:
            file.resolve().relative_to(self.folder)
        except ValueError:
            return None
        return file

    @staticmethod
    def _send(req: BaseHTTPRequestHandler, code: int, body: bytes, kind: str) -> None:
        req.send_response(code)
        req.send_header("Content-Type", kind)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)
