"""Cold start: import a team's seed knowledge and rule templates from a YAML or JSON file.

Schema (version 1; every key not listed here is an error, so typos fail loudly)::

    version: 1                  # optional; only 1 exists
    team: payments              # optional: the team of every entry that names none
    memories:                   # optional list of memories
      - kind: knowledge         # required: observation | decision | error | knowledge
        content: "Refunds over 500 EUR need a second approval."   # required, non-empty text
        scope: team             # private | team | task; default: team when a team is known, else none
                                # (no scope = every agent of the tenant reads it)
        team: payments          # default: the file's team
        agent: planner          # whose memory it is (required for private scope)
        task: t-1               # the task it belongs to (required for task scope)
        task_type: refund       # guidance for later tasks of this type finds it
        subject: refund approval  # what a decision/knowledge is about (conflict detection)
        tags: [billing]         # list of strings
        confidence: 0.9         # 0..1, default 1.0; under 0.5 it waits in the review queue
    rules:                      # optional list of rule templates
      - guidance: "Run the database migrations before deploying."   # required text
        task_type: deploy       # added to guidance when the task's type is this ...
        keywords: [migration]   # ... or when the task text contains one of these (at least one of the two)
        team: payments          # scope, team, agent, task, tags, confidence: as for memories
        confidence: 1.0

A rule becomes a KNOWLEDGE memory tagged ``rule`` (its match in ``metadata.rule``); guidance lists the
rules matching a task first (:func:`clawvm.teams.guidance.matching_rules`).

Everything is validated before anything is written, and written in one atomic batch: a bad file imports
nothing. Errors are :class:`ValidationError` whose ``field`` names the file, the line and the field, e.g.
``seed.yaml:12: memories[3].confidence``. Ids are derived from each entry's content and scope, so
importing the same file twice adds nothing.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from clawvm.core.embed import count_tokens
from clawvm.core.errors import ValidationError
from clawvm.core.model import Kind, Memory, Scope, Tier, build_memory
from clawvm.teams.shared import RULE_TAG, TEAM_KINDS, check_scope, task_type_tag
from clawvm.vm.tiers import Pager
from clawvm.write.commit import Host


class SeedHost(Host, Protocol):
    """Seeding imports memories through the harness (so they are redacted and embedded like any write)."""

    @property
    def pager(self) -> Pager: ...

    def import_memories(self, memories: Sequence[Memory]) -> int: ...


_NAMESPACE = uuid.UUID("a4be4b2e-7f2c-4c55-8d0b-7a2f2b9c1e64")
_TOP = {"version", "team", "memories", "rules"}
_COMMON = {"scope", "team", "agent", "task", "tags", "confidence", "task_type", "subject"}
_MEMORY_KEYS = _COMMON | {"kind", "content"}
_RULE_KEYS = _COMMON | {"guidance", "keywords"}
_FIELD_NAMES = {"agent_id": "agent", "team_id": "team", "task_id": "task"}  # Memory field -> seed key


@dataclass(frozen=True)
class SeedReport:
    memories: int  # memory entries in the file
    rules: int  # rule entries in the file
    imported: int  # written now (the rest were already present)


class _Lines:
    """Line numbers of the parsed document's nodes, by path (``("memories", 3, "confidence")``)."""

    def __init__(self, text: str) -> None:
        try:
            self.root: yaml.Node | None = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError:  # JSON that YAML cannot read (rare): lines of the entries are unknown
            self.root = None

    def first_duplicate(self) -> tuple[tuple[str | int, ...], str] | None:
        """The first key written twice in one mapping (its path, and the key): YAML keeps the last one
        silently, so a second ``content:`` would replace the first unseen."""
        stack: list[tuple[yaml.Node | None, tuple[str | int, ...]]] = [(self.root, ())]
        while stack:
            node, path = stack.pop(0)
            if isinstance(node, yaml.MappingNode):
                seen: set[str] = set()
                for key, value in node.value:
                    if isinstance(key, yaml.ScalarNode):
                        if key.value in seen:
                            return path, key.value
                        seen.add(key.value)
                        stack.append((value, (*path, key.value)))
            elif isinstance(node, yaml.SequenceNode):
                stack.extend((child, (*path, i)) for i, child in enumerate(node.value))
        return None

    def line(self, path: tuple[str | int, ...]) -> int:
        node, best = self.root, 1
        for step in path:
            if node is None:
                break
            best = node.start_mark.line + 1
            node = self._child(node, step)
        return best if node is None else node.start_mark.line + 1

    @staticmethod
    def _child(node: yaml.Node, step: str | int) -> yaml.Node | None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == step:
                    return value  # type: ignore[no-any-return]
        if isinstance(node, yaml.SequenceNode) and isinstance(step, int) and step < len(node.value):
            return node.value[step]  # type: ignore[no-any-return]
        return None


