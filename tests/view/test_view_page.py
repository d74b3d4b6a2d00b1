"""`rayform view`'s page in a real headless browser (Debian's chromium driven by Playwright) on
the demo slice: the list and its filters, cameras in sync by their recorded frame times, plots
and their cursor, deep links, the selection snippet, offline use and the decoded-frame path.
Every test fails if the page logged a JavaScript error."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, sync_playwright
from support import DEMO_SLICE, ServerProcess, forbid_network, make_client

import rayform
import rayform.view
from rayform.format import decode_timestamps

#: Every camera element's state, for asserts.
VIDEOS = (
    "[...document.querySelectorAll('#cameras video')].map(v => ({t: v.currentTime, "
    "ready: v.readyState, seeking: v.seeking, stream: v.dataset.stream}))"
)
SETTLED = (
    "() => { const v = [...document.querySelectorAll('#cameras video')]; "
    "return v.length > 0 && v.every(x => x.readyState >= 2 && !x.seeking); }"
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "install Debian's chromium (scripts/setup.sh does, as root)"
    with sync_playwright() as pw:
        b = pw.chromium.launch(
            executable_path=chromium, args=["--autoplay-policy=no-user-gesture-required"]
        )
        yield b
        b.close()


class PageErrors:
    """JavaScript errors and failed requests the page reported."""

    def __init__(self, page: Page) -> None:
        self.seen: list[str] = []
        page.on("pageerror", lambda exc: self.seen.append(f"uncaught: {exc}"))
        page.on("console", self._console)

    def _console(self, msg: ConsoleMessage) -> None:
        if msg.type == "error":
            self.seen.append(f"console: {msg.text}")


@pytest.fixture
def online(demo_server: ServerProcess, tmp_path: Path) -> rayform.Slice:
    return make_client(demo_server.url, tmp_path / "cache").slices.get(DEMO_SLICE)


def _open(
    browser: Browser,
    slice_: rayform.Slice,
    query: str = "",
    init: str | None = None,
    status: str = "",
    **kw: Any,
) -> Iterator[Page]:
    server = rayform.view.serve(slice_, **kw)
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    if init is not None:
        context.add_init_script(init)
    page = context.new_page()
    errors = PageErrors(page)
    try:
        page.goto(server.url + query)
        page.wait_for_selector("#episodes tbody tr")
        yield page
        # An expected error answer is logged by Chromium as a failed load; nothing else may be.
        seen = [e for e in errors.seen if not (status and "Failed to load resource" in e)]
        assert seen == [], seen
        assert (
            status in str(page.locator("#status").text_content())
            if status
            else page.locator("#status").text_content() == ""
        )
    finally:
        context.close()
        server.stop()


@pytest.fixture
def page(browser: Browser, online: rayform.Slice) -> Iterator[Page]:
    yield from _open(browser, online)


def _frame_of(slice_: rayform.Slice, segment: str, stream: str, t_s: float) -> int:
    """The frame each camera must show at ``t_s`` s from the episode's start: the last one
    captured at or before it, by the recorded capture times."""
    seg = slice_.segment(segment)
    ref = seg.streams[stream].timestamps
    assert ref is not None
    t_ns = decode_timestamps(slice_.blob_path(ref).read_bytes())
    # The page gets times in whole microseconds; a time on a frame's own capture time (a frame
    # step lands there) shows that frame.
    return max(
        0, int(np.searchsorted(t_ns - seg.start_ns, round(t_s * 1e9) + 1000, side="right")) - 1
    )


def _assert_in_sync(page: Page, slice_: rayform.Slice, segment: str) -> float:
    """Every video shows the frame its own capture times give for the page's clock."""
    page.wait_for_function(SETTLED, timeout=20_000)
    t = float(page.evaluate("rayformView.time()"))
    for v in page.evaluate(VIDEOS):
        rate = slice_.segment(segment).streams[v["stream"]].rate_hz
        assert int(v["t"] * rate) == _frame_of(slice_, segment, v["stream"], t), (v, t)
    return t


