"""What the client needs beside the network to resolve a slice from the cache: opening its
manifest (fetching and checking its pages) and, offline, the error that names the
``rayform pull`` which fetches what the cache lacks.

Private to the SDK; :class:`~rayform.Client` is its user. Opening a manifest needs both
:mod:`rayform.cache` and :mod:`rayform.manifest`; here, neither package imports the other for
it. Modules: ``_open`` (:func:`open_manifest`), ``_offline`` (:func:`missing_blobs`,
:func:`remembered`), ``_migrate`` (:func:`migrate_cache`, ``rayform cache migrate``).
"""

from rayform._resolve._migrate import CacheMigration, migrate_cache
from rayform._resolve._offline import missing_blobs, remembered
from rayform._resolve._open import PAGE_JOBS, open_manifest

__all__ = [
    "PAGE_JOBS",
    "CacheMigration",
    "migrate_cache",
    "missing_blobs",
    "open_manifest",
    "remembered",
]
