"""kiln.guards: guard records become one fast check per cache entry; caches per code object.

See the package README for the contract with capture (the guard records) and the
frontend (lookup, insert, the recompile limit).
"""

from kiln.guards import stamps
from kiln.guards.__about__ import __version__
from kiln.guards.cache import CacheEntry, CodeCache, cache_for, reset
from kiln.guards.check import GuardCheck, build_check
from kiln.guards.config import GuardsConfig, config
from kiln.guards.errors import GuardsError, RecompileLimitExceeded, UnsupportedGuard

__all__ = [
    "CacheEntry",
    "CodeCache",
    "GuardCheck",
    "GuardsConfig",
    "GuardsError",
    "RecompileLimitExceeded",
    "UnsupportedGuard",
    "__version__",
    "build_check",
    "cache_for",
    "config",
    "reset",
    "stamps",
]
