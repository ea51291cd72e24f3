"""How far does one updater + one generator scale? Stand-in pods at 16, 64 and 256.

Against the local RabbitMQ, the real ``podracer serve updater`` and ``podracer serve
generator`` processes serve *stand-in pods*: asyncio tasks (spread over ``--workers``
processes) that take an ``Initialization`` (prefetch 1), sleep ``--round`` seconds
instead of training, publish a ``Checkpoint`` whose state is a real PPO state (hidden
size chosen so the payload is about ``--mib`` MiB) filled with fresh random float32
values, then ack. Pods start staggered over one round, as real pods drift apart.

Figures per pod count, over ``--duration`` seconds of steady state:

* updater throughput: checkpoints stored per second (and the offered rate);
* checkpoint -> leaderboard latency p50/p99: ``stored - created`` of every store row
  (``created`` is stamped when the stand-in builds the checkpoint, just before publish);
  ``p99 warm`` leaves out the first ``WARMUP_S`` seconds (the updater's warm-up), ``p99 pub``
  is the pod's own leg (build, encode, publish until the broker's confirm);
* generator starvation: share of pod time spent waiting for an initialization, after
  each pod's first one (the very first fill of the queue is start-up, reported apart);
* broker memory: peak ``mem_used`` of ``/api/nodes`` (management plugin);
* CPU by role (updater, generator, stand-ins, RabbitMQ's ``beam.smp``) over the run, in
  cores busy and in ms per stored checkpoint: where the machine's time goes.

Targets (256 pods, 4 MiB, 30 s rounds): p99 < 1 s, starvation < 1%.

    python -m benchmarks.scale                       # 16, 64, 256 pods, 4 MiB, 30 s rounds
    python -m benchmarks.scale --pods 16 --duration 30 --round 10   # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import psutil
import torch

from agents.build import build_agent, resolve_config
from agents.registry import default_registry
from broker.core.blobstore import FileBlobStore
from broker.core.errors import BrokerError
from broker.core.experiment import Experiment
from broker.core.schemas import Checkpoint, Initialization, Stop
from broker.core.settings import (
    configure_logging,
    default_experiment,
    read_experiment,
    write_experiment,
)
from broker.transports.connect import connect
from broker.transports.sync_client import SyncClient
from envs.registry import make_env
from leaderboard.store import LeaderboardStore

ENV = "torch/Pendulum-v1"
WARMUP_S = 10.0
"""Checkpoints created this soon after the first one count as warm-up, not steady state."""
Spec = dict[str, tuple[tuple[int, ...], torch.dtype]]


# ---------------------------------------------------------------- the experiment


def _state_bytes(hidden: int) -> int:
    return sum(int(t.nbytes) for t in _fresh_state({"hidden_size": hidden}).values())


def _fresh_state(hparams: dict[str, Any]) -> dict[str, torch.Tensor]:
    registry = default_registry()
    hp = {"num_envs": 4, **hparams}
    config = resolve_config(registry, "ppo", hp)
    env = make_env(ENV, config.num_envs, "cpu")
    try:
        agent = build_agent(registry, "ppo", hp, env, torch.device("cpu"), 0)
    finally:
        env.close()
    return agent.state_dict()


def hidden_for(mib: float) -> int:
    """The PPO hidden size whose full state (weights + Adam moments) is about ``mib``.

    The state's size is quadratic in the hidden size; three small agents fix the curve.
    """
    xs = (8, 16, 32)
    a0, a1, a2 = (_state_bytes(x) for x in xs)
    # the quadratic through the three points
    quad = ((a2 - a1) / (xs[2] - xs[1]) - (a1 - a0) / (xs[1] - xs[0])) / (xs[2] - xs[0])
    lin = (a1 - a0) / (xs[1] - xs[0]) - quad * (xs[0] + xs[1])
    const = a0 - quad * xs[0] ** 2 - lin * xs[0]
    target = mib * 2**20 - const
    return int((-lin + math.sqrt(lin * lin + 4 * quad * target)) / (2 * quad))


def make_experiment(name: str, hidden: int, round_s: float) -> Experiment:
    """PPO only, with ``hidden_size`` pinned so the generator never mutates the shapes;
    the round budget is the stand-ins' (the generator sizes its queue from it)."""
    return default_experiment(ENV).with_overrides(
        name=name, algos={"ppo": 1}, hparams={"ppo": {"hidden_size": hidden, "num_envs": 4}},
        device="cpu", explore_p=0.2, round_budget={"seconds": round_s})


