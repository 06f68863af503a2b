"""Video I/O with PyAV: frame-sparse decoding, the one resize path, mp4 writing, frame counting.

Decoding (``VideoDecoder.decode``) returns exactly the frames asked for, by timestamp:
it seeks once to the keyframe before the first wanted frame, decodes forward, and converts to
RGB *only* the wanted frames, resizing them in the same swscale call (the original
decoded and converted every clip frame at full size, then resized each one separately).
Open containers are cached per process, so a DataLoader worker opens each file once.

The swscale conversion (and ``resize_rgb`` for live images) lives in ``transforms.images``: one
resize path for training and inference.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from av.video.reformatter import VideoReformatter

from dit4dit_npu.data.errors import DatasetError
from dit4dit_npu.transforms.images import swscale_rgb

# When two wanted frames are further apart than this, seeking is cheaper than decoding through.
SEEK_GAP_S = 1.0


class VideoDecoder:
    """Frame-sparse decoder with a per-process LRU cache of open containers.

    Safe with forked DataLoader workers: a cache inherited from another process is dropped on
    first use (file positions are shared across fork, so containers must never be shared), and
    pickling (spawn) carries no open files.
    """

    def __init__(self, max_open: int = 64, seek_gap_s: float = SEEK_GAP_S) -> None:
        self.max_open = max_open
        self.seek_gap_s = seek_gap_s
        self._cache: OrderedDict[str, av.container.InputContainer] = OrderedDict()
        self._pid = os.getpid()
        self._reformatter = VideoReformatter()

    def __getstate__(self) -> dict:
        return {"max_open": self.max_open, "seek_gap_s": self.seek_gap_s}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def close(self) -> None:
        if self._pid == os.getpid():
            for c in self._cache.values():
                c.close()
        self._cache.clear()

    def _open(self, path: Path) -> av.container.InputContainer:
        if self._pid != os.getpid():  # forked: never touch the parent's containers or contexts
            self._cache = OrderedDict()
            self._reformatter = VideoReformatter()
            self._pid = os.getpid()
        key = str(path)
        container = self._cache.get(key)
        if container is not None:
            self._cache.move_to_end(key)
            return container
        if not path.is_file():
            raise DatasetError(f"video file missing: {path}")
        try:
            container = av.open(key)
        except (av.FFmpegError, OSError) as e:
            raise DatasetError(f"cannot open video {path} (truncated or corrupt mp4?): {e}") from None
        if not container.streams.video:
            container.close()
            raise DatasetError(f"video file {path} has no video stream")
        # One decode thread: DataLoader workers parallelize; frame threads add latency to seeks.
        container.streams.video[0].codec_context.thread_count = 1
        self._cache[key] = container
        while len(self._cache) > self.max_open:
            _, old = self._cache.popitem(last=False)
            old.close()
        return container

    def decode(
        self,
        path: str | Path,
        timestamps: Sequence[float],
        tolerance_s: float = 1e-4,
        size_hw: Sequence[int] | None = None,
    ) -> np.ndarray:
        """Frames at ``timestamps`` (seconds, any order, repeats allowed) -> uint8 (N, H, W, 3).

        A frame matches a timestamp when their difference is within ``tolerance_s`` (lerobot's
        rule); a timestamp with no matching frame is an error naming the file and the closest frame.
        """
        path = Path(path)
        wanted = sorted(set(float(t) for t in timestamps))
        if not wanted:
            raise ValueError("decode: no timestamps requested")
        container = self._open(path)
        try:
            found = self._decode_sorted(container, wanted, tolerance_s, size_hw, path)
        except av.FFmpegError as e:
            self._drop(path)
            raise DatasetError(f"error decoding video {path} (truncated or corrupt?): {e}") from None
        except DatasetError:
            self._drop(path)
            raise
        return np.stack([found[float(t)] for t in timestamps])

    def _drop(self, path: Path) -> None:
        c = self._cache.pop(str(path), None)
        if c is not None:
            c.close()

    def _decode_sorted(
        self,
        container: av.container.InputContainer,
        wanted: list[float],
        tol: float,
        size_hw: Sequence[int] | None,
        path: Path,
    ) -> dict[float, np.ndarray]:
        stream = container.streams.video[0]
        time_base = float(stream.time_base or Fraction(1, 1_000_000))  # float: Fraction math is slow
        found: dict[float, np.ndarray] = {}
        i = 0
        while i < len(wanted):
            # Seek to the keyframe at or before (target - tol); the decoder is flushed by seek.
            target_pts = int((wanted[i] - tol) / time_base)
            container.seek(max(target_pts, 0), stream=stream, backward=True, any_frame=False)
            last_time = None
            reseek = False
            for frame in container.decode(stream):
                if frame.pts is None:
                    continue
                t = frame.pts * time_base
                last_time = t
                if t < wanted[i] - tol:
                    continue  # decoded only as a reference for later frames; never converted
                if abs(t - wanted[i]) > tol:
                    raise DatasetError(
                        f"video {path}: no frame within {tol:g} s of t={wanted[i]:.6f} s "
                        f"(nearest decoded frame at {t:.6f} s; timestamps off the video's frame grid?)"
                    )
                image = swscale_rgb(frame, size_hw, self._reformatter)
                while i < len(wanted) and abs(t - wanted[i]) <= tol:
                    found[wanted[i]] = image
                    i += 1
                if i == len(wanted):
                    return found
                if wanted[i] - t > self.seek_gap_s:
                    reseek = True
                    break
            if not reseek:
                end = "no frames" if last_time is None else f"last frame at {last_time:.6f} s"
                raise DatasetError(
                    f"video {path} ends before t={wanted[i]:.6f} s ({end}; truncated video or "
                    f"episode longer than its video?)"
                )
        return found


class Mp4Writer:
    """Streaming yuv420p mp4 encoder: frames are appended in any number of calls, so a long
    recording (or several episodes sharing one file) never has to be held in memory at once."""

    def __init__(
        self,
        path: str | Path,
        size_hw: Sequence[int],
        fps: int,
        codec: str = "libx264",
        gop: int = 8,
        crf: int = 12,
    ) -> None:
        h, w = int(size_hw[0]), int(size_hw[1])
        if h % 2 or w % 2:
            raise ValueError(f"yuv420p needs even frame sizes, got {h}x{w}")
        self.size_hw = (h, w)
        self.frames = 0
        self._container = av.open(str(path), "w")
        try:
            self._stream = self._container.add_stream(codec, rate=fps)
        except ValueError:  # av's UnknownCodecError
            self._container.close()
            raise DatasetError(f"video codec {codec!r}: not available in this PyAV/FFmpeg build (e.g. libx264)") from None
        self._stream.width, self._stream.height = w, h
        self._stream.pix_fmt = "yuv420p"
        # libsvtav1 (lerobot's default encoder, g=2) takes a numeric preset; x264 a named one.
        preset = {"libx264": "veryfast", "libsvtav1": "10"}.get(codec)
        self._stream.options = {"crf": str(crf), "g": str(gop)} | ({"preset": preset} if preset else {})

    def write(self, frames: np.ndarray) -> None:
        """Append uint8 RGB frames, (N, H, W, 3) or one (H, W, 3)."""
        frames = np.asarray(frames)
        if frames.ndim == 3:
            frames = frames[None]
        if frames.dtype != np.uint8 or frames.shape[1:] != (*self.size_hw, 3):
            raise ValueError(
                f"expected uint8 frames of shape (N, {self.size_hw[0]}, {self.size_hw[1]}, 3), "
                f"got {frames.dtype} {frames.shape}"
            )
        for f in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")
            for packet in self._stream.encode(frame):
                self._container.mux(packet)
        self.frames += len(frames)

    def close(self) -> None:
        if self._container is None:
            return
        for packet in self._stream.encode():  # flush the encoder's delayed frames
            self._container.mux(packet)
        self._container.close()
        self._container = None

    def __enter__(self) -> Mp4Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_mp4(
    path: str | Path,
    frames: np.ndarray,
    fps: int,
    codec: str = "libx264",
    gop: int = 8,
    crf: int = 12,
) -> None:
    """Encode uint8 (N, H, W, 3) RGB frames as a yuv420p mp4 (H, W even), h264 by default."""
    with Mp4Writer(path, frames.shape[1:3], fps, codec=codec, gop=gop, crf=crf) as writer:
        writer.write(frames)


def probe_video(path: str | Path) -> dict:
    """Frame count (by demuxing packets, no decode), size, fps and last frame time of a video."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"video file missing: {path}")
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise DatasetError(f"video file {path} has no video stream")
            stream = container.streams.video[0]
            tb = stream.time_base
            pts = [p.pts for p in container.demux(stream) if p.size and p.pts is not None]
            info = {
                "frames": len(pts),
                "height": stream.codec_context.height,
                "width": stream.codec_context.width,
                "fps": float(stream.average_rate) if stream.average_rate else None,
                "codec": stream.codec_context.name,
                "last_time": float(max(pts) * tb) if pts else None,
            }
    except av.FFmpegError as e:
        raise DatasetError(f"cannot read video {path} (truncated or corrupt mp4?): {e}") from None
    return info


