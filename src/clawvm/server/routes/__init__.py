"""The API's routes, one module per resource, each an ``APIRouter`` named ``router`` (mounted by
:func:`clawvm.server.app.create_app`). Routes only call the library, through the caller's harness.

==================  =========================================================================
:mod:`.health`      ``/healthz``, ``/readyz`` (no key)
:mod:`.keys`        ``/v1/whoami``, ``/v1/keys``
:mod:`.memories`    ``/v1/memories...``, ``/v1/export``
:mod:`.recall`      ``/v1/recall``, ``/v1/context``
:mod:`.sessions`    ``/v1/sessions/...``, ``/v1/checkpoints/...``, ``/v1/tasks/...``, ``/v1/tick``
:mod:`.events`      ``/v1/events``, ``/v1/events/stream``, ``/v1/stats``
:mod:`.dashboard`   ``/dashboard`` (MemLens, :mod:`clawvm.dashboard`)
:mod:`.params`      the path parameters they share (``MemoryId``, ``ScopeId``)
==================  =========================================================================
"""