# ---------------------------------------------------------------- stand-in pods


@dataclasses.dataclass
class PodStats:
    """One stand-in pod's clock."""

    rounds: int = 0
    first_wait: float = 0.0
    """Seconds waiting for the very first initialization (start-up)."""
    wait: float = 0.0
    """Seconds waiting for an initialization after the first one."""
    busy: float = 0.0
    """Seconds after the first initialization (waiting included)."""
    publish: list[float] = dataclasses.field(default_factory=list)
    """Seconds from building each checkpoint to the broker's confirm (the pod's leg)."""


def _random_state(template: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # fresh values every time: content-addressed blobs must not deduplicate
    return {k: torch.randn(v.shape, dtype=v.dtype) if v.is_floating_point() else v
            for k, v in template.items()}


async def _stand_in(transport: Any, name: str, template: dict[str, torch.Tensor],
                    round_s: float, start_at: float, end_at: float, stats: PodStats) -> None:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start_at - loop.time()))
    async with transport.consume("generator", prefetch=1, expect=Initialization) as inbox:
        items = aiter(inbox)
        first = True
        since = loop.time()
        while loop.time() < end_at:
            t0 = loop.time()
            try:
                delivery = await asyncio.wait_for(anext(items), end_at - t0)
            except TimeoutError:
                if not first:
                    stats.wait += loop.time() - t0
                break
            waited = loop.time() - t0
            if first:
                stats.first_wait, since, first = waited, loop.time(), False
            else:
                stats.wait += waited
            init = delivery.message
            await asyncio.sleep(round_s)
            state = await asyncio.to_thread(_random_state, template)
            checkpoint = Checkpoint(
                experiment=init.experiment, id=init.id, init_id=init.id, pod=name,
                algorithm=init.algorithm, env=init.env, hparams=dict(init.hparams),
                state=state, score_mean=-1000.0 + 100.0 * random.random(), score_std=1.0,
                env_steps=1000, wall_time=round_s, parent_id=init.parent_id,
                generation=init.generation)
            await transport.publish("updater", checkpoint)
            stats.publish.append(time.time() - checkpoint.created)
            await delivery.ack()
            stats.rounds += 1
        if not first:
            stats.busy = loop.time() - since


async def _worker(args: argparse.Namespace) -> list[PodStats]:
    experiment = read_experiment(args.experiment)
    template = _fresh_state(dict(experiment.hparams["ppo"]))
    loop = asyncio.get_running_loop()
    start = loop.time()
    end_at = start + args.round + args.duration
    stats = [PodStats() for _ in range(args.n)]
    async with connect(args.broker, experiment=experiment.name,
                       blobs=FileBlobStore(args.store)) as transport:
        tasks = [asyncio.create_task(_stand_in(
            transport, f"w{args.index}-{i}", template, args.round,
            start + random.uniform(0, args.round), end_at, stats[i])) for i in range(args.n)]
        loop.add_signal_handler(signal.SIGUSR1, _dump_tasks)
        # a round started just before the end finishes; anything slower is stuck
        _, stuck = await asyncio.wait(tasks, timeout=end_at + args.round + 60 - loop.time())
        for task in stuck:
            task.print_stack(file=sys.stderr)
            task.cancel()
        if stuck:
            print(f"worker {args.index}: {len(stuck)} stand-ins stuck at the end",
                  file=sys.stderr)
    return stats


def _dump_tasks() -> None:
    """``kill -USR1 <worker>``: print where every task waits (diagnosing a hang)."""
    for task in asyncio.all_tasks():
        task.print_stack(file=sys.stderr)


def worker_main(args: argparse.Namespace) -> int:
    """Entry of one stand-in worker process: write its pods' stats to ``args.out``."""
    torch.set_num_threads(1)
    configure_logging("WARNING")
    stats = asyncio.run(_worker(args))
    Path(args.out).write_text(json.dumps([dataclasses.asdict(s) for s in stats]))
    return 0


# ---------------------------------------------------------------- one measurement


