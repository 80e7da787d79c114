"""The docs say what the code does: every command, file and config key README.md and docs/*.md
name is checked against the code itself.

- A command line (in a code block, or in `backticks`) that starts with `python3 start_main.py`,
  `python3 -m training.<module>`, `distributed/ssh_connector.py` (with or without `python3`),
  `python3 benchmarks/<name>.py`, `torchrun`, `python3 -m torch.distributed.launch` or
  `python3 -m pytest` is parsed by the real argument parser of that entry point (a benchmark's
  `main` runs until its parser has parsed; the launchers' parsers, then the module's; pytest's
  own parser with its plugins' options): a flag that does not exist, or a value of the wrong
  type, fails. Placeholders are allowed: `[...]` around an optional part, `...` for "and so
  on", `<...>` for one value. A code block's line ending in a backslash goes on on the next
  line.
- A repository file a doc names (`training/fleet/collector.py`, `docs/img/load.png`, a
  markdown link) exists, and a link to a heading (`USAGE.md#files-of-a-run`) finds it.
- A config key a doc names (`training.lr_schedule`, `distributed.workers[1].gpu_id`) exists
  in configs/schema.py, and every ```yaml block loads with the schema.
- docs/DESIGN.md's module table lists every module of the project (configs/, distributed/,
  training/, start_main.py, start_worker.py) and every benchmark.

The self-tests at the bottom feed the checks made-up lines, so the checks can fail.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import io
import re
import shlex
import sys
from pathlib import Path

import pytest

from configs import Config, ConfigError
from configs.loading import load_config_text
from configs.schema import WorkerSpec
from tests.conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# torchrun's parser, importing torch.distributed.elastic, warns that stderr (captured) has no fd
pytestmark = pytest.mark.filterwarnings("ignore:Unable to enable fault handler")

# where a command the check parses starts, within a line of code
_START = re.compile(
    r"(?:(?<=^)|(?<=[\s(]))(?:python3? +start_main\.py(?=\s|$)"
    r"|python3? +-m +training\.[\w.]+(?=\s|$)"
    r"|python3? +distributed/ssh_connector\.py(?=\s|$)"
    r"|python3? +benchmarks/\w+\.py(?=\s|$)"
    r"|python3? +-m +pytest(?=\s|$)"
    r"|(?:python3? +-m +torch\.distributed\.launch|distributed/ssh_connector\.py|torchrun)"
    r"(?=\s+-))")  # these bare (a name in a sentence) only with a flag after
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_INLINE = re.compile(r"`([^`\n]+(?:\n[^`\n]+){0,3})`")


class _Parsed(Exception):
    """Raised in place of returning from parse_args: the command line parsed."""


def code_spans(text: str) -> list[str]:
    """Every line of a fenced code block (but yaml and python) and every inline code span
    (one spread over a line break joined into one line)."""
    spans = []
    for lang, body in _FENCE.findall(text):
        if lang not in ("yaml", "python"):
            spans += re.sub(r"\\\n\s*", " ", body).splitlines()  # a line ending in a backslash goes on
    outside = _FENCE.sub("", text)
    spans += [" ".join(s.split()) for s in _INLINE.findall(outside)]
    return spans


def commands_in(text: str) -> list[str]:
    """The command lines in `text` that the check parses, each cut at a shell operator
    (`&&`, `|`, `;`, `>`) or a `#` comment."""
    found = []
    for span in code_spans(text):
        for part in re.split(r"&&|\|\||[|;]|\s\d?>>?|\s#", span):
            m = _START.search(part)
            if m:
                found.append(part[m.start():].strip())
    return found


def _words(command: str) -> list[str]:
    """The command's words with the placeholders turned into plain values."""
    command = re.sub(r"<[^<>]*>", "1", command)  # <start time> -> one value (of any type)
    command = command.replace("[", " ").replace("]", " ")  # an optional part: given
    return [w for w in shlex.split(command) if w not in ("...", "…")]


