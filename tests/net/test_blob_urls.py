"""Download URLs asked for many blobs at once (``rayform._net.BlobUrls``), against a fake post.

The real server and object store are in ``tests/server/test_s3.py``; here, what the book does
with each kind of answer: one request for what was announced, threads that wait for a request
already on its way, and every answer it must not trust or cannot use sending downloads back to
the blob path.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from rayform._net import BlobUrls, RetryableError
from rayform.errors import InvalidArgumentError

SLICE = "slc_7c1e04aa"
H = [f"{i:064x}" for i in range(1, 600)]


class FakeServer:
    """Answers like the stub with an S3 backend, and records what was asked."""

    def __init__(self, expires_in: int = 900) -> None:
        self.expires_in = expires_in
        self.asked: list[list[str]] = []
        self.answer: Any = None  # when set, returned as it is
        self.error: Exception | None = None
        self.delay_s = 0.0

    def post(self, path: str, doc: dict[str, Any]) -> Any:
        assert path == f"v1/slices/{SLICE}/blob-urls"
        self.asked.append(list(doc["hashes"]))
        time.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        if self.answer is not None:
            return self.answer
        urls = {h: f"http://store.test/b/{h}?X-Amz-Signature=s" for h in doc["hashes"]}
        return {"urls": urls, "expires_in": self.expires_in}


def test_one_request_serves_every_announced_blob() -> None:
    server = FakeServer()
    book = BlobUrls(server.post)
    book.expect(SLICE, H[:10])
    assert book.url(SLICE, H[3]) == f"http://store.test/b/{H[3]}?X-Amz-Signature=s"
    assert server.asked == [[H[3], *H[:3], *H[4:10]]], "the one needed now first"
    assert [book.url(SLICE, h) for h in H[:10]] == [
        f"http://store.test/b/{h}?X-Amz-Signature=s" for h in H[:10]
    ]
    assert len(server.asked) == 1


def test_large_announcements_are_asked_for_in_batches() -> None:
    server = FakeServer()
    book = BlobUrls(server.post)
    book.expect(SLICE, H)
    for h in H:
        assert book.url(SLICE, h) is not None
    assert [len(b) for b in server.asked] == [256, 256, len(H) - 512]


def test_an_unannounced_or_lone_blob_takes_the_blob_path() -> None:
    server = FakeServer()
    book = BlobUrls(server.post)
    assert book.url(SLICE, H[0]) is None  # nobody said it was coming
    book.expect(SLICE, H[:1])
    assert book.url(SLICE, H[0]) is None  # one blob: a request of its own saves nothing
    assert server.asked == []


def test_threads_wait_for_the_request_that_covers_them() -> None:
    server = FakeServer()
    server.delay_s = 0.3
    book = BlobUrls(server.post)
    book.expect(SLICE, H[:8])
    got: dict[str, str | None] = {}

    def fetch(h: str) -> None:
        got[h] = book.url(SLICE, h)

    threads = [threading.Thread(target=fetch, args=(h,)) for h in H[:8]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(server.asked) == 1 and sorted(server.asked[0]) == sorted(H[:8])
    assert all(got[h] is not None for h in H[:8])


def test_urls_are_not_used_near_their_expiry() -> None:
    server = FakeServer(expires_in=1)
    book = BlobUrls(server.post)
    book.expect(SLICE, H[:2])
    assert book.url(SLICE, H[0]) is not None
    time.sleep(0.8)  # a quarter of the second is left: too little to start a download
    assert book.url(SLICE, H[1]) is None
    assert len(server.asked) == 1


@pytest.mark.parametrize(
    "answer",
    [
        [],
        {"urls": [], "expires_in": 900},
        {"urls": {}, "expires_in": -1},
        {"urls": {}, "expires_in": True},
        {"urls": {}, "expires_in": 10**9},
        {"urls": {H[0]: 5}, "expires_in": 900},
        {"urls": {H[0]: "file:///etc/passwd"}, "expires_in": 900},
        {"urls": {H[0]: "http://x/" + "a" * 9000}, "expires_in": 900},
        {"urls": {H[500]: "http://store.test/other"}, "expires_in": 900},  # not asked for
    ],
    ids=[
        "not-an-object",
        "urls-a-list",
        "negative-expiry",
        "bool-expiry",
        "expiry-too-long",
        "url-not-text",
        "not-http",
        "url-too-long",
        "hash-not-asked",
    ],
)
def test_an_answer_that_fails_a_check_is_ignored_and_asking_stops(answer: Any) -> None:
    server = FakeServer()
    server.answer = answer
    book = BlobUrls(server.post)
    book.expect(SLICE, H[:4])
    assert book.url(SLICE, H[0]) is None
    book.expect(SLICE, H[4:8])
    assert book.url(SLICE, H[4]) is None
    assert len(server.asked) == 1, "a server that answers nonsense is not asked again"


def test_a_local_store_answers_no_urls_and_asking_stops() -> None:
    server = FakeServer()
    server.answer = {"urls": {}, "expires_in": 0}
    book = BlobUrls(server.post)
    book.expect(SLICE, H[:4])
    assert book.url(SLICE, H[0]) is None
    book.expect(SLICE, H[4:8])
    assert book.url(SLICE, H[5]) is None
    assert len(server.asked) == 1


def test_an_older_server_that_refuses_the_path_is_asked_once() -> None:
    server = FakeServer()
    server.error = InvalidArgumentError("the server refused the request (405)")
    book = BlobUrls(server.post)
    book.expect(SLICE, H[:4])
    assert book.url(SLICE, H[0]) is None
    book.expect(SLICE, H[4:8])
    assert book.url(SLICE, H[4]) is None
    assert len(server.asked) == 1


def test_a_failed_request_costs_its_batch_and_three_in_a_row_stop_asking() -> None:
    server = FakeServer()
    server.error = RetryableError("HTTP 503")
    book = BlobUrls(server.post)
    book.expect(SLICE, H[:2])
    assert book.url(SLICE, H[0]) is None
    assert book.url(SLICE, H[1]) is None  # it was in the failed batch: the blob path
    server.error = None
    book.expect(SLICE, H[2:4])
    assert book.url(SLICE, H[2]) is not None, "a busy server is asked again"
    server.error = RetryableError("HTTP 501")
    for k in range(3):
        book.expect(SLICE, H[10 + 2 * k : 12 + 2 * k])
        assert book.url(SLICE, H[10 + 2 * k]) is None
    book.expect(SLICE, H[20:22])
    assert book.url(SLICE, H[20]) is None
    assert len(server.asked) == 5, "after three failures in a row it stops asking"


def test_a_forked_process_starts_with_no_urls() -> None:
    import multiprocessing as mp

    server = FakeServer()
    book = BlobUrls(server.post)
    book.expect(SLICE, H[:4])
    assert book.url(SLICE, H[0]) is not None
    ctx = mp.get_context("fork")
    queue = ctx.Queue()

    def child() -> None:
        queue.put(book.url(SLICE, H[1]))  # announced in the parent: not in this process

    proc = ctx.Process(target=child)
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0 and queue.get(timeout=5) is None
