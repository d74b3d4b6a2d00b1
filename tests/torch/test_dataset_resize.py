"""EpisodeDataset(image_size=, resize=): every camera at the training resolution, the same
pixels whatever the decoder, today's frames without it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from rayform import DatasetURI, InvalidArgumentError
from rayform._resolution import Plan, Target, parse_image_size
from rayform.integrations._common import sample_spec
from rayform.slice import Slice
from rayform.torch import EpisodeDataset, MixtureDataset, collate
from rayform.torch._decoding import _batch
from rayform.torch._decoding._resize import resize_frames
from rayform.torch._decoding._video import forget_intra_checks

CAMS = ["cam0/rgb", "wrist/rgb"]
OBS = [*CAMS, "joints/position"]
ACTION = "joints/position_delta"
KEYS = [0, 9, 31, 20, 57, 3]  # across the small demo's 4 episodes, out of order


def make(slice_: Slice, **kw) -> EpisodeDataset:
    return EpisodeDataset(slice_, obs=OBS, action=ACTION, fps=15, horizon=4, shard=None, **kw)


def frames(ds: EpisodeDataset, key: str = "cam0/rgb") -> torch.Tensor:
    return torch.stack([s[key] for s in ds.__getitems__(KEYS)])


def reference(full: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """The interpolation the docs name, on a contiguous uint8 batch."""
    return F.interpolate(full.contiguous(), size=size, mode="bilinear", antialias=True)


# -- geometry ------------------------------------------------------------------------------------
def test_each_mode_places_the_frame_as_documented() -> None:
    # 96x128 (4:3) into 64x64.
    assert Target(64, 64, "pad").plan(96, 128) == Plan((0, 0, 96, 128), (48, 64), (8, 0))
    assert Target(64, 64, "squash").plan(96, 128) == Plan((0, 0, 96, 128), (64, 64), (0, 0))
    assert Target(64, 64, "crop").plan(96, 128) == Plan((0, 16, 96, 96), (64, 64), (0, 0))
    # A tall target: pad fits the width and pads rows; crop keeps every row.
    assert Target(64, 32, "pad").plan(96, 128) == Plan((0, 0, 96, 128), (24, 32), (20, 0))
    assert Target(64, 32, "crop").plan(96, 128) == Plan((0, 40, 96, 48), (64, 32), (0, 0))
    assert Target(224, 224, "pad").plan(480, 640) == Plan((0, 0, 480, 640), (168, 224), (28, 0))
    assert Target(224, 224, "pad").plan(480, 640).downscales
    assert not Target(224, 224, "crop").plan(96, 128).downscales


def test_resize_frames_pads_with_zeros_and_crops_the_centre() -> None:
    full = torch.randint(1, 256, (2, 3, 96, 128), dtype=torch.uint8)
    padded = resize_frames(full, Target(64, 64, "pad"))
    assert padded.shape == (2, 3, 64, 64) and padded.dtype == torch.uint8 and padded.is_contiguous()
    assert not padded[:, :, :8].any() and not padded[:, :, 56:].any()
    assert torch.equal(padded[:, :, 8:56], reference(full, (48, 64)))
    cropped = resize_frames(full, Target(64, 64, "crop"))
    assert torch.equal(cropped, reference(full[:, :, :, 16:112], (64, 64)))
    assert torch.equal(resize_frames(full, Target(64, 64, "squash")), reference(full, (64, 64)))
    # Already at the size: the stored pixels, untouched (a non-contiguous input made contiguous).
    same = resize_frames(
        full.permute(0, 1, 3, 2).contiguous().transpose(2, 3), Target(96, 128, "squash")
    )
    assert torch.equal(same, full) and same.is_contiguous()


# -- the dataset ---------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["pad", "squash", "crop"])
def test_every_camera_is_the_target_size_in_every_mode(demo: Slice, mode: str) -> None:
    full = frames(make(demo))
    ds = make(demo, image_size=(64, 64), resize=mode)
    got = frames(ds)
    assert got.shape == (len(KEYS), 3, 64, 64) and got.dtype == torch.uint8
    assert torch.equal(got, resize_frames(full, Target(64, 64, mode)))
    if mode == "pad":  # the demo's cameras are 4:3: 8 zero rows above and below
        assert not got[:, :, :8].any() and not got[:, :, 56:].any() and got[:, :, 8:56].any()
    sample = ds[KEYS[1]]
    assert (
        sample["wrist/rgb"].shape == (3, 64, 64)
        and sample["joints/position"].dtype == torch.float32
    )
    assert ds.frame_shape("wrist/rgb") == (3, 64, 64)


def test_a_size_per_camera(demo: Slice) -> None:
    ds = make(demo, image_size={"wrist/rgb": (32, 48), "cam0/rgb": (64, 64)}, resize="squash")
    sample = ds[KEYS[2]]
    assert sample["cam0/rgb"].shape == (3, 64, 64) and sample["wrist/rgb"].shape == (3, 32, 48)
    assert ds.image_size == {"cam0/rgb": (64, 64), "wrist/rgb": (32, 48)}
    assert "image_size=cam0/rgb:64x64,wrist/rgb:32x48&" in ds.uri
    same = make(demo, image_size={"wrist/rgb": (64, 64), "cam0/rgb": (64, 64)})
    assert same.image_size == (64, 64) and "image_size=64x64&" in same.uri


def test_without_image_size_the_frames_are_todays_bit_for_bit(demo: Slice) -> None:
    default = make(demo)
    explicit = make(demo, image_size=None, resize="crop")
    for key in CAMS:
        stored = frames(default, key)
        assert stored.shape == (len(KEYS), 3, 96, 128)
        assert torch.equal(stored, frames(explicit, key))
    assert (
        default.uri == explicit.uri and "?v=1&" in default.uri and "image_size" not in default.uri
    )
    assert default.describe()["image_size"] is None and default.describe()["resize"] is None
    assert default.frame_shape("cam0/rgb") == (3, 96, 128)


@pytest.mark.parametrize("mode", ["pad", "squash", "crop"])
def test_every_decoder_backend_gives_the_same_resized_pixels(demo: Slice, mode: str) -> None:
    forget_intra_checks()
    got = {}
    for backend in (None, "torchcodec", "pyav"):
        ds = make(demo, image_size=(72, 60), resize=mode, decoder_backend=backend)
        got[backend] = torch.cat([frames(ds, key) for key in CAMS])
        assert set(ds.open_decoders()) == {backend or "intra"}  # None: the packet decoder
    assert torch.equal(got[None], got["torchcodec"]) and torch.equal(got[None], got["pyav"])
    assert got[None].shape == (2 * len(KEYS), 3, 72, 60)


def test_workers_threads_and_collate_give_the_in_process_batches(demo: Slice) -> None:
    ds = make(demo, image_size=(64, 64), resize="pad")
    base = DataLoader(ds, batch_size=8)
    ref = [b["cam0/rgb"] for b in base]
    assert ref[0].shape == (8, 3, 64, 64)
    loader = DataLoader(ds, batch_size=8, num_workers=2, collate_fn=collate)
    assert all(torch.equal(a, b["cam0/rgb"]) for a, b in zip(ref, loader, strict=True))
    threaded = make(demo, image_size=(64, 64), resize="pad", decode_threads=2)
    assert all(
        torch.equal(a, b["cam0/rgb"])
        for a, b in zip(ref, DataLoader(threaded, batch_size=8), strict=True)
    )


@pytest.mark.parametrize("threads", [0, 2])
def test_a_batch_resized_in_several_buffers_gives_the_same_frames(
    demo: Slice, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = {key: frames(make(demo, image_size=(64, 64)), key) for key in CAMS}
    # A buffer of one frame: each segment's frames decoded and resized apart (with threads,
    # each buffer's resize split between them too).
    monkeypatch.setattr(_batch, "_BUFFER_BYTES", 1)
    ds = make(demo, image_size=(64, 64), decode_threads=threads)
    assert all(torch.equal(frames(ds, key), ref[key]) for key in CAMS)


def test_frames_enlarged_past_the_per_call_bound_match_a_fresh_reader(
    demo: Slice, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 96x128 frames enlarged to 384x512: the scaled frames are 16x the decoded ones, and one
    # segment's frames alone exceed the 3 MiB bound of a call (never split: one call anyway).
    monkeypatch.setattr(_batch, "_BUFFER_BYTES", 3 << 20)
    ds = make(demo, image_size=(384, 512))
    for keys in ([0, 2, 4], list(range(0, 64, 2)), [1, 3, 5]):
        batch = ds.__getitems__(keys)
        fresh = make(demo, image_size=(384, 512)).__getitems__(keys)  # nothing read before
        assert all(
            torch.equal(s[cam], r[cam]) for s, r in zip(batch, fresh, strict=True) for cam in CAMS
        )
        assert batch[0]["cam0/rgb"].shape == (3, 384, 512)


def test_history_of_frames_is_resized_too(demo: Slice) -> None:
    ds = make(demo, image_size=(32, 32), resize="crop", obs_steps=3)
    sample = ds[KEYS[1]]
    assert sample["cam0/rgb"].shape == (3, 3, 32, 32)
    assert sample_spec(ds)["cam0/rgb"] == ("uint8", (3, 3, 32, 32))


# -- what reports shapes and lineage follows ----------------------------------------------------
def test_tracker_spec_describe_and_uri_carry_the_resolution(demo: Slice) -> None:
    ds = make(demo, image_size=(64, 48), resize="crop")
    spec = sample_spec(ds)
    assert spec["cam0/rgb"] == ("uint8", (3, 64, 48)) and spec["wrist/rgb"] == (
        "uint8",
        (3, 64, 48),
    )
    d = ds.describe()
    assert d["image_size"] == [64, 48] and d["resize"] == "crop"
    uri = DatasetURI.parse(ds.uri)
    assert (
        ds.uri.split("?")[1].startswith("v=3&")
        and uri.image_size == "64x48"
        and uri.resize == "crop"
    )
    assert uri.dataset_kwargs()["image_size"] == (64, 48)
    rebuilt = EpisodeDataset(demo, **uri.dataset_kwargs(), shard=None)
    assert rebuilt.uri == ds.uri and torch.equal(frames(rebuilt), frames(ds))


def test_a_mixture_checks_the_resized_shapes(demo: Slice) -> None:
    a = make(demo, image_size=(64, 64))
    MixtureDataset([(a, 1), (make(demo, image_size=(64, 64), resize="crop"), 1)])
    with pytest.raises(InvalidArgumentError, match=r"'cam0/rgb' differs.*same image_size="):
        MixtureDataset([(a, 1), (make(demo), 1)])


# -- arguments -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (
            {"image_size": (224, 224), "resize": "letterbox"},
            r"resize='letterbox': use one of 'pad', 'squash', 'crop'",
        ),
        ({"resize": "stretch"}, "resize='stretch': use one of"),
        (
            {"image_size": 224},
            r"image_size=224: use \(height, width\) in pixels.*e.g. \(224, 224\)",
        ),
        ({"image_size": (224, 0)}, r"image_size=\(224, 0\): use \(height, width\)"),
        ({"image_size": (224, 224, 3)}, "two integers from 1 to 8192"),
        ({"image_size": (True, 224)}, "two integers"),
        ({"image_size": (224.0, 224)}, "two integers"),
        ({"image_size": "224x224"}, "use \\(height, width\\)"),
        (
            {"image_size": {"cam0/rgb": (64, 64)}},
            "no size for camera 'wrist/rgb': give every camera a size",
        ),
        (
            {
                "image_size": {
                    "cam0/rgb": (64, 64),
                    "wrist/rgb": (64, 64),
                    "joints/position": (1, 1),
                }
            },
            "'joints/position', which is not a camera of this dataset: key it by the sample's camera keys",
        ),
        (
            {"image_size": {"cam0/rgb": (64, 64), "wrist/rgb": (0, 64)}},
            r"image_size\['wrist/rgb'\]=\(0, 64\)",
        ),
    ],
)
def test_arguments_are_checked_up_front(demo: Slice, kw: dict, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        make(demo, **kw)


def test_image_size_needs_a_camera(demo: Slice) -> None:
    with pytest.raises(InvalidArgumentError, match="obs has no camera"):
        EpisodeDataset(demo, obs=["joints/position"], action=ACTION, fps=15, image_size=(64, 64))
    with pytest.raises(InvalidArgumentError, match="'joints/position' is not a camera"):
        make(demo).frame_shape("joints/position")


def test_a_pulls_sizes_are_checked_on_a_slice_without_renditions(demo: Slice) -> None:
    # No rendition to choose, so the originals; but a size for an unknown camera, or for
    # streams without one, is as wrong as on a slice with renditions.
    assert not demo.segments.has_renditions
    sizes = {"cam0/rgb": (24, 32), "wrist/rgb": (24, 32)}
    assert demo.blobs(image_size=sizes) == demo.blobs()
    with pytest.raises(InvalidArgumentError, match="'cam9/rgb', which is not a camera"):
        demo.blobs(image_size={**sizes, "cam9/rgb": (24, 32)})
    with pytest.raises(InvalidArgumentError, match="no camera"):
        demo.blobs(["joints/position"], image_size=(24, 32))
    with pytest.raises(InvalidArgumentError, match="HEIGHTxWIDTH"):
        parse_image_size("\u00b2x2")  # a digit to str.isdigit(), not to int()


@pytest.mark.parametrize(
    ("query", "match"),
    [
        (
            "v=1&image_size=64x64&resize=pad",
            "image_size= under v=1: a training resolution is query version v=3",
        ),
        ("v=2&image_size=64x64&resize=pad", "image_size= under v=2"),
        ("v=3", "lacks image_size, resize"),
        ("v=3&image_size=64x64", "lacks resize"),
        ("v=3&image_size=64&resize=pad", "write HEIGHTxWIDTH"),
        ("v=3&image_size=64x64&resize=fit", "resize='fit': use one of"),
        ("v=3&image_size=b:64x64,a:32x32&resize=pad", "'b', which is not in obs"),
    ],
)
def test_uri_refuses_a_malformed_resolution(query: str, match: str) -> None:
    args = "action=&action_mode=hold&fps=15&frame=&horizon=1&obs=a&obs_steps=1&seed=0"
    with pytest.raises(InvalidArgumentError, match=match):
        DatasetURI.parse(f"rayform://h/slc_7c1e04aa@{'ab' * 32}?{query}&{args}")


def test_uri_resolution_is_canonical() -> None:
    base = f"rayform://h/slc_7c1e04aa@{'ab' * 32}?"
    args = "action=&action_mode=hold&fps=15&frame=&horizon=1&obs=b,a&obs_steps=1&seed=0"
    uri = DatasetURI.parse(f"{base}v=3&resize=pad&image_size=a%3A32x32,b:64x64&{args}")
    assert str(uri) == (
        f"{base}v=3&action=&action_mode=hold&fps=15&frame=&horizon=1"
        "&image_size=b:64x64,a:32x32&obs=b,a&obs_steps=1&resize=pad&seed=0"
    )
    same = DatasetURI.parse(f"{base}v=3&resize=squash&image_size=a:32x32,b:32x32&{args}")
    assert same.image_size == "32x32" and same.dataset_kwargs()["image_size"] == (32, 32)
    assert DatasetURI.parse(str(uri)) == uri
