"""AlphaZero-style Go training: self-play workers, the coach, training rounds and evaluation.

`ls training/` is the floor plan: the commands and the coach at the top, the library in rooms
below them (docs/DESIGN.md, "Layout", says what each holds; tests/test_layers.py checks every
import against this order):

- go/      the game: rules, array boards, features, records, SGF (no torch)
- run/     a run's files and processes: run folder, models, metrics, logs, signals
- search/  tree search and self-play (no torch)
- learn/   the net, the replay window, samples
- train/   the trainer's process: a round, the long-lived trainer, their phases and files
- play/    GTP players, referee, GNU Go series, arena, ratings
- fleet/   worker supervision, local and SSH backends, the collector, load balancing
- top      the coach, its trainer drivers (rounds, long_lived_trainer) and what follows a
           trained generation (generations), branch; and the commands: trainer, worker,
           simworker, serve, search_processes, gtp, analysis, strength, sandbox

A room imports only from the rooms below it (go and run at the bottom; search on go; learn on
go and run; train on go, run and learn; play on go, run, search and learn; fleet on go, run,
learn, train and `distributed/`); the top imports any room. `distributed/` never imports this
package.

It must not: import anything itself (importing a submodule stays as cheap as that submodule).
"""
