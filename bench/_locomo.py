"""Shared helpers for the benchmarks: a LoCoMo loader and an on-disk vector cache.

The LoCoMo data is read from a path given on the command line and never copied into the repository
(CC BY-NC 4.0, evaluation only). See ``../shared/data/locomo/README.md`` for the format and its quirks.

Evidence repair (README "Evidence quirks"): one evidence string may hold several ids (``"D8:6; D9:17"``);
an id may be malformed (``"D:11:26"`` -> ``"D11:26"``, ``"D30:05"`` -> ``"D30:5"``) or name no turn of the
conversation (``"D10:19"`` when session 10 ends at turn 16, or a bare ``"D"``). Multi-id strings are split,
malformed ids are normalised when the normalised id exists, and whatever still names no turn is dropped.
The counts are kept in :class:`EvidenceReport`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}

_SESSION = re.compile(r"session_(\d+)")
_ID = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")  # tolerant: "D:11:26", "D 3:4", "D30:05"
_SPLIT = re.compile(r"[;,\s]+(?=D)")


@dataclass(frozen=True)
class Turn:
    dia_id: str
    speaker: str
    text: str
    session: str  # "session_<n>"
    session_no: int
    index: int  # 0-based position inside the session
    date: datetime
    caption: str | None = None  # ``blip_caption``: what an image model saw in the photo the turn shared

    @property
    def content(self) -> str:
        return f"{self.speaker}: {self.text}"

    @property
    def recorded(self) -> str:
        """What an agent records for the turn: the line, plus the photo it shared as words when it has one
        (``"[shares a photo of a dog ...]"``, the way an agent with an image captioner would note it).
        The image ``query`` field is not used: it is how the dataset's authors found the image."""
        return f"{self.content} [shares {self.caption}]" if self.caption else self.content


@dataclass(frozen=True)
class QA:
    question: str
    answer: str
    category: int
    evidence: tuple[str, ...]  # repaired dia_ids, each naming a turn of the conversation
    raw_evidence: tuple[str, ...]


@dataclass
class Conversation:
    sample_id: str
    speakers: tuple[str, str]
    sessions: dict[str, list[Turn]]  # in session order
    dates: dict[str, datetime]
    qa: list[QA]

    @property
    def turns(self) -> list[Turn]:
        return [t for ts in self.sessions.values() for t in ts]


@dataclass
class EvidenceReport:
    strings: int = 0  # evidence strings seen
    clean: int = 0  # used as they were
    split: int = 0  # strings holding several ids, split
    split_ids: int = 0  # ids those strings yielded
    repaired: int = 0  # malformed ids normalised to an existing turn
    dropped: int = 0  # ids (or strings) naming no turn, dropped
    no_evidence_qa: int = 0  # QA items left with no evidence at all (excluded from recall metrics)
    details: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "strings": self.strings, "clean": self.clean, "split": self.split, "split_ids": self.split_ids,
            "repaired": self.repaired, "dropped": self.dropped, "no_evidence_qa": self.no_evidence_qa,
            "details": self.details,
        }

    def summary(self) -> str:
        return (
            f"evidence strings {self.strings}: clean {self.clean}, "
            f"split {self.split} (into {self.split_ids} ids), "
            f"repaired {self.repaired}, dropped {self.dropped}; QA items with no usable evidence: "
            f"{self.no_evidence_qa}"
        )