def _parse_with(main, argv: list[str]) -> str | None:
    """Run `main(argv)` until its parser has parsed; the parser's error, or None."""
    original_parse_args = argparse.ArgumentParser.parse_args
    original_known = argparse.ArgumentParser.parse_known_args
    depth = [0]

    def parse_args(self, args=None, namespace=None):
        self.allow_abbrev = False  # a doc spells each flag out
        depth[0] += 1
        try:
            original_parse_args(self, args, namespace)
        finally:
            depth[0] -= 1
        raise _Parsed()

    def parse_known_args(self, args=None, namespace=None):
        self.allow_abbrev = False
        result = original_known(self, args, namespace)
        if depth[0]:
            return result
        raise _Parsed()

    err = io.StringIO()
    argparse.ArgumentParser.parse_args = parse_args
    argparse.ArgumentParser.parse_known_args = parse_known_args
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            main(argv)
    except _Parsed:
        return None
    except SystemExit as e:
        if e.code in (0, None):  # --help
            return None
        return err.getvalue().strip().splitlines()[-1] if err.getvalue() else f"exit {e.code}"
    finally:
        argparse.ArgumentParser.parse_args = original_parse_args
        argparse.ArgumentParser.parse_known_args = original_known
    return "the entry point returned without parsing its command line"


def _module_main(module: str):
    if not (REPO / (module.replace(".", "/") + ".py")).is_file():
        raise LookupError(f"no module {module} (no {module.replace('.', '/')}.py)")
    main = getattr(importlib.import_module(module), "main", None)
    if main is None:
        raise LookupError(f"{module} has no command line (no main)")
    return main


def _benchmark_main(script: str):
    """The `main` of benchmarks/<name>.py, loaded without running it, as a function of argv (a
    main that reads sys.argv is given it there)."""
    path = REPO / script
    if not path.is_file():
        raise LookupError(f"no benchmark {script}")
    name = f"_doc_benchmark_{path.stem}"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
    main = getattr(module, "main", None)
    if main is None:
        raise LookupError(f"{script} has no main")

    def run(argv: list[str]):
        saved = sys.argv
        sys.argv = [str(path), *argv]
        try:
            return main(argv) if inspect.signature(main).parameters else main()
        finally:
            sys.argv = saved
    return run


def _check_launcher(parser, argv: list[str], name: str, use_env: bool = True) -> str | None:
    """A torchrun / torch.distributed.launch line: the launcher's parser, then the module's
    (given `--local-rank` first, as the launcher passes it unless --use-env)."""
    error = _parse_with(lambda a: parser.parse_args(a), argv)
    if error:
        return f"{name}: {error}"
    args = parser.parse_args(argv)
    if not args.module:
        return f"{name} runs no -m module"
    script_args = list(args.training_script_args)
    if not getattr(args, "use_env", use_env):
        script_args = ["--local-rank=0", *script_args]
    return _parse_with(_module_main(args.training_script), script_args)


def _check_pytest(argv: list[str]) -> str | None:
    """pytest's own command-line parser, with the options of its installed plugins."""
    from _pytest.config import get_config

    config = get_config()
    config.pluginmanager.load_setuptools_entrypoints("pytest11")
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            config._parser.parse(argv)
    except (pytest.UsageError, SystemExit) as e:
        return "pytest: " + str(e).strip().splitlines()[-1]
    return None


def check_command(command: str) -> str | None:
    """Why `command` does not parse with its entry point's parser; None when it does."""
    words = _words(command)
    while words and words[0] in ("python", "python3"):
        words = words[1:]
    try:
        if words[0] == "start_main.py":
            spec = importlib.util.spec_from_file_location("start_main", REPO / "start_main.py")
            start_main = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(start_main)
            return _parse_with(start_main.main, words[1:])
        if words[0] == "distributed/ssh_connector.py":
            from distributed.cli import main
            return _parse_with(main, words[1:])
        if words[0].startswith("benchmarks/"):
            return _parse_with(_benchmark_main(words[0]), words[1:])
        if words[:2] == ["-m", "pytest"]:
            return _check_pytest(words[2:])
        if words[:2] == ["-m", "torch.distributed.launch"]:
            from torch.distributed.launch import get_args_parser
            launch = get_args_parser()
            launch.add_argument("--use-env", "--use_env", action="store_true")  # as its main
            return _check_launcher(launch, words[2:], "torch.distributed.launch", use_env=False)
        if words[0] == "-m":
            return _parse_with(_module_main(words[1]), words[2:])
        if words[0] == "torchrun":
            from torch.distributed.run import get_args_parser
            return _check_launcher(get_args_parser(), words[1:], "torchrun")
    except LookupError as e:
        return str(e)
    return f"not a command the check knows: {command}"


