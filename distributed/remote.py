"""What runs on a worker host: its folder layout and the shell/Python text we send there.

Vocabulary: a worker's *root* is its remote folder (`distributed.remote_dir`, or the worker's
own `remote_dir`), made absolute against the remote home once connected. Under it:

    venv/                       the deployed project (python -m venv --system-site-packages)
    deploy/<dist>-<ver>-py3-none-any.whl  the shipped wheel
    config.yaml                 the config the coach pushes for the workers
    logs/worker_<name>.log      the daemon's stdout/stderr
    run/worker_<name>.pid       the daemon's pid (its own session and process group)
    workers/<name>/             the worker folder (training.worker's `--dir`):
        status.json             the heartbeat (distributed.status.Heartbeat)
        models/                 model_<gen:06d>.pt.zst + manifests pushed by the coach
        outbox/                 finished game batches waiting for the coach

Several workers may share one host and one root (one per GPU): everything per worker is under
its name.

Every value that enters a shell command goes through `shlex.quote` (`q`). The run folder on
the coach's side is `training.run.run_dir.RunDir`'s; this is the worker host's twin.

It must not: run anything on a host (the connector sends the text built here; the one local
command is `git ls-files` for the deploy wheel), or know about Go or torch (the preflight
snippet imports torch only on the remote side, inside a try).
"""

from __future__ import annotations

import base64
import configparser
import csv
import fnmatch
import hashlib
import io
import posixpath
import re
import shlex
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

# Environment variable set on every daemon we start, so that a stale pid file whose pid was
# reused by an unrelated process is never mistaken for (or killed as) our worker.
WORKER_ENV = "AZGO_WORKER"

# The daemon's argv; placeholders are filled by `format_start_argv` (see SSHConnector).
CHECK_AFTER_START_S = 0.3  # a daemon gone this soon after start is reported as failed

def daemon_start_command(module: str = "training.worker") -> tuple[str, ...]:
    """A worker daemon's argv template on a host, spelled once (the real daemon, or
    `training.simworker`); `SSHConnector` fills the placeholders, the coach appends
    `--min-seq N`."""
    return ("{python}", "-m", module, "--name", "{name}", "--config", "{config}", "--dir",
            "{dir}", "--models-dir", "{models}", "--gpu-id", "{gpu_id}",
            "--log-to-stderr-only")


DEFAULT_START_COMMAND = daemon_start_command()


def q(value: object) -> str:
    """Shell-quote one argument."""
    return shlex.quote(str(value))


def join(argv: Sequence[object]) -> str:
    """Shell-quote and join an argv list."""
    return " ".join(q(a) for a in argv)


@dataclass(frozen=True)
class WorkerPaths:
    """Absolute remote paths of one worker (see the module docstring)."""

    root: str
    name: str

    @property
    def venv(self) -> str:
        return posixpath.join(self.root, "venv")

    @property
    def venv_python(self) -> str:
        return posixpath.join(self.root, "venv", "bin", "python")

    @property
    def deploy_dir(self) -> str:
        return posixpath.join(self.root, "deploy")

    @property
    def config(self) -> str:
        return posixpath.join(self.root, "config.yaml")

    @property
    def models(self) -> str:
        return posixpath.join(self.worker_dir, "models")

    @property
    def log(self) -> str:
        return posixpath.join(self.root, "logs", f"worker_{self.name}.log")

    @property
    def pid_file(self) -> str:
        return posixpath.join(self.root, "run", f"worker_{self.name}.pid")

    @property
    def worker_dir(self) -> str:
        return posixpath.join(self.root, "workers", self.name)

    @property
    def heartbeat(self) -> str:
        return posixpath.join(self.worker_dir, "status.json")

    @property
    def lease(self) -> str:
        """Which run's coach uses this worker folder (`training.fleet.ssh_workers`)."""
        return posixpath.join(self.worker_dir, "lease.json")

    @property
    def outbox(self) -> str:
        return posixpath.join(self.worker_dir, "outbox")

    def resolve(self, path: str) -> str:
        """`path` if absolute, else relative to the root."""
        return path if path.startswith("/") else posixpath.join(self.root, path)


def absolute_root(remote_dir: str, home: str) -> str:
    """Make a configured remote_dir ("~/azgo", "azgo", "/srv/azgo") absolute."""
    if remote_dir == "~":
        return home
    if remote_dir.startswith("~/"):
        return posixpath.normpath(posixpath.join(home, remote_dir[2:]))
    if not remote_dir.startswith("/"):
        return posixpath.normpath(posixpath.join(home, remote_dir))
    return posixpath.normpath(remote_dir)


# ----------------------------------------------------------------------------- preflight