def _open_episode(page: Page, row: int) -> str:
    tr = page.locator("#episodes tbody tr").nth(row)
    seg = str(tr.get_attribute("data-id"))
    tr.click()
    page.wait_for_selector("#episode[data-ready='1']")
    page.wait_for_function(SETTLED, timeout=20_000)
    return seg


def test_list_shows_every_episode_and_a_site_filter_narrows_it(
    page: Page, online: rayform.Slice
) -> None:
    ids = [s.id for s in online.segments]
    assert page.locator("#episodes tbody tr").evaluate_all("rs => rs.map(r => r.dataset.id)") == ids
    site = online.segments[0].site
    page.get_by_label(site, exact=True).check()
    page.wait_for_function(
        "() => document.querySelectorAll('#episodes tbody tr').length == "
        f"{sum(s.site == site for s in online.segments)}"
    )
    shown = page.locator("#episodes tbody tr td:nth-child(3)").all_text_contents()
    assert shown and set(shown) == {site}
    page.fill("#f-prefix", ids[0][:12])
    page.wait_for_function("() => document.querySelectorAll('#episodes tbody tr').length == 1")
    # A time range (UTC) keeps the episodes overlapping it: from the last one's start on.
    page.fill("#f-prefix", "")
    page.get_by_label(site, exact=True).uncheck()
    last = online.segments[len(ids) - 1]
    page.fill(
        "#f-start",
        datetime.fromtimestamp(last.start_ns // 10**9, tz=timezone.utc).strftime(
            "%Y-%m-%d %H:%M:%S"
        ),
    )
    page.wait_for_function(
        f"() => [...document.querySelectorAll('#episodes tbody tr')].map(r => r.dataset.id).join() == '{last.id}'"
    )


def test_cameras_play_in_sync_and_the_plot_cursor_follows(
    page: Page, online: rayform.Slice
) -> None:
    seg = _open_episode(page, 1)
    videos = page.evaluate(VIDEOS)
    assert {v["stream"] for v in videos} == {"cam0/rgb", "wrist/rgb"}
    assert all(v["ready"] >= 2 for v in videos)
    plots = page.locator(".plot").evaluate_all("ps => ps.map(p => p.dataset.stream)")
    assert set(plots) == {"joints/position", "joints/position_delta", "ee/pose"}
    legend = page.locator(".plot[data-stream='ee/pose'] .legend .key").all_text_contents()
    assert legend == ["x", "y", "z", "qx", "qy", "qz", "qw"]
    joints = page.locator(".plot[data-stream='joints/position'] .legend .key")
    assert joints.all_text_contents() == [f"[{d}]" for d in range(14)]
    # each entry in its line's colour: the first two differ
    colours = joints.evaluate_all("ks => ks.map(k => k.style.getPropertyValue('--colour'))")
    assert colours[0] and colours[0] != colours[1]
    cursor = "parseFloat(document.querySelector('.plot .cursor').style.left)"
    before = page.evaluate(cursor)
    page.click("#play")
    page.wait_for_function(
        "() => [...document.querySelectorAll('#cameras video')].every(v => v.currentTime > 0.4)",
        timeout=20_000,
    )
    assert page.evaluate(cursor) > before
    page.click("#play")  # pause
    _assert_in_sync(page, online, seg)
    t = float(page.evaluate("rayformView.time()"))
    page.click("#step-fwd")
    page.wait_for_function(SETTLED)
    assert page.evaluate("rayformView.time()") > t
    _assert_in_sync(page, online, seg)


def test_a_deep_link_opens_the_episode_at_the_time(browser: Browser, online: rayform.Slice) -> None:
    seg = online.segments[2].id
    for page in _open(browser, online, f"&segment={seg}&t=1.234"):
        page.wait_for_selector("#episode[data-ready='1']")
        assert seg in str(page.locator("#ep-title").text_content())
        t = _assert_in_sync(page, online, seg)
        assert abs(t - 1.234) <= 0.1
        assert page.locator(f"#episodes tr.current[data-id='{seg}']").count() == 1
        page.wait_for_function("() => location.search.includes('t=1.234')")


