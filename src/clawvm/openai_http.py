"""The one HTTP call ClawVM makes to an OpenAI-compatible endpoint (embeddings, chat completions).

Kept in one place so timeouts, auth and JSON handling are the same everywhere; callers map failures
(any exception listed in ``FAILURES``) to their own error class.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
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