PREFLIGHT_SNIPPET = r"""
import json, os, platform, shutil, sys
out = {"python": platform.python_version(), "executable": sys.executable,
       "hostname": platform.node()}
try:
    from importlib.metadata import version
    out["project_version"] = version(sys.argv[1])
except Exception:
    out["project_version"] = None
out["torch"], out["cuda"], out["gpus"] = None, False, []
if sys.argv[3] == "1":
    try:
        import torch
        out["torch"] = torch.__version__
        out["cuda"] = bool(torch.cuda.is_available())
        if out["cuda"]:
            out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception as e:
        out["torch_error"] = repr(e)[:300]
d = sys.argv[2]
while not os.path.isdir(d):
    d = os.path.dirname(d) or "/"
out["free_disk_gb"] = shutil.disk_usage(d).free / 1e9
print(json.dumps(out))
"""


def preflight_command(paths: WorkerPaths, python: str, dist: str, with_torch: bool) -> str:
    """Run the preflight snippet with the worker's venv python if deployed, else `python`."""
    return (
        f"p={q(paths.venv_python)}; [ -x \"$p\" ] || p={q(python)}; "
        f"exec \"$p\" -c {q(PREFLIGHT_SNIPPET)} {q(dist)} {q(paths.root)} "
        f"{'1' if with_torch else '0'}"
    )


# ----------------------------------------------------------------------------- daemon

# true when pid $1 is alive, not a zombie, and carries our marker for worker $2
_ALIVE_FN = (
    "alive() { [ -r /proc/$1/status ] && ! grep -q '^State:[[:space:]]*Z' /proc/$1/status "
    f"&& tr '\\0' '\\n' < /proc/$1/environ 2>/dev/null | grep -qxF \"{WORKER_ENV}=$2\"; }}; "
)


def start_command(paths: WorkerPaths, argv: Sequence[str]) -> str:
    """Start `argv` detached (setsid: own session and process group) unless already running.

    Runs in the root folder, output appended to the log. Prints `running PID` or
    `started PID`. `cd X || exit 1; ... &` (not `cd X && cmd &`) so that the SSH channel
    closes at once. The GPU is the command's business (`--gpu-id`): no CUDA_VISIBLE_DEVICES,
    which would renumber the devices under it.
    """
    return (
        _ALIVE_FN
        + "umask 077; "  # the worker's folders and files are the user's alone
        + f"mkdir -p {q(paths.root)} && cd {q(paths.root)} || exit 1; "
        + f"mkdir -p logs run {q(paths.outbox)} {q(paths.models)} || exit 1; "
        + f"p=$(cat {q(paths.pid_file)} 2>/dev/null); "
        + f"if [ -n \"$p\" ] && alive \"$p\" {q(paths.name)}; then echo running $p; exit 0; fi; "
        + f"{WORKER_ENV}={q(paths.name)} setsid {join(argv)} >> {q(paths.log)} 2>&1 < /dev/null & "
        + f"p=$!; echo $p > {q(paths.pid_file)}; "
        # a daemon that dies at once (bad python path, missing module) is reported now
        + f"sleep {CHECK_AFTER_START_S}; if ! alive $p {q(paths.name)}; then "
        + f"echo exited $p; tail -n 20 {q(paths.log)} >&2; exit 1; fi; echo started $p"
    )


def running_command(paths: WorkerPaths) -> str:
    """Print the daemon's pid if it runs, nothing otherwise."""
    return (
        _ALIVE_FN
        + f"p=$(cat {q(paths.pid_file)} 2>/dev/null); "
        + f"if [ -n \"$p\" ] && alive \"$p\" {q(paths.name)}; then echo $p; fi; exit 0"
    )


def log_tail_command(paths: WorkerPaths, max_bytes: int) -> str:
    """Print at most the last `max_bytes` of the daemon's log (nothing when there is none)."""
    return f"tail -c {int(max_bytes)} {q(paths.log)} 2>/dev/null; exit 0"


def stop_command(paths: WorkerPaths, grace_s: float) -> str:
    """SIGTERM the daemon's process group, SIGKILL it after `grace_s`; prints what happened."""
    ticks = max(1, int(grace_s / 0.1))
    return (
        _ALIVE_FN
        + f"f={q(paths.pid_file)}; n={q(paths.name)}; p=$(cat \"$f\" 2>/dev/null); "
        + "if [ -z \"$p\" ] || ! alive \"$p\" \"$n\"; then "
        + "rm -f \"$f\"; echo not-running; exit 0; fi; "
        + "kill -TERM -- -\"$p\" 2>/dev/null || kill -TERM \"$p\" 2>/dev/null; "
        + f"i=0; while alive \"$p\" \"$n\" && [ $i -lt {ticks} ]; do sleep 0.1; i=$((i+1)); done; "
        + "if alive \"$p\" \"$n\"; then kill -KILL -- -\"$p\" 2>/dev/null || kill -KILL \"$p\"; "
        + "sleep 0.1; echo killed $p; else echo terminated $p; fi; rm -f \"$f\""
    )


