"""Where a pod's rounds run: a ``RoundRunner`` in a thread of the pod or in a process.

The pod service owns the broker; a round (build the agent, train, evaluate) is pure
compute handed to a worker as a ``RoundJob`` and returned as a ``RoundOutput``:

* ``ThreadWorker`` runs the ``RoundRunner`` in a thread of the pod's process. One
  pod per process (``podracer serve pod``) uses it.
* ``ProcessWorker`` runs it in a child process of its own that lives as long as the
  pod. Python holds one lock per process, and an RL round is mostly Python (env
  stepping, small ops): two pods on threads of one process get about 1.2 cores of a
  2-core machine; on processes they get both. Embedded mode gives every pod after
  the first one such a worker.

The runner keeps its envs between rounds (``EnvPool``), and a training env's episodes
go on into the next round (``ContinuingEnv``); evaluations always start from resets.
Jobs and outputs cross the process boundary as Python objects over a local pipe
between a pod and the process it started itself, never over the network; what comes
from the broker was decoded and validated by the pod before it became a job.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import multiprocessing.connection
import signal
import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch

from agents.base import Agent, AlgorithmRegistry
from agents.build import Resolved
from agents.pod.continuity import ContinuingEnv, EnvPool, Rows, fit_rows, replay_rows
from agents.pod.learners import LearnerGroup, build_learners
from agents.pod.pool import ExperiencePool
from agents.pod.pool_link import link_agent, record_envs, unwrap
from agents.pod.round import Progress, RoundResult, train_round
from agents.replay import ReplayBuffer
from broker.core.errors import EnvUnavailable
from broker.core.experiment import DEFAULT_POOL_OWN_SHARE, POOL_INTAKES, POOL_WARM_FROM
from broker.core.experiment_specs import SNAPSHOT_EVERY_S
from broker.core.schemas import Budget
from broker.runtime.faults import Fault, Faulted, Verdict, fault_of, judge, one_line
from envs.base import VecEnv

log = logging.getLogger(__name__)

Report = Callable[[Progress], None]
ShouldStop = Callable[[], bool]


@dataclasses.dataclass(frozen=True)
class RoundJob:
    """One round to run: the agent to build (or restore) and how long to train it."""

    resolved: Resolved
    """The algorithm and its config, resolved once from the message (``agents.build``)."""
    env: str
    seed: int
    budget: Budget
    state: Mapping[str, torch.Tensor] | None = None
    """Weights, optimizer moments, counters of the parent (``None``: a fresh agent)."""
    replay: Rows | None = None
    """The parent lineage's replay rows, when this process has them."""
    own_rng: bool = False
    """Explore on ``seed``, not on the parent's RNG state (a child of a checkpoint)."""
    target: float | None = None
    """End the round as soon as an evaluation reaches it."""
    pooled: bool = True
    """Learn from the experience pool's rows too (``Initialization.pooled``); the round
    writes to the pool either way."""
    parent_score: float | None = None
    """The leaderboard's score of the parent, which the round's pool rows carry
    (``Initialization.parent_score``)."""


@dataclasses.dataclass(frozen=True)
class RoundOutput:
    """The round's result and the replay rows its lineage holds now (off-policy only)."""

    result: RoundResult
    replay: Rows | None


