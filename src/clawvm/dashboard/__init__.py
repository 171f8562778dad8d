"""MemLens dashboard: a FastAPI router (:func:`create_router`) serving static HTML/JS/CSS and a JSON API
over :mod:`clawvm.observe.lens`. Needs the ``server`` extra (fastapi)."""

from clawvm.dashboard.routes import create_router, lens_for

__all__ = ["create_router", "lens_for"]
