"""Shared fixtures: every storage engine behind one parametrization, and one shared embedding model.

The engines themselves are listed in ``engines.py`` (add PostgreSQL there). ``engine`` yields a set-up
Store and ``harness`` an open Harness, once per engine; a test restricted to some engines is marked
``@pytest.mark.engines("sqlite", ...)``.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from pathlib import Path

import pytest

import clawvm
import pg_server
from clawvm import Harness
from clawvm.store import Store
from engines import ENGINES, harness_target, make_store


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "engines(*names): run an engine-parametrized test only on these engines"
    )


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A child process a failed test left stuck is killed: at exit, multiprocessing waits for every
    non-daemon child, so one stuck child held the whole run until CI's time ran out."""
    for child in multiprocessing.active_children():
        child.kill()
        child.join(timeout=5)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "engine_name" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("engines")
        names = ENGINES if marker is None else [n for n in ENGINES if n in marker.args]
        metafunc.parametrize("engine_name", names)


@pytest.fixture(scope="module", autouse=True)
def _postgres_database_per_module(request: pytest.FixtureRequest) -> Iterator[None]:
    """PostgreSQL stores made during a module live in one database, dropped when the module ends."""
    name = request.module.__name__
    pg_server.begin_module(name)
    yield
    pg_server.end_module(name)


@pytest.fixture(scope="session", autouse=True)
def _postgres_server() -> Iterator[None]:
    """The PostgreSQL server (started on first use, see pg_server.py) stops with the session."""
    yield
    pg_server.stop()


@pytest.fixture
def engine(engine_name: str, tmp_path: Path) -> Iterator[Store]:
    store = make_store(engine_name, tmp_path, "t.db")
    store.setup()
    try:
        yield store
    finally:
        store.close()


@pytest.fixture(scope="session")
def embedder() -> clawvm.MiniLMEmbedder:
    emb = clawvm.MiniLMEmbedder()
    emb.embed_query("warm up")  # load the model once, here, not inside a timed test
    return emb


@pytest.fixture
def harness(engine_name: str, tmp_path: Path, embedder: clawvm.MiniLMEmbedder) -> Iterator[Harness]:
    h = Harness.open(harness_target(engine_name, tmp_path), embedder=embedder)
    try:
        yield h
    finally:
        h.close()
