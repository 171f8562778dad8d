"""ClawVM: harness-managed memory for LLM agents."""

from clawvm.agents.agent import AgentWithMemory
from clawvm.core.embed import Embedder, MiniLMEmbedder, OpenAIEmbedder
from clawvm.core.errors import (
    AccessDeniedError,
    AuthenticationError,
    ClawVMError,
    ConfigError,
    ConflictError,
    CryptoError,
    EmbedderError,
    InvalidToolResultError,
    NotFoundError,
    RateLimitError,
    SchemaError,
    StoreError,
    TamperedError,
    ValidationError,
    WrongKeyError,
)
from clawvm.core.model import Cost, Filters, Kind, Link, LinkType, Memory, Scope, State, Status, Tier
from clawvm.core.redact import Redaction, RedactionPolicy, redact
from clawvm.core.version import __version__ as __version__
from clawvm.harness import Harness
from clawvm.recall.retrieval import PRESETS, RecallConfig, Recalled
from clawvm.store.crypto import DataKey, DataKeys

__all__ = [
    "PRESETS",
    "AccessDeniedError",
    "AgentWithMemory",
    "AuthenticationError",
    "ClawVMError",
    "ConfigError",
    "ConflictError",
    "Cost",
    "CryptoError",
    "DataKey",
    "DataKeys",
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
    "Status",
    "StoreError",
    "TamperedError",
    "Tier",
    "ValidationError",
    "WrongKeyError",
    "redact",
]