def decoded_size(path: str | Path) -> tuple[int, int]:
    """(H, W) of the first decoded frame: what training really gets, whatever info.json says."""
    path = Path(path)
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise DatasetError(f"video file {path} has no video stream")
            for frame in container.decode(container.streams.video[0]):
                return frame.height, frame.width
    except av.FFmpegError as e:
        raise DatasetError(f"cannot decode video {path} (truncated or corrupt mp4?): {e}") from None
    raise DatasetError(f"video file {path} has no frames")


def decode_problem(path: str | Path, expected_frames: int | None = None) -> str | None:
    """Decode every frame (no RGB conversion): a corrupt payload that demuxing alone does not
    see is found here, before training, rather than at step N and again on every resume."""
    path = Path(path)
    n, last = 0, None
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            stream.codec_context.thread_count = 0  # a check, not a DataLoader worker: use the cores
            for frame in container.decode(stream):
                n += 1
                last = frame.time
    except (av.FFmpegError, IndexError) as e:
        where = "before the first frame" if last is None else f"after frame {n} (t={last:.3f} s)"
        return f"{path}: decoding fails {where}: {e}"
    if expected_frames is not None and n != expected_frames:
        return f"{path}: {n} frames decode, the stream holds {expected_frames} (corrupt payload?)"
    return None
