"""AlphaZero-style Go training: self-play workers, the coach, training rounds and evaluation.

The modules sit in layers (docs/DESIGN.md, "Layout", lists each with its job; the table in
tests/test_layers.py is checked against every import):

- base: coords, go, records, sgf, model_store, run_dir, round_result, metrics, elo, rating,
  placement, balance, logsetup, signals, run_lock, child_process, training_error
- engine: fastgo, features, net, mcts, selfplay, players, gtp_client, referee, gnugo, gtp,
  arena
- pipeline: replay_buffer, samples, ddp, node_relay, train_state, trainer, worker, simworker,
  collector, fleet, local_workers, ssh_workers, remote_training
- top: coach, rounds, strength, sandbox

A module imports only from its own layer and the lower layers its row names there (engine
builds on base alone; pipeline and top on everything below them). `distributed/` (the hosts
layer, with `distributed.transfer` in base) never imports this package.

It must not: import anything itself (importing a submodule stays as cheap as that submodule).
"""