class _Seed:
    def __init__(self, path: Path, text: str, tenant: str) -> None:
        self.path = path
        self.lines = _Lines(text)
        self.tenant = tenant

    def fail(self, where: tuple[str | int, ...], problem: str, fix: str) -> ValidationError:
        dotted = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in where).lstrip(".") or "file"
        return ValidationError(f"{self.path}:{self.lines.line(where)}: {dotted}", problem, fix)

    def text(
        self, entry: dict[str, Any], key: str, where: tuple[str | int, ...], required: bool
    ) -> str | None:
        v = entry.get(key)
        if v is None:
            if required:
                raise self.fail(where, f"has no {key!r}", f"add {key}: ...")
            return None
        if not isinstance(v, str) or not v.strip():
            raise self.fail((*where, key), f"is {v!r}", "write a non-empty string")
        return v.strip()

    def confidence(self, entry: dict[str, Any], where: tuple[str | int, ...]) -> float:
        v = entry.get("confidence", 1.0)
        # YAML reads ``yes``/``true`` as a boolean, which a number field would otherwise take as 1.0
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.fail((*where, "confidence"), f"is {v!r}", "write a number from 0 to 1")
        return float(v)

    def memory(
        self, entry: Any, where: tuple[str | int, ...], team: str | None, known: set[str], rule: bool
    ) -> Memory:
        if not isinstance(entry, dict):
            raise self.fail(where, f"is a {type(entry).__name__}", "write a mapping of fields")
        for key in entry:
            if key not in known:
                raise self.fail((*where, str(key)), "is not a known field", f"use one of {sorted(known)}")
        kind: Any = Kind.KNOWLEDGE
        if not rule:
            kind = self.text(entry, "kind", where, True)
            if kind not in {k.value for k in TEAM_KINDS}:
                kinds = [k.value for k in TEAM_KINDS]
                raise self.fail((*where, "kind"), f"is {kind!r}", f"use one of {kinds}")
        content = self.text(entry, "guidance" if rule else "content", where, True)
        team = self.text(entry, "team", where, False) or team
        scope = self.text(entry, "scope", where, False) or ("team" if team else None)
        tags = entry.get("tags", [])
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise self.fail((*where, "tags"), f"is {tags!r}", "write a list of strings")
        tags = list(tags)
        metadata: dict[str, Any] = {"seed": {"file": self.path.name, "line": self.lines.line(where)}}
        task_type = self.text(entry, "task_type", where, False)
        subject = self.text(entry, "subject", where, False)
        if subject:
            metadata["subject"] = subject
        if rule:
            keywords = entry.get("keywords", [])
            if not isinstance(keywords, list) or not all(isinstance(k, str) and k.strip() for k in keywords):
                raise self.fail((*where, "keywords"), f"is {keywords!r}", "write a list of non-empty strings")
            if not task_type and not keywords:
                raise self.fail(where, "matches no task", "add task_type: ... or keywords: [...]")
            metadata["rule"] = {
                "task_type": task_type.lower() if task_type else None,
                "keywords": [k.strip().lower() for k in keywords],
            }
            tags.append(RULE_TAG)
        elif task_type:
            tags.append(task_type_tag(task_type))
            metadata["task_type"] = task_type
        fields: dict[str, Any] = {
            "content": content,
            "kind": kind,
            "tenant": self.tenant,
            "scope": scope,
            "team_id": team,
            "agent_id": self.text(entry, "agent", where, False),
            "task_id": self.text(entry, "task", where, False),
            "tags": tags,
            "confidence": self.confidence(entry, where),
            "tier": Tier.LONG_TERM,
            "metadata": metadata,
        }
        if scope not in (None, *(s.value for s in Scope)):
            raise self.fail((*where, "scope"), f"is {scope!r}", f"use one of {[s.value for s in Scope]}")
        identity = json.dumps(
            [self.tenant, kind, scope, team, fields["agent_id"], fields["task_id"], content]
        )
        fields["id"] = str(uuid.uuid5(_NAMESPACE, identity))
        try:
            m = build_memory(fields)
            check_scope(m)
        except ValidationError as exc:
            name = exc.field.split(".")[0]
            key = _FIELD_NAMES.get(name, name)
            raise self.fail((*where, key), exc.problem, exc.fix) from None
        return m.model_copy(update={"token_count": count_tokens(m.content)})