@dataclasses.dataclass(frozen=True)
class RunnerConfig:
    """How a runner builds rounds; the same for every round of a pod."""

    device: str = "cpu"
    eval_episodes: int = 16
    learners: int = 1
    eval_every_s: float | str | None = "auto"
    """Evaluation cadence within a round (see ``agents.pod.round``)."""
    torch_threads: int | None = None
    """torch intra-op threads of a process worker (a thread worker leaves them alone)."""
    snapshot_every_s: float | None = SNAPSHOT_EVERY_S
    """A round this long or longer reports intermediate bests this often (the pod
    publishes them: see ``agents.pod.round``)."""
    pool: ExperiencePool | None = None
    """The node's experience pool (``agents.pod.pool``; shared memory, so it reaches a
    process worker when it starts); ``None``: the pod learns from its own data only."""
    pool_own_share: float = DEFAULT_POOL_OWN_SHARE
    """Least share of a learner's new data that is its own (``agents.pod.pool_link``)."""
    pool_warm_from: str = POOL_WARM_FROM[0]
    """Which pool rows an empty buffer starts from (``broker.core.experiment.POOL_WARM_FROM``)."""
    pool_intake: str = POOL_INTAKES[0]
    """Which of the others' new rows a learner takes (``broker.core.experiment.POOL_INTAKES``)."""
    seeded_eval: bool = False
    """Evaluate on episodes seeded from the round's seed (reproducible mode): the same
    agent then gets the same score in every run."""


def buffer_of(agent: Agent) -> ReplayBuffer | None:
    """The replay buffer of an off-policy agent (learner 0's in a group), else ``None``."""
    if isinstance(agent, LearnerGroup):
        agent = agent.learners[0]
    buffer = getattr(agent, "buffer", None)
    return buffer if isinstance(buffer, ReplayBuffer) else None


def carried(env: VecEnv) -> ContinuingEnv:
    """``env`` as a training env of this round: its episodes in progress carry on."""
    kept = env if isinstance(env, ContinuingEnv) else ContinuingEnv(env)
    kept.carry_on()
    return kept


def plain(env: VecEnv) -> VecEnv:
    """``env`` as an evaluation env: every reset real."""
    return env.inner if isinstance(env, ContinuingEnv) else env