def test_clicking_a_plot_seeks_every_video(page: Page, online: rayform.Slice) -> None:
    seg = _open_episode(page, 0)
    before = [v["t"] for v in page.evaluate(VIDEOS)]
    canvas = page.locator(".plot canvas").first
    box = canvas.bounding_box()
    assert box is not None
    canvas.click(position={"x": box["width"] * 0.75, "y": box["height"] / 2})
    t = _assert_in_sync(page, online, seg)
    assert abs(t - 0.75 * online.segment(seg).duration_s) < 0.05
    after = [v["t"] for v in page.evaluate(VIDEOS)]
    assert all(a > b + 0.5 for a, b in zip(after, before, strict=True))
    # cam0 dropped a frame before this time in the demo: a page that counted frames (video time
    # = episode time) would show the next frame; the asserts above read the recorded times.
    assert _frame_of(online, seg, "cam0/rgb", t) != int(t * 30.0)
    left = page.evaluate("parseFloat(document.querySelector('.plot .cursor').style.left)")
    assert abs(left - 4 - 0.75 * (box["width"] - 8)) < 3


def test_the_selection_snippet_selects_the_marked_episodes(
    page: Page, online: rayform.Slice
) -> None:
    ids = [s.id for s in online.segments]
    # No mark, no filter: the whole slice, and no select= line.
    page.wait_for_function("() => document.querySelector('#selection').dataset.ready === '1'")
    assert "no filter: the whole slice" in str(page.locator("#snippet").text_content())
    assert page.locator("#expression-row").is_hidden()
    page.locator("#episodes .mark").nth(1).check()
    page.locator("#episodes .mark").nth(3).check()
    page.wait_for_function(
        "() => document.querySelector('#sel-count').textContent.includes('2 marked')"
    )
    code = str(page.locator("#snippet").text_content())
    scope: dict[str, Any] = {"slice_": online}
    exec(code, scope)
    assert [s.id for s in scope["view"].segments] == [ids[1], ids[3]]
    assert page.locator("#expression").text_content() == f"segments:{ids[1]},{ids[3]}"
    assert page.locator("#expression-row").is_visible()
    # A site filter and an ID prefix join the marks; the snippet still runs as printed.
    page.get_by_label(online.segments[1].site, exact=True).check()
    page.fill("#f-prefix", "seg_")
    page.wait_for_function(
        "() => document.querySelector('#snippet').textContent.includes('where=')"
    )
    scope = {"slice_": online}
    exec(str(page.locator("#snippet").text_content()), scope)
    assert [s.id for s in scope["view"].segments] == [ids[1], ids[3]]
    # The prefix alone: a where= predicate, which the select= line says has no expression.
    page.click("#clear-marks")
    page.get_by_label(online.segments[1].site, exact=True).uncheck()
    page.wait_for_function(
        "() => document.querySelector('#sel-count').textContent.startsWith('4 episodes, 0 marked')"
    )
    assert page.locator("#expression-row").is_visible()
    assert "where= predicate" in str(page.locator("#expression").text_content())


