"""The worker daemon's model loading: newer models found, verified, built and swapped in.

`ModelLoading` is a base class of `training.worker.Worker` and holds its "models" methods; the
fields they read and write (`models_dir`, `cache_dir`, `generation`, `_selfplay`, the locks
and events) are set by `Worker.__init__`, and they call the daemon's `load_evaluator`,
`make_selfplay`, `_report_error` and `_write_heartbeat`.

The first model is loaded while the games wait (`_sync`); each newer one loads in a thread
(the "model-loader", `_start_loader`) while the games go on: a watchdog observer of the model
folder wakes it (`_watch_models`), a slow rescan backs it up (`POLL_MODELS_S`). A model is
verified against its manifest (size, sha256) and unpacked into cache/ (`_unpack`), built and
checked (`_build`), then offered to the games, which take it in at their next network call
(`_note_switch` does the bookkeeping, `_in_use` announces it and drops older cached models).
A model that fails any of these is refused (remembered by generation, sha256 and size) and
reported; the daemon keeps the model it has.

It must not: write batches, take the folder lock, or talk to any network.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable

from distributed.status import WorkerState
from training.run import model_store
from training.run.model_store import Manifest, ModelStoreError

log = logging.getLogger(__name__)

# how often the model folder is re-scanned even without a watchdog event (a missed inotify
# event, or a file system without it, must not leave a worker on an old model forever)
POLL_MODELS_S = 30.0


class ModelLoading:
    """The model methods of the worker daemon (`training.worker.Worker`)."""

    def _watch_models(self) -> Any:
        """An observer of models/ for manifests (None: the slow poll finds new models)."""
        from training.run.watch import watch

        return watch(self.models_dir, lambda p: p.endswith(".json"), self._models_changed)

    def _wait_for_models(self) -> None:
        """No usable model yet: wait for the model folder to change (or a short poll)."""
        self._models_changed.wait(timeout=min(5.0, self.cfg.distributed.heartbeat_interval_s))

    def _newer_manifest(self) -> Manifest | None:
        """The newest manifest when it is newer than the model in use and not refused."""
        self._models_changed.clear()
        try:
            manifest = model_store.newest_manifest(self.models_dir)
        except ModelStoreError as e:
            self._report_error(str(e))
            return None
        if manifest is None or manifest.generation <= self.generation:
            return None
        if self._refused.get(manifest.generation) == (manifest.sha256, manifest.size):
            return None
        return manifest

    def _load_timed(self, manifest: Manifest) -> tuple[Callable, int, dict] | None:
        """Unpack and build `manifest`'s model: (evaluate, generation, phase seconds), or None
        when it is refused (reported: state Error, the reason in the heartbeat)."""
        t0 = time.perf_counter()
        try:
            dest = self._unpack(manifest)
            t1 = time.perf_counter()
            evaluate, generation = self._build(manifest, dest)
        except (ModelStoreError, OSError, ValueError, RuntimeError) as e:
            # Error until a good model arrives; self-play goes on with the model we have
            self._refused[manifest.generation] = (manifest.sha256, manifest.size)
            if self._selfplay is not None:
                log.error("keeping model generation %d", self.generation)
            self._report_error(f"model generation {manifest.generation} refused: {e}")
            return None
        t2 = time.perf_counter()
        return evaluate, generation, {"unpack_s": t1 - t0, "build_s": t2 - t1}

    def _sync(self) -> bool:
        """Load the newest valid model if it is newer than ours, the games waiting (the first
        model; later ones load in the background, `_start_loader`); True when one is in use."""
        manifest = self._newer_manifest()
        if manifest is None:
            return self._selfplay is not None
        with self._lock:
            self.state = WorkerState.SYNCING
        self._write_heartbeat()
        loaded = self._load_timed(manifest)
        if loaded is None:
            return self._selfplay is not None
        evaluate, generation, phases = loaded
        if self._selfplay is None:
            self._selfplay = self.make_selfplay(evaluate, generation)
        else:
            self._selfplay.set_evaluator(evaluate, generation)
        with self._lock:
            self._offered_at[generation] = time.monotonic()
            self._switch = {"generation": generation, **phases}
        self._in_use(generation)
        return True

    def _start_loader(self) -> None:
        """Load each newer model in a thread while self-play goes on (KataGo's self-play
        swaps nets the same way), then offer it to the games: it goes in at their next
        network call (`SelfPlay.offer_evaluator`). Woken by the model folder's watcher (and
        the main loop's slow rescan); ends with the daemon."""
        def loop() -> None:
            while not self._stop.is_set():
                self._models_changed.wait(timeout=POLL_MODELS_S)
                if self._stop.is_set():
                    return
                try:
                    load_newer()
                except Exception as e:  # noqa: BLE001 - the loader must outlive any one model
                    log.exception("model loader")
                    self._report_error(f"model loader: {type(e).__name__}: {e}")
                    self._stop.wait(1.0)

        def load_newer() -> None:
            manifest = self._newer_manifest()
            if manifest is None or manifest.generation in self._offered_at:
                return
            loaded = self._load_timed(manifest)
            if loaded is not None and not self._stop.is_set():
                evaluate, generation, phases = loaded
                with self._lock:
                    self._offered_at[generation] = time.monotonic()
                    self._switch = {"generation": generation, **phases}
                    offer = getattr(self._selfplay, "offer_evaluator", None)
                    if offer is None:  # a custom engine: swapped after its step
                        self._ready = (evaluate, generation)
                if offer is not None:
                    offer(evaluate, generation)

        self._loader = threading.Thread(target=loop, name="model-loader", daemon=True)
        self._loader.start()

    def _note_switch(self) -> None:
        """Between steps: the bookkeeping of a model that went in during the last one, and
        a model that is ready goes in now (also for an engine without `offer_evaluator`)."""
        with self._lock:
            ready, self._ready = self._ready, None
        take = getattr(self._selfplay, "take_offered", None)
        if ready is not None:
            self._selfplay.set_evaluator(*ready)
            generation = ready[1]
        else:
            if take is not None:
                take()
            generation = int(getattr(self._selfplay, "generation", self.generation))
        if generation > self.generation:
            with self._lock:
                ready_at = self._offered_at.get(generation)
                if ready_at is not None:  # at most this long: the rest of one step
                    self._switch["waited_s"] = time.monotonic() - ready_at
            self._in_use(generation)

    def _in_use(self, generation: int) -> None:
        """Generation `generation` plays now: heartbeat, log, the cache's older models go."""
        with self._lock:
            self.generation = generation
            self.state = WorkerState.ACTIVE
            if self.last_error.startswith("model"):
                self.last_error = ""
            for g in [g for g in self._offered_at if g < generation]:
                del self._offered_at[g]
            phases = " ".join(f"{k}={v:.2f}s" for k, v in self._switch.items()
                              if k.endswith("_s"))
        log.info("model generation %d in use (%s)", generation, phases)
        self._write_heartbeat()
        for old in self.cache_dir.glob("model_*.pt"):  # older ones only: the loader may be
            digits = old.stem.removeprefix("model_")    # reading a newer one
            if digits.isdigit() and int(digits) < generation:
                old.unlink(missing_ok=True)

    def _unpack(self, manifest: Manifest) -> Path:
        """Verify (size, sha256) and decompress into cache/."""
        dest = self.cache_dir / f"{manifest.stem}.pt"
        model_store.unpack_model(self.models_dir, manifest, dest)
        return dest

    def _build(self, manifest: Manifest, dest: Path) -> tuple[Callable, int]:
        """The evaluator of the unpacked model `dest` (`load_evaluator`), checked against
        its manifest."""
        try:
            evaluate, generation = self.load_evaluator(dest)
        except Exception as e:  # noqa: BLE001 - any load failure means: refuse this model
            dest.unlink(missing_ok=True)
            raise ModelStoreError(f"{dest}: does not load: {type(e).__name__}: {e}") from e
        if generation != manifest.generation:
            raise ModelStoreError(
                f"{dest}: holds generation {generation}, its manifest says {manifest.generation}"
            )
        return evaluate, generation
