// rayform view: the episode list, one episode's cameras in sync, plots, deep links, selection.
// Plain DOM and canvas, no library. Episode time is seconds from the episode's start; each
// camera maps it to a frame through that camera's recorded capture times, never frame counts.
"use strict";

const S = {
  info: null, offset: 0, limit: 50, total: 0, marked: new Set(), pageIds: [],
  ep: null, cams: [], plots: [], texts: [], dur: 0, t: 0, playing: false, speed: 1, base: 0, t0: 0,
};
const $ = (id) => document.getElementById(id);
const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
  "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39"];

function status(text) { $("status").textContent = text || ""; }

async function api(path, params) {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(params || {})) if (v !== "" && v != null) url.searchParams.set(k, v);
  const r = await fetch(url, { credentials: "same-origin" });
  const doc = await r.json();
  if (!r.ok) throw new Error(doc.error || r.statusText);
  return doc;
}

function report(err) { status(err && err.message ? err.message : String(err)); }

// -- filters and the list -----------------------------------------------------------------
function utcNs(text) {
  // "2026-01-01 12:00:00" (UTC) or any ISO time -> ns since 1970 as a decimal string.
  text = text.trim();
  if (!text) return "";
  let iso = text.replace(" ", "T");
  if (!/(Z|[+-]\d\d:?\d\d)$/.test(iso)) iso += "Z";
  const ms = Date.parse(iso);
  if (Number.isNaN(ms)) throw new Error(`cannot read the time ${JSON.stringify(text)}: use 2026-01-01 12:00:00 (UTC)`);
  return (BigInt(ms) * 1000000n).toString();
}

function fmtUtc(ns) {
  return new Date(Number(BigInt(ns) / 1000000n)).toISOString().replace("T", " ").replace(/\.\d+Z$/, "");
}

function filterParams() {
  const sites = [...document.querySelectorAll("#site-filter input:checked")].map((e) => e.value);
  return { sites: sites.map(encodeURIComponent).join(","), prefix: $("f-prefix").value.trim(),
    start_ns: utcNs($("f-start").value), end_ns: utcNs($("f-end").value),
    where: $("f-where").value.trim() };
}

async function loadList() {
  let params;
  try { params = filterParams(); } catch (e) { report(e); return; }
  const doc = await api("/api/episodes", { ...params, offset: S.offset, limit: S.limit });
  S.total = doc.total;
  S.pageIds = doc.episodes.map((e) => e.id);
  const body = $("episodes").tBodies[0];
  body.replaceChildren(...doc.episodes.map(row));
  const last = Math.min(S.offset + S.limit, S.total);
  $("page-info").textContent = S.total ? `${S.offset + 1}\u2013${last} of ${S.total}` : "no episode matches";
  $("prev").disabled = S.offset === 0;
  $("next").disabled = last >= S.total;
  status("");
}

function row(e) {
  const tr = document.createElement("tr");
  tr.dataset.id = e.id;
  if (S.ep && S.ep.id === e.id) tr.classList.add("current");
  const mark = document.createElement("input");
  mark.type = "checkbox";
  mark.className = "mark";
  mark.checked = S.marked.has(e.id);
  mark.addEventListener("click", (ev) => ev.stopPropagation());
  mark.addEventListener("change", () => {
    if (mark.checked) S.marked.add(e.id); else S.marked.delete(e.id);
    updateSelection();
  });
  const kinds = Object.values(e.streams);
  const count = (k) => kinds.filter((x) => x === k).length;
  const cells = [e.id, e.site, fmtUtc(e.start_ns), `${e.duration_s.toFixed(2)} s`,
    `${count("video")} cameras, ${count("table")} tables`];
  const first = document.createElement("td");
  first.append(mark);
  tr.append(first, ...cells.map((text, i) => {
    const td = document.createElement("td");
    td.textContent = text;
    if (i === 4) {
      td.className = "streams";
      td.title = Object.entries(e.streams).map(([n, k]) => `${n} (${k})`).join("\n");
    }
    return td;
  }));
  tr.addEventListener("click", () => openEpisode(e.id, 0).catch(report));
  return tr;
}

