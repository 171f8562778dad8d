"""Path parameters shared by the routes: bounded, so a path cannot carry an unbounded id to the store."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path

MemoryId = Annotated[str, Path(min_length=1, max_length=100, description="a memory id")]
ScopeId = Annotated[str, Path(min_length=1, max_length=256)]  # a session or task id