# --- files ------------------------------------------------------------------------------------

_TRACKED_TOP = ("configs", "training", "distributed", "tests", "benchmarks", "docs", ".ci")
_FILE_EXT = ("py", "yaml", "md", "png", "sh", "toml", "cfg", "js", "svg")
_PATH = re.compile(r"(?<![\w./<$~-])((?:\.ci|[A-Za-z_][\w-]*)(?:/[\w.-]+)+/?)(?![\w/<*-])")
_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
_ANCHOR_LINK = re.compile(r"\]\(([^)\s#]*)#([^)\s]+)\)")


def paths_in(text: str) -> list[str]:
    """Repository paths named in code or as link targets: a path under one of the repository's
    own folders with a source extension (`runs/main/...` is made by a run, and folders such as
    `distributed/requests/` may be too: neither is checked)."""
    found = []
    for span in code_spans(text):
        for p in _PATH.findall(span):
            if p.split("/")[0] in _TRACKED_TOP and p.rsplit(".", 1)[-1] in _FILE_EXT:
                found.append(p)
    found += [p for p in _LINK.findall(text) if "://" not in p]
    return found


def anchors_in(text: str) -> list[tuple[str, str]]:
    """(file, anchor) of every link to a heading: `[x](USAGE.md#files-of-a-run)`; file "" for
    a heading of the same page."""
    return _ANCHOR_LINK.findall(text)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces
    to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def check_anchor(path: str, anchor: str, doc: Path) -> str | None:
    target = doc if not path else next(
        (p for p in (REPO / path, doc.parent / path) if p.is_file()), None)
    if target is None:
        return None  # the missing file is check_path's
    headings = re.findall(r"^#+ (.+)$", _FENCE.sub("", target.read_text()), re.M)
    if anchor in {_slug(h) for h in headings}:
        return None
    return f"no heading #{anchor} in {target.relative_to(REPO)}"


def check_path(path: str, doc: Path) -> str | None:
    if (REPO / path).exists() or (doc.parent / path).exists():
        return None
    return f"no such file in the repository: {path}"


# --- config keys ------------------------------------------------------------------------------

_SECTIONS = tuple(f.name for f in dataclasses.fields(Config))
_KEY = re.compile(r"(?<![\w./-])(" + "|".join(_SECTIONS)
                  + r")\.([a-z_]+)((?:\[\d+\])?)((?:\.[a-z_]+)?)(?![\w(/-])")


def keys_in(text: str) -> list[str]:
    """Dotted config keys in code spans (`training.lr`, `distributed.workers[0].gpu_id`);
    a dotted name that is a module of the repository (`training.gtp`,
    `distributed.status.parse_status_text`) is not a key."""
    found = []
    for span in code_spans(text):
        for section, key, index, sub in _KEY.findall(span):
            if ((REPO / section / f"{key}.py").exists() or (REPO / section / key).is_dir()
                    or key in _FILE_EXT):  # a module, or a file name such as go.py
                continue
            found.append(f"{section}.{key}{index}{sub}")
    return found


def check_key(dotted: str) -> str | None:
    m = re.fullmatch(r"(\w+)\.(\w+)(?:\[\d+\])?(?:\.(\w+))?", dotted)
    if not m:
        return f"not a config key: {dotted}"
    section, key, sub = m.groups()
    part = getattr(Config(), section, None)
    if part is None or key not in {f.name for f in dataclasses.fields(part)}:
        return f"{section}.{key} is not a key of configs/schema.py"
    if sub:
        if key not in ("workers", "training_nodes"):
            return f"{dotted}: {section}.{key} has no keys of its own"
        if sub not in {f.name for f in dataclasses.fields(WorkerSpec)}:
            return f"{dotted}: {sub} is not a key of a worker entry (WorkerSpec)"
    return None


def check_yaml(block: str) -> str | None:
    try:
        load_config_text(block, "yaml block")
    except ConfigError as e:
        return str(e)
    return None


# --- docs/DESIGN.md's module table -------------------------------------------------------------

_MODULE_ROOTS = ("configs", "distributed", "training")


