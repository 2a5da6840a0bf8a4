"""The LRA ``pathfinder`` task (Tay et al. 2021; presets as bench/tasks/lra.py says) and its generator: LRA
Pathfinder-style images (Linsley et al. 2018) — two markers, joined by one snake of paddles (label 1) or lying
on two different snakes (label 0), among distractor snakes. ``generate_pathfinder`` says how an image is drawn
and where it differs from the original generator; ``PathfinderParams`` holds the settings (LRA's pathfinder32
values, scaled for other sides).

2 classes: are the two markers joined by one path? Pixels 0-255 as tokens, no padding. LRA's 32x32 settings at
seq_len 1024 (paper); the CPU preset draws 16x16 images (seq_len 256) with the lengths scaled down
(``PathfinderParams.for_side``). Sizes: LRA's 80/10/10 of 200,000 images at 32x32 and above, 12,000 / 2,000 /
2,000 below; generated from ``--seed`` (like ``listops``) and cached as bench/tasks/data_files.py caches.

Shape legend: S image side, P pixels (S*S), K snake steps.
"""

import hashlib
import math
from dataclasses import asdict, dataclass
from typing import Dict, Optional

import numpy as np

from bench.tasks.data_files import cached
from bench.tasks.lra import LRATask, images_problem, lra_presets, square_side


