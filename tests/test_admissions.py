"""The admission log under a write that comes up short: a real file-size limit
(RLIMIT_FSIZE) in a child process makes the kernel write part of a line, as a full disk does."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from training.go.records import batch_name
from training.train.admissions import AdmissionLog, AdmissionReader

_CHILD = textwrap.dedent("""
    import resource, signal, sys
    from training.train.admissions import AdmissionLog

    path, names = sys.argv[1], sys.argv[2:]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit returns short
    log = AdmissionLog(path)
    log.admit(names[0], 10)
    size = len(open(path, "rb").read())
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 20, hard))  # the next line is cut
    try:
        log.admit(names[1], 20)
        print("admitted past the limit")
    except OSError as e:
        print("refused:", e)
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # space again
    log.admit(names[2], 30)
""")


def test_a_short_write_leaves_no_torn_line_and_the_log_goes_on(tmp_path):
    path = tmp_path / "admitted.jsonl"
    names = [batch_name("worker1", 0, i) for i in range(3)]
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path), *names], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "refused:" in out.stdout and "only" in out.stdout, out.stdout
    read = AdmissionReader(path).poll()  # the trainer's side reads every line
    assert [(a.seq, a.name, a.positions) for a in read] == [(1, names[0], 10),
                                                            (2, names[2], 30)]
    log = AdmissionLog(path)  # and the coach's side after a restart
    assert log.seq == 2 and log.names == {names[0], names[2]}
    assert names[1] not in log.names  # not admitted: the coach admits it on a later pass
