"""Benchmark: the README loader with and without text streams (and a tokenizer) in ``obs``.

Builds the demo slice (``rayform-server demo --small`` by default, ``--full`` for the README's
own), then the same segments with a ``task`` state stream (a task per episode, from 4 tasks)
and a ``language/subtask`` state stream (two subtasks per episode, the second from its middle)
added (the blobs of the other streams are the demo's), serves the data root on a loopback port
and times the README loader (``obs=["cam0/rgb", "wrist/rgb", "joints/position"]``, action
``joints/position_delta``, fps 15, horizon 16, ``EpisodeSampler(shuffle=True)``,
``rayform.torch.collate``) against the same loader with ``"task"`` appended to ``obs``, with
``"task"`` and ``"language/subtask"``, and with both and a tokenizer in the workers (a WordLevel
``tokenizers`` tokenizer trained on the strings, padded to 16), in alternating fresh processes
(``bench._timing.time_loader``: a warm-up, then timed windows of one continuous shuffled
stream). Reports each side's median samples/s and each ratio against the loader without text,
by samples/s and by CPU per sample of the loader's processes (targets: >= 0.98 with the text
streams, >= 0.95 with the tokenizer).

Usage::

    python -m bench.text_loader [--full] [--rounds 3] [--batches 20] [--workers 2]

Writes ``bench/results/text-loader-<small|full>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SLICE, TASKS_SLICE = "slc_7c1e04aa", "slc_7a5c7a5c"
TASKS = ["pick up the cube", "hand it over", "place it in the bin", "push it left"]
SUBTASKS = ["reach the cube", "close the gripper", "lift", "move over the bin", "open the gripper"]

ADD_TASKS = """
import sys, numpy as np
from rayform.format import encode_text
from rayform.manifest import Segment, Stream
from rayform_server.builder import commit_segments
from rayform_server.store import Store
store = Store(sys.argv[1])
m = store.load_manifest(store.get_slice(sys.argv[2])["manifest"])
tasks, subtasks = sys.argv[4].split("|"), sys.argv[5].split("|")
segs = []
for i, seg in enumerate(m.segments):
    ref = store.put_bytes(encode_text([seg.start_ns], [{"content": tasks[i % len(tasks)]}]))
    task = Stream("task", "text", ref, 15.0, (1,), "str", 1, seg.start_ns, seg.start_ns,
                  quantity="state")
    mid = (seg.start_ns + seg.end_ns) // 2
    two = [{"content": subtasks[(i + k) % len(subtasks)], "style": "subtask"} for k in (0, 1)]
    sub_ref = store.put_bytes(encode_text([seg.start_ns, mid], two))
    subtask = Stream("language/subtask", "text", sub_ref, 15.0, (1,), "str", 2, seg.start_ns,
                     mid, quantity="state")
    segs.append(Segment(seg.id, seg.version, seg.site, seg.start_ns, seg.end_ns,
                        {**seg.streams, "task": task, "language/subtask": subtask}))
store.set_slice(sys.argv[3], commit_segments(store, segs, "demo with tasks"), "demo with tasks")
"""

TIME = """
import json, sys
import rayform
from torch.utils.data import DataLoader
from bench._timing import time_loader
url, token, cache, slice_id, text, batches, workers, words = sys.argv[1:9]
obs = ["cam0/rgb", "wrist/rgb", "joints/position"]
obs += {"none": [], "task": ["task"]}.get(text, ["task", "language/subtask"])
tokenizer = None
if text == "tokens":
    import torch
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from tokenizers.trainers import WordLevelTrainer

    vocab = Tokenizer(WordLevel(unk_token="[UNK]"))
    vocab.pre_tokenizer = Whitespace()
    vocab.train_from_iterator(words.split("|"), WordLevelTrainer(special_tokens=["[PAD]", "[UNK]"]))
    vocab.enable_padding(pad_id=0, pad_token="[PAD]", length=16)

    def tokenizer(texts):
        enc = vocab.encode_batch(texts)
        return {"input_ids": torch.tensor([e.ids for e in enc]),
                "attention_mask": torch.tensor([e.attention_mask for e in enc]).bool()}

