"""Team memory (ConMem) on a scripted multi-agent scenario: do later tasks get warned, and never misled?

A planner, a writer and a reviewer share one team. Tasks of five types come in a fixed pseudo-random order
(``--tasks``, ``--seed``). Before each task the writer asks for guidance (``--budget`` tokens) on the
task's text and type. Then, scripted:

- failures recur: each task type has its failure families (one family also hits two types); a family
  occurs on a task with probability ``--failure-rate`` and the reviewer records it as an ERROR, worded by
  one of several paraphrases with the task's service name in it;
- decisions get revised: with probability 0.3 the planner changes the current value of one of five
  subjects (a revision of the decision via ``revise_with_retry``; with ``--unaware-rate`` the planner does
  not know and records a fresh DECISION on the same subject instead, which fusion flags as a conflict);
- facts are re-observed: each task the writer records two observations drawn from a pool of facts, each
  written in several paraphrases (the duplicates fusion should merge).

Fusion runs after each task. Reported:

- ``pitfall_recall``: of the failure occurrences whose family happened before, the share whose task's
  guidance (built before the failure) contained a pitfall of that family (an ERROR of it, or a KNOWLEDGE
  synthesized or merged from one). Goal 1.0.
- ``stale_decision_rate``: of the guidance blocks showing at least one decision, the share showing one
  that is no longer the subject's current value. Goal 0.
- ``duplicate_rate``: of the active observations, the share that repeat a fact another active one states
  (before and after the final fusion).
- guidance tokens (mean, p95, max) against the budget.

The same scenario is also run as a ``naive`` baseline: decisions always recorded fresh, no fusion, and
guidance from a plain top-k recall of the team's memories under the same budget (same line format).

    python bench/team.py --json out.json [--tasks 60] [--no-embed]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np

from clawvm import Harness, Kind, Memory
from clawvm.core.embed import count_tokens
from clawvm.teams import shared as teams
from clawvm.teams.guidance import format_line
from clawvm.teams.merge import merge_team

TEAM = "app"
SERVICES = ["billing", "ledger", "invoicing", "payouts", "search", "profiles", "checkout", "reports"]
TASK_TYPES = {
    "deploy": "Deploy {svc} version {n} to production",
    "release-note": "Write the release note for {svc} {n}",
    "refund": "Handle the refund batch {n} for {svc}",
    "migration": "Move {svc} data to the new cluster, step {n}",
    "api-client": "Integrate the payments API into {svc} (ticket {n})",
}
FAMILIES = {  # family -> (task types it hits, paraphrases)
    "migrations-first": (["deploy"], [
        "Deploy of {svc} failed: database migrations were not applied before the release",
        "The {svc} rollout broke because nobody ran the schema migrations first",
        "{svc} crashed on start after the release: pending DB migrations",
    ]),
    "breaking-change": (["release-note"], [
        "The {svc} release note forgot to mention the breaking API change",
        "Release note for {svc} omitted that the export endpoint is incompatible now",
        "Readers of the {svc} note were not told about the removed API field",
    ]),
    "double-refund": (["refund"], [
        "Refund batch for {svc} paid twice: the idempotency key was missing",
        "Customers of {svc} got duplicate refunds because retries had no idempotency key",
        "{svc} refunds were issued two times (no idempotency key on retry)",
    ]),
    "payments-timeout": (["refund", "api-client"], [
        "Calls from {svc} to the payments API timed out after 30 s without a retry",
        "The payments API kept timing out for {svc}; there was no backoff",
        "{svc} hung on the payments API: 30 s timeouts and no retries",
    ]),
    "lock-timeout": (["migration"], [
        "Copying {svc} tables hit a lock timeout: the batch size was too large",
        "The {svc} migration stalled on table locks; batches of 50k rows are too big",
        "{svc} data move aborted with lock wait timeout (batches too large)",
    ]),
}
SUBJECTS = {
    "postgres version": ["Use Postgres 15 for new services", "Use Postgres 16 for new services",
                         "Use Postgres 17 for new services"],
    "release day": ["Release on Tuesdays", "Release on Wednesdays", "Release on Mondays"],
    "api style": ["New endpoints are REST with JSON bodies", "New endpoints are gRPC",
                  "New endpoints are GraphQL"],
    "retry policy": ["Retry failed calls 3 times with backoff", "Retry failed calls 5 times with backoff",
                     "Retry failed calls twice with jitter"],
    "note tone": ["Release notes use a formal tone", "Release notes use a friendly tone",
                  "Release notes use a neutral, short tone"],
}
FACTS = [
    ["The billing API returns amounts in cents", "Amounts from the billing API are expressed in cents",
     "billing API amounts are in cents, not euros"],
    ["Staging resets every night at 02:00 UTC", "The staging environment is wiped nightly at 02:00 UTC"],
    ["The search index rebuild takes about 40 minutes",
     "Rebuilding the search index needs roughly 40 minutes"],
    ["Profiles are cached for 10 minutes", "The profile cache keeps entries 10 minutes"],
    ["Checkout needs a CSRF token on every POST", "Every checkout POST must carry a CSRF token"],
    ["Reports are generated from the read replica",
     "The reports job reads from the replica, not the primary"],
    ["Payouts run on business days only", "No payouts are sent on weekends or holidays"],
    ["The ledger is append-only; corrections are new entries",
     "Ledger entries are never edited, only reversed"],
]


@dataclass
class Task:
    n: int
    type: str
    svc: str
    text: str
    failures: list[str]
    decision: tuple[str, int, bool] | None  # subject, new value index, planner unaware
    observations: list[tuple[int, int]]  # fact, paraphrase


def script(n_tasks: int, seed: int, failure_rate: float, unaware_rate: float) -> list[Task]:
    rng = random.Random(seed)
    values = {s: 0 for s in SUBJECTS}
    tasks = []
    for n in range(1, n_tasks + 1):
        ttype = rng.choice(list(TASK_TYPES))
        svc = rng.choice(SERVICES)
        failures = [f for f, (types, _) in FAMILIES.items() if ttype in types and rng.random() < failure_rate]
        decision = None
        if rng.random() < 0.3:
            subject = rng.choice(list(SUBJECTS))
            values[subject] = (values[subject] + 1) % len(SUBJECTS[subject])
            decision = (subject, values[subject], rng.random() < unaware_rate)
        obs = [(f, rng.randrange(len(FACTS[f]))) for f in rng.sample(range(len(FACTS)), 2)]
        tasks.append(Task(n, ttype, svc, TASK_TYPES[ttype].format(svc=svc, n=n), failures, decision, obs))
    return tasks


@dataclass
class Run:
    name: str
    recall_hits: int = 0
    recall_total: int = 0
    blocks_with_decisions: int = 0
    stale_blocks: int = 0
    tokens: list[int] = field(default_factory=list)
    seconds_guidance: list[float] = field(default_factory=list)
    duplicate_rate_before: float = 0.0
    duplicate_rate_after: float = 0.0
    conflicts_flagged: int = 0
    pitfalls: int = 0

    def as_dict(self, budget: int) -> dict[str, Any]:
        return {
            "pitfall_recall": self.recall_hits / self.recall_total if self.recall_total else None,
            "later_occurrences": self.recall_total,
            "stale_decision_rate": self.stale_blocks / self.blocks_with_decisions
            if self.blocks_with_decisions else 0.0,
            "blocks_with_decisions": self.blocks_with_decisions,
            "duplicate_rate_before_fusion": round(self.duplicate_rate_before, 4),
            "duplicate_rate": round(self.duplicate_rate_after, 4),
            "guidance_tokens_mean": round(statistics.fmean(self.tokens), 1) if self.tokens else 0.0,
            "guidance_tokens_p95": float(np.percentile(self.tokens, 95)) if self.tokens else 0.0,
            "guidance_tokens_max": max(self.tokens, default=0),
            "budget": budget,
            "guidance_ms_p50": round(1000 * statistics.median(self.seconds_guidance), 1)
            if self.seconds_guidance else 0.0,
            "conflicts_flagged": self.conflicts_flagged,
            "pitfall_updates": self.pitfalls,
        }


class Scenario:
    def __init__(self, h: Harness, tasks: list[Task], budget: int, naive: bool) -> None:
        self.h, self.tasks, self.budget, self.naive = h, tasks, budget, naive
        self.run = Run("naive" if naive else "clawvm")
        self.family_of: dict[str, set[str]] = {}  # memory id -> failure families it stands for
        self.fact_of: dict[str, int] = {}  # observation id -> fact
        self.current: dict[str, str] = {}  # subject -> text of its current value
        self.decision_ids: dict[str, str] = {}  # subject -> id of the decision the planner knows
        self.seen_families: set[str] = set()
        for agent in ("planner", "writer", "reviewer"):
            h.grant(TEAM, agent, write=True)

    def families(self, m: Memory) -> set[str]:
        found = set(self.family_of.get(m.id, ()))
        for p in m.metadata.get("provenance", []):
            found |= self.family_of.get(p["id"], set())
        return found

    def guidance(self, task: Task) -> tuple[list[Memory], int]:
        """The memories shown to the writer before ``task`` and the tokens of the block."""
        h = self.h
        if self.naive:
            kinds = [k.value for k in teams.TEAM_KINDS]
            hits = h.recall(task.text, k=30, track=False, team_id=TEAM, kind=kinds)
            shown, used = [], 0
            for hit in hits:
                cost = count_tokens(format_line(hit.memory))
                if used + cost <= self.budget:
                    shown.append(hit.memory)
                    used += cost
            return shown, used
        g = h.guidance("writer", task.text, self.budget, task_id=f"t{task.n}", task_type=task.type)
        found = h.store.get_many(g.ids)
        return [found[i] for i in g.ids if i in found], g.tokens

    def play(self) -> Run:
        h, run = self.h, self.run
        for task in self.tasks:
            h.flush()  # what was recorded is embedded by the next task (and runs are repeatable)
            started = time.perf_counter()
            shown, tokens = self.guidance(task)
            run.seconds_guidance.append(time.perf_counter() - started)
            run.tokens.append(tokens)
            self.score(task, shown)
            self.act(task)
            if not self.naive:
                report = merge_team(h, team_id=TEAM)
                run.conflicts_flagged += len(report.conflicts)
                run.pitfalls += len(report.knowledge)
        run.duplicate_rate_after = self.duplicate_rate()
        return run

    def score(self, task: Task, shown: list[Memory]) -> None:
        run = self.run
        warned = set().union(*(self.families(m) for m in shown)) if shown else set()
        for family in task.failures:
            if family in self.seen_families:
                run.recall_total += 1
                run.recall_hits += family in warned
        decisions = [m for m in shown if m.kind is Kind.DECISION]
        if decisions:
            run.blocks_with_decisions += 1
            current = set(self.current.values())
            run.stale_blocks += any(m.content not in current for m in decisions)

    def act(self, task: Task) -> None:
        h, tid = self.h, f"t{task.n}"
        for family in task.failures:
            phrasings = FAMILIES[family][1]
            text = phrasings[task.n % len(phrasings)].format(svc=task.svc)
            m = teams.record(h, text, agent_id="reviewer", team_id=TEAM, kind=Kind.ERROR, task_id=tid,
                             task_type=task.type)
            self.family_of[m.id] = {family}
            self.seen_families.add(family)
        if task.decision is not None:
            subject, value, unaware = task.decision
            text = SUBJECTS[subject][value]
            self.current[subject] = text
            known = self.decision_ids.get(subject)
            if known is None or unaware or self.naive:
                m = teams.record(h, text, agent_id="planner", team_id=TEAM, kind=Kind.DECISION, task_id=tid,
                                 subject=subject)
            else:
                m = teams.revise_with_retry(h, known, lambda _m, t=text: {"content": t}, agent_id="planner")
            self.decision_ids[subject] = m.id
        for fact, phrasing in task.observations:
            m = teams.record(h, FACTS[fact][phrasing], agent_id="writer", team_id=TEAM,
                             kind=Kind.OBSERVATION, task_id=tid)
            self.fact_of[m.id] = fact

    def duplicate_rate(self) -> float:
        facts = [self.fact_for(m) for m in self.h.iter_all(kind=Kind.OBSERVATION, team_id=TEAM)]
        labelled = [f for f in facts if f is not None]
        return (len(labelled) - len(set(labelled))) / len(labelled) if labelled else 0.0

    def fact_for(self, m: Memory) -> int | None:
        if m.id in self.fact_of:
            return self.fact_of[m.id]
        for p in m.metadata.get("provenance", []):
            if p["id"] in self.fact_of:
                return self.fact_of[p["id"]]
        return None


def play(tasks: list[Task], budget: int, naive: bool, embed: bool) -> Run:
    with Harness.open("memory://", embedder="default" if embed else None) as h:
        run = Scenario(h, tasks, budget, naive).play()
    if not naive:  # the rate before fusion: the same memories recorded without fusing
        with Harness.open("memory://", embedder=None) as h:
            unfused = Scenario(h, tasks, budget, naive=True)
            for task in tasks:
                unfused.act(task)
            run.duplicate_rate_before = unfused.duplicate_rate()
    else:
        run.duplicate_rate_before = run.duplicate_rate_after
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=60, help="how many tasks (default 60)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--budget", type=int, default=400, help="guidance budget in tokens (default 400)")
    ap.add_argument("--failure-rate", type=float, default=0.6)
    ap.add_argument("--unaware-rate", type=float, default=0.2)
    ap.add_argument("--no-embed", action="store_true", help="lexical only (no embedding model)")
    ap.add_argument("--json", dest="json_path", help="write results here")
    args = ap.parse_args()
    tasks = script(args.tasks, args.seed, args.failure_rate, args.unaware_rate)
    results: dict[str, Any] = {
        "tasks": args.tasks, "seed": args.seed, "embedder": None if args.no_embed else "all-MiniLM-L6-v2",
        "failure_occurrences": sum(len(t.failures) for t in tasks),
        "decision_changes": sum(t.decision is not None for t in tasks),
    }
    for naive in (False, True):
        started = time.perf_counter()
        run = play(tasks, args.budget, naive, not args.no_embed)
        results[run.name] = {**run.as_dict(args.budget), "seconds": round(time.perf_counter() - started, 1)}
    columns = ("pitfall_recall", "stale_rate", "dup_before", "dup_after", "tokens")
    print(f"{'':<8} " + " ".join(f"{c:>{w}}" for c, w in zip(columns, (14, 10, 10, 9, 7), strict=True)))
    for name in ("clawvm", "naive"):
        r = results[name]
        recall = "-" if r["pitfall_recall"] is None else f"{r['pitfall_recall']:.3f}"
        print(
            f"{name:<8} {recall:>14} {r['stale_decision_rate']:>10.3f}"
            f" {r['duplicate_rate_before_fusion']:>10.3f} {r['duplicate_rate']:>9.3f}"
            f" {r['guidance_tokens_mean']:>7.1f}"
        )
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
