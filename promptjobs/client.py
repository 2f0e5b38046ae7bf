"""`promptjobs.client`, as it was: the client now installs alone as `promptjobs-client`
(clients/python/, importable as `promptjobs_client`); this name re-exports it."""

from promptjobs_client import *  # noqa: F403
from promptjobs_client import __all__ as __all__
