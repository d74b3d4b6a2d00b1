"""The HTTP side of the client: transport with retries and stall bounds, the checks of what a
server answers, parallel pulls and the per-process fetch log.

Private to the SDK; :class:`~rayform.Client` is its user. Modules: ``_transport`` (httpx, Range
resume, redirects to a store), ``_retry`` (the retry policy, on tenacity), ``_pace`` (the
stall bound and the minimum rate), ``_deadline`` (socket reads that end by a deadline),
``_outage`` (one store's stall ends the other fetches of it on this host), ``_reference``
(checks of slice references and listings), ``_blob_urls`` (presigned URLs of many blobs in one
request), ``_pull`` (``rayform pull``), ``_progress`` (its bar), ``_fetchlog`` (counts and
logs).
"""

from rayform._net._blob_urls import BlobUrls
from rayform._net._fetchlog import FetchCounts, FetchLog, fetch_log, mark_ahead
from rayform._net._outage import Outages
from rayform._net._progress import bar_size_options
from rayform._net._pull import PullReport, run_pull
from rayform._net._reference import LISTING_CAP, REFERENCE_CAP, check_listing, check_reference
from rayform._net._retry import RetryableError, RetryPolicy, Side, run_with_retries
from rayform._net._transport import ERROR_BODY_CAP, JSON_CAP, Transport

__all__ = [
    "ERROR_BODY_CAP",
    "JSON_CAP",
    "LISTING_CAP",
    "BlobUrls",
    "Outages",
    "REFERENCE_CAP",
    "FetchCounts",
    "FetchLog",
    "PullReport",
    "RetryPolicy",
    "RetryableError",
    "Side",
    "Transport",
    "bar_size_options",
    "check_listing",
    "check_reference",
    "fetch_log",
    "mark_ahead",
    "run_pull",
    "run_with_retries",
]
