"""The 3-node RabbitMQ cluster of ``.ci/rabbitmq-cluster.sh``, driven from Python.

Node ``n`` (1..3) is ``prn@localhost`` with AMQP on ``127.0.0.1:568n``. Everything here
waits on the broker's own readiness signals (``rabbitmqctl`` answers, ``cluster_status``,
a queue's online members), each bounded by a timeout; nothing sleeps a fixed time.

A partition is made with Erlang cookies (:meth:`Nodes.partition`): the cut-off node gets
a wrong cookie for each of its peers and drops its links to them. Every distribution
connection between it and the others is then refused during the handshake, in both
directions, until :meth:`Nodes.heal` restores the cookies: to the cluster it is exactly
a node behind a broken network. The machine's nodes all share the loopback interface
(and there is no ``iptables`` here), so dropping packets by port could not tell one
node's outgoing links from another's; freezing the VM (SIGSTOP) would test a hung node,
not a partition. The cut-off node itself keeps running and sees a minority, so
``pause_minority`` (set by the script) pauses it: it closes its client connections and
the clients fail over to the majority, which keeps the quorum queues available.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tests.processes import alive

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "rabbitmq-cluster.sh"
NODES = (1, 2, 3)


def name(n: int) -> str:
    """Erlang node name of node ``n``."""
    return f"pr{n}@localhost"


def wait_for(predicate: Callable[[], Any], timeout: float, what: str,
             poll: float = 0.5) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned) or fail."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)


class Nodes:
    """Start, stop, inspect, kill and partition the nodes of the test cluster."""

    def script(self, *args: str, timeout: float = 300.0) -> str:
        """Run ``.ci/rabbitmq-cluster.sh ARGS``; its stdout (raises on failure)."""
        done = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True,
                              timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmq-cluster.sh {' '.join(args)} failed "
                               f"({done.returncode}): {done.stderr.strip()[-2000:]}")
        return done.stdout

    def start(self) -> None:
        """Start missing nodes and join them (idempotent; restarts a killed node)."""
        self.script("start")

    def stop(self) -> None:
        """Stop every node and delete the cluster's data."""
        self.script("stop", timeout=120.0)

    @property
    def url(self) -> str:
        """The broker URL that lists all three nodes."""
        return self.script("url").strip()

    @staticmethod
    def node_url(n: int) -> str:
        """URL of node ``n`` alone."""
        return f"amqp://guest:guest@127.0.0.1:{5680 + n}/"

    def ctl(self, n: int, *args: str, timeout: float = 30.0) -> str | None:
        """``rabbitmqctl -n prN ARGS``; stdout, or ``None`` if it failed or timed out."""
        try:
            return self.script("ctl", str(n), "-q", *args, timeout=timeout)
        except (RuntimeError, subprocess.TimeoutExpired):
            return None

    def eval(self, n: int, expr: str) -> str | None:
        """Evaluate an Erlang expression on node ``n``."""
        return self.ctl(n, "eval", expr)

    # ------------------------------------------------------------ state

    def booted(self, n: int) -> bool:
        """Node ``n`` runs the RabbitMQ app (not stopped, not paused)."""
        out = self.eval(n, "rabbit:is_running().")
        return out is not None and out.strip() == "true"

    def running_nodes(self, seen_from: Iterable[int] = NODES) -> set[str]:
        """Running cluster members as the first booted node of ``seen_from`` sees them."""
        for n in seen_from:
            out = self.ctl(n, "cluster_status", "--formatter", "json")
            if out:
                with contextlib.suppress(ValueError):
                    return set(json.loads(out).get("running_nodes", []))
        return set()

    def queue(self, queue: str, seen_from: Iterable[int] = NODES) -> dict[str, Any]:
        """``leader``, ``members`` and ``online`` of quorum queue ``queue``."""
        for n in seen_from:
            out = self.ctl(n, "list_queues", "name", "leader", "members", "online",
                           "--formatter", "json")
            if not out:
                continue
            with contextlib.suppress(ValueError):
                for row in json.loads(out):
                    if row.get("name") == queue:
                        return dict(row)
        return {}

    def leader(self, queue: str) -> int:
        """The node that leads quorum queue ``queue``."""
        leader = wait_for(lambda: self.queue(queue).get("leader"), 60, f"a leader of {queue}")
        return int(str(leader).removeprefix("pr").split("@")[0])

    def online(self, queue: str, seen_from: Iterable[int] = NODES) -> set[str]:
        """Members of quorum queue ``queue`` that are online (its nodes run and see it)."""
        return set(self.queue(queue, seen_from).get("online") or [])

    def healthy(self, queues: Iterable[str]) -> bool:
        """Every queue has three members, all online (so all three nodes run, joined)."""
        wanted = {name(n) for n in NODES}
        rows = {}
        out = next((o for o in (self.ctl(n, "list_queues", "name", "members", "online",
                                         "--formatter", "json") for n in NODES) if o), "")
        with contextlib.suppress(ValueError):
            rows = {row.get("name"): row for row in json.loads(out or "[]")}
        return all(set(rows.get(q, {}).get("members") or []) == wanted
                   and set(rows.get(q, {}).get("online") or []) == wanted for q in queues)

    def wait_healthy(self, queues: Iterable[str], timeout: float = 180.0) -> None:
        """Wait until :meth:`healthy`."""
        names = list(queues)
        wait_for(lambda: self.healthy(names), timeout,
                 f"3 running nodes and 3 online members of {names}", poll=1.0)

    # ------------------------------------------------------------ faults

    def pid(self, n: int) -> int:
        """OS pid of node ``n``'s Erlang VM."""
        return int(self.script("pid", str(n)).strip())

    def kill(self, n: int, queue: str) -> float:
        """SIGKILL node ``n``'s VM and wait until ``queue`` counts it offline; the time
        (``time.time()``) of the kill."""
        pid = self.pid(n)
        os.kill(pid, signal.SIGKILL)
        killed_at = time.time()
        wait_for(lambda: not alive(pid), 30, f"pid {pid} of {name(n)} to exit")
        peers = [m for m in NODES if m != n]
        wait_for(lambda: name(n) not in self.online(queue, peers), 60,
                 f"{queue} to see {name(n)} offline")
        return killed_at

    def partition(self, n: int, queue: str) -> float:
        """Cut node ``n`` off from its peers (see the module doc) and wait until the
        majority counts it offline in ``queue`` and it paused itself; the time
        (``time.time()``) of the cut."""
        peers = [m for m in NODES if m != n]
        names = ", ".join(f"'{name(m)}'" for m in peers)
        out = self.eval(n, f"[begin erlang:set_cookie(P, podracer_partitioned), "
                           f"erlang:disconnect_node(P) end || P <- [{names}]], ok.")
        assert out is not None and "ok" in out, f"could not partition {name(n)}: {out!r}"
        cut_at = time.time()
        wait_for(lambda: name(n) not in self.online(queue, peers), 60,
                 f"the majority to count {name(n)} offline in {queue}")
        wait_for(lambda: not self.booted(n), 90, f"{name(n)} to pause (pause_minority)")
        return cut_at

    def heal(self, n: int) -> None:
        """Give node ``n`` its peers' cookie back and reconnect it."""
        peers = [m for m in NODES if m != n]
        names = ", ".join(f"'{name(m)}'" for m in peers)
        out = self.eval(n, f"[begin erlang:set_cookie(P, erlang:get_cookie()), "
                           f"net_adm:ping(P) end || P <- [{names}]], ok.")
        assert out is not None and "ok" in out, f"could not heal {name(n)}: {out!r}"

    def connected_peers(self, n: int) -> set[str]:
        """Nodes that node ``n`` has a distribution link to (CLI nodes excluded)."""
        out = self.eval(n, "nodes().") or ""
        return {name(m) for m in NODES if name(m) in out}


def delete_experiment(url: str, experiment: str) -> None:
    """Delete the queues and exchanges of ``experiment`` through the node at ``url``."""
    from broker.runtime.lifecycle import BrokerAdmin

    with BrokerAdmin(url, experiment) as admin:
        admin.delete_all()
