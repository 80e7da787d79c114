"""Playing against others: GTP players, the referee, GNU Go series, the arena, ratings.

- `players`: `MctsPlayer` and `NetPlayer`, the GTP engine's search players.
- `gtp_client`, `referee`, `gnugo`: GTP engines as subprocesses, refereed games, judged series
  against GNU Go.
- `arena`: generation against generation (gating, Elo) and the coach's GNU Go games.
- `elo`, `rating`: Elo with intervals, SPRT, Wilson intervals, the anchored pool rating.

The commands on top of it are `training.gtp` and `training.strength`. Builds on `go/`, `run/`,
`search/` and `learn/`.
"""