def format_start_argv(template: Sequence[str], **values: object) -> list[str]:
    """Fill `{python}`, `{name}`, `{config}`, `{root}`, `{dir}`, `{models}`, `{log}`,
    `{gpu_id}` into each argv item."""
    return [str(item).format(**values) for item in template]


# ----------------------------------------------------------------------------- deploy


@dataclass(frozen=True)
class ProjectInfo:
    """The local project to ship: its distribution name, version and source folder, what it
    requires (`Requires-Dist` lines) and which top-level folders hold its packages (glob
    patterns on the first path component; `*` ships every tracked folder)."""

    dist: str
    version: str
    root: Path
    requires: tuple[str, ...] = ()
    packages: tuple[str, ...] = ("*",)
    python_requires: str = ""


def _cfg_list(text: str) -> tuple[str, ...]:
    return tuple(line.strip() for line in text.splitlines() if line.strip())


def local_project(root: Path | None = None) -> ProjectInfo:
    """Read the project's setup.cfg (the repository this file is in, unless `root` is given):
    name, version, python_requires, install_requires, and the packages' top-level folders
    (`[options.packages.find] include`, or an explicit `[options] packages` list)."""
    root = root or Path(__file__).resolve().parent.parent
    setup_cfg = root / "setup.cfg"
    cp = configparser.ConfigParser()
    if not cp.read(setup_cfg) or "metadata" not in cp:
        raise FileNotFoundError(f"{setup_cfg}: no [metadata] section; deploy needs the "
                                "project's name and version there")
    opts = cp["options"] if "options" in cp else {}
    packages = _cfg_list(opts.get("packages", ""))
    if packages in ((), ("find:",)):
        find = cp["options.packages.find"] if "options.packages.find" in cp else {}
        packages = _cfg_list(find.get("include", "")) or ("*",)
    return ProjectInfo(cp["metadata"]["name"], cp["metadata"]["version"], root,
                       requires=_cfg_list(opts.get("install_requires", "")),
                       packages=packages,
                       python_requires=opts.get("python_requires", "").strip())


def wheel_name(project: ProjectInfo) -> str:
    """`<dist>-<version>-py3-none-any.whl`, the name pip expects of a pure-Python wheel."""
    return f"{_wheel_dist(project)}-{project.version}-py3-none-any.whl"


def _wheel_dist(project: ProjectInfo) -> str:
    return re.sub(r"[-_.]+", "_", project.dist).lower()


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def build_wheel(project: ProjectInfo, out_dir: Path) -> Path:
    """A pure-Python wheel of the project's files git tracks, nothing else: an untracked
    `.env`, key, run folder or scratch file beside the code never leaves the main node (add a
    new module with `git add` before deploying it). Regular files only: a tracked symlink is
    not followed. Only files under the package folders (`project.packages`) ship.

    A config file under `configs/` ships redacted (`redacted_config_text`): the main node's
    worker list, hosts, users, key paths and weights stay on the main node.

    A wheel, not a source archive: pip installs it by unpacking, so a worker host needs no
    build backend (an old setuptools without `bdist_wheel` cannot build one offline). The
    bytes depend only on the files' contents and modes (times are fixed), so its sha256
    identifies the code that a worker runs.
    """
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached"],
        cwd=project.root, capture_output=True, check=True,
    ).stdout.decode().split("\0")
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / wheel_name(project)
    tmp = wheel.with_name(wheel.name + ".tmp")
    info_dir = f"{_wheel_dist(project)}-{project.version}.dist-info"
    record: list[tuple[str, str, str]] = []  # RECORD's rows: path, hash, size

    def write(zf: zipfile.ZipFile, arcname: str, data: bytes, mode: int = 0o644) -> None:
        zi = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))  # fixed: same bytes
        zi.external_attr = ((mode & 0o777) | 0o100000) << 16
        zi.compress_type = zipfile.ZIP_DEFLATED
        zf.writestr(zi, data)

    def add(zf: zipfile.ZipFile, arcname: str, data: bytes, mode: int = 0o644) -> None:
        write(zf, arcname, data, mode)
        record.append((arcname, _record_hash(data), str(len(data))))

    def ships(rel: str) -> bool:
        top, sep, _ = rel.partition("/")
        return bool(sep) and any(fnmatch.fnmatchcase(top, pat) for pat in project.packages)

    metadata = [
        "Metadata-Version: 2.1",
        f"Name: {project.dist}",
        f"Version: {project.version}",
        *([f"Requires-Python: {project.python_requires}"] if project.python_requires else []),
        *(f"Requires-Dist: {req}" for req in project.requires),
    ]
    wheel_meta = ["Wheel-Version: 1.0", "Generator: azgo deploy", "Root-Is-Purelib: true",
                  "Tag: py3-none-any"]
    with zipfile.ZipFile(tmp, "w") as zf:
        for rel in sorted(f for f in files if f and ships(f)):
            path = project.root / rel
            if not path.is_file() or path.is_symlink():
                continue
            if rel.startswith("configs/") and rel.endswith((".yaml", ".yml")):
                data = redacted_config_text(path.read_text(encoding="utf-8",
                                                           errors="replace")).encode()
            else:
                data = path.read_bytes()
            add(zf, rel, data, path.stat().st_mode)
        add(zf, f"{info_dir}/METADATA", ("\n".join(metadata) + "\n").encode())
        add(zf, f"{info_dir}/WHEEL", ("\n".join(wheel_meta) + "\n").encode())
        record.append((f"{info_dir}/RECORD", "", ""))
        rows = io.StringIO()
        csv.writer(rows, lineterminator="\n").writerows(record)  # a path may hold a comma
        write(zf, f"{info_dir}/RECORD", rows.getvalue().encode())
    tmp.replace(wheel)
    return wheel