class MemorySampler:
    """Polls the management API's ``mem_used`` in a thread; keeps the peak."""

    def __init__(self, url: str, every_s: float = 1.0) -> None:
        self.url = url
        self.every_s = every_s
        self.peak = 0
        self.baseline = self._read()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> int:
        request = urllib.request.Request(self.url + "/api/nodes")
        token = base64.b64encode(b"guest:guest").decode()
        request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return int(json.load(response)[0]["mem_used"])
        except (OSError, ValueError, KeyError, IndexError):
            return 0

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.peak = max(self.peak, self._read())

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _cpu_seconds(pids: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds (user + system) used so far by each group of processes."""
    out: dict[str, float] = {}
    for role, group in pids.items():
        total = 0.0
        for pid in group:
            with contextlib.suppress(psutil.Error):
                times = psutil.Process(pid).cpu_times()
                total += times.user + times.system
        out[role] = total
    return out


def _broker_pids() -> list[int]:
    return [p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == "beam.smp"]


def _delete(url: str, experiment: str) -> None:
    from broker.runtime.lifecycle import BrokerAdmin

    with BrokerAdmin(url, experiment) as admin:
        admin.delete_all()


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def measure(pods: int, args: argparse.Namespace, hidden: int, root: Path) -> dict[str, Any]:
    """Run ``pods`` stand-ins against a fresh updater + generator; the figures."""
    name = f"scale{pods}-{uuid.uuid4().hex[:6]}"
    run = root / name
    store = run / "store"
    store.mkdir(parents=True)
    experiment = make_experiment(name, hidden, args.round)
    exp_file = write_experiment(experiment, run / "experiment.json")
    env = {**os.environ, "PODRACER_BROKER": args.broker, "PODRACER_EXPERIMENT_FILE":
           str(exp_file), "PODRACER_STORE": str(store), "PODRACER_LOG_LEVEL": "WARNING"}
    services = {}
    for role in ("updater", "generator"):
        with (run / f"{role}.log").open("ab") as fh:
            services[role] = subprocess.Popen(
                [sys.executable, "-m", "podracer", "serve", role], env=env, stdout=fh,
                stderr=subprocess.STDOUT)
    time.sleep(3.0)
    workers = min(args.workers, pods)
    shares = [pods // workers + (i < pods % workers) for i in range(workers)]
    outs = [run / f"worker-{i}.json" for i in range(workers)]
    started = time.time()
    try:
        with MemorySampler(args.management) as memory:
            procs = [subprocess.Popen(
                [sys.executable, "-m", "benchmarks.scale", "--worker", "--n", str(n),
                 "--index", str(i), "--experiment", str(exp_file), "--store", str(store),
                 "--broker", args.broker, "--round", str(args.round), "--duration",
                 str(args.duration), "--out", str(out)], env=env)
                for i, (n, out) in enumerate(zip(shares, outs, strict=True))]
            pids = {"updater": [services["updater"].pid],
                    "generator": [services["generator"].pid],
                    "stand-ins": [p.pid for p in procs], "broker": _broker_pids()}
            cpu_before, wall_before = _cpu_seconds(pids), time.monotonic()
            # CPU is read when the stand-ins stop taking work (their processes exit later)
            time.sleep(args.round + args.duration)
            cpu = {k: v - cpu_before[k] for k, v in _cpu_seconds(pids).items()}
            cpu_wall = time.monotonic() - wall_before
            codes = [p.wait(timeout=args.round * 3 + args.duration + 300) for p in procs]
            time.sleep(2.0)  # the last checkpoints reach the store
    finally:
        with SyncClient(args.broker, name) as client, contextlib.suppress(BrokerError):
            client.publish_control(Stop(experiment=name, reason="benchmark over"))
        for proc in services.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
        _delete(args.broker, name)
    if any(codes):
        raise SystemExit(f"a stand-in worker failed ({codes}); see {run}")
    stats = [PodStats(**s) for out in outs for s in json.loads(out.read_text())]
    with LeaderboardStore(store) as lb:
        entries = [e for e in lb.entries() if e.created >= started]
    latencies = [e.stored - e.created for e in entries]
    # the first checkpoints wait for the updater's one-time warm-up (its validator
    # builds the agent once per shape): the steady state starts WARMUP_S after the first
    first = min((e.created for e in entries), default=started)
    warm = [e.stored - e.created for e in entries if e.created >= first + WARMUP_S]
    stored_times = sorted(e.stored for e in entries)
    span = (stored_times[-1] - stored_times[0]) if len(stored_times) > 1 else math.nan
    busy = sum(s.busy for s in stats)
    return {
        "pods": pods, "checkpoints": len(entries),
        "throughput": (len(entries) - 1) / span if span and span > 0 else math.nan,
        "offered": pods / args.round,
        "p50": _percentile(latencies, 0.50), "p99": _percentile(latencies, 0.99),
        "p99_warm": _percentile(warm, 0.99),
        "p99_publish": _percentile([x for s in stats for x in s.publish], 0.99),
        "max": max(latencies, default=math.nan),
        "starvation": sum(s.wait for s in stats) / busy if busy else math.nan,
        "first_wait_max": max((s.first_wait for s in stats), default=math.nan),
        "mem_peak_mib": memory.peak / 2**20, "mem_base_mib": memory.baseline / 2**20,
        "dead": _dead_count(run / "updater.log"),
        "cpu_share": {k: round(v / cpu_wall, 3) for k, v in cpu.items()},
        "cpu_ms_per_checkpoint": {k: round(1000 * v / max(1, len(entries)), 1)
                                  for k, v in cpu.items()},
    }


def _dead_count(log: Path) -> int:
    return log.read_text(errors="replace").count("rejected message") if log.exists() else 0


# ---------------------------------------------------------------- entry


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pods", default="16,64,256", help="comma-separated pod counts")
    p.add_argument("--mib", type=float, default=4.0, help="checkpoint payload, MiB")
    p.add_argument("--round", type=float, default=30.0, help="seconds per stand-in round")
    p.add_argument("--duration", type=float, default=60.0,
                   help="seconds measured after the one-round stagger")
    p.add_argument("--workers", type=int, default=4, help="stand-in worker processes")
    p.add_argument("--broker", default="amqp://guest:guest@127.0.0.1:5672/")
    p.add_argument("--management", default="http://127.0.0.1:15672")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--n", "--index"):
        p.add_argument(hidden, type=int, default=0, help=argparse.SUPPRESS)
    for hidden in ("--experiment", "--store", "--out"):
        p.add_argument(hidden, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    """Measure every pod count in ``--pods`` and print one table."""
    args = _parser().parse_args(argv)
    if args.worker:
        return worker_main(args)
    hidden = hidden_for(args.mib)
    payload = _state_bytes(hidden) / 2**20
    counts = [int(c) for c in args.pods.split(",") if c.strip()]
    print(f"scale: PPO hidden {hidden} -> {payload:.2f} MiB checkpoints, rounds "
          f"{args.round:g} s, {args.duration:g} s measured after a {args.round:g} s stagger, "
          f"{args.workers} stand-in processes, 1 updater + 1 generator; cpus "
          f"{os.cpu_count()}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="podracer-scale-") as tmp:
        for pods in counts:
            rows.append(measure(pods, args, hidden, Path(tmp)))
            print(f"  done {pods} pods: {json.dumps(rows[-1])}", flush=True)
    print(f"{'pods':>5} {'ckpts':>6} {'offered/s':>9} {'stored/s':>8} {'p50 s':>7} "
          f"{'p99 s':>7} {'p99 warm':>8} {'p99 pub':>7} {'max s':>7} {'starve':>7} "
          f"{'1st wait':>8} "
          f"{'mem MiB':>8} {'dead':>4}")
    for r in rows:
        print(f"{r['pods']:>5} {r['checkpoints']:>6} {r['offered']:>9.2f} "
              f"{r['throughput']:>8.2f} {r['p50']:>7.3f} {r['p99']:>7.3f} "
              f"{r['p99_warm']:>8.3f} {r['p99_publish']:>7.3f} {r['max']:>7.3f} "
              f"{100 * r['starvation']:>6.2f}% {r['first_wait_max']:>7.1f}s "
              f"{r['mem_peak_mib']:>8.0f} {r['dead']:>4}")
    for r in rows:
        print(f"{r['pods']:>5} pods, CPU (cores busy) by role: {r['cpu_share']}; "
              f"ms per stored checkpoint: {r['cpu_ms_per_checkpoint']}")
    target = [r for r in rows if r["pods"] == 256]
    if target:
        r = target[0]
        p99_ok = "met" if r["p99_warm"] < 1 else "MISSED"
        starve_ok = "met" if r["starvation"] < 0.01 else "MISSED"
        print(f"targets at 256 pods: p99 {r['p99']:.3f} s, after warm-up {r['p99_warm']:.3f} s "
              f"(< 1 s: {p99_ok}), starvation "
              f"{100 * r['starvation']:.2f}% (< 1%: {starve_ok})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