@dataclass(frozen=True)
class PathfinderParams:
    """Generator settings in pixels of the output image; the defaults are LRA's pathfinder32 values
    (LRA's release) with the hardest contour length, 14 (``curv_contour_length_14``)."""

    side: int = 32
    padding: float = 1.0
    paddle_length: float = 2.0
    paddle_margin: float = 1.0  # gap between consecutive paddles, and the least gap between distinct strokes
    stroke_radius: float = 0.5  # paddles are drawn 1 px wide
    contour_length: int = 14  # paddles per target snake
    distractor_length: int = 4  # contour_length // 3
    num_distractors: int = 5  # 20 // distractor_length
    marker_radius: float = 1.5
    seed_distance: float = 7.0
    continuity: float = 1.0

    @classmethod
    def for_side(cls, side: int) -> "PathfinderParams":
        """LRA's values at 32 px. Other sides scale the seed distance and the contour length with the side
        (14·side/32 paddles above 32 px, 12·side/32 below, where longer snakes seldom fit: 6 at 16 px),
        distractor_length = contour_length // 3 and the number of distractors with the area; paddle, stroke
        and marker sizes stay in pixels."""
        if side == 32:
            return cls()
        scale = side / 32
        contour = max(3, round((14 if side > 32 else 12) * scale))
        distractor = max(1, contour // 3)
        return cls(
            side=side,
            contour_length=contour,
            distractor_length=distractor,
            num_distractors=max(1, round((20 // distractor) * scale * scale)),
            seed_distance=float(max(3, round(7 * scale))),
        )


_OCC, _RENDER, _BINS = 2, 4, 64  # occupancy and render grids: cells per pixel; orientation bins of the stamps
_TURNS = np.deg2rad(np.arange(-80.0, 81.0, 20.0))  # candidate turns per step, each jittered by ±10°


def _capsule(length: float, radius: float) -> np.ndarray:
    """(BINS, M, 2) integer (dy, dx) offsets of the cells within ``radius`` of a segment of ``length`` (cells)
    starting at a cell centre, one set per orientation bin, padded by repeating the first offset."""
    r = int(math.ceil(length + radius)) + 1
    grid = np.stack(np.mgrid[-r : r + 1, -r : r + 1], -1).reshape(-1, 2).astype(np.float64)
    sets = []
    for b in range(_BINS):
        u = np.array([math.sin(2 * math.pi * b / _BINS), math.cos(2 * math.pi * b / _BINS)])
        t = np.clip(grid @ u, 0.0, length)
        sets.append(grid[np.linalg.norm(grid - t[:, None] * u, axis=1) <= radius].astype(np.int64))
    size = max(len(s) for s in sets)
    return np.stack([np.concatenate([s, np.repeat(s[:1], size - len(s), 0)]) for s in sets])


def _unit(theta: np.ndarray) -> np.ndarray:
    return np.stack([np.sin(theta), np.cos(theta)], -1)  # (..., 2) as (dy, dx)


class _SnakeDrawer:
    """Vectorised over images: grows snakes on per-image occupancy grids and renders them."""

    def __init__(self, p: PathfinderParams, rng: np.random.Generator):
        self.p, self.rng = p, rng
        self.step = p.paddle_length + p.paddle_margin  # joint to joint; the paddle is centred in the step
        self.sep = 2 * p.stroke_radius + p.paddle_margin  # least centre-line distance between distinct strokes
        self.occ_stamp = _capsule(self.step * _OCC, self.sep * _OCC)
        self.paddle_stamp = _capsule(p.paddle_length * _RENDER, p.stroke_radius * _RENDER)
        self.marker_stamp = _capsule(0.0, p.marker_radius * _RENDER)
        self.marker_keepout = _capsule(0.0, (p.marker_radius + self.sep) * _OCC)
        self.margin = int(math.ceil((self.step + self.sep + p.marker_radius) * _RENDER)) + 2
        self.checks = np.arange(1, 7) * self.step / 6  # points checked along a candidate step (t > 0)

    def canvas(self, n: int, scale: int, walls: bool = False) -> np.ndarray:
        """(n, G, G) bool canvases with a margin around the image; ``walls`` marks everything closer than
        ``padding`` to the image border as occupied (exact at scale 2 for padding in half pixels)."""
        g = self.p.side * scale + 2 * self.margin
        canvas = np.zeros((n, g, g), bool)
        if walls:
            lo = self.margin + int(math.ceil(self.p.padding * scale))
            hi = self.margin + int(math.floor((self.p.side - self.p.padding) * scale))
            canvas[:, :lo], canvas[:, hi:], canvas[:, :, :lo], canvas[:, :, hi:] = True, True, True, True
        return canvas

    def stamp(self, canvas, rows, starts, thetas, offsets, scale):
        """Marks the cells of ``offsets`` around each start point (px) on the canvases of ``rows``."""
        g = canvas.shape[1]
        bins = np.round(np.asarray(thetas) / (2 * math.pi) * _BINS).astype(np.int64) % _BINS
        base = np.floor(starts * scale).astype(np.int64) + self.margin
        cells = base[:, None, :] + offsets[bins]  # (n, M, 2), inside the canvas thanks to the margin
        canvas.reshape(-1)[((rows[:, None] * g + cells[..., 0]) * g + cells[..., 1]).ravel()] = True

    def choose(self, occ, rows, starts, thetas, weights, include_start):
        """Per image, one of C candidate steps (starts (n, C, 2), thetas (n, C)) whose check points are inside
        the padded canvas and free, drawn with the given weights. Returns (index (n,), found (n,))."""
        g = occ.shape[1]
        ts = np.concatenate([[0.0], self.checks]) if include_start else self.checks
        u = _unit(thetas).astype(np.float32) * np.float32(_OCC)
        origin = (starts.astype(np.float32) * _OCC + self.margin)[:, :, None, :]  # (n, C, 1, 2) in cells
        pts = origin + ts.astype(np.float32)[None, None, :, None] * u[:, :, None, :]  # (n, C, T, 2)
        cells = np.clip(pts, 0, g - 1).astype(np.int64)  # the walls make anything near or past the border "hit"
        hit = occ.reshape(-1)[(rows[:, None, None] * g + cells[..., 0]) * g + cells[..., 1]]
        cum = np.cumsum(weights * ~hit.any(-1), 1)  # (n, C)
        total = cum[:, -1]
        idx = np.argmax(cum > (self.rng.random(len(rows)) * total)[:, None], 1)
        return idx, total > 0

    def grow(self, occ, rows, seed_starts, seed_thetas, steps):
        """Grows one snake per image from the first free of T seeds (seed_starts (n, T, 2)). A step turns by
        Δ with weight cos²(continuity·Δ) among the free candidates; the newest step is committed to the
        occupancy only when the next is placed (it touches its successor). Returns joints (n, steps+1, 2),
        step orientations (n, steps) and the number of steps placed (n,)."""
        n, ar = len(rows), np.arange(len(rows))
        joints, thetas = np.zeros((n, steps + 1, 2)), np.zeros((n, steps))
        idx, alive = self.choose(occ, rows, seed_starts, seed_thetas, np.ones(seed_thetas.shape), True)
        joints[:, 0], thetas[:, 0] = seed_starts[ar, idx], seed_thetas[ar, idx]
        joints[:, 1] = joints[:, 0] + self.step * _unit(thetas[:, 0])
        placed = alive.astype(np.int64)
        pending = alive.copy()
        for k in range(1, steps):
            live = np.flatnonzero(alive)
            delta = _TURNS[None, :] + (self.rng.random((len(live), len(_TURNS))) - 0.5) * np.deg2rad(20.0)
            cand = thetas[live, k - 1, None] + delta
            weights = np.cos(np.minimum(np.abs(delta) * self.p.continuity, np.pi / 2)) ** 2
            starts = np.repeat(joints[live, k][:, None, :], len(_TURNS), 1)
            idx, found = self.choose(occ, rows[live], starts, cand, weights, False)
            done = np.flatnonzero(pending)
            self.stamp(occ, rows[done], joints[done, k - 1], thetas[done, k - 1], self.occ_stamp, _OCC)
            pending[:] = False
            grown = live[found]
            thetas[grown, k] = cand[found, idx[found]]
            joints[grown, k + 1] = joints[grown, k] + self.step * _unit(thetas[grown, k])
            placed[grown] += 1
            alive[:] = False
            alive[grown] = pending[grown] = True
        done = np.flatnonzero(pending)
        last = placed[done] - 1
        self.stamp(occ, rows[done], joints[done, last], thetas[done, last], self.occ_stamp, _OCC)
        return joints, thetas, placed

    def grow_full(self, occ, rows, make_seeds, steps, attempts=3):
        """``grow`` until the snake has all its steps, up to ``attempts`` times per image (each failed
        attempt is erased from the occupancy first). make_seeds(i) → (starts (len(i), T, 2), thetas (len(i), T))
        for the local indices i. Returns joints, thetas and whether the snake is complete (n,)."""
        n = len(rows)
        snapshot = occ[rows].copy()
        joints, thetas, complete = np.zeros((n, steps + 1, 2)), np.zeros((n, steps)), np.zeros(n, bool)
        todo = np.arange(n)
        for _ in range(attempts):
            starts, angles = make_seeds(todo)
            j, t, placed = self.grow(occ, rows[todo], starts, angles, steps)
            joints[todo], thetas[todo] = j, t
            complete[todo] = placed == steps
            todo = todo[placed < steps]
            occ[rows[todo]] = snapshot[todo]
            if not len(todo):
                break
        return joints, thetas, complete

    def centre_line(self, joints):
        """(n, K+1, 2) joints → (n, 6K+1, 2) points every half step-sixth along the centre line."""
        t = np.arange(6) / 6
        seg = joints[:, :-1, None, :] + t[None, None, :, None] * (joints[:, 1:, None, :] - joints[:, :-1, None, :])
        return np.concatenate([seg.reshape(len(joints), -1, 2), joints[:, -1:]], 1)


def generate_pathfinder(
    count: int, params: PathfinderParams, rng: np.random.Generator, records: bool = False, chunk: int = 2048
):
    """``count`` Pathfinder images (count, S, S) uint8 and labels (count,) int64, exactly half positive
    (count // 2 negatives), in random order. With ``records`` also the snakes' joints and the markers.

    One image: (1) target snake A from a seed in the central square [2·seed_distance, S − 2·seed_distance)²,
    then target snake B from a seed ``seed_distance`` from A's seed, each ``contour_length`` paddles;
    (2) two markers (discs of ``marker_radius``): A's or B's origin tip, and the terminal tip of the same
    snake (label 1) or of the other one (label 0); (3) ``num_distractors`` snakes of ``distractor_length``
    paddles anywhere free; (4) strokes rendered 1 px wide at 4x resolution and averaged to 0-255.
    A snake is a chain of steps of paddle_length + paddle_margin px; the paddle (a dash) is centred in its
    step, so consecutive paddles are separated by ``paddle_margin``; each step turns by Δ drawn with weight
    cos²(continuity·Δ) (|Δ| < 90°) among candidates whose centre line keeps at least 2·stroke_radius +
    paddle_margin from every other stroke (and from the markers, for distractors) and ``padding`` from the
    border. Images whose target snakes cannot reach full length, whose markers lie closer than
    2·marker_radius + 1 px, or where the other target snake passes within marker_radius + 2·stroke_radius +
    paddle_margin of a marker, are rejected and drawn again.

    Differences from the original generator (drewlinsley/pathfinder, snakes2.py, as used by LRA): the two
    target snakes grow one after the other (there, in alternation); collisions are tested on a 2x occupancy
    grid with capsule stamps (there, dilated anti-aliased masks); turning candidates are 9 jittered angles
    (there, the pixels on a circle); distractors keep away from the markers, and a distractor that is boxed
    in stays shorter (there, it is dropped); no single-paddle clutter; all strokes have full contrast (there,
    per-paddle contrasts); labels are exactly balanced (there, Bernoulli(0.5))."""
    p = params
    draw = _SnakeDrawer(p, rng)
    side_r = p.side * _RENDER
    quota = {1: count - count // 2, 0: count // 2}
    kept = {0: [], 1: []}
    tried, made = 0, 0
    while quota[0] > 0 or quota[1] > 0:
        # candidates for what is missing at the yield seen so far (deterministic: depends only on the draws)
        if tried >= 20_000 and made == 0:
            raise ValueError(f"pathfinder: no image fits these settings ({p}); use a larger side")
        rate = max(made / tried, 0.05) if tried else 0.3
        n = int(min(chunk, max(64, 1.2 * (quota[0] + quota[1]) / rate)))
        occ = draw.canvas(n, _OCC, walls=True)
        rows = np.arange(n)
        lo, hi = 2 * p.seed_distance, p.side - 2 * p.seed_distance
        if hi - lo < 2:
            lo, hi = p.side / 2 - 1, p.side / 2 + 1
        ja, ta, ok = draw.grow_full(
            occ,
            rows,
            lambda i: (rng.uniform(lo, hi, (len(i), 8, 2)), rng.uniform(-np.pi, np.pi, (len(i), 8))),
            p.contour_length,
        )
        rows, ja, ta = rows[ok], ja[ok], ta[ok]
        jb, tb, ok = draw.grow_full(
            occ,
            rows,
            lambda i: (
                ja[i, None, 0] + p.seed_distance * _unit(rng.uniform(-np.pi, np.pi, (len(i), 8))),
                rng.uniform(-np.pi, np.pi, (len(i), 8)),
            ),
            p.contour_length,
        )
        rows, ja, ta, jb, tb = rows[ok], ja[ok], ta[ok], jb[ok], tb[ok]
        joints, thetas = np.stack([ja, jb], 1), np.stack([ta, tb], 1)  # (m, 2, K+1, 2), (m, 2, K)
        half = p.paddle_margin / 2
        origin = joints[:, :, 0] + half * _unit(thetas[:, :, 0])  # (m, 2, 2) tips of the first paddles
        terminal = joints[:, :, -1] - half * _unit(thetas[:, :, -1])  # tips of the last paddles
        m, ar = len(rows), np.arange(len(rows))
        labels = rng.integers(0, 2, m)
        first = rng.integers(0, 2, m)  # the snake whose origin tip is marked
        second = np.where(labels == 1, first, 1 - first)
        tips = np.stack([origin[ar, first], terminal[ar, second]], 1)  # (m, 2, 2)
        owner = np.stack([first, second], 1)
        good = np.linalg.norm(tips[:, 0] - tips[:, 1], axis=-1) >= 2 * p.marker_radius + 1
        lines = np.stack([draw.centre_line(ja), draw.centre_line(jb)], 1)  # (m, 2, L, 2)
        for j in range(2):  # the snake that does not own marker j keeps clear of it
            other = lines[ar, 1 - owner[:, j]]
            gap = np.linalg.norm(other - tips[:, j, None, :], axis=-1).min(1)
            good &= gap >= p.marker_radius + draw.sep
        rows, joints, thetas, tips, owner, labels = (a[good] for a in (rows, joints, thetas, tips, owner, labels))
        for j in range(2):
            draw.stamp(occ, rows, tips[:, j], np.zeros(len(rows)), draw.marker_keepout, _OCC)
        distractors = []
        for _ in range(p.num_distractors):
            seeds = rng.uniform(p.padding, p.side - p.padding, (len(rows), 8, 2))
            distractors.append(
                draw.grow(occ, rows, seeds, rng.uniform(-np.pi, np.pi, (len(rows), 8)), p.distractor_length)
            )
        # render: every placed step's paddle and the two marker discs on a 4x canvas, then block means
        canvas = draw.canvas(len(rows), _RENDER)
        local = np.arange(len(rows))
        targets = [(joints[:, s], thetas[:, s], np.full(len(rows), p.contour_length)) for s in range(2)]
        for dj, dt, dn in targets + distractors:  # (m, K+1, 2) joints, (m, K) angles, (m,) steps placed
            for k in range(dt.shape[1]):
                has = np.flatnonzero(dn > k)
                start = dj[has, k] + half * _unit(dt[has, k])
                draw.stamp(canvas, local[has], start, dt[has, k], draw.paddle_stamp, _RENDER)
        for j in range(2):
            draw.stamp(canvas, local, tips[:, j], np.zeros(len(rows)), draw.marker_stamp, _RENDER)
        inner = canvas[:, draw.margin : draw.margin + side_r, draw.margin : draw.margin + side_r]
        images = np.round(inner.reshape(-1, p.side, _RENDER, p.side, _RENDER).mean((2, 4)) * 255).astype(np.uint8)
        tried, made = tried + n, made + len(rows)
        for i in range(len(rows)):
            label = int(labels[i])
            if quota[label] > 0:
                quota[label] -= 1
                record = None
                if records:
                    record = {
                        "joints": joints[i],
                        "tips": tips[i],
                        "owner": owner[i],
                        "distractors": [dj[i, : dn[i] + 1] for dj, _, dn in distractors if dn[i] > 0],
                    }
                kept[label].append((images[i], record))
    everything = [(img, 1, rec) for img, rec in kept[1]] + [(img, 0, rec) for img, rec in kept[0]]
    order = rng.permutation(len(everything))
    images = np.stack([everything[i][0] for i in order]) if count else np.zeros((0, p.side, p.side), np.uint8)
    labels = np.array([everything[i][1] for i in order], dtype=np.int64)
    if records:
        return images, labels, [everything[i][2] for i in order]
    return images, labels


# ------------------------------------------------------------------------------------------ the task
class Pathfinder(LRATask):
    """LRA Pathfinder from our generator; the paper preset is Table 7's "Pathfinder" column."""

    GENERATOR_VERSION = 1  # bump when the generator changes: old caches are then ignored
    reads_files = False  # generated

    def __init__(self):
        super().__init__(
            "pathfinder",
            "cls",
            vocab_size=256,
            num_classes=2,
            metric="accuracy",
            presets=lra_presets(1024, 1024, 5e-4, 62_400, 312, 312, 20),
        )
        self.sizes: Optional[Dict[str, int]] = None  # None: by image side (see the module docstring)

    @staticmethod
    def default_sizes(side: int) -> Dict[str, int]:
        if side >= 32:
            return {"train": 160_000, "valid": 20_000, "test": 20_000}
        return {"train": 12_000, "valid": 2_000, "test": 2_000}

    def setup(self, seq_len, seed, data_dir, eval_context=0):
        side = square_side(seq_len, "pathfinder")
        if side < 16:
            raise ValueError(f"pathfinder: images need a side of at least 16 px (seq_len 256), got {seq_len}")
        params = PathfinderParams.for_side(side)
        sizes = self.sizes or self.default_sizes(side)
        key = hashlib.sha256(repr((self.GENERATOR_VERSION, asdict(params), sorted(sizes.items()), seed)).encode())
        arrays = cached(
            data_dir,
            f"pathfinder-{key.hexdigest()[:20]}",
            lambda: self.generate(params, sizes, seed),
            lambda arrays: images_problem(arrays, sizes, (side, side)),
        )
        self.splits = {
            split: (arrays[f"{split}_x"].reshape(-1, side * side), arrays[f"{split}_y"])
            for split in ("train", "valid", "test")
        }

    @staticmethod
    def generate(params, sizes, seed):
        arrays = {}
        for offset, split in enumerate(("train", "valid", "test")):
            rng = np.random.default_rng([seed % 2**32, offset, 7])
            arrays[f"{split}_x"], arrays[f"{split}_y"] = generate_pathfinder(sizes[split], params, rng)
        return arrays