class RoundRunner:
    """Builds and trains rounds; envs stay open between rounds (see module doc)."""

    def __init__(self, registry: AlgorithmRegistry, config: RunnerConfig,
                 make_env: Callable[[str, int, torch.device], VecEnv]) -> None:
        self.registry = registry
        self.config = config
        self.device = torch.device(config.device)
        self.envs = EnvPool(lambda name, copies: make_env(name, copies, self.device))
        self._eval_every: dict[str, float] = {}
        """The evaluation interval each env's last round ended with."""

    def _take_envs(self, name: str, copies: int) -> tuple[list[VecEnv], VecEnv]:
        """The round's envs. The pod builds only its own experiment's env (``Pod.refusal``)
        with a size its message had checked, so a failure here is this node's (a missing
        data file or simulator, out of memory or descriptors): ``EnvUnavailable``."""
        taken: list[VecEnv] = []
        try:
            for _ in range(self.config.learners):
                taken.append(carried(self.envs.take(name, copies)))
            taken.append(plain(self.envs.take(name, self.config.eval_episodes)))
        except EnvUnavailable:
            self._give_back(name, taken)
            raise
        except Exception as exc:
            self._give_back(name, taken)
            raise EnvUnavailable(f"env {name[:200]} cannot be built here: {one_line(exc)}"
                                 ) from None
        return taken[:-1], taken[-1]

    def _build(self, job: RoundJob) -> tuple[Agent, list[VecEnv], VecEnv]:
        config = job.resolved.config
        envs, eval_env = self._take_envs(job.env, config.num_envs)
        envs = record_envs(self.config.pool, job.env, envs)  # experience pool hook
        state = job.state
        if job.replay is not None and state is not None:
            capacity = getattr(config, "buffer_size", None)
            if isinstance(capacity, int):
                state = {**state, **fit_rows(job.replay, capacity)}
        try:
            agent = build_learners(self.registry, job.resolved, envs, self.device, job.seed,
                                   state, own_rng=job.own_rng)
        except BaseException:
            self._give_back(job.env, [*envs, eval_env])
            raise
        return agent, envs, eval_env

    def _give_back(self, name: str, envs: list[VecEnv]) -> None:
        for env in envs:
            self.envs.give_back(name, env.num_envs, unwrap(env))

    def probe(self, job: RoundJob) -> None:
        """Build ``job`` (no training) to learn whether this node can work again after a
        fault of its own; raises ``Faulted`` like ``run``."""
        try:
            _agent, envs, eval_env = self._build(job)
        except Exception as exc:
            raise fault_of(exc, unknown=Fault.MESSAGE) from None
        self._give_back(job.env, [*envs, eval_env])

    def run(self, job: RoundJob, report: Report | None = None,
            should_stop: ShouldStop | None = None) -> RoundOutput:
        """Build and train ``job``; a failure raises ``Faulted`` with its verdict
        (``broker.runtime.faults``)."""
        if self.config.torch_threads:  # OpenMP counts threads per calling thread: set it
            torch.set_num_threads(self.config.torch_threads)  # where the round trains
        try:
            agent, envs, eval_env = self._build(job)
        except Exception as exc:
            # Past the env (``_take_envs``), building depends only on the message: sizes
            # that overflow an allocation, a state whose counters are not scalars... Every
            # pod would fail the same way, unless the table knows it as this node's.
            log.debug("traceback", exc_info=True)
            raise fault_of(exc, unknown=Fault.MESSAGE) from None
        try:
            link = link_agent(self.config.pool, agent, envs, self.config.pool_own_share,
                              self.config.pool_warm_from, learn=job.pooled,
                              intake=self.config.pool_intake, score=job.parent_score)
            result = train_round(agent, envs[0], eval_env, job.budget,
                                 eval_every_s=self.config.eval_every_s, on_progress=report,
                                 should_stop=should_stop,
                                 eval_episodes=self.config.eval_episodes, target=job.target,
                                 snapshot_every_s=self.config.snapshot_every_s,
                                 auto_start_s=self._eval_every.get(job.env),
                                 feed=link,
                                 eval_seed=job.seed if self.config.seeded_eval else None,
                                 target_ends_round=False)  # the pod publishes its claims
        except BaseException as exc:
            for env in [*envs, eval_env]:  # mid-episode state of a failed round: rebuild
                env.close()
            if isinstance(exc, Exception):
                # a round that built may well train on another try or another pod
                log.debug("traceback", exc_info=True)
                raise fault_of(exc, unknown=Fault.MOMENT) from None
            raise
        self._give_back(job.env, [*envs, eval_env])
        if result.eval_every_s is not None:
            self._eval_every[job.env] = result.eval_every_s
        buffer = buffer_of(agent)
        return RoundOutput(result, replay_rows(buffer) if buffer is not None else None)

    def close(self) -> None:
        """Close the kept envs."""
        self.envs.close()


class ThreadWorker:
    """Runs rounds in the calling thread (the pod calls ``run`` via ``to_thread``)."""

    def __init__(self, runner: RoundRunner) -> None:
        self.runner = runner

    def run(self, job: RoundJob, report: Report | None = None,
            should_stop: ShouldStop | None = None) -> RoundOutput:
        """See ``RoundRunner.run``."""
        return self.runner.run(job, report, should_stop)

    def probe(self, job: RoundJob) -> None:
        """See ``RoundRunner.probe``."""
        self.runner.probe(job)

    def close(self) -> None:
        """Close the runner's envs."""
        self.runner.close()


