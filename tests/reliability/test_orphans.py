"""A service whose parent dies with SIGKILL stops by itself (``PODRACER_PARENT_PID``).

The orchestrator's local pods lead their own sessions, so killing ``podracer train``'s
process group does not reach them; before this, they went on consuming the experiment's
queues with nobody to stop them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

SERVICE = textwrap.dedent("""
    import sys
    from pathlib import Path
    from broker.runtime.service import run_service

    marks = Path(sys.argv[1])

    async def main(ctx):
        marks.write_text("ready\\n")
        await ctx.stopping.wait()
        marks.write_text("ready\\nstopped\\n")
        return 0

    sys.exit(run_service(main, None, name="orphan-probe"))
""")

PARENT = textwrap.dedent("""
    import os, subprocess, sys, time
    env = {**os.environ, "PODRACER_PARENT_PID": str(os.getpid())}
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], env=env,
                             start_new_session=True)
    print(child.pid, flush=True)
    time.sleep(600)
""")


def wait_for(path: Path, text: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return True
        time.sleep(0.05)  # polling a file the child writes, with a deadline
    return False


def test_a_service_stops_when_its_parent_is_killed(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, SERVICE, str(marks)],
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    assert parent.stdout is not None
    child_pid = int(parent.stdout.readline())
    try:
        assert wait_for(marks, "ready", 30), "the service never started"
        assert "stopped" not in marks.read_text()  # alive while its parent lives
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        assert wait_for(marks, "stopped", 15), "the orphaned service kept running"
    finally:
        parent.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(child_pid, signal.SIGKILL)
