"""ClawVM: harness-managed memory for LLM agents."""

from clawvm.agents.agent import AgentWithMemory
from clawvm.agents.reliability import ReliabilityPolicy
from clawvm.core.embed import Embedder, MiniLMEmbedder, OpenAIEmbedder
from clawvm.core.errors import (
    AccessDeniedError,
    AuthenticationError,
    ClaimedError,
    ClawVMError,
    ConfigError,
    ConflictError,
    CryptoError,
    DimensionError,
    EmbedderError,
    InvalidToolResultError,
    NotFoundError,
    RateLimitError,
    SchemaError,
    StateConflictError,
    StoreError,
    TamperedError,
    UpstreamError,
    ValidationError,
    WrongKeyError,
)
from clawvm.core.model import Cost, Filters, Kind, Link, LinkType, Memory, Scope, State, Status, Tier
from clawvm.core.redact import Redaction, RedactionPolicy, redact
from clawvm.core.version import __version__ as __version__
from clawvm.harness import Harness
from clawvm.recall.retrieval import PRESETS, RecallConfig, Recalled
from clawvm.store.crypto import DataKey, DataKeys
from clawvm.vm.compress import ExtractiveSummarizer, LLMSummarizer, Summarizer
from clawvm.vm.context import Context, Quotas
from clawvm.vm.scoring import ScoringConfig
from clawvm.vm.tiers import PagerConfig, TierBudgets

__all__ = [
    "PRESETS",
    "AccessDeniedError",
    "AgentWithMemory",
    "AuthenticationError",
    "ClaimedError",
    "ClawVMError",
    "ConfigError",
    "ConflictError",
    "Context",
    "Cost",
    "CryptoError",
    "DataKey",
    "DataKeys",
    "DimensionError",
    "Embedder",
    "EmbedderError",
    "ExtractiveSummarizer",
    "Filters",
    "Harness",
    "InvalidToolResultError",
    "Kind",
    "LLMSummarizer",
    "Link",
    "LinkType",
    "Memory",
    "MiniLMEmbedder",
    "NotFoundError",
    "OpenAIEmbedder",
    "PagerConfig",
    "Quotas",
    "RateLimitError",
    "RecallConfig",
    "Recalled",
    "Redaction",
    "RedactionPolicy",
    "ReliabilityPolicy",
    "SchemaError",
    "Scope",
    "ScoringConfig",
    "State",
    "StateConflictError",
    "Status",
    "StoreError",
    "Summarizer",
    "TamperedError",
    "Tier",
    "TierBudgets",
    "UpstreamError",
    "ValidationError",
    "WrongKeyError",
    "redact",
]
