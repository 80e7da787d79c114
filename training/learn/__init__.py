"""Learning's model room: the net, the replay window and samples, which the workers, the arena
and the trainer stand on.

- `net`: `PolicyValueNet`, model files, batched evaluators.
- `replay_buffer`: the window over ingested game batches as training samples.
- `samples`: samples as tensors and arrays; `training_error`: the one error of training,
  raised here and in `training.train`.

The trainer's process (a round, the long-lived trainer) is `training.train`. Builds on `go/`
and `run/`.
"""
