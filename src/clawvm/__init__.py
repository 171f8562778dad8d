"""ClawVM: harness-managed memory for LLM agents."""

from .embed import Embedder, MiniLMEmbedder, OpenAIEmbedder
from .errors import (
    ClawVMError,
    ConfigError,
    ConflictError,
    EmbedderError,
    NotFoundError,
    SchemaError,
    StoreError,
    ValidationError,
)
from .harness import Harness
from .model import Cost, Filters, Kind, Link, LinkType, Memory, State, Status, Tier
from .retrieval import PRESETS, RecallConfig, Recalled

__all__ = [
    "PRESETS",
    "ClawVMError",
    "ConfigError",
    "ConflictError",
    "Cost",
    "Embedder",
    "EmbedderError",
    "Filters",
    "Harness",
    "Kind",
    "Link",
    "LinkType",
    "Memory",
    "MiniLMEmbedder",
    "NotFoundError",
    "OpenAIEmbedder",
    "RecallConfig",
    "Recalled",
    "SchemaError",
    "State",
    "Status",
    "StoreError",
    "Tier",
    "ValidationError",
]
__version__ = "0.1.0"
