"""The one HTTP call ClawVM makes to an OpenAI-compatible endpoint (embeddings, chat completions).

Kept in one place so timeouts, auth and JSON handling are the same everywhere; callers map failures
(any exception listed in ``FAILURES``) to their own error class. :class:`ChatEndpoint` is the one
single-prompt chat call the optional LLM helpers (summarizer, synthesizer) share.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

FAILURES = (urllib.error.URLError, OSError, KeyError, IndexError, ValueError, TypeError)


def post_json(base_url: str, path: str, payload: dict[str, Any], api_key: str, timeout_s: float) -> Any:
    """POST ``payload`` as JSON to ``base_url`` + ``path`` and return the decoded JSON reply."""
    req = urllib.request.Request(
        base_url.rstrip("/") + path,
        data=json.dumps(payload).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"},
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())


@dataclass(frozen=True)
class ChatEndpoint:
    """An OpenAI-compatible ``/chat/completions`` endpoint asked one prompt at a time."""

    base_url: str
    model: str
    api_key: str = ""
    timeout_s: float = 30.0

    def complete(self, prompt: str) -> str:
        """The model's reply to ``prompt`` (one user message, temperature 0), stripped.

        Raises one of ``FAILURES`` when the endpoint fails or answers in another shape."""
        request = {"model": self.model, "messages": [{"role": "user", "content": prompt}], "temperature": 0}
        payload = post_json(self.base_url, "/chat/completions", request, self.api_key, self.timeout_s)
        return str(payload["choices"][0]["message"]["content"]).strip()
