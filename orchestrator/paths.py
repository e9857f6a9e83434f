"""Where the orchestrator keeps files of its own on this machine: the per-user cache (built
environments, compiled simulator, dry runs) and the per-user data folder (the default SQLite
store, run state, device profiles). Standard library and platformdirs only: every layer may
import it; platformdirs is imported when asked, so importing this module costs nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

APP = "orchestrator"
CACHE_ENV = "ORCH_CACHE_DIR"


def cache_root() -> Path:
    """The per-user cache (``ORCH_CACHE_DIR`` overrides, e.g. in CI)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir(APP))


def data_root() -> Path:
    """The per-user data folder (each user of it has its own override: ``ORCH_DATABASE_URL``,
    ``ORCH_STATE_DIR``, ``ORCH_PROFILES_DIR``)."""
    from platformdirs import user_data_dir

    return Path(user_data_dir(APP))
