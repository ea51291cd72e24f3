"""Whether a process the test started is still running."""

from __future__ import annotations

from pathlib import Path


def alive(pid: int) -> bool:
    """Running: an exited process nobody has reaped yet (a zombie) counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"
