"""ClawVM: harness-managed memory for LLM agents."""

from .agent import AgentWithMemory
from .crypto import DataKey, DataKeys
from .embed import Embedder, MiniLMEmbedder, OpenAIEmbedder
from .errors import (
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
from .harness import Harness
from .model import Cost, Filters, Kind, Link, LinkType, Memory, Scope, State, Status, Tier
from .redact import Redaction, RedactionPolicy, redact
from .retrieval import PRESETS, RecallConfig, Recalled

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
__version__ = "0.1.0"
