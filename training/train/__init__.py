"""Training: the trainer's process, a round or the long-lived trainer, and its file contracts.

- `round`: one training round in its phases (`train_round`), what `python -m training.trainer`
  runs.
- `phases`, `steps`: the phases of training (plan, start the net, restore, run steps, finish)
  over one `Session`, and what one optimizer step is.
- `ddp`, `node_relay`, `train_state`: the process group, training nodes without shared files
  (and the one place the replay window is built from the config), checkpoints and the LR
  schedule.
- `continuous`, `admissions`: the long-lived trainer, the admission log it reads and the
  trainer.json it writes.
- `round_result`, `command`: what a round reports to the coach, and the trainer's command
  line, spelled once for everyone who starts one.

Builds on `learn/` (the net, the replay window, samples), `go/` and `run/`; the coach's side
(`training.rounds`, `training.long_lived_trainer`, `training.generations`) imports only
`admissions`, `round_result`, `command` and `train_state` from here, none of them at its
module level with torch.
"""
