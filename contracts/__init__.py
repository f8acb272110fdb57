"""The data every inferbus service and client agrees on: events, failure codes,
subjects, streams.

Imports msgspec and the standard library alone, so a client can vendor it.
"""

from .delivery import *  # noqa: F403
from .delivery import __all__ as _delivery_all
from .events import *  # noqa: F403
from .events import __all__ as _events_all
from .failures import *  # noqa: F403
from .failures import __all__ as _failures_all
from .generation import *  # noqa: F403
from .generation import __all__ as _generation_all
from .llmservice import *  # noqa: F403
from .llmservice import __all__ as _llmservice_all
from .replies import *  # noqa: F403
from .replies import __all__ as _replies_all
from .subjects import *  # noqa: F403
from .subjects import __all__ as _subjects_all

__all__ = [
    *_delivery_all,
    *_events_all,
    *_failures_all,
    *_generation_all,
    *_llmservice_all,
    *_replies_all,
    *_subjects_all,
]
