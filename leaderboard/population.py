"""Who trains next: the algorithm where compute pays, then continue, branch or start a lineage.

The population is a set of *lineages*: chains of checkpoints where each round continued
the previous one. A lineage's *head* is its newest checkpoint; its *history* is the
head and its ancestors (through branches too: a branch starts from its parent's
weights, so the score curve runs on through it), on an axis of training seconds
(the rounds' wall times summed). ``Planner.next`` decides the next round in two steps.

1. **Algorithm, by its curve at equal training** (``shares``, ``leader``). An
   algorithm's *curve* (``Curve``) is its best score so far (over all its lineages)
   against the training seconds it has had (its rounds' wall times summed, in the order
   they came back). The curve never falls, so a round that scores below an earlier one
   (common on MuJoCo: Hopper's SAC went 202, then 15) costs the algorithm nothing; it
   only stops adding to it. Two algorithms are compared where both have trained as long:
   where the less trained one stands, the other's curve read off at the same training,
   on the line between the two points around it (a round learns all along and is scored
   only at its end: read as a step, the leader's pod's 60 s rounds read 760 after 106 s
   where it had 760 after 88 s and 2394 after 112 s, and lost to TD3's 1728 after 94 s;
   and SAC's round of 20 s that ended 0.01 s after TD3's was read one round early, 215
   instead of 402, against TD3's 279); a lead within the noise of the two evaluations
   (their standard error) wins nothing, so the algorithm further along keeps the lead
   (HalfCheetah, measured: TD3 at 4045 with an episode std of 929 against SAC at 4013,
   std 72, after 85 s each, handed TD3 the lead and stopped SAC's best lineage at 5521).
   So an algorithm that reached a score with less training leads one that needed more,
   however steep the other's last rise; an early leader that flattens (PPO) hands over
   to a slower starter as soon as the starter passes it at equal training; and a starved
   algorithm is judged on its own training seconds, not on the time it waited. Nothing
   is extrapolated: early curves jump (HalfCheetah's PPO went -184, -188, 1227), and a
   rise projected from them (best + recent rate * ``ready_s``, the rule before this one)
   handed rounds back and forth between close risers and to the one that was behind. A
   lead counts only once the leader has learned something by then (its best so far
   above its first evaluation by more than their noise, or above the first evaluation
   of another algorithm that rose above its own): early on HalfCheetah, PPO standing
   still (-2) is "ahead" of SAC running backwards (-112), and nothing about 300 s
   follows from it (``beats``); on Hopper, SAC's first round scored 1085 and its next
   ones less, yet it had learned more than PPO, risen from 177 to 323 (``learned``).
   Training here counts data, not only time (``training = "data"``, ``DATA``): a round
   weighs its own seconds and, at its own rate of collection, the experience-pool rows
   it learned from, so a member that starts from rows others collected is compared at
   the data behind it. The *leader*
   wins the most of these pairs (ties: the higher best so far). An algorithm
   with fewer than two checkpoints gets its mix weight: it is measured before it is
   judged, however long that takes, and no fixed warm-up is needed. Its first lineage's
   second round is issued as soon as the first is back (``MEASURE``), before any other
   round, so the lineage that may lead does not wait for a pod while others start; and
   while a round of it is in flight it gets no other (no second lineage of an algorithm
   that may lose). Once measured, every algorithm keeps a floor of ``min_share`` (times
   its mix weight relative to the others) so the mix stays alive, and the rest of the
   rounds goes to the leader. The round goes to the algorithm furthest below its share
   of the recent rounds (deficit round robin over counts that decay by ``RECENT_DECAY``
   per round, so a change of shares takes effect at once rather than after the old
   surplus is paid back).

   By default (``measure = "ready"``) an algorithm's first lineage goes first until it
   has trained ``ready_s``, not for its second round only (``"two-rounds"``), and
   "measured" below means that much: nobody is judged before it had time to learn
   (``MEASURE``). With ``"even"`` the leader also earns nothing before then: the rounds
   that are not measuring rounds go by the mix weights until every algorithm is measured
   (``EVEN``). With more than one pod, once every algorithm is measured, **one
   algorithm's best lineage keeps a pod of its own**, the *keeper*, and the other pods
   explore. By default (``keeper = "agreed"``, ``AGREED``) the first keeper is the
   leader at equal training when it leads on evidence (it beats another; else the best
   checkpoint's algorithm), and the pod goes to another algorithm only once both rules
   agree on it: it holds the best checkpoint *and* beats the keeper at equal training.
   With ``"best"``, the algorithm that holds the best checkpoint keeps it; with
   ``"leader"``, the algorithm leading on evidence (with none the round robin); with
   ``"near"``, that leader's while its best checkpoint is within ``RETURN_DROP`` of the
   best one, else the best checkpoint's. Measured on HalfCheetah, 3 seeds interleaved:
   by the leader at equal training the pod went at 192 s to TD3 (4470 after 84 s of
   training, against SAC's 4073 then) while SAC's best lineage, at 6527, waited 61 s for
   a pod; kept by the best checkpoint, SAC's best lineage trained without a gap to the
   end and the tournament scored 7712 against 6737 (1.05x and 0.92x the lone SAC pod).
   The equal-training comparison still shares the other pods and the one pod. When a
   round comes back and none in flight is on the leader's pod, the leader's idle best
   head is continued there (``KEEPER``), so the lineage most likely to win trains
   without a gap, as a lone pod would. A new leader whose head is busy on another pod
   takes the next pod that frees up; meanwhile the last leader's lineage goes on in the
   freed pod for one ordinary round (``STAND_IN``; measured: the pod went to the round
   robin, and the last leader's best lineage, at 3720, had no round in the last 60 s; as
   a long round, ``stand_in = "long"``, it held the pod 60 s more). A new keeper whose
   best head is idle while the last keeper's long round runs waits for the kept pod
   (``handover = "same-pod"``, the default), or takes the next pod that frees up
   (``"next-pod"``; the last keeper's round runs out and its pod explores). Waiting, on
   HalfCheetah SAC's lineage, holding the best checkpoint at 3781 from 104 s, sat idle
   67 s while TD3's 60 s round ran on the kept pod and the other pod ran PPO's floor and
   a TD3 branch (that run ended at 5088; in two of three later runs it sat 68-70 s); yet
   over 3 seeds interleaved "next-pod" scored 7310 ± 1017 against 7534 ± 873: TD3, which
   kept the pod, also learns far, so the wait cost nothing measurable, and the default
   stays. The leader's pod trains in rounds ``KEEPER_ROUNDS`` long (the pod waits for
   the updater's measurement of a round's checkpoint before it can continue it: once per
   long round). When that lineage has collapsed, fallen below the algorithm's best
   checkpoint significantly (Welch, as below) and by more than ``RETURN_DROP`` of that
   score, and is not improving, the keeper continues that checkpoint instead
   (``RETURN``): a collapse (common for SAC on Hopper) costs one long round. The other
   pods' rounds go round robin by the mix weights (``exploring``), the leader's other
   lineages included, so every challenger keeps gaining training and can take the kept
   pod (by the best checkpoint, or at equal training with ``"leader"``); an algorithm
   that has trained ``ready_s`` and is behind every other at equal training keeps only
   its floor there (``min_share`` times its weight: PPO on HalfCheetah stayed under 2000
   while SAC and TD3 passed 4000 at equal training, and took a third of the exploring
   pod by the mix; judged before it had trained ``ready_s``, Hopper's TD3, at 162
   against PPO's 178 after 40 s, each with an episode std of 2 to 5, got no round after
   its first two). Measured on HalfCheetah, both alternatives starved the challengers: a
   pod for every lineage that became the leader's best (two SAC lineages overtook each
   other in turn and held both pods for 130 s while TD3, which then reached 6275 in 105
   s of training, waited), and the floors on the other pod (SAC's floor was spent on its
   measuring rounds; it waited 150 s, then led at equal training from its next round
   on). By default (``exploring = "near"``, ``NEAR``) only the keeper's *challengers*
   train there beyond their floors: another algorithm not behind every other and within
   ``RETURN_DROP`` of the keeper at equal training. The keeper's algorithm keeps its
   floor there while it has one (the challenger trains on, the keeper's lineage having
   its pod), and every algorithm that is no challenger keeps its floor, so with none the
   keeper's other lineages (branches of its best) take the rest. With ``"challengers"``
   (``CHALLENGERS``) an algorithm that is neither a challenger nor behind every other
   keeps its mix weight; with ``"mix"`` the keeper's algorithm does too. On one pod the
   shares decide every round.
2. **Lineage, within the algorithm**:

   * no checkpoint yet, or with probability ``explore_p``: a *fresh* lineage (tuned
     defaults for an algorithm's first, sampled hyperparameters after that);
   * an idle head (no round of its lineage in flight) that is not *ready* (trained
     less than ``ready_s`` since its lineage started or branched) is continued first:
     nobody is judged before it had time to learn;
   * then the best idle head among the ``members`` best heads is continued, unless it
     is *behind and not improving*: some kept head is significantly better (one-sided
     Welch t-test at ``alpha`` over the two evaluations' episodes:
     ``leaderboard.selection.significantly_better``) and its own history gained less
     than the noise of two evaluations over its last ``window`` scores. It then gives
     up its pod: the round is a *branch* of a significantly better head (weights,
     optimizer state and, in the pod, its replay data) with mutated hyperparameters
     (PBT exploit/explore). A head that is behind but still rising keeps training, and
     one lucky evaluation does not take over a lineage;
   * when every head is busy and the family has fewer than ``members`` heads, a
     branch of a head chosen by the selection strategy starts a new lineage.

A continuation keeps the hyperparameters of its parent; only a branch mutates them.
Heads outside the ``members`` best that are ready are no longer continued (culled).
What is in flight is remembered per initialization until its checkpoint is stored or
``lost_after_s`` has passed (a round that was dropped or dead-lettered).
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence

from broker.core.errors import ConfigError
from broker.core.experiment_specs import (
    EXPLORINGS,
    HANDOVERS,
    KEEPER_ROUNDS_RULES,
    KEEPERS,
    MEASURES,
    SNAPSHOT_EVERY_S,
    STAND_INS,
    TRAININGS,
    check_rules,
)
from leaderboard.curves import Curve, beats, cost, exploring, leader, pairs, shares, slope
from leaderboard.selection import SelectionStrategy, ranked, significantly_better
from leaderboard.store import Entry, LeaderboardStore

RECENT_DECAY = 0.9
"""Per issued round, the weight of every earlier round in the deficit round robin (a
memory of about ten rounds)."""
KEEPER = "continue the leader's best lineage"
"""The reason of a round on the leader's pod of its own (one such round at a time)."""
MEASURE = "continue an algorithm's first lineage: it is measured before it is judged"
"""The reason of a round of an algorithm's first lineage while the algorithm is not
measured (``Planner._measuring_round``: with ``measure = "ready"``, the default, every
round until it has trained ``ready_s``; with ``"two-rounds"`` its second round).
HalfCheetah, measured: the round robin started TD3's first lineage on the pod where
SAC's first round had ended, and SAC's lineage, the eventual leader, waited 29 s for a
pod. ``"ready"`` against ``"two-rounds"`` on HalfCheetah, 3 seeds each, on a machine
where the lone SAC pod made 1,166 env steps/s (``benchmarks.tournament --tasks
halfcheetah``; the ``tournament-measureready`` runs right after the others): "ready"
4743 ± 197 (4526, 4788, 4913), "two-rounds" 4276 ± 573 (4378, 4792, 3659), SAC alone
5384 ± 102. Judged on two rounds, SAC (-116 and -246: its first 50k steps on HalfCheetah
go nowhere) lost to TD3 (233, 520) at 45 s of training in two of three runs (and in the
run without the pool); TD3 kept the pod from 115 s to 191-199 s while SAC's third round,
2204 and 2402, waited 60 s for a pod. With "ready" SAC's third round came next; TD3,
warm-started from the pool, still kept the pod first in two runs, once rightly (it
scored 4788)."""
EVEN = MEASURES[2]
"""A value of ``PopulationConfig.measure`` (not the default): as ``"ready"``, and until
every algorithm has trained ``ready_s`` the rounds that are not measuring rounds go by the
mix weights, so no algorithm leads before every one could be compared. With ``"ready"``
the leader at equal training takes all but the others' floors from the moment two are
measured. Seen on Hopper-v5 (seed 0, the lone SAC pod at 2,108 env steps/s): PPO led SAC
by 5 points (314 against 309) after about 66 s of training each, both flat; SAC's first
lineage stood idle from 66 s to 127 s while TD3 was measured on one pod and PPO went on
on the other, PPO kept the pod first, and the run scored 1345 against SAC alone's 3157.
Against ``"ready"`` (300 s, 3 seeds, the lone SAC pod at 700-1,150 env steps/s): Hopper-v5
652, 749, 441 against 2562, 2699, 477; HalfCheetah-v5 5467, 4626 against 4908, 4659, 6684
(docs/concepts.md): not better, so not the default."""
RETURN = "return the leader's best lineage to its best checkpoint"
"""The reason of a keeper's round that continues the algorithm's best checkpoint, not its
fallen head (Hopper, measured: SAC's best lineage reached 2119 at 180 s, then went 1567,
1143, 1167, 529, and the leader's pod went on continuing its head to the end)."""
STAND_IN = "continue the last keeper's lineage for one round while the new keeper's is busy"
"""The reason of a stand-in round (``stand_in = "one-round"``): an ordinary round, so the
new keeper's best head takes the next pod that frees up. Measured (Hopper, seed 2): TD3,
holding the best checkpoint at 86 s, kept a pod for a 60 s round, then for another 60 s
as the stand-in while SAC, the best by then, had its head busy on the other pod. Over 3
seeds interleaved with the lone SAC pod (``benchmarks.tournament --tasks hopper``): one
round 3071 ± 93, a long round 2380 ± 970, SAC alone 3142 ± 79; but the gap is seed 0's,
where TD3 (419 against SAC's 383 after 83 s) kept the pod to the end with no stand-in,
so it measures the early keeper's luck more than this rule. On HalfCheetah (3 seeds), one
round 7403 ± 796, a long round 8689 ± 423, SAC alone 8034 ± 658, with the same decisions
in both rows (SAC kept the pod from about 95 s; no keeper change, so no stand-in): the
gap is run-to-run noise. Kept as the default because it removes a cost seen twice."""
FIRST_KEEPER = "population.first_keeper"
"""The experiment key naming an algorithm whose first lineage keeps a pod from its second
round on, before every algorithm is measured (``Planner._first_kept``; not set by
default). The best lineage of a tournament trained 0.75-0.90x the env steps of a lone
SAC pod on HalfCheetah-v5 (docs/concepts.md): the first keeper was chosen at 130-165 s,
once every algorithm had trained ``ready_s``, and SAC's lineage waited for pods until
then. Named here, that lineage is the incumbent from the start, the others are measured
on the other pods, and the keeper rule (``AGREED``) hands the pod over on evidence.
Measured on 2026-12-03 (the lone SAC pod 2,608 env steps/s on HalfCheetah-v5, 2,580 on
Hopper-v5), 300 s, 3 seeds, ``first_keeper = "sac"`` interleaved with SAC alone and the
defaults right after: HalfCheetah 8447 ± 481 (8582, 8847, 7914), the defaults 8039 ± 854
(8718, 7080, 8319), SAC alone 8068 ± 934; Hopper 3021 ± 192 (2823, 3206, 3034), the
defaults 3245 ± 2, SAC alone 3334 ± 242. SAC kept a pod from 23-28 s, yet the best
lineage trained as much as with the defaults on HalfCheetah (0.94-0.96x the lone pod's
env steps, the defaults 0.94-0.95x), and on Hopper the best checkpoint's lineage trained
less (0.48-0.73x, the defaults 0.67-0.87x; in seed 0 a branch on the other pod made it
while the kept lineage fell from 2271 to 1021). On a slow machine (2026-12-03, the lone
pod 993 and 1,010 env steps/s), seeds interleaved with the defaults and SAC alone:
HalfCheetah 5660 ± 810 against the defaults' 4899 ± 648 and SAC alone's 5865 ± 1002 (the
best lineage 0.95-1.02x the lone pod's env steps, the defaults' 0.65-1.01x); Hopper 1385 ±
922 against 1785 ± 774 and 2413 ± 934 (a stuck SAC lineage held the pod). It helps where
SAC leads from the start and costs where it sticks, so it is not the default."""
RETURN_DROP = 0.25
"""Least fall below the algorithm's best checkpoint, as a share of that score's
magnitude, that counts as a collapse (``RETURN``). Significance alone is not enough:
Hopper's early episodes all fall at the same step, so a 6-point dip on a plateau of 300
is significant. Measured (Hopper, seed 1): SAC's lineage went 299, 242, 293, and the
keeper returned to the 299 twice, throwing away 40 s and then 60 s of training; its
collapses were 2119 to 1567 and below."""
KEEPER_ROUNDS = 3
"""A keeper's round is this many rounds long (``leaderboard.generator``). Measured on
HalfCheetah with one-round keeper rounds: the leader's pod stood idle 4-7 s after every
round (55 s of 300) while the updater measured its checkpoint, a would-be best, before
the next round could continue it; the other pod, whose checkpoints were seldom
candidates, lost 10 s."""
UNTIL_YIELDED = KEEPER_ROUNDS_RULES[1]
"""A value of ``PopulationConfig.keeper_round`` (not the default): a keeper's round runs
until the run's time budget ends, reporting its intermediate bests every
``SNAPSHOT_EVERY_S``, unless another algorithm is to keep the pod: then ``Planner.yields``
names it, the generator publishes ``control.yield`` and the pod ends it (evaluated and
published, as a round that ran out) and takes its next. So the leader's lineage trains
as a lone pod's one long round does, with no gap between rounds. In ``three-rounds``
rounds (``KEEPER_ROUNDS``), each one's end cost the lineage its evaluation and the wait
for the updater's measurement before the next could continue it: on HalfCheetah-v5 (seed
3, SAC's lineage kept from 144 s) 2 s of every 60. A collapse inside a long round is not
seen (its snapshots are its bests), so ``RETURN`` applies at the round's end only; the
run's answer still takes the best snapshot. Reproducible mode (``by_steps``) keeps
``three-rounds``: a yield depends on timing. Measured on HalfCheetah-v5 (seeds 0-2
interleaved, ``benchmarks.tournament --methods tournament,tournament-keeperthree,sac``,
the lone SAC pod at 1,415 env steps/s): until yielded 6711 ± 361, three rounds
6372 ± 599, SAC alone 6509 ± 1007; within the runs' noise (two runs of one seed
differed by 1665). Not the default: on Hopper-v5 (seeds 0, 1) it scored 2413 and 2259
against SAC alone 3170 and 3143. In seed 0 the kept SAC lineage read 318, 652, 273 in
its long round while a branch of it on the other pod rose to 2173: a yield went only to
another algorithm, never to a better lineage of the keeper's own (now ``OUTGROWN``).
Measured with it (seeds 0-2, ``benchmarks.tournament --methods
tournament,tournament-keeperyield,sac``, the lone SAC pod at 3,106-3,265 env steps/s):
Hopper until yielded 3244 ± 87, three rounds 3356 ± 77, SAC alone 3151 ± 277;
HalfCheetah 8545 ± 593, 9440 ± 333 and 9049 ± 1743. A yield is decided on the store,
and a long round shows its progress only in snapshots 60 s apart: on HalfCheetah (seed
1) SAC's kept round was told to yield 45 s into it, before its first snapshot, to TD3,
whose 6062 had passed SAC's last published 5981; the round ended at 6663, and TD3's long
round held the pod to the end. So a yield is now a request to measure: the round told to
yield holds the kept pod until its result is stored (``Planner._keeper_round``; the other
pod, freed first, takes an ordinary round), and the next kept round is decided on that
result, which may give the pod back to the same lineage; and a yield is decided only on
the round's current progress (``YIELD_LOOK_S``)."""
OUTGROWN = "an idle lineage of its own algorithm outgrew it"
"""Why a kept round told to yield (``UNTIL_YIELDED``) ends when its own algorithm keeps the
pod: an idle lineage of that algorithm (a branch trained on another pod) scores above the
round's best so far by more than ``RETURN_DROP`` of its magnitude, significantly; the
keeper's next round continues that lineage. Without it, on Hopper-v5 (seed 0) the kept SAC
lineage read 318, 652 and 273 in its long round from 130 s to the end while a branch of
it on the other pod rose to 2173."""
YIELD_LOOK_S = SNAPSHOT_EVERY_S + 15.0
"""A kept round is told to yield only on its current progress: once it has reported (an
intermediate best) after the rival's checkpoint was stored, or once this long has passed
since its latest report (or its start) with none newer: it has looked for a new best since
(every ``SNAPSHOT_EVERY_S``, plus the look's evaluation and the updater's measurement)
and found none, so its latest report is its best. Measured without it (HalfCheetah-v5,
seed 2): SAC's kept round, reported at 5458, was told to yield 23 s later to TD3's 5600,
came back at 6043, was kept again, and was told to yield 22 s later to TD3's 6193."""
YIELD_AGAIN_S = 30.0
"""A kept round told to yield (``Planner.yields``) and not back this many seconds later is
told again: events are best-effort, and a round told to yield holds the kept pod until its
result is stored. A pod ends a yielded round at its next iteration, so its result is
normally stored within seconds; a repeat for a round that already ended changes nothing."""
AGREED = "agreed"
"""The default keeper rule (``PopulationConfig.keeper``): the leader at equal training
first (else the best checkpoint's algorithm), then another algorithm only once it both
holds the best checkpoint and beats the keeper at equal training. Seen on HalfCheetah
(seed 0, on a machine where SAC made 690 env steps/s): by the best checkpoint alone, PPO
took the pod at 128 s with 678 after 105 s of training, where SAC had 507 after 72 s and
PPO's best so far read -17 at 72 s; PPO kept it two long rounds (1069, then 604) and the
run scored 2866. Over 3 seeds interleaved with the old rule and the lone SAC pod (SAC
alone at 900 env steps/s; ``benchmarks.tournament --tasks halfcheetah --methods
tournament,tournament-keepbest,sac``): "agreed" 3224 ± 884 (2992, 4201, 2479), "best"
3411 ± 1527 (1660, 4111, 4463), SAC alone 4844 ± 365. No difference in the mean; each
rule lost one run to its first keeper: by the best checkpoint PPO (911, no other
algorithm had learned yet) kept the pod to the end and ended at 1591; by "agreed" TD3,
840 after 47 s and ahead at equal training, took it over SAC's best checkpoint (885
after 98 s), and SAC took it back only at 268 s. Kept as the default for the smaller
spread and the bounded loss: a keeper ahead at equal training is still learning, where
PPO's flat curve held the pod to the end."""
CHALLENGERS = "challengers"
"""The rule of the exploring pods before ``NEAR`` (``PopulationConfig.exploring``): the keeper's
algorithm, which has a pod of its own, keeps only its floor there while it has a
challenger (another algorithm not behind every other and within ``RETURN_DROP`` of it
at equal training: ``leaderboard.curves.exploring``), so the challenger trains on. Seen
on HalfCheetah (seed 0, on a machine where SAC alone made 2,041 env steps/s): TD3 kept
a pod from 148 s, its second lineage took every other round of the other pod by the
mix, and SAC, the challenger, trained 188 s of 300 and ended at 5909 against TD3's 6595.
Over 3 seeds (``benchmarks.tournament --tasks halfcheetah``, the "mix" runs as
``tournament`` before this rule, then ``tournament-explorechallengers``, one after the
other on that machine): "challengers" 7102 ± 181 (7070, 7296, 6939), "mix" 6559 ± 1140
(6664, 7642, 5369), SAC alone 7404 ± 1039 (6257, 7670, 8284). In seed 2 by the mix,
TD3, warm-started from the pool, kept the pod from 150 s and SAC, with every other round
of the other pod, took it back at 276 s (5369); by "challengers" the challenger trained
on without a gap, and the run ended on the better of two lineages trained most of the
run."""
MIX = "mix"
"""The exploring pods' rule before ``CHALLENGERS``: the mix, with only an algorithm behind
every other at its floor."""
NEAR = "near"
"""The default rule of the exploring pods (``PopulationConfig.exploring``): only the
keeper's challengers train there beyond their floors (``leaderboard.curves.exploring``,
``beside="challengers"``), and with no challenger the keeper's algorithm takes the rest, its other
lineages (branches of its best) training most of those pods. Seen on Hopper (seed 2, on
a machine where SAC alone made 1,362 env steps/s): by "challengers" PPO, flat at 174-181
but ahead of TD3 (at 38) and so not behind every other, took five rounds of the other
pod from 137 s to the end; by "near" SAC's branch trained there instead. Over 3 seeds
interleaved with the rule before and the lone SAC pod (``benchmarks.tournament --tasks
hopper --methods tournament,tournament-explorenear,sac``): "near" 2671 ± 494 (2739, 3127,
2146), "challengers" 2134 ± 1297 (637, 2843, 2922), SAC alone 1845 ± 927 (1170, 1462,
2902). Seed 0 decided the same by both rules (TD3 was within a quarter of SAC): its gap
is the runs' noise. In seed 1 SAC's branch on the other pod rose to 2531 beside the
kept lineage's 3127; in seed 2 the two SAC lineages reached 2146 and 934 (by
"challengers" SAC's kept lineage reached 2926 beside PPO's rounds). On HalfCheetah
both rules decide alike while the runner-up is within a quarter of the keeper and PPO
is behind every other, as in every run measured there."""
RISING = "rising"
"""A rule of the exploring pods (``PopulationConfig.exploring``): ``NEAR``, and an
algorithm ``stalled`` behind every other's best (``leaderboard.curves.stalled``: behind
each by more than ``RETURN_DROP`` of its magnitude, and risen by no more than that share
of its own over its last ``window`` evaluations) keeps only its floor there, as one
behind every other at equal training does. Seen on Hopper-v5 (seeds 1 and 2, the lone SAC
pod at about 700 env steps/s): PPO, flat at 175-186, took two 26-s rounds of the exploring
pod as the keeper's challenger while SAC's lineage waited 51 s and 75 s for a pod. TD3,
the keeper, had learned from about 78k pool rows, so its first checkpoint counted as
about 100 s of training (``DATA``) and PPO, at 69-96 s, read as ahead of it at equal
training and near it. Measured on a fast machine (the lone SAC pod at 2,085-2,279 env
steps/s; seeds 0-2 interleaved, ``benchmarks.tournament --methods
tournament,tournament-explorerising,sac``): Hopper "rising" 3098 ± 177, "near" 3072 ±
272, SAC alone 3148 ± 86 (by "near" PPO took one 26-s round in two of three runs, by
"rising" none); HalfCheetah 7368 ± 877, 8400 ± 275 and 7859 ± 1708, where the rule
changed no decision (the gap is the runs' noise). Not the default: the
case it is for arose on a slow machine, where it was not measured."""
KEPT = "kept"
"""A rule of the exploring pods (``PopulationConfig.exploring``): every algorithm but the
keeper's at its floor, a challenger within a quarter included, so the keeper's other
lineages (branches of its best) train the exploring pods beyond the floors. Seen on
HalfCheetah-v5 (2026-12-02, SAC's rounds at about 2,000 env steps/s; runs of
``benchmarks.lineages`` at 300 s): in three runs SAC's first lineage stood at 4,600-4,700 after
140 s; where the other pod went to a branch of it (TD3, at 2423, was no challenger) the
kept lineage read 6405 60 s later and the run ended at 8693; where the other pod trained
TD3 (at 3396 and 4109, a challenger) it read 5719 and 5477 and the runs ended at 7036
and 6388. Measured right after the defaults and SAC alone (``benchmarks.tournament
--methods tournament-explorekept``, 3 seeds, not interleaved with them): HalfCheetah 7832 ±
373 against the defaults' 6892 ± 930 and SAC alone's 7762 ± 1630; on Hopper it decided
as ``NEAR`` would have (no challenger). Interleaved with the defaults and SAC alone
(``--methods tournament,tournament-explorekept,sac``, 3 seeds, SAC alone at 2,769 env
steps/s): HalfCheetah "kept" 8427 ± 809, "near" 8846 ± 529, SAC alone 8026 ± 877; the
keeper's branch on the other pod stayed behind the keeper to the end, where by "near" a
second algorithm beside it reached the best checkpoint or near it. Not the default
(``docs/concepts.md``, "The tournament against its best member, measured")."""
BESIDE_KEPT = {NEAR: "challengers", RISING: "challengers", KEPT: "none"}
"""Who trains beside the keeper's algorithm on the exploring pods, by rule
(``leaderboard.curves.exploring``'s ``beside``; ``"all"`` by the others)."""
DATA = "data"
"""The default of ``PopulationConfig.training``: equal training counts a round's own
seconds (env steps, reproducible) and the experience-pool rows it learned from, each at
the round's own rate of collection (``leaderboard.curves.cost``); ``ready_s`` is still
held against its own rounds alone. Counted by its own rounds (``"own"``, the rule
before), a member that starts from the pool looks fast: on HalfCheetah TD3, started at
85-90 s from ~80k rows SAC's first lineage had collected, read 3866 after 67 s of its own
rounds where SAC read about 2200, kept the pod from 154-166 s to the end in 3 runs of 3,
and SAC, in 20-s rounds on the other pod, ended best in two of them. Counted by data,
TD3's first round weighs 71 s instead of its 22 s, and SAC kept the pod from 164-167 s
in all three. Over 3 seeds interleaved with the rule before and the lone SAC pod
(``benchmarks.tournament --tasks halfcheetah,hopper --methods
tournament-trainingdata,tournament-trainingown,sac``, on a machine where the lone SAC pod made about
1,000 env steps/s): HalfCheetah "data" 5946 ± 301 (6161, 5603, 6075), "own" 5265 ± 636
(5943, 4683, 5169), SAC alone 5602 ± 931 (5537, 6564, 4705); Hopper "data" 1134 ± 522
(864, 1736, 801), "own" 801 ± 185 (921, 896, 588), SAC alone 1341 ± 347 (1718, 1272,
1034). "data" scored above "own" on 5 of 6 seeds."""
MAX_HISTORY = 10_000
"""Longest ancestry walked (a guard against a corrupt store whose parents loop)."""


