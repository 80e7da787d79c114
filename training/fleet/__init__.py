"""The workers: supervising them, their two backends, collecting their games, balancing.

- `fleet`: `Fleet`, `Member`, `Backend`: one supervisor thread per worker, with deadlines.
- `local_workers`, `ssh_workers`: a worker daemon as a local subprocess, or on an SSH host.
- `collector`: exactly-once ingest of worker batches into the run's replay folder.
- `remote_training`: the trainer's extra ranks on SSH hosts.
- `placement`, `balance`: where local workers run; each worker's share of a generation.

The daemon itself is `training.worker` (a command and the documented base class). Builds on
`go/`, `run/`, `learn/` and `distributed/`.
"""
