"""The harness: the one object callers use (:class:`Harness`, in :mod:`.facade`), with the parts of its
work that stand on their own in modules beside it (:mod:`.importing`)."""

from clawvm.harness.facade import Harness
from clawvm.harness.importing import Imported

__all__ = ["Harness", "Imported"]