@dataclasses.dataclass(frozen=True)
class PopulationConfig:
    """How the planner shares rounds between algorithms and lineages."""

    members: int = 2
    """Lineages kept per algorithm (the best by their head's score)."""
    ready_s: float = 60.0
    """Training seconds a lineage gets after it starts or branches before it is judged."""
    min_share: float = 0.15
    """Floor of the rounds every algorithm keeps once measured (times its mix weight
    relative to the others) while the shares decide every round (one pod); the rest goes
    to the leader (module doc)."""
    keeper: str = KEEPERS[0]
    """Whose best lineage keeps a pod of its own: the ``leader`` at equal training until
    another both holds the best checkpoint and beats it there (``agreed``), the algorithm
    of the ``best`` checkpoint, the ``leader``, or the leader while its best is ``near``
    the best checkpoint (``broker.core.experiment_specs.PopulationSpec.keeper``)."""
    handover: str = HANDOVERS[0]
    """When another algorithm is to keep a pod while the last keeper's long round runs:
    once that round ends (``same-pod``) or at the next free pod (``next-pod``). A round
    told to yield (``yields``) no longer holds the pod: its successor takes the next."""
    stand_in: str = STAND_INS[0]
    """While a new keeper's best head is busy, the last keeper's lineage goes on in one
    ordinary round (``one-round``: ``STAND_IN``) or in a keeper's long round (``long``)."""
    measure: str = MEASURES[0]
    """An algorithm's first lineage goes first until it has trained ``ready_s``
    (``ready``) or for two rounds (``two-rounds``), and the first keeper waits for every
    algorithm to have as much (``MEASURE``); with ``even``, as ``ready``, and until then the
    measured algorithms share the other rounds by their mix weights (``EVEN``). Measured:
    ``MEASURE``."""
    exploring: str = EXPLORINGS[0]
    """Who the pods other than the kept one train: only the keeper's challengers above
    their floors, the keeper's algorithm above its own while it has none (``near``:
    ``NEAR``); that, and a stalled algorithm at its floor too (``rising``: ``RISING``);
    the mix with the keeper's algorithm at its floor while challenged (``challengers``:
    ``CHALLENGERS``); the mix (``mix``); or the keeper's algorithm above its floor, every
    other at its own (``kept``: ``KEPT``). An algorithm behind every other at equal
    training is at its floor by every rule."""
    training: str = TRAININGS[0]
    """What equal training counts: a member's own rounds and the pool rows it learned from
    (``data``: ``DATA``, ``leaderboard.curves.cost``), or its own rounds alone (``own``).
    ``ready_s`` is always held against its own rounds."""
    keeper_round: str = KEEPER_ROUNDS_RULES[0]
    """How long a keeper's round runs: ``KEEPER_ROUNDS`` rounds (``three-rounds``, the
    default), or until the run ends or ``Planner.yields`` ends it (``until-yielded``:
    ``UNTIL_YIELDED``)."""
    first_keeper: str = ""
    """An algorithm whose first lineage keeps a pod, as the incumbent, before every
    algorithm is measured (``FIRST_KEEPER``); empty: none."""
    explore_p: float = 0.0
    """Probability that a round starts a fresh lineage with sampled hyperparameters."""
    window: int = 4
    """Evaluations of a lineage's history its improvement rate is fitted over."""
    alpha: float = 0.05
    """Significance level a challenger must reach to replace an incumbent lineage."""
    episodes: int = 16
    """Episodes behind every checkpoint's score (the experiment's ``eval_episodes``; with
    one, there is no spread to test and a higher mean wins)."""
    by_steps: bool = False
    """Count training in env steps, not wall seconds: ``ready_s`` is then env steps, and
    improvement rates are per env step (reproducible mode: no decision reads a clock)."""

    def __post_init__(self) -> None:
        if self.members < 1:
            raise ConfigError("population.members", f"must be >= 1, got {self.members}")
        if not (math.isfinite(self.ready_s) and self.ready_s >= 0):
            raise ConfigError("population.ready_s", f"must be >= 0, got {self.ready_s}")
        if not 0.0 <= self.min_share <= 1.0:
            raise ConfigError("population.min_share", f"must be in [0, 1], got {self.min_share}")
        check_rules(self.keeper, self.handover, self.stand_in, self.measure, self.exploring,
                    self.training, self.keeper_round)
        if not 0.0 <= self.explore_p <= 1.0:
            raise ConfigError("explore_p", f"must be in [0, 1], got {self.explore_p}")
        if self.window < 2:
            raise ConfigError("population.window", f"must be >= 2, got {self.window}")
        if not 0.0 < self.alpha < 1.0:
            raise ConfigError("population.alpha", f"must be in (0, 1), got {self.alpha}")
        if self.episodes < 1:
            raise ConfigError("eval_episodes", f"must be >= 1, got {self.episodes}")