_PRIVATE_KEYS = {"workers": [], "training_nodes": [], "worker_weights": {},
                 "master_addr": None}


def redacted_config_text(text: str) -> str:
    """A config file's text without what names other machines (distributed.workers,
    training_nodes, worker_weights, master_addr); a file that is not a YAML mapping ships
    as a comment saying so (it held nothing a worker reads)."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        data = None
    if not isinstance(data, dict):
        return "# not shipped: this file is not a YAML mapping on the main node\n"
    dist = data.get("distributed")
    if isinstance(dist, dict):
        data["distributed"] = {**dist, **{k: v for k, v in _PRIVATE_KEYS.items() if k in dist}}
    return ("# shipped by the coach: hosts, users, key paths and weights removed\n"
            + yaml.safe_dump(data, sort_keys=False))


def deployed_marker(paths: WorkerPaths) -> str:
    """File in the venv holding `<version> <archive sha256>` of the last successful deploy."""
    return posixpath.join(paths.venv, "azgo-deployed.txt")


def installed_version_command(paths: WorkerPaths, dist: str) -> str:
    """Print the version of `dist` the worker's venv sees, or nothing."""
    snippet = (
        "import sys\nfrom importlib.metadata import version\n"
        "try:\n    print(version(sys.argv[1]))\nexcept Exception:\n    pass\n"
    )
    return (
        f"p={q(paths.venv_python)}; [ -x \"$p\" ] || exit 0; "
        f"\"$p\" -c {q(snippet)} {q(dist)}"
    )


def make_venv_command(paths: WorkerPaths, python: str) -> str:
    """Create the venv unless it exists; make the folders.

    `--system-site-packages` reuses the host's torch etc.; `--without-pip` so that the host's
    own pip is used; ensurepip only when the host has no pip.
    """
    vpy = q(paths.venv_python)
    return (
        f"umask 077; mkdir -p {q(paths.deploy_dir)} {q(posixpath.join(paths.root, 'logs'))} "
        "|| exit 1; "
        f"[ -x {vpy} ] || {q(python)} -m venv --system-site-packages --without-pip "
        f"{q(paths.venv)} || exit 1; "
        f"{vpy} -m pip --version > /dev/null 2>&1 || {vpy} -m ensurepip --default-pip"
    )


def pip_install_command(paths: WorkerPaths, archive: str, *, with_deps: bool) -> str:
    """pip install the shipped wheel into the venv (no network when `with_deps` is false)."""
    flags = "--no-deps --no-index" if not with_deps else ""
    return (
        f"{q(paths.venv_python)} -m pip install --quiet --disable-pip-version-check "
        f"--force-reinstall {flags} {q(archive)}"
    )


MISSING_DEPS_SNIPPET = r"""
import re, sys
from importlib.metadata import requires, version
missing = []
for req in requires(sys.argv[1]) or []:
    if ";" in req:
        continue  # extras and markers: not needed to run
    name = re.split(r"[ <>=!~\[(]", req.strip(), maxsplit=1)[0]
    try:
        version(name)
    except Exception:
        missing.append(name)
print(" ".join(missing))
"""


SPEED_ONLY_DEPS = frozenset({"onnx", "onnxruntime"})
"""Requirements a worker runs without, only slower (the net falls back to TorchScript): a
host that lacks them is told so, and deploy does not reach for the network for them alone."""


def missing_deps_command(paths: WorkerPaths, dist: str) -> str:
    """Print the names of `dist`'s requirements the venv cannot find (space separated)."""
    return f"{q(paths.venv_python)} -c {q(MISSING_DEPS_SNIPPET)} {q(dist)}"