@dataclass(frozen=True)
class ParsedSeed:
    """A seed file validated into memories (nothing written yet), and how many entries each section had
    (an entry written twice is one memory)."""

    memories: list[Memory]
    memory_entries: int
    rule_entries: int


def parse(path: str | Path, *, tenant: str = "default") -> ParsedSeed:
    """Validate a seed file into memories; nothing is written."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValidationError(
            f"{path}:1: file", f"cannot be read ({exc})", "pass a UTF-8 YAML or JSON file"
        ) from None
    doc = _load(path, text)
    seed = _Seed(path, text, tenant)
    if (duplicate := seed.lines.first_duplicate()) is not None:
        where, key = duplicate
        raise seed.fail((*where, key), "is written twice in one mapping", "keep one (YAML reads the last)")
    if not isinstance(doc, dict):
        raise seed.fail((), f"is a {type(doc).__name__}", "write a mapping with memories: and/or rules:")
    for key in doc:
        if key not in _TOP:
            raise seed.fail((str(key),), "is not a known section", f"use one of {sorted(_TOP)}")
    if doc.get("version", 1) != 1:
        raise seed.fail(("version",), f"is {doc.get('version')!r}", "use version: 1")
    team = seed.text(doc, "team", (), False)
    out: dict[str, Memory] = {}
    counts = {}
    for section, known, rule in (("memories", _MEMORY_KEYS, False), ("rules", _RULE_KEYS, True)):
        entries = doc.get(section)
        entries = [] if entries is None else entries  # an empty mapping is an error, not "no entries"
        if not isinstance(entries, list):
            raise seed.fail((section,), f"is a {type(entries).__name__}", "write a list of entries")
        counts[section] = len(entries)
        for n, entry in enumerate(entries):
            m = seed.memory(entry, (section, n), team, known, rule)
            out.setdefault(m.id, m)  # the same entry twice is one memory
    return ParsedSeed(list(out.values()), counts["memories"], counts["rules"])


def _load(path: Path, text: str) -> Any:
    suffix = path.suffix.lower()
    if suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            where = f"{path}:{exc.lineno}: file"
            raise ValidationError(where, f"is not valid JSON ({exc.msg})", "fix it") from None
    if suffix in (".yaml", ".yml"):
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = mark.line + 1 if mark is not None else 1
            problem = getattr(exc, "problem", None) or str(exc)
            where = f"{path}:{line}: file"
            raise ValidationError(where, f"is not valid YAML ({problem})", "fix it") from None
    raise ValidationError(f"{path}:1: file", f"has suffix {suffix!r}", "name it .yaml, .yml or .json")


def import_seed(h: SeedHost, path: str | Path) -> SeedReport:
    """Validate ``path`` and import it in one atomic batch (see the module docstring)."""
    parsed = parse(path, tenant=h.tenant)
    now = h.now()
    stamped = []
    for m in parsed.memories:
        m = m.model_copy(update={"created_at": now})
        stamped.append(m.model_copy(update={"value": h.pager.value_now(m, now)}))
    imported = h.import_memories(stamped)
    return SeedReport(memories=parsed.memory_entries, rules=parsed.rule_entries, imported=imported)
