"""The local, content-addressed cache a whole cluster can share (docs/cache.md, docs/team.md).

The public face of the cache package: :class:`Cache` (``_store``) and what the client and the
dataset use of its parts: eviction under a byte limit (``_evict``), the modes of a team cache
(``_sharing``), reading a blob that may vanish meanwhile (``_reread``). The other modules are
the cache's own: partial downloads (``_partial``), download claims, the one lock per blob
(``_claims``), pins across nodes (``_pinmarks``), the ledger of the processes that use the
cache and their byte counts (``_live``), and the one liveness rule for every file another
process or node leaves (``_liveness``).
"""

from rayform.cache._evict import Evictor, EvictReport, Pins, check_fits, evict_lru
from rayform.cache._live import lease
from rayform.cache._liveness import HOST
from rayform.cache._pinmarks import Pinned, pinned
from rayform.cache._reread import read_blob
from rayform.cache._sharing import CacheModes, shared_mode
from rayform.cache._store import Cache, CacheEntry, VerifyReport

__all__ = [
    "HOST",
    "Cache",
    "CacheEntry",
    "CacheModes",
    "EvictReport",
    "Evictor",
    "Pinned",
    "Pins",
    "VerifyReport",
    "check_fits",
    "evict_lru",
    "lease",
    "pinned",
    "read_blob",
    "shared_mode",
]
