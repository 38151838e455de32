"""Kill points for the kill battery (tests/workflow/test_kill_battery.py), loaded only through PYTHONPATH.

RFFM_KILL_AT="<file name>:<before|after>[:<n>]" makes an `rffm` process SIGKILL its whole process group
(the Snakemake run that started it, when that run is a session of its own) right before or right after
the n-th (default first) rename or link that puts a file of that name in place: "before" leaves the
temporary file of a finished write behind, "after" leaves the file and nothing after it.
"""

import os
import signal
import sys
from pathlib import Path

_spec = os.environ.get("RFFM_KILL_AT", "")
if _spec and Path(sys.argv[0]).name == "rffm":
    _name, _when, *_nth = _spec.split(":")
    _left = [int(_nth[0]) if _nth else 1]

    def _kill() -> None:
        Path(os.environ["RFFM_KILL_MARK"]).write_text(_spec)  # the test knows the point was reached
        os.killpg(os.getpgrp(), signal.SIGKILL)

    def _wrap(function):
        def wrapped(source, destination, *args, **kwargs):
            hit = Path(os.fsdecode(destination)).name == _name
            if hit and _when == "before" and _left[0] == 1:
                _kill()
            result = function(source, destination, *args, **kwargs)  # a failed attempt (then retried) does not count
            if hit:
                _left[0] -= 1
                if _left[0] == 0 and _when == "after":
                    _kill()
            return result

        return wrapped

    os.replace, os.rename, os.link = _wrap(os.replace), _wrap(os.rename), _wrap(os.link)
