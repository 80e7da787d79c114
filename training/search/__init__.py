"""The tree search and self-play: many games searched at once, one network call per step.

- `mcts`: batched PUCT or Gumbel MuZero search over preallocated arrays.
- `selfplay`: `SelfPlay`, whole games with playout caps, resignation and training targets.

The net comes in as an `evaluate` callable: no torch here. Builds on `go/`.
"""
