"""The game: Go's rules, the board as arrays, input features, game records and SGF.

- `coords`: the vocabulary (BLACK, WHITE, EMPTY, flat indices, PASS, GTP text).
- `rules`: the readable reference rules (`Position`, `IllegalMove`): the rules of record.
- `fastgo`: the same rules over flat arrays in numba, for many games at once (the hot path).
- `features`: the net's input planes and the 8 symmetries.
- `endgame`: the judge's view of a finished board (dead stones, the score without them).
- `records`: a game as a `GameRecord`, game batch files, their names and their validation.
- `sgf`: games as SGF text and back.

The room at the bottom: it imports no other room, no torch and no paramiko.
"""