def _serve(conn: multiprocessing.connection.Connection, stop: Any,
           registry: AlgorithmRegistry, config: RunnerConfig,
           make_env: Callable[[str, int, torch.device], VecEnv]) -> None:
    """The worker process: run each job received on ``conn`` until ``None`` arrives."""
    # Ctrl-C reaches every process of the terminal's group; the pod owning this worker
    # decides how the round ends (it sets ``stop``: the round is cut short, evaluated and
    # published), so the child must not die of it. SIGINT came blocked from
    # ``ProcessWorker.start`` (a Ctrl-C during start-up stays pending); ignored, then
    # unblocked, a pending one is dropped.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    runner = RoundRunner(registry, config, make_env)
    last = [-1.0]

    def report(progress: Progress) -> None:
        # every iteration reports; the pipe carries evaluations and one report a second
        if (progress.score is not None or progress.snapshot is not None
                or progress.seconds - last[0] >= 1.0):
            last[0] = progress.seconds
            conn.send(("progress", progress))

    try:
        while True:
            request = conn.recv()
            if request is None:
                return
            kind, job = request
            last[0] = -1.0
            try:
                if kind == "probe":
                    runner.probe(job)
                    conn.send(("done", None))
                else:
                    conn.send(("done", runner.run(job, report, stop.is_set)))
            except Exception as exc:
                # judged here, where it happened (the output's tensors may not fit in
                # /dev/shm either); only the verdict crosses the pipe
                conn.send(("failed", judge(exc, unknown=Fault.MOMENT)))
    except (EOFError, KeyboardInterrupt, BrokenPipeError):
        return
    finally:
        runner.close()


class ProcessWorker:
    """Runs rounds in a child process that lives as long as this worker (module doc).

    A worker whose process died is started again for the next round; the round it was
    running fails as a fault of the moment (the pod returns it to the queue)."""

    def __init__(self, registry: AlgorithmRegistry, config: RunnerConfig,
                 make_env: Callable[[str, int, torch.device], VecEnv]) -> None:
        # the registry is pickled into the child: its algorithms must be importable there
        self._args = (registry, config, make_env)
        self._mp = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        self._proc: Any = None
        self._conn: multiprocessing.connection.Connection | None = None
        self._stop = self._mp.Event()
        self.start()

    def start(self) -> None:
        """Start the child process (done at construction, and again after it died)."""
        parent, child = self._mp.Pipe()
        self._proc = self._mp.Process(target=_serve, args=(child, self._stop, *self._args),
                                      daemon=True, name="podracer-round-worker")
        # the child inherits this thread's signal mask across exec: with SIGINT blocked,
        # a Ctrl-C during its imports waits for ``_serve``, which ignores it
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            self._proc.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        child.close()
        self._conn = parent

    def run(self, job: RoundJob, report: Report | None = None,
            should_stop: ShouldStop | None = None) -> RoundOutput:
        """See ``RoundRunner.run``; blocks until the child process answers."""
        output: RoundOutput = self._ask("run", job, report, should_stop)
        return output

    def probe(self, job: RoundJob) -> None:
        """See ``RoundRunner.probe``."""
        self._ask("probe", job, None, None)

    def _ask(self, kind: str, job: RoundJob, report: Report | None,
             should_stop: ShouldStop | None) -> Any:
        with self._lock:
            if self._proc is None or not self._proc.is_alive():
                self.start()
            conn = self._conn
            assert conn is not None
            self._stop.clear()
            try:
                conn.send((kind, job))
                while True:
                    if should_stop is not None and should_stop():
                        self._stop.set()
                    if not conn.poll(0.05):
                        if not self._proc.is_alive():
                            raise EOFError
                        continue
                    answer, payload = conn.recv()
                    if answer == "progress":
                        if report is not None:
                            report(payload)
                    elif answer == "done":
                        return payload
                    else:
                        raise Faulted(payload)
            except (EOFError, BrokenPipeError, ConnectionResetError):
                code = self._proc.exitcode
                self._proc = None
                raise Faulted(Verdict(Fault.MOMENT, "round worker process died (exit "
                                                    f"code {code})")) from None
            except Faulted:
                raise
            except Exception as exc:  # the job or the answer did not cross the pipe
                raise fault_of(exc, unknown=Fault.MOMENT) from None

    def close(self) -> None:
        """Ask the child to finish and wait for it (then terminate it)."""
        with self._lock:
            if self._proc is None:
                return
            try:
                if self._conn is not None:
                    self._conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self._proc.join(timeout=10)
            if self._proc.is_alive():
                self._proc.terminate()
                self._proc.join(timeout=5)
            self._proc = None
            if self._conn is not None:
                self._conn.close()


Worker = ThreadWorker | ProcessWorker
