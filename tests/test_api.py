"""The public API is pinned: adding or removing a name from ``clawvm.__all__`` is a deliberate change."""

from __future__ import annotations

import importlib
from importlib import resources

import clawvm

PUBLIC = [
    # the config types users pass to Harness.open, context() and tool_reliability()
    "Context",
    "ExtractiveSummarizer",
    "LLMSummarizer",
    "PagerConfig",
    "Quotas",
    "ReliabilityPolicy",
    "ScoringConfig",
    "Summarizer",
    "TierBudgets",
    "PRESETS",
    "AccessDeniedError",
    "AgentWithMemory",
    "AuthenticationError",
    "ClaimedError",
    "ClawVMError",
    "ConfigError",
    "ConflictError",
    "Cost",
    "CryptoError",
    "DataKey",
    "DataKeys",
    "DimensionError",
    "Embedder",
    "EmbedderError",
    "Filters",
    "Harness",
    "InvalidToolResultError",
    "Kind",
    "Link",
    "LinkType",
    "Memory",
    "MiniLMEmbedder",
    "NotFoundError",
    "OpenAIEmbedder",
    "RateLimitError",
    "RecallConfig",
    "Recalled",
    "Redaction",
    "RedactionPolicy",
    "SchemaError",
    "Scope",
    "State",
    "StateConflictError",
    "Status",
    "StoreError",
    "TamperedError",
    "UpstreamError",
    "Tier",
    "ValidationError",
    "WrongKeyError",
    "redact",
]


def test_all_is_pinned() -> None:
    assert sorted(clawvm.__all__) == sorted(PUBLIC)
    assert len(clawvm.__all__) == len(set(clawvm.__all__))


def test_every_public_name_is_importable() -> None:
    module = importlib.import_module("clawvm")
    for name in clawvm.__all__:
        assert getattr(module, name) is not None
        namespace: dict[str, object] = {}
        exec(f"from clawvm import {name}", namespace)
        assert namespace[name] is getattr(module, name)


def test_errors_form_one_tree() -> None:
    for name in (
        "ConfigError",
        "ConflictError",
        "EmbedderError",
        "NotFoundError",
        "SchemaError",
        "StoreError",
        "ValidationError",
    ):
        assert issubclass(getattr(clawvm, name), clawvm.ClawVMError)
    assert issubclass(clawvm.SchemaError, clawvm.StoreError)


def test_package_is_typed() -> None:
    marker = resources.files("clawvm").joinpath("py.typed")
    assert marker.is_file()
    assert isinstance(clawvm.__version__, str) and clawvm.__version__


def test_py_typed_ships_in_built_distributions() -> None:
    import tomllib
    from pathlib import Path

    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    config = tomllib.loads(pyproject.read_text())
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["clawvm"]