let selTimer = 0;
function updateSelection() {
  clearTimeout(selTimer);
  selTimer = setTimeout(async () => {
    try {
      const doc = await api("/api/selection", { ...filterParams(), segments: [...S.marked].join(",") });
      const many = doc.marked > 10 ? `# ${doc.marked} marked episodes\n` : "";
      $("snippet").textContent = many + doc.code;
      // No filter: the snippet says "the whole slice" and there is no select= to show.
      const predicate = filterParams().prefix !== "";
      $("expression-row").hidden = !doc.expression && !predicate;
      $("expression").textContent = doc.expression || "(none: an ID prefix is a where= predicate)";
      $("sel-count").textContent = `${doc.count} episodes, ${doc.marked} marked`;
      $("selection").dataset.ready = "1";
    } catch (e) {
      $("snippet").textContent = "";
      $("sel-count").textContent = e.message;
    }
  }, 150);
}

function refilter() {
  S.offset = 0;
  loadList().catch(report);
  updateSelection();
}

// -- one episode --------------------------------------------------------------------------
const CODEC_TYPES = { h264: 'video/mp4; codecs="avc1.42E01E"', hevc: 'video/mp4; codecs="hvc1.1.6.L93.B0"',
  h265: 'video/mp4; codecs="hvc1.1.6.L93.B0"', av1: 'video/mp4; codecs="av01.0.05M.08"',
  vp9: 'video/mp4; codecs="vp09.00.10.08"' };

function browserPlays(codec) {
  const probe = document.createElement("video");
  return probe.canPlayType(CODEC_TYPES[codec] || "video/mp4") !== "";
}

function frameAt(cam, t) {
  // Index of the last frame captured at or before t (0 before the first); times come in
  // whole microseconds, so a time within 1 us of a capture is that capture.
  const ts = cam.times;
  let lo = 0, hi = ts.length - 1;
  if (t < ts[0]) return 0;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (ts[mid] <= t + 1e-6) lo = mid; else hi = mid - 1;
  }
  return lo;
}

function mediaQuery(name) {
  return `segment=${encodeURIComponent(S.ep.id)}&stream=${encodeURIComponent(name)}`;
}

function makeCamera(st) {
  const box = document.createElement("div");
  box.className = "camera";
  const mode = st.mode === "video" && browserPlays(st.codec) ? "video" : "frames";
  const cam = { name: st.name, times: st.times, rate: st.rate_hz, mode, shown: -1, loading: false, want: 0 };
  if (mode === "video") {
    const v = document.createElement("video");
    v.muted = true;
    v.playsInline = true;
    v.preload = "auto";
    v.src = `/media?${mediaQuery(st.name)}`;
    v.addEventListener("error", () => whyNot(v.src, st.name));
    cam.el = v;
  } else {
    const img = document.createElement("img");
    img.alt = st.name;
    img.addEventListener("load", () => { cam.loading = false; if (cam.want !== cam.shown) showFrame(cam, cam.want); });
    img.addEventListener("error", () => { cam.loading = false; });
    cam.el = img;
  }
  cam.el.dataset.stream = st.name;
  cam.el.className = "cam-" + mode;
  const label = document.createElement("div");
  label.className = "label";
  label.textContent = `${st.name} \u00b7 ${st.rate_hz} Hz \u00b7 ${st.count} frames${mode === "frames" ? " \u00b7 decoded frames" : ""}`;
  box.append(cam.el, label);
  return [box, cam];
}

async function whyNot(src, name) {
  // A video that failed: the server's JSON error says why (not cached offline, ...), else the
  // browser could not decode it.
  try {
    const r = await fetch(src, { headers: { Range: "bytes=0-0" } });
    status(r.ok ? `${name}: the browser cannot play this video` : `${name}: ${(await r.json()).error}`);
  } catch (e) {
    status(`${name}: ${e.message}`);
  }
}

function showFrame(cam, i) {
  cam.want = i;
  if (cam.loading || cam.shown === i) return;
  cam.loading = true;
  cam.shown = i;
  cam.el.src = `/frame?${mediaQuery(cam.name)}&i=${i}`;
}