@dataclasses.dataclass(frozen=True)
class Plan:
    """The next round: its algorithm, and its parent (``None``: a fresh lineage)."""

    algorithm: str
    parent: Entry | None
    mutate: bool
    """Branch with mutated hyperparameters (``False``: continue, or fresh)."""
    reason: str
    keeper: bool = False
    """A round on the leader's pod of its own (``KEEPER``): ``KEEPER_ROUNDS`` long."""


@dataclasses.dataclass(frozen=True)
class _Issued:
    plan: Plan
    at: float


def _continues(child: Entry, parent: Entry) -> bool:
    # a continuation keeps its parent's hyperparameters; a branch mutates them
    return child.hparams == parent.hparams


class Family:
    """One algorithm's checkpoints seen as lineages (derived from the store alone, so a
    restarted generator sees the same population)."""

    def __init__(self, entries: Sequence[Entry], by_steps: bool = False) -> None:
        """``by_steps``: training is counted in env steps, not wall seconds (reproducible
        mode: wall time differs from run to run, so no decision may read it)."""
        self.by_id = {e.id: e for e in entries}
        self.by_steps = by_steps
        self._since: dict[str, float] = {}
        continued = {e.parent_id for e in entries
                     if e.parent_id in self.by_id and _continues(e, self.by_id[e.parent_id])}
        self.heads = ranked([e for e in entries if e.id not in continued])
        """Checkpoints no stored round continued, best first."""

    def since(self, checkpoint_id: str) -> float:
        """Training seconds of the lineage ending at ``checkpoint_id`` since it started or
        branched."""
        chain: list[Entry] = []
        entry = self.by_id.get(checkpoint_id)
        while entry is not None and entry.id not in self._since and len(chain) < MAX_HISTORY:
            chain.append(entry)
            parent = self.by_id.get(entry.parent_id or "")
            entry = parent if parent is not None and _continues(entry, parent) else None
        total = self._since.get(entry.id, 0.0) if entry is not None else 0.0
        for link in reversed(chain):
            total += self.cost(link)
            self._since[link.id] = total
        return self._since.get(checkpoint_id, 0.0)

    def history(self, checkpoint_id: str, last: int) -> list[tuple[float, Entry]]:
        """The last ``last`` checkpoints of the history ending at ``checkpoint_id``
        (through branches), oldest first, each with the training seconds behind it
        counted from the oldest one returned."""
        chain: list[Entry] = []
        seen: set[str] = set()
        entry = self.by_id.get(checkpoint_id)
        while entry is not None and entry.id not in seen and len(chain) < last:
            seen.add(entry.id)
            chain.append(entry)
            entry = self.by_id.get(entry.parent_id or "")
        out: list[tuple[float, Entry]] = []
        clock = 0.0
        for link in reversed(chain):
            clock += self.cost(link) if out else 0.0
            out.append((clock, link))
        return out

    def cost(self, entry: Entry) -> float:
        """The training behind ``entry`` (``cost``)."""
        return cost(entry, self.by_steps)

    def improving(self, checkpoint_id: str, window: int, episodes: int) -> bool:
        """Whether the history ending at ``checkpoint_id`` gained, over its last
        ``window`` evaluations, more than the noise of two evaluations (the standard
        error of a difference of two means of ``episodes`` episodes). Unmeasured
        (one evaluation) counts as improving: nobody is judged on nothing."""
        points = self.history(checkpoint_id, window)
        rate = slope([(t, e.score_mean) for t, e in points])
        if rate is None:
            return True
        first, head = points[0][1], points[-1][1]
        noise = math.sqrt((first.score_std ** 2 + head.score_std ** 2) / max(1, episodes - 1))
        return rate * (points[-1][0] - points[0][0]) > noise


