"""The one error of a training round, raised by the trainer and the modules it is made of.

`TrainingError` is a round that cannot start or finish for a reason the user can fix: no data,
a bad checkpoint, a bad option, a training node that sent something unreadable. The trainer's
command line turns it into one log line and exit code 1. It lives apart so that the sample
arrays, the process group, the relay and the checkpoints raise the same error without
importing the round.

It must not: import anything, or hold any other error (bugs are asserts, torch's own errors
stay torch's).
"""


class TrainingError(Exception):
    """A round that cannot start or finish: no data, a bad checkpoint, a bad option."""