// -- labels (docs/curation.md): shown per episode, written through the viewer's client ----
function showLabels(labels, spans) {
  S.labels = labels || {};
  S.spans = spans || {};
  const parts = Object.entries(S.labels)
    .filter(([k]) => !(k in S.spans) && k !== "tags")
    .map(([k, v]) => `${k}=${JSON.stringify(v)}`);
  for (const [k, r] of Object.entries(S.spans)) parts.push(`${k}: ${r.length} range${r.length === 1 ? "" : "s"}`);
  $("ep-label-values").textContent = parts.length ? parts.join(" ") : "no labels";
  const tags = Array.isArray(S.labels.tags) ? S.labels.tags : [];
  $("ep-tags").replaceChildren(...tags.map((tag) => {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "tag";
    b.dataset.tag = tag;
    b.title = `remove the tag ${tag}`;
    b.textContent = `${tag} \u00d7`;
    b.addEventListener("click", () => setTags(tags.filter((x) => x !== tag)).catch(report));
    return b;
  }));
  showSpans();
}

async function label(values, extra) {
  if (!S.ep) return;
  const body = { segment: S.ep.id, ...(values ? { values } : {}), ...(extra || {}) };
  const r = await fetch("/api/label", { method: "POST", credentials: "same-origin",
    headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  const doc = await r.json();
  if (!r.ok) throw new Error(doc.error || r.statusText);
  showLabels(doc.labels, doc.spans);
  status(`labels v${doc.version} saved`);
  if ($("f-where").value.trim()) refilter(); // the filter may keep other episodes now
}

function setTags(tags) { return label({ tags: tags.length ? [...new Set(tags)].sort() : null }); }

function setKey() {
  const key = $("label-key").value.trim();
  const kind = $("label-kind").value;
  const raw = $("label-value").value;
  if (!key) return Promise.resolve();
  let value = raw === "" ? null : raw;
  if (value !== null && kind === "number") value = Number(raw);
  if (value !== null && kind === "bool") value = ["true", "1", "yes"].includes(raw.trim().toLowerCase());
  return label({ [key]: value }, kind === "text" && value !== null ? { kinds: { [key]: "text" } } : {});
}

// A time range: its start marked at the playhead ([), its end (]) saves it under key/name.
function markStart() {
  S.spanStart = Math.min(Math.max(now(), 0), S.dur);
  $("span-pending").textContent = `from ${S.spanStart.toFixed(3)} s`;
}

function markEnd() {
  if (S.spanStart === undefined || S.spanStart === null) { status("mark the range's start first ([)"); return Promise.resolve(); }
  const key = $("span-key").value.trim() || "events";
  const name = $("span-name").value.trim() || key;
  const t1 = Math.min(Math.max(now(), 0), S.dur);
  const [a, b] = S.spanStart <= t1 ? [S.spanStart, t1] : [t1, S.spanStart];
  S.spanStart = null;
  $("span-pending").textContent = "";
  return label(null, { span: { key, t0_s: a, t1_s: b, name } });
}

function showSpans() {
  // Each spans label: a track as long as the episode, a bar per range (a click seeks to its
  // start; the x removes it), drawn like the events' marks.
  for (const row of document.querySelectorAll(".span-row")) row.remove();
  for (const [key, ranges] of Object.entries(S.spans || {})) {
    const track = document.createElement("div");
    track.className = "track";
    ranges.forEach(([a, b, name], k) => {
      const bar = document.createElement("button");
      bar.type = "button";
      bar.className = "span-bar";
      bar.dataset.name = name;
      bar.dataset.t0 = String(a);
      bar.dataset.t1 = String(b);
      bar.style.left = `${(100 * a) / (S.dur || 1)}%`;
      bar.style.width = `${Math.max((100 * (b - a)) / (S.dur || 1), 0.3)}%`;
      bar.title = `${name}: ${a.toFixed(3)} s - ${b.toFixed(3)} s (click: seek; shift-click: remove)`;
      bar.addEventListener("click", (ev) => {
        if (ev.shiftKey) label(null, { unspan: { key, index: k } }).catch(report);
        else seek(a);
      });
      track.append(bar);
    });
    const row = document.createElement("div");
    row.className = "span-row event-row";
    row.dataset.key = key;
    const title = document.createElement("span");
    title.className = "name";
    title.textContent = `label ${key} (${ranges.length})`;
    row.append(title, track);
    $("events").append(row);
  }
}

async function openEpisode(id, t) {
  pause();
  const ep = await api("/api/episode", { segment: id });
  S.ep = ep;
  S.dur = ep.duration_s;
  S.t = 0;
  $("episode-empty").hidden = true;
  $("episode").hidden = false;
  $("ep-title").textContent = `${ep.id} \u00b7 ${ep.site} \u00b7 v${ep.version} \u00b7 ${fmtUtc(ep.start_ns)} UTC \u00b7 ${ep.duration_s.toFixed(3)} s`;
  for (const tr of $("episodes").tBodies[0].rows) tr.classList.toggle("current", tr.dataset.id === id);
  $("ep-labels").hidden = !("labels" in ep);
  $("ep-keys").hidden = !("labels" in ep);
  S.cams = [];
  const boxes = [];
  for (const st of ep.streams.filter((s) => s.kind === "video")) {
    const [box, cam] = makeCamera(st);
    boxes.push(box);
    S.cams.push(cam);
  }
  $("cameras").replaceChildren(...boxes);
  $("scrubber").max = String(S.dur);
  S.plots = [];
  $("plots").replaceChildren();
  S.texts = [];
  $("language").replaceChildren();
  $("events").replaceChildren();
  const tables = ep.streams.filter((s) => s.kind === "table");
  const texts = ep.streams.filter((s) => s.kind === "text");
  const [docs, textDocs] = await Promise.all([
    Promise.all(tables.map((st) => api("/api/table", { segment: id, stream: st.name }))),
    Promise.all(texts.map((st) => api("/api/text", { segment: id, stream: st.name }))),
  ]);
  if (S.ep !== ep) return; // another episode was opened meanwhile
  for (const doc of docs) S.plots.push(makePlot(doc));
  // The task first, then the other states (subtask, plan...) by name; events after them.
  textDocs.sort((a, b) => (a.name === "task" ? -1 : b.name === "task" ? 1 : a.name.localeCompare(b.name)));
  for (const doc of textDocs) S.texts.push(doc.timing === "events" ? makeEvents(doc) : makeState(doc));
  showLabels(ep.labels, ep.spans); // after the events: label ranges are the timeline's last rows
  seek(Math.min(Math.max(Number(t) || 0, 0), S.dur));
  $("episode").dataset.ready = "1";
}

// -- the clock ----------------------------------------------------------------------------
function now() { return S.playing ? S.base + ((performance.now() - S.t0) / 1000) * S.speed : S.t; }

function seek(t) {
  S.t = Math.min(Math.max(t, 0), S.dur);
  if (S.playing) { S.base = S.t; S.t0 = performance.now(); }
  sync(true);
  render();
  remember();
}

function play() {
  if (!S.ep || S.playing) return;
  if (S.t >= S.dur - 1e-6) S.t = 0;
  S.playing = true;
  S.base = S.t;
  S.t0 = performance.now();
  $("play").innerHTML = "&#10074;&#10074;";
  sync(true);
  requestAnimationFrame(tick);
}

function pause() {
  if (!S.playing) return;
  S.t = Math.min(now(), S.dur);
  S.playing = false;
  $("play").innerHTML = "&#9654;";
  for (const c of S.cams) if (c.mode === "video") c.el.pause();
  sync(true);
  render();
  remember();
}

function waiting() {
  // A camera that is seeking or has no frame yet (still fetching) holds the clock, so the
  // others do not run ahead of it.
  return S.cams.some((c) => c.mode === "video" && !c.ended && (c.el.seeking || c.el.readyState < 2));
}

function tick() {
  if (!S.playing) return;
  if (waiting()) { S.base = S.t; S.t0 = performance.now(); requestAnimationFrame(tick); return; }
  S.t = now();
  if (S.t >= S.dur) { S.t = S.dur; pause(); return; }
  sync(false);
  render();
  requestAnimationFrame(tick);
}

function sync(force) {
  // Each camera shows the frame captured last at or before S.t. A playing video runs on its
  // own and is only pulled back when it drifts by more than two frames from the clock.
  for (const c of S.cams) {
    const i = frameAt(c, S.t);
    if (c.mode === "frames") { showFrame(c, i); continue; }
    const v = c.el;
    const want = (i + 0.5) / c.rate;
    const ended = S.t > c.times[c.times.length - 1] + 1 / c.rate;
    c.ended = ended;
    if (S.playing && !ended) {
      v.playbackRate = S.speed;
      if (force || Math.abs(v.currentTime - want) > 2 / c.rate) v.currentTime = want;
      if (v.paused) v.play().catch(() => {});
    } else {
      if (!v.paused) v.pause();
      if (force || Math.abs(v.currentTime - want) > 1e-3) v.currentTime = want;
    }
  }
}

function render() {
  $("scrubber").value = String(S.t);
  $("clock").textContent = `${S.t.toFixed(3)} s / ${S.dur.toFixed(3)} s`;
  for (const p of S.plots) placeCursor(p);
  for (const x of S.texts) x.show(S.t);
}

let linkTimer = 0;
function remember() {
  clearTimeout(linkTimer);
  linkTimer = setTimeout(() => history.replaceState(null, "", deepLink()), 200);
}

function deepLink() {
  const url = new URL(location.href);
  if (S.ep) {
    url.searchParams.set("segment", S.ep.id);
    url.searchParams.set("t", S.t.toFixed(3));
  }
  return url.toString();
}

function step(dir) {
  pause();
  let best = null;
  for (const c of S.cams) {
    const i = frameAt(c, S.t);
    let cand = null;
    if (dir > 0) {
      const j = c.times[i] > S.t + 1e-6 ? i : i + 1;
      if (j < c.times.length) cand = c.times[j];
    } else {
      const j = c.times[i] < S.t - 1e-6 ? i : i - 1;
      if (j >= 0) cand = c.times[j];
    }
    if (cand != null && (best == null || (dir > 0 ? cand < best : cand > best))) best = cand;
  }
  if (best != null) seek(best);
}

// -- language -----------------------------------------------------------------------------
function lastAtOrBefore(records, t) {
  // Index of the latest record at or before t (-1 before the first): the state in force.
  let lo = 0, hi = records.length;
  while (lo < hi) { const mid = (lo + hi) >> 1; if (records[mid].t_s <= t + 1e-6) lo = mid + 1; else hi = mid; }
  return lo - 1;
}

function textRow(parent, className, doc, title, body) {
  // One text stream's row: its name, then what shows it (a value, a track of marks).
  const row = document.createElement("div");
  row.className = className;
  row.dataset.stream = doc.name;
  const name = document.createElement("span");
  name.className = "name";
  name.textContent = title;
  row.append(name, body);
  $(parent).append(row);
  return row;
}

function makeState(doc) {
  // A state stream (task, subtask, plan): the record in force at the playhead.
  const value = document.createElement("span");
  value.className = "value";
  const line = textRow("language", "text-state", doc, doc.name, value);
  return {
    doc,
    show(t) {
      const i = lastAtOrBefore(doc.records, t);
      const text = i >= 0 ? (doc.records[i].content ?? "") : "";
      if (value.textContent !== text) value.textContent = text;
      line.dataset.record = String(i);
    },
  };
}

function makeEvents(doc) {
  // An events stream (interjections, VQA): one mark per record on a track as long as the
  // episode; a click seeks to it, and marks at or before the playhead are drawn as past.
  const track = document.createElement("div");
  track.className = "track";
  const marks = doc.records.map((r) => {
    const mark = document.createElement("button");
    mark.type = "button";
    mark.className = "event-mark";
    mark.style.left = `${(100 * r.t_s) / (S.dur || 1)}%`;
    mark.dataset.t = String(r.t_s);
    mark.title = `${r.t_s.toFixed(3)} s${r.role ? " " + r.role : ""}: ${r.content ?? "(a tool call)"}`;
    mark.addEventListener("click", () => seek(r.t_s));
    track.append(mark);
    return mark;
  });
  textRow("events", "event-row", doc, `${doc.name} (${doc.records.length})`, track);
  return {
    doc,
    show(t) { doc.records.forEach((r, k) => marks[k].classList.toggle("past", r.t_s <= t + 1e-6)); },
  };
}

// -- plots --------------------------------------------------------------------------------
const PAD = 4;

function makePlot(doc) {
  const box = document.createElement("div");
  box.className = "plot";
  box.dataset.stream = doc.name;
  const label = document.createElement("div");
  label.className = "label";
  label.textContent = `${doc.name}${doc.units ? " (" + doc.units + ")" : ""} \u00b7 ${doc.values.length} rows${doc.stride > 1 ? " (every " + doc.stride + "th)" : ""}`;
  const area = document.createElement("div");
  area.className = "area";
  const canvas = document.createElement("canvas");
  const cursor = document.createElement("div");
  cursor.className = "cursor";
  area.append(canvas, cursor);
  // One entry per dimension, in its line's colour: the component names where the manifest
  // says what the stream holds (a pose: x, y, z, qx, ...), else the vector's index.
  const legend = document.createElement("div");
  legend.className = "legend";
  (doc.dims || []).forEach((name, d) => {
    const item = document.createElement("span");
    item.className = "key";
    item.style.setProperty("--colour", PALETTE[d % PALETTE.length]);
    item.textContent = name;
    legend.append(item);
  });
  box.append(label, area, legend);
  $("plots").append(box);
  const plot = { doc, box, canvas, cursor };
  draw(plot);
  canvas.addEventListener("click", (ev) => {
    const r = canvas.getBoundingClientRect();
    const f = (ev.clientX - r.left - PAD) / (r.width - 2 * PAD);
    seek(Math.min(Math.max(f, 0), 1) * S.dur);
  });
  return plot;
}

function draw(plot) {
  const { canvas, doc } = plot;
  const w = canvas.clientWidth || 600, h = canvas.clientHeight || 130;
  canvas.width = w * devicePixelRatio;
  canvas.height = h * devicePixelRatio;
  const g = canvas.getContext("2d");
  g.scale(devicePixelRatio, devicePixelRatio);
  let lo = Infinity, hi = -Infinity;
  for (const r of doc.values) for (const v of r) if (v != null) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  if (!(hi > lo)) { lo -= 1; hi += 1; }
  const x = (t) => PAD + (t / (S.dur || 1)) * (w - 2 * PAD);
  const y = (v) => h - PAD - ((v - lo) / (hi - lo)) * (h - 2 * PAD);
  const dims = doc.values.length ? doc.values[0].length : 0;
  g.lineWidth = 1;
  for (let d = 0; d < dims; d++) {
    g.strokeStyle = PALETTE[d % PALETTE.length];
    g.beginPath();
    let pen = false;
    doc.values.forEach((r, k) => {
      const v = r[d];
      if (v == null) { pen = false; return; }
      if (pen) g.lineTo(x(doc.times[k]), y(v)); else g.moveTo(x(doc.times[k]), y(v));
      pen = true;
    });
    g.stroke();
  }
  g.fillStyle = "#5b6478";
  g.fillText(hi.toPrecision(3), PAD + 2, PAD + 10);
  g.fillText(lo.toPrecision(3), PAD + 2, h - PAD - 2);
}

function placeCursor(plot) {
  const w = plot.canvas.clientWidth;
  const left = PAD + (S.t / (S.dur || 1)) * (w - 2 * PAD);
  plot.cursor.style.left = `${left}px`;
  plot.cursor.dataset.t = S.t.toFixed(4);
}

// -- wiring -------------------------------------------------------------------------------
async function start() {
  const info = await api("/api/slice");
  S.info = info;
  $("slice-title").textContent = `${info.id} \u00b7 ${info.segments} episodes \u00b7 ${info.streams.length} streams`;
  document.title = `rayform view ${info.id}`;
  const fs = $("site-filter");
  for (const site of info.sites) {
    const label = document.createElement("label");
    const box = document.createElement("input");
    box.type = "checkbox";
    box.value = site;
    box.addEventListener("change", refilter);
    label.append(box, " " + site);
    fs.append(label);
  }
  $("f-start").placeholder = fmtUtc(info.start_ns);
  $("f-end").placeholder = fmtUtc(info.end_ns);
  let typing = 0;
  for (const id of ["f-prefix", "f-start", "f-end", "f-where"]) {
    $(id).addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(refilter, 250); });
  }
  $("filters").addEventListener("submit", (ev) => { ev.preventDefault(); refilter(); });
  $("prev").addEventListener("click", () => { S.offset = Math.max(0, S.offset - S.limit); loadList().catch(report); });
  $("next").addEventListener("click", () => { S.offset += S.limit; loadList().catch(report); });
  $("mark-page").addEventListener("click", () => {
    for (const id of S.pageIds) S.marked.add(id);
    for (const b of document.querySelectorAll("#episodes .mark")) b.checked = true;
    updateSelection();
  });
  $("clear-marks").addEventListener("click", () => {
    S.marked.clear();
    for (const b of document.querySelectorAll("#episodes .mark")) b.checked = false;
    updateSelection();
  });
  $("copy").addEventListener("click", () => copy($("snippet").textContent));
  $("label-success").addEventListener("click", () => label({ success: true }).catch(report));
  $("label-failure").addEventListener("click", () => label({ success: false }).catch(report));
  $("label-save").addEventListener("click", () => {
    const q = $("label-quality").value;
    if (q !== "") label({ quality: Number(q) }).catch(report);
  });
  $("tag-add").addEventListener("click", () => {
    const tag = $("label-tag").value.trim();
    const tags = Array.isArray(S.labels && S.labels.tags) ? S.labels.tags : [];
    if (tag) setTags([...tags, tag]).then(() => { $("label-tag").value = ""; }).catch(report);
  });
  $("label-set").addEventListener("click", () => setKey().catch(report));
  $("span-start").addEventListener("click", markStart);
  $("span-end").addEventListener("click", () => markEnd().catch(report));
  $("link").addEventListener("click", () => copy(deepLink()));
  $("play").addEventListener("click", () => (S.playing ? pause() : play()));
  $("step-back").addEventListener("click", () => step(-1));
  $("step-fwd").addEventListener("click", () => step(1));
  $("scrubber").addEventListener("input", () => seek(Number($("scrubber").value)));
  $("speed").addEventListener("change", () => {
    const t = now();
    S.speed = Number($("speed").value);
    seek(t);
  });
  document.addEventListener("keydown", (ev) => {
    // Form fields keep their keys; a focused button is activated by the browser itself.
    if (!S.ep || ["INPUT", "SELECT", "BUTTON", "TEXTAREA"].includes(ev.target.tagName)) return;
    if (ev.key === " ") { ev.preventDefault(); S.playing ? pause() : play(); }
    else if (ev.key === ".") step(1);
    else if (ev.key === ",") step(-1);
    else if (ev.key === "s" && S.ep.labels !== undefined) label({ success: true }).catch(report);
    else if (ev.key === "f" && S.ep.labels !== undefined) label({ success: false }).catch(report);
    else if (ev.key === "[") markStart();
    else if (ev.key === "]") markEnd().catch(report);
  });
  window.addEventListener("resize", () => { for (const p of S.plots) { draw(p); placeCursor(p); } });
  await loadList();
  updateSelection();
  const q = new URLSearchParams(location.search);
  if (q.get("segment")) await openEpisode(q.get("segment"), Number(q.get("t") || 0));
}

function copy(text) {
  if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(text).then(() => status("copied"), () => status("copy: select the text and press Ctrl-C"));
  else status("copy: select the text and press Ctrl-C");
}

// For tests and the browser console: the episode clock and its controls.
window.rayformView = { time: () => (S.playing ? Math.min(now(), S.dur) : S.t), state: S, seek, play, pause, openEpisode };
start().catch(report);
