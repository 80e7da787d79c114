"""Learning: the net, the replay window, and what one training round is made of.

- `net`: `PolicyValueNet`, model files, batched evaluators.
- `replay_buffer`: the window over ingested game batches as training samples.
- `samples`, `ddp`, `node_relay`, `train_state`, `round_result`, `training_error`: samples as
  tensors, the process group, training nodes without shared files, checkpoints and the LR
  schedule, what a round reports, the one error of a round.
- `steps`, `phases`: what one optimizer step is, and the phases of training (plan, start the
  net, restore, run steps, finish).
- `admissions`, `continuous`: the admission log, and the long-lived trainer that reads it.

The round itself is `training.trainer` (a command). Builds on `go/` and `run/`.
"""