def project_modules(repo: Path = REPO) -> list[str]:
    """Every module of the project: the .py files under configs/, distributed/ and training/
    (an `__init__.py` that holds only its docstring is no module of its own), and the two
    entry points at the top."""
    found = ["start_main.py", "start_worker.py"]
    for root in _MODULE_ROOTS:
        for path in sorted((repo / root).rglob("*.py")):
            if path.name == "__init__.py":
                body = ast.parse(path.read_text()).body
                if all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
                       for n in body):
                    continue
            found.append(path.relative_to(repo).as_posix())
    return found


def module_table(design: str) -> str:
    """The code block of docs/DESIGN.md that lists every module with its job."""
    start = design.index("Every module with its job:")
    m = _FENCE.search(design, start)
    assert m is not None, "docs/DESIGN.md: no code block after 'Every module with its job:'"
    return m.group(2)


def missing_from_module_table(design: str, repo: Path = REPO) -> list[str]:
    """The project's modules and benchmarks that docs/DESIGN.md's module table leaves out."""
    table = module_table(design)
    listed = set(re.findall(r"(?m)^ {2}(\S+\.py)(?:\s|$)", table))
    missing = [m for m in project_modules(repo) if m not in listed]
    m = re.search(r"(?ms)^ {2}benchmarks/(.*?)(?=^ {2}\S)", table)
    named = set(re.findall(r"\b(\w+)\b", m.group(1) if m else ""))
    missing += [f"benchmarks/{p.name}" for p in sorted((repo / "benchmarks").glob("*.py"))
                if p.stem not in named]
    return missing


def test_the_design_module_table_lists_every_module():
    missing = missing_from_module_table((REPO / "docs" / "DESIGN.md").read_text())
    assert missing == [], ("docs/DESIGN.md's module table ('Every module with its job') "
                           f"leaves out: {', '.join(missing)}; add each with its job")


# --- the docs ---------------------------------------------------------------------------------

def _problems(doc: Path) -> list[str]:
    text = doc.read_text()
    problems = []
    for command in commands_in(text):
        why = check_command(command)
        if why:
            problems.append(f"{command}\n    {why}")
    for path in paths_in(text):
        why = check_path(path, doc)
        if why:
            problems.append(why)
    for path, anchor in anchors_in(text):
        why = check_anchor(path, anchor, doc)
        if why:
            problems.append(why)
    for key in keys_in(text):
        why = check_key(key)
        if why:
            problems.append(why)
    for lang, block in _FENCE.findall(text):
        if lang == "yaml":
            why = check_yaml(block)
            if why:
                problems.append(why)
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_every_command_path_and_key_in_the_docs_is_real(doc):
    problems = _problems(doc)
    assert problems == [], f"{doc.relative_to(REPO)}:\n" + "\n".join(problems)


def test_the_readme_names_commands_files_and_keys():
    """The check reads something: the README's commands, files and keys are found."""
    text = (REPO / "README.md").read_text()
    commands = commands_in(text)
    assert "python3 start_main.py" in commands
    assert any(c.startswith("python3 -m training.") for c in commands)
    assert any(c.startswith("python3 distributed/ssh_connector.py") for c in commands)
    assert paths_in(text) and keys_in(text)


# --- self-tests: made-up lines fail -----------------------------------------------------------

@pytest.mark.parametrize("line", [
    "python3 start_main.py --hours 2",
    "python3 start_main.py --config configs/tiny.yaml --iterations 2   # a smoke run",
    "python3 -m training.strength [--generations 0,10,20] [--games 40] --endings <dir>",
    "python3 -m training.gtp --model M --seconds-per-move 1",
    "python3 distributed/ssh_connector.py --restart worker1",
    "distributed/ssh_connector.py --status",
    "torchrun --nproc_per_node=8 -m training.trainer --run-dir runs/main",
    "python3 -m training.trainer --world-size 2 --rank 1 --master-addr 10.0.0.1 --backend gloo",
])
def test_real_command_lines_parse(line):
    assert commands_in(f"`{line}`") == [line.split("   #")[0].strip()]
    assert check_command(commands_in(f"`{line}`")[0]) is None