def parse_date(text: str) -> datetime:
    """``"1:56 pm on 8 May, 2023"`` -> aware UTC datetime (LoCoMo dates carry no zone)."""
    cleaned = " ".join(text.replace(",", ", ").split()).replace(" ,", ",")
    for fmt in ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%I:%M%p on %d %B, %Y"):
        try:
            return datetime.strptime(cleaned, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    raise ValueError(f"unparseable LoCoMo date {text!r}")


def _repair(raw: str, known: set[str], report: EvidenceReport, where: str) -> list[str]:
    report.strings += 1
    raw = raw.strip()
    if raw in known:
        report.clean += 1
        return [raw]
    parts = [p.strip(" ;,") for p in _SPLIT.split(raw) if p.strip(" ;,")]
    if len(parts) > 1:
        report.split += 1
        report.split_ids += len(parts)
        report.details.append(f"{where}: split {raw!r} -> {parts}")
    out: list[str] = []
    for part in parts:
        if part in known:
            out.append(part)
            continue
        m = _ID.fullmatch(part)
        fixed = f"D{int(m.group(1))}:{int(m.group(2))}" if m else None
        if fixed is not None and fixed in known:
            report.repaired += 1
            report.details.append(f"{where}: repaired {part!r} -> {fixed!r}")
            out.append(fixed)
        else:
            report.dropped += 1
            report.details.append(f"{where}: dropped {part!r} (no such turn)")
    if not parts:
        report.dropped += 1
        report.details.append(f"{where}: dropped empty evidence string")
    return out


def load(path: str | Path) -> tuple[list[Conversation], EvidenceReport]:
    """Parse LoCoMo JSON into conversations with repaired evidence, plus the repair counts."""
    with open(path, encoding="utf-8") as fh:
        samples = json.load(fh)
    report = EvidenceReport()
    convs: list[Conversation] = []
    for sample in samples:
        conv = sample["conversation"]
        numbers = sorted(int(m.group(1)) for k in conv if (m := _SESSION.fullmatch(k)))
        sessions: dict[str, list[Turn]] = {}
        dates: dict[str, datetime] = {}
        for n in numbers:
            key = f"session_{n}"
            turns = conv[key]
            if not turns:
                continue
            date = parse_date(conv[f"{key}_date_time"])
            dates[key] = date
            sessions[key] = [
                Turn(t["dia_id"].strip(), t["speaker"], t["text"], key, n, i, date,
                     (t.get("blip_caption") or "").strip() or None)
                for i, t in enumerate(turns)
            ]
        known = {t.dia_id for ts in sessions.values() for t in ts}
        qa: list[QA] = []
        for i, item in enumerate(sample["qa"]):
            ev: list[str] = []
            for raw in item.get("evidence", []):
                for e in _repair(str(raw), known, report, f"{sample['sample_id']} qa#{i}"):
                    if e not in ev:
                        ev.append(e)
            if not ev:
                report.no_evidence_qa += 1
            answer = item.get("answer", item.get("adversarial_answer", ""))
            qa.append(QA(item["question"], str(answer), int(item["category"]), tuple(ev),
                         tuple(str(r) for r in item.get("evidence", []))))
        convs.append(
            Conversation(sample["sample_id"], (conv["speaker_a"], conv["speaker_b"]), sessions, dates, qa)
        )
    return convs, report


# ---- on-disk vector cache (outside the repository) -------------------------------------------------
def cache_dir() -> Path:
    base = os.environ.get("CLAWVM_BENCH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "clawvm-bench"
    )
    return Path(base)


class VectorCache:
    """Vectors keyed by sha1(model, mode, text), stored as append-only ``.npz`` shards per model.

    ``mode`` separates batch ("doc") embeddings from one-at-a-time ``embed_query`` ones: the int8 model
    quantises activations per batch, so the same text can differ in the last digits between the two.
    Computed vectors are written to a new shard every 8192 vectors and at :meth:`save`.
    """

    def __init__(self, model: str, dim: int, root: Path | None = None) -> None:
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", model)
        self.dir = (root or cache_dir()) / safe
        self.dim = dim
        self.model = model
        self._blocks: list[np.ndarray] = []
        self._row: dict[bytes, tuple[int, int]] = {}  # key -> (block, row)
        self._pending_keys: list[bytes] = []
        self._pending_vecs: list[np.ndarray] = []
        self.hits = 0
        self.misses = 0
        self._load()

    def _load(self) -> None:
        if not self.dir.exists():
            return
        for shard in sorted(self.dir.glob("shard-*.npz")):
            try:
                with np.load(shard) as z:
                    keys, vecs = z["keys"], z["vecs"]
            except (OSError, ValueError, KeyError):
                continue  # a torn or foreign file: ignore it
            if vecs.ndim != 2 or vecs.shape[1] != self.dim or keys.shape != (len(vecs), 20):
                continue
            b = len(self._blocks)
            self._blocks.append(vecs.astype(np.float32, copy=False))
            for j, k in enumerate(keys):
                self._row[k.tobytes()] = (b, j)

    def key(self, text: str, mode: str) -> bytes:
        return hashlib.sha1(f"{self.model}\0{mode}\0{text}".encode()).digest()

    def __len__(self) -> int:
        return len(self._row)

    def _add(self, keys: list[bytes], vecs: np.ndarray) -> None:
        b = len(self._blocks)
        self._blocks.append(vecs)
        for j, k in enumerate(keys):
            self._row[k] = (b, j)
        self._pending_keys.extend(keys)
        self._pending_vecs.append(vecs)
        if len(self._pending_keys) >= 8192:
            self.save()  # keep progress if a long run is interrupted

    def get_or_compute(
        self, texts: Sequence[str], compute: Callable[[list[str]], np.ndarray], mode: str = "doc",
        chunk: int = 2048, progress: Callable[[int, int], None] | None = None,
    ) -> np.ndarray:
        """Vectors for ``texts`` (rows in order), computing the missing ones with ``compute`` in chunks."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        missing: dict[bytes, list[int]] = {}
        missing_text: dict[bytes, str] = {}
        for i, t in enumerate(texts):
            k = self.key(t, mode)
            where = self._row.get(k)
            if where is not None:
                out[i] = self._blocks[where[0]][where[1]]
                self.hits += 1
            else:
                missing.setdefault(k, []).append(i)
                missing_text[k] = t
        keys = list(missing)
        self.misses += sum(len(v) for v in missing.values())
        done = 0
        for start in range(0, len(keys), chunk):
            part = keys[start : start + chunk]
            vecs = np.asarray(compute([missing_text[k] for k in part]), dtype=np.float32)
            vecs = vecs.reshape(-1, self.dim)
            for k, v in zip(part, vecs, strict=True):
                out[missing[k]] = v
            self._add(part, vecs)
            done += len(part)
            if progress is not None:
                progress(done, len(keys))
        return out

    def save(self) -> None:
        if not self._pending_keys:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        vecs = np.concatenate(self._pending_vecs)
        keys = np.frombuffer(b"".join(self._pending_keys), dtype=np.uint8).reshape(-1, 20)
        name = f"shard-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S%f')}-{os.getpid()}"
        tmp = self.dir / f"{name}.tmp"
        with open(tmp, "wb") as fh:
            np.savez(fh, keys=keys, vecs=vecs)
        tmp.rename(self.dir / f"{name}.npz")
        self._pending_keys, self._pending_vecs = [], []

    def describe(self) -> str:
        total = self.hits + self.misses
        if total == 0:
            return "cache not used"
        if self.misses == 0:
            return f"all {total} vectors from cache ({self.dir})"
        return f"{self.hits}/{total} vectors from cache, {self.misses} computed and stored in {self.dir}"


def source_state() -> dict[str, object]:
    """The commit and uncommitted ``src/`` files the numbers were measured on (src moves between runs)."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"commit": git("rev-parse", "--short", "HEAD").strip(),
            "dirty_src": git("status", "--porcelain", "--", "src").split("\n")[:-1]}
