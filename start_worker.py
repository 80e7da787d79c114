"""Start one self-play worker daemon: flags -> load_config -> Worker(cfg, name, dir).run().

The coach starts it itself (a local subprocess, or `python -m training.worker` over SSH on a
worker host); run it by hand only to try a worker alone:

    python start_worker.py --name worker1 --dir runs/main/workers/worker1

It logs to <log-dir>/worker_<name>.log (default <dir>/logs) and stops cleanly on SIGTERM.
`python start_worker.py --help` lists the flags (`--worker-class module:Class` runs a subclass
of training.worker.Worker).
"""

from __future__ import annotations

import os
import sys

from training.worker import main

if __name__ == "__main__":
    os.umask(0o077)  # run and worker folders, logs and models: the user's alone
    sys.exit(main())