@pytest.mark.parametrize("line, why", [
    ("python3 start_main.py --hourz 2", "unrecognized arguments: --hourz"),
    ("python3 start_main.py --iterations two", "invalid int value"),
    ("python3 -m training.strength --gnugo-levels 1", "unrecognized arguments"),
    ("python3 -m training.nosuchtool --help", "no module training.nosuchtool"),
    ("python3 -m training.gtp --modle M", "unrecognized arguments: --modle"),
    ("python3 distributed/ssh_connector.py --reboot worker1", "one of the arguments"),
    ("torchrun --nproc_per_node=2 -m training.trainer --gpu 2", "unrecognized arguments"),
    ("torchrun --nproc-per-nod=2 -m training.trainer", "torchrun"),
    ("torchrun --nprocs=2 -m training.trainer", "torchrun"),
])
def test_made_up_command_lines_fail(line, why):
    for text in (f"`{line}`", f"```bash\n{line}\n```\n", f"run `make && {line}` then"):
        (command,) = commands_in(text)
        problem = check_command(command)
        assert problem is not None and why in problem, (line, problem)


def test_made_up_paths_fail_and_real_ones_pass():
    doc = REPO / "docs" / "USAGE.md"
    text = ("See `training/fleet/collector.py`, `configs/tiny.yaml`, [a plot](img/load.png), "
            "`runs/main/metrics.csv` (made by a run) and `training/fleet/no_such_module.py`, "
            "`docs/NOPE.md`, [a picture](img/nothing.png).")
    problems = [check_path(p, doc) for p in paths_in(text)]
    assert [p for p in problems if p] == [
        "no such file in the repository: training/fleet/no_such_module.py",
        "no such file in the repository: docs/NOPE.md",
        "no such file in the repository: img/nothing.png",
    ]


def test_a_link_to_a_made_up_heading_fails():
    doc = REPO / "README.md"
    text = ("[flags](docs/USAGE.md#the-coach-start_mainpy), [runs](docs/USAGE.md#files-of-a-run), "
            "[nope](docs/USAGE.md#the-turbo-mode), [here](#two-commands), [there](#nowhere)")
    problems = [why for why in (check_anchor(p, a, doc) for p, a in anchors_in(text)) if why]
    assert problems == ["no heading #the-turbo-mode in docs/USAGE.md",
                        "no heading #nowhere in README.md"]


def test_made_up_config_keys_fail_and_real_ones_pass():
    text = ("`training.lr_schedule`, `distributed.workers[1].gpu_id`, `training.gtp`, "
            "`distributed.status.parse_status_text`, `mcts.simulations`; "
            "`training.learning_rate`, `mcts.simulation`, `distributed.workers[0].gpu`, "
            "`run.dir.name`")
    problems = [why for why in map(check_key, keys_in(text)) if why]
    assert problems == [
        "training.learning_rate is not a key of configs/schema.py",
        "mcts.simulation is not a key of configs/schema.py",
        "distributed.workers[0].gpu: gpu is not a key of a worker entry (WorkerSpec)",
        "run.dir.name: run.dir has no keys of its own",
    ]


def test_a_made_up_key_in_a_yaml_block_fails():
    assert check_yaml("self_play:\n  games_per_worker: 64\n") is None
    assert "self_play.games_per_wroker is not a known key" in check_yaml(
        "self_play:\n  games_per_wroker: 64\n")


def test_a_whole_doc_with_made_up_lines_fails(tmp_path, monkeypatch):
    doc = tmp_path / "BAD.md"
    doc.write_text("```bash\npython3 start_main.py --turbo\n```\n"
                   "The `training.turbo` key, see `training/turbo.py`.\n")
    problems = _problems(doc)
    assert len(problems) == 3, problems


def _copy_docs(tmp_path: Path) -> Path:
    """README.md and docs/*.md copied to tmp_path, docs/img linked: the docs as they are."""
    (tmp_path / "docs").mkdir()
    for doc in DOCS:
        (tmp_path / doc.relative_to(REPO)).write_text(doc.read_text())
    (tmp_path / "docs" / "img").symlink_to(REPO / "docs" / "img")
    return tmp_path


def _plant(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path.name} no longer has {old!r}: choose another line to plant in"
    path.write_text(text.replace(old, new, 1))


