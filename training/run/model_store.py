"""Published models on disk: `model_<gen:06d>.pt`, its shipped `.pt.zst` and its manifest.

Vocabulary:
  - generation: 0 for the random net the coach publishes first, +1 per training round.
  - published model: `models/model_000013.pt.zst` (zstd of the `torch.save` file written by
    `net.save_model`) plus `models/model_000013.json`, the manifest:
    `{"generation": 13, "sha256": <of the .pt.zst>, "size": <bytes of the .pt.zst>,
    "created": <unix time>}`. The manifest is written LAST, so a folder never shows a
    manifest whose model is missing; readers look only at manifests.
  - unpack: verify size and sha256 of the `.pt.zst` against the manifest, then decompress.

The coach publishes (`publish_model`) and copies to local workers (`copy_published`); the
worker finds the newest manifest (`newest_manifest`) and unpacks it (`unpack_model`).

It must not: import torch (the `.pt` is an opaque file here) or open SSH connections.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

from distributed.transfer import (
    TransferError,
    compress_file,
    decompress_file,
    sha256_file,
    write_json_atomic,
)

_MANIFEST_RE = re.compile(r"^model_(\d{6,})\.json$")
_MODEL_RE = re.compile(r"^model_(\d{6,})\.pt$")
# a 19x19 40-block net is ~400 MB; anything past this is a corrupt or hostile file
MAX_MODEL_BYTES = 4 << 30


class ModelStoreError(Exception):
    """A published model is missing, truncated, or does not match its manifest."""


@dataclass(frozen=True)
class Manifest:
    generation: int
    sha256: str
    size: int
    created: float

    @property
    def stem(self) -> str:
        return model_stem(self.generation)

    @property
    def zst_name(self) -> str:
        return f"{self.stem}.pt.zst"

    @property
    def json_name(self) -> str:
        return f"{self.stem}.json"


def model_stem(generation: int) -> str:
    """`model_000013` for generation 13."""
    return f"model_{generation:06d}"


def read_manifest(path: str | os.PathLike) -> Manifest:
    """Read one manifest file; ModelStoreError names the file and what is wrong."""
    path = Path(path)
    try:
        d = json.loads(path.read_text())
        m = Manifest(int(d["generation"]), str(d["sha256"]), int(d["size"]),
                     float(d.get("created", 0.0)))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelStoreError(f"{path}: unreadable model manifest ({type(e).__name__}: {e})")
    if path.name != m.json_name:
        raise ModelStoreError(f"{path}: manifest says generation {m.generation}")
    return m


def _generations(folder: str | os.PathLike, pattern: re.Pattern) -> list[int]:
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for m in map(pattern.match, os.listdir(folder)) if m)


WORKER_MODELS_KEPT = 2
"""Published models a worker's models/ folder keeps: the newest and the one before (a daemon
still loading the older one never finds it gone)."""


def manifest_generations(names: Iterable[str]) -> list[int]:
    """The generations whose manifests are among the file `names`, ascending."""
    return sorted(int(m.group(1)) for m in map(_MANIFEST_RE.match, names) if m)


def stale_generations(generations: Iterable[int], keep: int = WORKER_MODELS_KEPT) -> list[int]:
    """The published generations a worker's models/ folder drops: all but the newest `keep`
    (the one rule for local and SSH workers)."""
    ordered = sorted(set(generations))
    return ordered[:-keep] if keep > 0 else ordered


def stale_files(generation: int) -> tuple[str, str]:
    """A dropped generation's files, manifest first (a manifest never names a missing file)."""
    stem = model_stem(generation)
    return f"{stem}.json", f"{stem}.pt.zst"


def list_manifests(folder: str | os.PathLike) -> list[int]:
    """Generations that have a manifest in `folder`, ascending (temporary names skipped)."""
    return _generations(folder, _MANIFEST_RE)


def list_models(folder: str | os.PathLike) -> list[int]:
    """Generations that have a model file `model_<gen>.pt` in `folder`, ascending (published
    or not; temporary names skipped)."""
    return _generations(folder, _MODEL_RE)


def newest_manifest(folder: str | os.PathLike) -> Manifest | None:
    """The manifest of the highest generation in `folder`, or None."""
    gens = list_manifests(folder)
    if not gens:
        return None
    return read_manifest(Path(folder) / f"{model_stem(gens[-1])}.json")


def publish_model(models_dir: str | os.PathLike, generation: int, level: int = 3) -> Manifest:
    """Compress `models/model_<gen>.pt` to `.pt.zst` and write its manifest (last)."""
    models_dir = Path(models_dir)
    pt = models_dir / f"{model_stem(generation)}.pt"
    if not pt.is_file():
        raise ModelStoreError(f"{pt}: no model file to publish")
    zst = models_dir / f"{model_stem(generation)}.pt.zst"
    size = compress_file(pt, zst, level=level)
    manifest = Manifest(generation, sha256_file(zst), size, time.time())
    write_json_atomic(models_dir / manifest.json_name, asdict(manifest))
    return manifest


def verify_model(folder: str | os.PathLike, manifest: Manifest) -> Path:
    """Check the `.pt.zst` beside a manifest; returns its path or raises ModelStoreError."""
    zst = Path(folder) / manifest.zst_name
    try:
        size = zst.stat().st_size
    except OSError as e:
        raise ModelStoreError(f"{zst}: missing ({e.strerror})") from e
    if size != manifest.size:
        raise ModelStoreError(f"{zst}: {size} bytes, the manifest says {manifest.size}")
    digest = sha256_file(zst)
    if digest != manifest.sha256:
        raise ModelStoreError(
            f"{zst}: sha256 {digest[:12]}.. differs from the manifest's {manifest.sha256[:12]}.."
        )
    return zst


def unpack_model(folder: str | os.PathLike, manifest: Manifest, dest: str | os.PathLike) -> Path:
    """Verify a published model and decompress it to `dest` (atomically)."""
    zst = verify_model(folder, manifest)
    try:
        decompress_file(zst, dest, MAX_MODEL_BYTES)
    except TransferError as e:
        raise ModelStoreError(f"{zst}: cannot decompress: {e}") from e
    return Path(dest)


def copy_published(src_dir: str | os.PathLike, manifest: Manifest,
                   dst_dir: str | os.PathLike) -> int:
    """Copy a published model into a local worker's models/ folder; returns bytes copied.

    The `.pt.zst` goes first (temporary name, rename), the manifest last, so the worker's
    watcher never sees a manifest without its model.
    """
    src_dir, dst_dir = Path(src_dir), Path(dst_dir)
    dst_dir.mkdir(parents=True, exist_ok=True)
    target = dst_dir / manifest.zst_name
    tmp = dst_dir / f".{manifest.zst_name}.{os.getpid()}.tmp"
    try:
        shutil.copyfile(src_dir / manifest.zst_name, tmp)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    write_json_atomic(dst_dir / manifest.json_name, asdict(manifest))
    return manifest.size


def prune_models(folder: str | os.PathLike, keep: int = WORKER_MODELS_KEPT) -> None:
    """Delete the `stale_generations` of a local worker's models/ folder."""
    folder = Path(folder)
    for gen in stale_generations(list_manifests(folder), keep):
        for name in stale_files(gen):
            (folder / name).unlink(missing_ok=True)