class Planner:
    """Decides every round from the store and what it issued itself (module doc)."""

    def __init__(self, mix: Mapping[str, float], config: PopulationConfig,
                 selection: SelectionStrategy, store: LeaderboardStore, rng: random.Random,
                 lost_after_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not mix:
            raise ConfigError("algos", "give at least one algorithm")
        self.mix = dict(mix)
        self.config = config
        self.selection = selection
        self.store = store
        self.rng = rng
        self.lost_after_s = lost_after_s
        self.clock = clock
        self.rounds: dict[str, float] = dict.fromkeys(self.mix, 0.0)
        """Recent rounds per algorithm, each weighted ``RECENT_DECAY`` per later round."""
        self._issued: dict[str, _Issued] = {}
        self._yielded: dict[str, tuple[float, str]] = {}
        """Keeper rounds told to yield (``yields``), until they come back: when, and why."""
        self._yields_seen: tuple[int, frozenset[str], str | None, frozenset[str]] | None = None
        """The store's size, the rounds in flight, the incumbent and the kept rounds whose
        report is old enough (``YIELD_LOOK_S``) when ``yields`` last looked."""
        self._reported: dict[str, tuple[Entry | None, float]] = {}
        """Kept rounds in flight: the latest report of each (an intermediate best; none
        yet: ``None``) and when the planner first saw it (none: when it issued the round)."""
        self._noted_count = -1
        """The store's size when ``_reported`` was last brought up to date."""
        self.keeper_lost_after_s = lost_after_s
        """``lost_after_s`` of a keeper's round (the generator sets it for long ones)."""
        self.incumbent: str | None = None
        """The algorithm of the last round on the leader's pod (none yet: ``None``)."""

    # ---------------------------------------------------------------- bookkeeping

    def issued(self, init_id: str, plan: Plan) -> None:
        """Record that the initialization ``init_id`` carries out ``plan``."""
        self._issued[init_id] = _Issued(plan, self.clock())
        if plan.keeper:  # the leader's own pod: not a round of the shared ones
            self.incumbent = plan.algorithm
            return
        for name in self.rounds:
            self.rounds[name] *= RECENT_DECAY
        self.rounds[plan.algorithm] = self.rounds.get(plan.algorithm, 0.0) + 1.0

    def _settle(self) -> None:
        """Forget rounds that came back, or were lost (dropped, dead-lettered)."""
        now = self.clock()
        for init_id, rec in list(self._issued.items()):
            limit = self.keeper_lost_after_s if rec.plan.keeper else self.lost_after_s
            if now - rec.at > limit or self.store.get(init_id) is not None:
                del self._issued[init_id]
                self._yielded.pop(init_id, None)
                self._reported.pop(init_id, None)

    def busy(self) -> set[str]:
        """Checkpoint ids with a round of their lineage in flight."""
        return {rec.plan.parent.id for rec in self._issued.values()
                if rec.plan.parent is not None}

    def in_flight(self, algorithm: str | None = None) -> int:
        """Rounds issued and not yet back (of ``algorithm`` when given)."""
        self._settle()
        return sum(1 for rec in self._issued.values()
                   if algorithm is None or rec.plan.algorithm == algorithm)

    # ---------------------------------------------------------------- deciding

    def _curves(self) -> dict[str, Curve | None]:
        data = self.config.training == DATA
        return {name: Curve.of(self.store.top(1_000_000, algorithm=name), self.config.by_steps,
                               data)
                for name in self.mix}

    def allocation(self) -> dict[str, float]:
        """The share of rounds each algorithm gets now (module doc, step 1)."""
        cfg = self.config
        return shares(self.mix, self._curves(), cfg.min_share, cfg.episodes)

    def _algorithm(self, share: Mapping[str, float]) -> str:
        total = sum(share.values())
        share = {a: w / total for a, w in share.items()}
        order = list(self.mix)
        return min(order, key=lambda a: ((self.rounds.get(a, 0.0) + 1.0) / max(share[a], 1e-9),
                                         order.index(a)))

    def _idle(self, head: Entry) -> bool:
        # a head published by a round still in flight (an intermediate best) is busy too
        return head.id not in self.busy() and head.init_id not in self._issued

    def _keeps(self, curves: Mapping[str, Curve | None]) -> tuple[str | None, bool]:
        """The algorithm whose best lineage is to keep a pod now (``None``: none yet), and
        whether the pods are shared out around a kept one (module doc, step 1)."""
        cfg = self.config
        measured = {a: c for a, c in curves.items() if c is not None}
        tally = pairs(measured, cfg.episodes)
        first = leader(measured, cfg.episodes, tally)
        shared_pods = first is not None and len(measured) == len(self.mix) > 1 \
            and bool(self._issued) and (self.incumbent is not None or all(
                self._ready(curves.get(a)) for a in self.mix))
        return (self._kept(first, measured, tally) if shared_pods else None), shared_pods

    def yields(self) -> list[tuple[str, str]]:
        """Keeper rounds in flight to end now, each with why (``UNTIL_YIELDED``): another
        algorithm is to keep the pod and its best lineage is idle, ready to take it; or an
        idle lineage of the round's own algorithm has outgrown it (``OUTGROWN``). Each
        is named once, and again every ``YIELD_AGAIN_S`` while it is not back; the next kept
        round is decided once its result is stored (``UNTIL_YIELDED``)."""
        if self.config.keeper_round != UNTIL_YIELDED or self.config.by_steps:
            return []
        self._settle()
        now = self.clock()
        again = [(init_id, why) for init_id, (at, why) in self._yielded.items()
                 if now - at >= YIELD_AGAIN_S]
        self._yielded.update((init_id, (now, why)) for init_id, why in again)
        running = [(init_id, rec.plan.algorithm) for init_id, rec in self._issued.items()
                   if rec.plan.keeper and init_id not in self._yielded]
        # the generator asks every POLL_S: read the curves again only once something changed
        count = self.store.count()
        self._note_reports(count)
        looked = frozenset(init_id for init_id, _ in running
                           if now - self._reported[init_id][1] >= YIELD_LOOK_S)
        seen = (count, frozenset(self._issued), self.incumbent, looked)
        if not running or seen == self._yields_seen:
            return again
        self._yields_seen = seen
        keeps, _ = self._keeps(self._curves())
        successor = self._keeper(keeps) if keeps is not None else None
        if successor is None or successor.parent is None:
            return again
        rival = successor.parent
        current = [(init_id, algorithm) for init_id, algorithm in running
                   if init_id in looked or self._reported_after(init_id, rival)]
        out = [(init_id, f"{keeps} is to keep the pod") for init_id, algorithm in current
               if algorithm != keeps]
        out += [(init_id, f"{OUTGROWN} ({rival.score_mean:.1f})")
                for init_id, algorithm in current
                if algorithm == keeps and self._outgrown(init_id, rival)]
        self._yielded.update((init_id, (now, why)) for init_id, why in out)
        return again + out

    def _note_reports(self, count: int) -> None:
        """Note each kept round's latest report, and when it was first seen (``_reported``);
        the store is read only when its ``count`` changed (a report is a new checkpoint)."""
        now, changed, self._noted_count = self.clock(), count != self._noted_count, count
        for init_id, rec in self._issued.items():
            if not rec.plan.keeper:
                continue
            noted = self._reported.setdefault(init_id, (None, rec.at))
            if not changed:
                continue
            latest = max((e for e in self.store.top(1_000_000, algorithm=rec.plan.algorithm)
                          if e.init_id == init_id), key=lambda e: e.stored, default=None)
            if latest is not None and (noted[0] is None or noted[0].id != latest.id):
                self._reported[init_id] = (latest, now)

    def _reported_after(self, init_id: str, rival: Entry) -> bool:
        """Whether the kept round ``init_id`` reported after ``rival`` was stored."""
        latest = self._reported[init_id][0]
        return latest is not None and latest.stored >= rival.stored

    def _outgrown(self, init_id: str, rival: Entry) -> bool:
        """Whether the kept round ``init_id``'s best so far (its latest intermediate best,
        else the checkpoint it continued) is below ``rival``, an idle lineage of its own
        algorithm, by more than ``RETURN_DROP`` and significantly (``OUTGROWN``)."""
        cfg = self.config
        rec = self._issued[init_id]
        own = next((e for e in self.store.top(1_000_000, algorithm=rec.plan.algorithm)
                    if e.init_id == init_id), rec.plan.parent)
        return own is not None \
            and rival.score_mean - own.score_mean > RETURN_DROP * abs(rival.score_mean) \
            and significantly_better(rival, own, cfg.episodes, cfg.alpha)

    def next(self) -> Plan:
        """The next round (see the module doc)."""
        self._settle()
        cfg = self.config
        curves = self._curves()
        share = shares(self.mix, curves, cfg.min_share, cfg.episodes)
        keeps, shared_pods = self._keeps(curves)
        # (``keeps`` is given only around a kept pod; before, a first keeper may take one)
        keeper = self._keeper_round(keeps) if keeps is not None else (
            None if shared_pods else self._first_kept())
        if keeper is not None:
            return keeper
        measuring = self._measuring_round(curves)
        if measuring is not None:
            return measuring
        held = self.incumbent if cfg.exploring != MIX else None
        if shared_pods:
            weights = exploring(self.mix, curves, cfg.min_share, cfg.episodes, cfg.ready_s,
                                held, RETURN_DROP, BESIDE_KEPT.get(cfg.exploring, "all"),
                                cfg.window if cfg.exploring == RISING else 0)
        elif cfg.measure == EVEN and not all(self._ready(curves.get(a)) for a in self.mix):
            weights = dict(self.mix)  # nobody leads before everyone could be compared
        else:
            weights = share
        # an algorithm not measured yet runs one round at a time (HalfCheetah, measured: a
        # second, fresh TD3 lineage started while the first was being measured, trained
        # 86 s at -550 to -780, and the leader's lineage waited 25 s for a pod)
        running = {rec.plan.algorithm for rec in self._issued.values()}  # settled above
        waiting = {a for a in weights if curves.get(a) is None and a in running}
        if len(waiting) < len(weights):
            weights = {a: 0.0 if a in waiting else w for a, w in weights.items()}
        algorithm = self._algorithm(weights)
        family = Family(self.store.top(1_000_000, algorithm=algorithm), cfg.by_steps)
        heads = family.heads
        if not heads:
            return Plan(algorithm, None, False, "first of its algorithm")
        if self.rng.random() < cfg.explore_p:
            return Plan(algorithm, None, False, "explore")
        kept = heads[:cfg.members]
        idle = [h for h in kept if self._idle(h)]
        for head in idle:
            if family.since(head.id) < cfg.ready_s:
                return Plan(algorithm, head, False, "continue (not ready yet)")
        if idle:
            head = idle[0]
            better = [h for h in kept if h.id != head.id
                      and significantly_better(h, head, cfg.episodes, cfg.alpha)]
            if better and not family.improving(head.id, cfg.window, cfg.episodes):
                return Plan(algorithm, self._pick(better), True,
                            "replace a lineage that is behind and not improving")
            return Plan(algorithm, head, False, "continue")
        return Plan(algorithm, self._pick(kept), True, "branch (every lineage busy)")

    def _kept(self, first: str | None, measured: Mapping[str, Curve],
              tally: Mapping[str, tuple[int, int]]) -> str | None:
        """The algorithm whose best lineage keeps the leader's pod, by
        ``PopulationConfig.keeper``; ``leads`` is the leader ``first`` when it leads on
        evidence (it beats another at equal training):

        * ``agreed`` (``AGREED``): the incumbent, until the best checkpoint's algorithm
          also beats it at equal training; with no incumbent yet, ``leads``, else the
          best checkpoint's;
        * ``best``: the best checkpoint's;
        * ``leader``: ``leads`` (none: the round robin);
        * ``near``: ``leads`` while its best checkpoint is within ``RETURN_DROP`` of the
          best one, else the best checkpoint's."""
        leads = first if first is not None and tally[first][0] > 0 else None
        if self.config.keeper == "leader":
            return leads
        top = self.store.top(1)
        if not top:
            return None
        best = top[0].algorithm
        if self.config.keeper == AGREED:
            held = self.incumbent
            if held is None or held not in measured:
                return leads if leads is not None else best
            return best if best != held and beats(measured, best, held,
                                                  self.config.episodes) else held
        if self.config.keeper == "near" and leads is not None:
            own = self.store.top(1, algorithm=leads)[0].score_mean
            if top[0].score_mean - own <= RETURN_DROP * abs(top[0].score_mean):
                return leads
        return best

    def _keeper_round(self, keeps: str) -> Plan | None:
        """The round of the pod ``keeps``'s best lineage is to keep, if one is due now. A
        kept round told to yield still holds the pod until its result is stored, which
        may keep the pod for its lineage (``UNTIL_YIELDED``)."""
        keeping = {r.plan.algorithm for r in self._issued.values() if r.plan.keeper}
        if keeps in keeping:
            return None
        if keeping:  # the last keeper's long round runs
            return self._keeper(keeps) if self.config.handover == "next-pod" else None
        # a new leader whose head is busy takes the pod next time; until then the
        # incumbent's lineage goes on there (measured: the pod went to the round robin,
        # and the incumbent's best lineage, at 3720, had no round in the last 60 s)
        keeper = self._keeper(keeps)
        if keeper is None and self.incumbent is not None:
            keeper = self._keeper(self.incumbent)
            if keeper is not None and self.config.stand_in == "one-round":
                keeper = dataclasses.replace(keeper, keeper=False, reason=STAND_IN)
        return keeper

    def _first_kept(self) -> Plan | None:
        """The kept round of ``PopulationConfig.first_keeper``'s lineage before the pods are
        shared out around a keeper (``FIRST_KEEPER``): once it has a checkpoint, while
        another round is in flight (there is another pod) and no kept round is."""
        algorithm = self.config.first_keeper
        if not algorithm or algorithm not in self.mix or not self._issued \
                or any(rec.plan.keeper for rec in self._issued.values()) \
                or not self.store.top(1, algorithm=algorithm):
            return None
        return self._keeper(algorithm)

    def _ready(self, curve: Curve | None) -> bool:
        """Whether an algorithm of this ``curve`` is measured (``PopulationConfig.measure``):
        it has two checkpoints, and with ``ready`` it has trained ``ready_s``."""
        return curve is not None and (self.config.measure == "two-rounds"
                                      or curve.own_training >= self.config.ready_s)

    def _measuring_round(self, curves: Mapping[str, Curve | None]) -> Plan | None:
        """The next round of an algorithm's first lineage while that algorithm is not
        measured (``_ready``) and the lineage is idle: an algorithm is measured on one
        lineage, with no wait between its rounds (``MEASURE``). One algorithm alone is
        never compared: none."""
        if len(self.mix) < 2:
            return None
        for algorithm in self.mix:
            if self._ready(curves.get(algorithm)):
                continue
            entries = self.store.top(1_000_000, algorithm=algorithm)
            heads = Family(entries, self.config.by_steps).heads if entries else []
            if len(heads) == 1 and self._idle(heads[0]):
                return Plan(algorithm, heads[0], False, MEASURE)
        return None

    def _keeper(self, algorithm: str) -> Plan | None:
        """The round of the leader's pod: its best idle head, continued; or, when that
        lineage collapsed below the algorithm's best checkpoint (``RETURN_DROP``,
        significant) and is not improving, that checkpoint (``RETURN``); None while the
        head is busy."""
        cfg = self.config
        entries = self.store.top(1_000_000, algorithm=algorithm)
        family = Family(entries, cfg.by_steps)
        head, best = family.heads[0], entries[0]
        if not self._idle(head):
            return None
        if best.id != head.id and self._idle(best) \
                and best.score_mean - head.score_mean > RETURN_DROP * abs(best.score_mean) \
                and significantly_better(best, head, cfg.episodes, cfg.alpha) \
                and not family.improving(head.id, cfg.window, cfg.episodes):
            return Plan(algorithm, best, False, RETURN, keeper=True)
        return Plan(algorithm, head, False, KEEPER, keeper=True)

    def _pick(self, heads: Sequence[Entry]) -> Entry:
        chosen = self.selection.select(list(heads), self.rng)
        return chosen if chosen is not None else heads[0]
