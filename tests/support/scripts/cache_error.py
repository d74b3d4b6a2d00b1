"""``rayform.Client(offline=True)`` on the cache directory of ``RAYFORM_CACHE_DIR``: prints the
type and message of the ``CacheError`` it raises (nothing if it raises none).

Usage: ``RAYFORM_CACHE_DIR=... python cache_error.py``.
"""

import rayform

if __name__ == "__main__":
    try:
        rayform.Client(offline=True)
    except rayform.CacheError as exc:
        print(type(exc).__name__, exc)
