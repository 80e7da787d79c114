"""A run's files and processes: the run folder, published models, metrics, logs, signals.

- `run_dir`: `RunDir`, the one spelling of the run folder's layout.
- `model_store`: published models (model_<gen>.pt, the shipped .pt.zst, the manifest).
- `metrics`: one row per generation (metrics.json, metrics.csv) and progress.png.
- `logsetup`, `signals`, `run_lock`, `child_process`: the log setup, stop signals, one coach per
  run folder, one stoppable call in a child process.

A bottom room beside `go/`: it imports no other room.
"""
