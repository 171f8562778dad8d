"""Shared fixtures: every storage engine behind one parametrization, and one shared embedding model.

The engines themselves are listed in ``engines.py`` (add PostgreSQL there). ``engine`` yields a set-up
Store and ``harness`` an open Harness, once per engine; a test restricted to some engines is marked
``@pytest.mark.engines("sqlite", ...)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import clawvm
from clawvm import Harness
from clawvm.store import Store
from engines import ENGINES, harness_target, make_store


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "engines(*names): run an engine-parametrized test only on these engines"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "engine_name" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("engines")
        names = ENGINES if marker is None else [n for n in ENGINES if n in marker.args]
        metafunc.parametrize("engine_name", names)


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