def test_the_page_works_offline_from_a_pulled_cache(
    browser: Browser, demo_server: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_client(demo_server.url, tmp_path / "cache").pull(DEMO_SLICE)
    offline = rayform.Client(cache_dir=tmp_path / "cache", offline=True).slices.get(DEMO_SLICE)
    forbid_network(monkeypatch, "the offline viewer opened a connection")
    for page in _open(browser, offline):
        seg = _open_episode(page, 3)
        page.click(".plot canvas")
        _assert_in_sync(page, offline, seg)


#: A browser without H.264: what the page must detect per stream and work around.
NO_H264 = "HTMLMediaElement.prototype.canPlayType = function (t) { return t.includes('avc1') ? '' : 'maybe'; };"


def test_offline_without_the_blobs_the_page_names_the_pull(
    browser: Browser, demo_server: ServerProcess, tmp_path: Path
) -> None:
    make_client(demo_server.url, tmp_path / "cache").slices.get(DEMO_SLICE)  # the manifest only
    offline = rayform.Client(cache_dir=tmp_path / "cache", offline=True).slices.get(DEMO_SLICE)
    for page in _open(browser, offline, status="rayform pull"):
        page.locator("#episodes tbody tr").nth(0).click()
        page.wait_for_function(
            "() => document.querySelector('#status').textContent.includes('rayform pull')"
        )


@pytest.mark.parametrize("how", ["forced", "codec"])
def test_decoded_frames_replace_video(browser: Browser, online: rayform.Slice, how: str) -> None:
    kw: dict[str, Any] = {"frames": True} if how == "forced" else {"init": NO_H264}
    for page in _open(browser, online, **kw):
        page.locator("#episodes tbody tr").nth(0).click()
        page.wait_for_selector("#episode[data-ready='1']")
        assert page.locator("#cameras video").count() == 0
        page.evaluate("rayformView.seek(1.0)")
        page.wait_for_function(
            "() => [...document.querySelectorAll('#cameras img')]"
            ".every(i => i.complete && i.naturalWidth == 128 && i.src.includes('i='))",
            timeout=20_000,
        )
        seg = online.segments[0].id
        for src in page.locator("#cameras img").evaluate_all("is => is.map(i => i.src)"):
            stream = "cam0/rgb" if "cam0" in src else "wrist/rgb"
            assert src.endswith(f"&i={_frame_of(online, seg, stream, 1.0)}")


def test_screenshot_of_the_episode_view(page: Page, online: rayform.Slice, tmp_path: Path) -> None:
    _open_episode(page, 1)
    page.evaluate("rayformView.seek(1.2)")
    page.wait_for_function(SETTLED)
    shot = tmp_path / "view.png"
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 50_000  # videos, plots and text; a blank page is a few kB


@pytest.fixture
def writable(write_server: ServerProcess, tmp_path: Path) -> rayform.Slice:
    """The demo slice through a client with the write token."""
    from support import WRITE_TOKEN

    client = rayform.Client(endpoint=write_server.url, token=WRITE_TOKEN, cache_dir=tmp_path / "c")
    return client.slices.get(DEMO_SLICE)


def test_label_from_the_page_and_filter_on_it(browser: Browser, writable: rayform.Slice) -> None:
    slice_ = writable
    for page in _open(browser, slice_):
        seg = _open_episode(page, 1)
        assert page.locator("#ep-label-values").text_content() == "no labels"
        page.click("#label-success")
        page.wait_for_function(
            "() => document.querySelector('#ep-label-values').textContent == 'success=true'"
        )
        page.fill("#label-quality", "0.8")
        page.click("#label-save")
        page.wait_for_function(
            "() => document.querySelector('#ep-label-values').textContent.includes('quality=0.8')"
        )
        page.fill("#f-where", "success and quality > 0.5")
        page.wait_for_function(
            f"() => [...document.querySelectorAll('#episodes tbody tr')].map(r => r.dataset.id).join() == '{seg}'"
        )
        page.wait_for_function(
            "() => document.querySelector('#snippet').textContent.includes(\"where='success and quality > 0.5'\")"
        )
        page.evaluate("document.querySelector('#status').textContent = ''")  # 'labels v2 saved'
    labels = slice_.labels
    assert labels.version == 2 and labels[seg] == {"success": True, "quality": 0.8}


#: The language slice's episode: a task that switches at 1.0 s, a subtask from 0.5 s, and
#: events at 0.3 s and 1.45 s (seconds from the episode's start, which is its camera's first
#: frame).
LANGUAGE = {
    "task": [(0.0, "pick the cube"), (1.0, "place it in the bin")],
    "language/subtask": [(0.5, "reach"), (1.2, "grasp")],
    "language/interjection": [(0.3, "slower"), (1.45, "stop!")],
}


@pytest.fixture(scope="module")
def language_slice(tmp_path_factory: pytest.TempPathFactory) -> Iterator[rayform.Slice]:
    """A one-episode slice served on loopback: a 2 s camera at 10 Hz, joints, and the text
    streams of :data:`LANGUAGE`."""
    from rayform_server.builder import SliceBuilder, TableData, TextData, VideoData
    from rayform_server.store import Store

    root = tmp_path_factory.mktemp("view-language")
    t0 = 10**18
    t = t0 + np.arange(20, dtype=np.int64) * 100_000_000
    frames = np.zeros((20, 48, 64, 3), np.uint8)
    frames[:, :, :, 1] = np.arange(20, dtype=np.uint8)[:, None, None] * 10
    streams: list[Any] = [
        VideoData("cam0/rgb", frames, t, 10),
        TableData("joints/position", t, np.arange(40, dtype=np.float32).reshape(20, 2), 10),
    ]
    for name, records in LANGUAGE.items():
        times = np.array([t0 + round(s * 1e9) for s, _ in records], np.int64)
        timing = "events" if "interjection" in name else "state"
        streams.append(
            TextData(name, times, [{"content": c} for _, c in records], 10, timing=timing)
        )
    b = SliceBuilder(Store(root))
    b.add_segment("seg_1a46a6e0", site="lab", streams=streams)
    b.commit("slc_1a46a6e9")
    server = ServerProcess(root)
    try:
        yield make_client(server.url, root.parent / "lang-cache").slices.get("slc_1a46a6e9")
    finally:
        server.stop()


def _shown(page: Page, stream: str) -> str:
    return str(page.locator(f".text-state[data-stream='{stream}'] .value").text_content())


def test_the_task_and_subtask_in_force_show_under_the_cameras(
    browser: Browser, language_slice: rayform.Slice
) -> None:
    for page in _open(browser, language_slice, "&segment=seg_1a46a6e0&t=0.2"):
        page.wait_for_selector("#episode[data-ready='1']")
        # Under the cameras: the task first, then the other states; events are no state.
        order = page.locator("#episode > div").evaluate_all("ds => ds.map(d => d.id)")
        assert order.index("cameras") + 1 == order.index("language")
        states = page.locator(".text-state").evaluate_all("ls => ls.map(l => l.dataset.stream)")
        assert states == ["task", "language/subtask"]
        assert (_shown(page, "task"), _shown(page, "language/subtask")) == ("pick the cube", "")
        # The record in force is the latest at or before the playhead, on a switch included.
        for t, task, subtask in [
            (0.5, "pick the cube", "reach"),
            (0.99, "pick the cube", "reach"),
            (1.0, "place it in the bin", "reach"),
            (1.3, "place it in the bin", "grasp"),
            (0.1, "pick the cube", ""),  # back again: never a later record
        ]:
            page.evaluate(f"rayformView.seek({t})")
            assert (_shown(page, "task"), _shown(page, "language/subtask")) == (task, subtask), t
        # Playing moves the subtask on with the clock.
        page.evaluate("rayformView.seek(1.1)")
        page.click("#play")
        page.wait_for_function(
            "() => document.querySelector(\".text-state[data-stream='language/subtask'] .value\")"
            ".textContent == 'grasp'",
            timeout=20_000,
        )
        page.click("#play")


def test_events_are_marks_on_the_timeline_that_seek(
    browser: Browser, language_slice: rayform.Slice
) -> None:
    for page in _open(browser, language_slice, "&segment=seg_1a46a6e0&t=0"):
        page.wait_for_selector("#episode[data-ready='1']")
        row = page.locator(".event-row[data-stream='language/interjection']")
        assert "language/interjection (2)" in str(row.locator(".name").text_content())
        marks = row.locator(".event-mark")
        assert [float(str(m.get_attribute("data-t"))) for m in marks.all()] == [0.3, 1.45]
        assert "stop!" in str(marks.nth(1).get_attribute("title"))
        # Placed along the track at their share of the episode (its duration from the page).
        dur = float(page.evaluate("rayformView.state.dur"))
        lefts = marks.evaluate_all("ms => ms.map(m => parseFloat(m.style.left))")
        assert lefts == pytest.approx([100 * 0.3 / dur, 100 * 1.45 / dur], abs=1e-3)
        assert marks.evaluate_all("ms => ms.map(m => m.classList.contains('past'))") == [
            False,
            False,
        ]
        marks.nth(1).click()
        page.wait_for_function("() => Math.abs(rayformView.time() - 1.45) < 1e-6")
        assert _shown(page, "task") == "place it in the bin"
        assert marks.evaluate_all("ms => ms.map(m => m.classList.contains('past'))") == [
            True,
            True,
        ]
        assert page.locator(".text-state[data-stream='language/interjection']").count() == 0


def test_tags_other_keys_and_time_ranges_from_the_page(
    browser: Browser, writable: rayform.Slice
) -> None:
    import httpx

    slice_ = writable
    values = "() => document.querySelector('#ep-label-values').textContent"
    for page in _open(browser, slice_):
        seg = _open_episode(page, 1)
        for tag in ("regrasp", "dim"):
            page.fill("#label-tag", tag)
            page.click("#tag-add")
            page.wait_for_selector(f"#ep-tags .tag[data-tag='{tag}']")
        page.click("#ep-tags .tag[data-tag='regrasp']")  # a tag's chip removes it
        page.wait_for_function(
            "() => [...document.querySelectorAll('#ep-tags .tag')].map(t => t.dataset.tag).join() == 'dim'"
        )
        for key, kind, value in (("grade", "category", "bad"), ("score", "number", "0.5"),
                                 ("note", "text", "slipped at the handover")):  # fmt: skip
            page.fill("#label-key", key)
            page.select_option("#label-kind", kind)
            page.fill("#label-value", value)
            page.click("#label-set")
            page.wait_for_function(f"() => ({values})().includes('{key}=')")
        # A range: [ at 0.5 s, ] at 1.25 s, named; shown as a bar on the timeline.
        page.fill("#span-name", "grasp_failed")
        page.evaluate("document.activeElement.blur(); rayformView.seek(0.5)")
        page.keyboard.press("[")
        page.evaluate("rayformView.seek(1.25)")
        page.keyboard.press("]")
        bar = page.wait_for_selector(
            ".span-row[data-key='events'] .span-bar[data-name='grasp_failed']"
        )
        assert bar is not None and float(str(bar.get_attribute("data-t0"))) == 0.5
        # A second range, removed again by shift-clicking its bar.
        page.fill("#span-name", "slip")
        page.evaluate("document.activeElement.blur(); rayformView.seek(1.5)")
        page.click("#span-start")
        page.evaluate("rayformView.seek(1.75)")
        page.click("#span-end")
        slip = page.wait_for_selector(".span-bar[data-name='slip']")
        assert slip is not None
        slip.click(modifiers=["Shift"])
        page.wait_for_function("() => !document.querySelector(\".span-bar[data-name='slip']\")")
        assert page.locator(".span-bar").count() == 1
        page.evaluate("document.activeElement.blur()")
        page.keyboard.press("s")  # the success shortcut
        page.wait_for_function(f"() => ({values})().includes('success=true')")
        # Without the page's secret, the same write is refused.
        base = page.url.split("?")[0]
        body = {"segment": seg, "span": {"key": "events", "t0_s": 0, "t1_s": 1, "name": "x"}}
        assert httpx.post(f"{base}api/label", json=body, timeout=30).status_code == 403
        page.evaluate("document.querySelector('#status').textContent = ''")
    labels = slice_.labels
    start = slice_.segment(seg).start_ns
    assert labels[seg]["tags"] == ["dim"] and labels[seg]["grade"] == "bad"
    assert labels[seg]["score"] == 0.5 and labels.kinds["note"] == "text"
    assert labels[seg]["note"] == "slipped at the handover" and labels[seg]["success"] is True
    assert labels.spans(seg, "events") == [
        (start + 500_000_000, start + 1_250_000_000, "grasp_failed")
    ]