def make():
    client = rayform.Client(endpoint=url, token=token, cache_dir=cache)
    ds = rayform.torch.EpisodeDataset(client.slices.get(slice_id), obs=obs,
                                      action="joints/position_delta", fps=15, horizon=16,
                                      frame="ros", tokenizer=tokenizer)
    sampler = rayform.torch.EpisodeSampler(ds, shuffle=True)
    return DataLoader(ds, batch_size=64, num_workers=int(workers), sampler=sampler,
                      persistent_workers=int(workers) > 0, collate_fn=rayform.torch.collate)

row = time_loader(make, batches=int(batches), runs=3, warmup_batches=5,
                  batch_size_of=lambda b: int(b["action"].shape[0]), log=lambda m: None)
print(json.dumps({"samples_per_s": row["samples_per_s"], "runs": row["runs"],
                  "cpu_s_per_sample": row["cpu_s_per_sample"]}))
"""


def _py(code: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    out = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=3600
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="the full demo (default: --small)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    from bench._serve import serving

    work = Path(tempfile.mkdtemp(prefix="rayform-text-loader-"))
    root = work / "data"
    demo = [sys.executable, "-m", "rayform_server", "demo", "--root", str(root)]
    subprocess.run([*demo, *([] if args.full else ["--small"])], check=True, capture_output=True)
    _py(ADD_TASKS, str(root), SLICE, TASKS_SLICE, "|".join(TASKS), "|".join(SUBTASKS))
    words = "|".join(TASKS + SUBTASKS)
    sides = {
        "without_task": (SLICE, "none"),
        "with_task": (TASKS_SLICE, "task"),
        "with_task_subtask": (TASKS_SLICE, "subtask"),
        "with_task_subtask_tokenizer": (TASKS_SLICE, "tokens"),
    }
    runs: dict[str, list[float]] = {k: [] for k in sides}
    cpu: dict[str, list[float]] = {k: [] for k in sides}  # CPU s per sample, workers included
    with serving(root) as (url, token):
        cache = str(work / "cache")
        for slice_id, flag in sides.values():  # pull both: the timed loops read the cache
            _py(TIME, url, token, cache, slice_id, flag, "2", "0", words)
        for _ in range(args.rounds):
            for k, (slice_id, flag) in sides.items():
                doc = json.loads(
                    _py(
                        TIME,
                        url,
                        token,
                        cache,
                        slice_id,
                        flag,
                        str(args.batches),
                        str(args.workers),
                        words,
                    )
                )
                runs[k].append(doc["samples_per_s"])
                cpu[k].append(doc["cpu_s_per_sample"])
    result = {
        "demo": "full" if args.full else "small",
        "rounds": args.rounds,
        "batches": args.batches,
        "workers": args.workers,
        "runs": runs,
        **{k: statistics.median(v) for k, v in runs.items()},
    }
    result["ratio"] = result["with_task"] / result["without_task"]
    for k in ("with_task_subtask", "with_task_subtask_tokenizer"):
        result[f"ratio_{k}"] = result[k] / result["without_task"]
    # The same ratios round by round (sides alternate within a round: the same machine load),
    # and by CPU per sample (the loader's processes together): speed kept is the loader
    # without text's CPU per sample over this side's, which a shared machine moves far less.
    others = [k for k in sides if k != "without_task"]
    result["round_ratios"] = {
        k: [w / n for w, n in zip(runs[k], runs["without_task"], strict=True)] for k in others
    }
    result["cpu_s_per_sample"] = cpu
    result["cpu_ratios"] = {
        k: statistics.median(
            n / w for w, n in zip(cpu[k], cpu["without_task"], strict=True) if w > 0
        )
        for k in others
    }
    out = HERE / "results" / f"text-loader-{result['demo']}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=True))
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
