"""Learning: the net, the replay window, and what one training round is made of.

- `net`: `PolicyValueNet`, model files, batched evaluators.
- `replay_buffer`: the window over ingested game batches as training samples.
- `samples`, `ddp`, `node_relay`, `train_state`, `round_result`, `training_error`: samples as
  tensors, the process group, training nodes without shared files, checkpoints and the LR
  schedule, what a round reports, the one error of a round.

The round itself is `training.trainer` (a command). Builds on `go/` and `run/`.
"""