def test_planted_errors_in_a_copy_of_the_docs_fail(tmp_path):
    """The docs copied pass; with a benchmark flag that does not exist, a launcher line with a
    bad flag, a pytest flag that does not exist and a module left out of DESIGN.md's table,
    each planted error is found, and nothing else."""
    copy = _copy_docs(tmp_path)
    docs = [copy / d.relative_to(REPO) for d in DOCS]
    assert [p for d in docs for p in _problems(d)] == []
    assert missing_from_module_table((copy / "docs" / "DESIGN.md").read_text()) == []

    _plant(copy / "docs" / "GTP.md", "benchmarks/engine.py --seconds 0.5",
           "benchmarks/engine.py --secs 0.5")
    _plant(copy / "docs" / "USAGE.md", "torch.distributed.launch --nproc_per_node=4",
           "torch.distributed.launch --nprocs-per-node=4")
    _plant(copy / "docs" / "USAGE.md", "python3 -m pytest -m load tests/test_load.py -s",
           "python3 -m pytest -m load tests/test_load.py --shout")
    _plant(copy / "docs" / "PERFORMANCE.md", "benchmarks/train.py --beside-selfplay 2",
           "benchmarks/train.py --beside-self-play 2")
    table = module_table((copy / "docs" / "DESIGN.md").read_text())
    (ledger_line,) = [line for line in table.splitlines()
                      if line.startswith("  training/fleet/ledger.py ")]
    _plant(copy / "docs" / "DESIGN.md", ledger_line + "\n", "")

    problems = {d.name: _problems(d) for d in docs}
    assert [p.splitlines()[1].strip() for p in problems["GTP.md"]] == [
        "engine.py: error: unrecognized arguments: --secs 0.5"]
    usage = [p.splitlines()[1].strip() for p in problems["USAGE.md"]]
    assert len(usage) == 2, usage
    assert usage[0].startswith("torch.distributed.launch: ") and usage[0].endswith(
        "unrecognized arguments: --nprocs-per-node=4"), usage
    assert usage[1].startswith("pytest: ") and usage[1].endswith(
        "unrecognized arguments: --shout"), usage
    assert len(problems["PERFORMANCE.md"]) >= 1 and all(
        "unrecognized arguments: --beside-self-play" in p for p in problems["PERFORMANCE.md"])
    assert [n for n, p in problems.items() if p] == ["GTP.md", "PERFORMANCE.md", "USAGE.md"]
    assert missing_from_module_table((copy / "docs" / "DESIGN.md").read_text()) == [
        "training/fleet/ledger.py"]


@pytest.mark.parametrize("line, why", [
    ("python3 benchmarks/selfplay.py --breakdown configs/gpu.yaml --devise cuda",
     "unrecognized arguments: --devise"),
    ("python3 benchmarks/train.py --steps twenty", "invalid int value"),
    ("python3 benchmarks/nosuch.py --quick", "no benchmark benchmarks/nosuch.py"),
    ("python3 benchmarks/learning.py --board 7", "required: --variant"),
    ("python -m torch.distributed.launch --nproc_per_node=2 -m training.trainer --gpu 2",
     "unrecognized arguments: --gpu"),
    ("python -m torch.distributed.launch --nproc_per_node=2 training/trainer.py",
     "runs no -m module"),
    ("python3 -m pytest -x --qiet", "unrecognized arguments: --qiet"),
])
def test_made_up_benchmark_launcher_and_pytest_lines_fail(line, why):
    (command,) = commands_in(f"```bash\n{line}\n```\n")
    problem = check_command(command)
    assert problem is not None and why in problem, (line, problem)


@pytest.mark.parametrize("line", [
    "python3 benchmarks/engine.py --seconds 0.5 --positions 6",
    "python3 benchmarks/gpu_run.py --deadline 590",
    "python3 benchmarks/learning.py --board 7 --minutes 9 \\\n  --variant a:mcts.algorithm=puct",
    "python -m torch.distributed.launch --nproc_per_node=4 -m training.trainer --run-dir r",
    "AZGO_LOAD_S=60 python -m pytest tests/test_load.py -m load -s -k scale",
])
def test_real_benchmark_launcher_and_pytest_lines_parse(line):
    (command,) = commands_in(f"```bash\n{line}\n```\n")
    assert check_command(command) is None, command
