"""Near-duplicate search over 64-bit perceptual hashes (tpustream/image/phash.py): every (query, base) pair within
Hamming distance ``d``, at a million base hashes, in bounded memory, by multi-index hashing.

Multi-index hashing (Norouzi, Punjani and Fleet, "Fast Exact Search in Hamming Space with Multi-Index Hashing",
2014): the 64 bits are cut into ``m`` substrings. If two hashes are within ``d`` and substring ``i`` is searched
within radius ``r_i``, then by pigeonhole some searched substring matches within its radius as soon as
``sum(r_i + 1) >= d + 1`` (otherwise the distance would be at least that sum). So each query looks up its
substring's neighbours within ``r_i`` in a table of base hashes bucketed by that substring, and only those
candidates are verified with a 64-bit popcount. ``m = d + 1`` substrings with radius 0 is the plain pigeonhole
version; at a million hashes its ~6-bit buckets hold ~16,000 hashes each, so the planner below picks ``m`` (3 to
``d + 1``) and the radii from the sizes: at 1,000,000 base hashes and d = 8, three ~21-bit substrings each
searched within radius 2. The search is exact (the same pairs as brute force, tests/unit/test_near_duplicates.py)
and integer-only.

The default distance, ``DEFAULT_MAX_DISTANCE``, comes from the planted-copy ROC (``planted_copy_roc``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

__all__ = [
    "DEFAULT_MAX_DISTANCE",
    "DEFAULT_WINDOW_DISTANCE",
    "NearPairs",
    "NearClusters",
    "SearchPlan",
    "plan_search",
    "near_pairs",
    "near_pairs_brute_force",
    "near_window_pairs",
    "near_window_pairs_brute_force",
    "near_clusters",
    "as_hashes",
    "popcount",
]

# From the planted-copy ROC (tpustream/bench/datacheck.py, ``tpustream bench datacheck``; pHash by the
# shard-writing path, perceptual_hash_bytes: a JPEG decoded to grey at 1/8 from 192 px up). Two pHashes differ
# in an even number of bits (each has 32 set: coefficients above their median), so d and d + 1 find the same
# pairs (a CIFAR-size PPM's hash, rounded to quarters, can tie at its median: rarely 31 bits).
#   photos (102 distinct 224 px JPEGs, 5,151 distinct pairs; 510 planted copies):
#     d       0     2     4     6     8     10    12    14    16
#     recall  48.8  72.4  83.5  94.5  97.7  98.8  99.4  99.6  99.8 %
#     false   0     0     0     0     0     0     0     0     0.078 %
#   digits (1,797 distinct 32 px PNGs, 1,613,706 distinct pairs; 1,500 planted copies):
#     recall  69.8  79.6  80.1  80.5  80.8  80.9  81.5  82.1  83.1 %
#     false   0     0.0002 0.004 0.023 0.082 0.213 0.481 0.984 1.861 %
# d = 8: recall 97.7% >= 95% at no false pair among the photos (at most 3 in 5,151 = 0.06% at 95% confidence),
# and the digits' false-pair rate 0.082% <= 0.1% (d = 10 would cross it: 8x8 digits of one class upscaled are
# near-identical). On the digits every edit but the shift is found (100% at d >= 4); a 1-4 px shift of a 32 px
# image moves 3-12% of its side, which pHash does not survive (4% found at d = 8; 68% of 1 px shifts), so the
# digits' overall recall is 80.8%: the 95% holds for images of photo size, not for shifted thumbnails.
DEFAULT_MAX_DISTANCE = 8
# Thumbnails (32 to 64 px a side) are also matched by their window hashes (image.phash_windows: the pHashes of
# inner windows at offsets whose differences cover every 1-4 px shift): a val/test image is a near copy when
# its pHash is within DEFAULT_MAX_DISTANCE of a train image's, or one of its query windows within
# DEFAULT_WINDOW_DISTANCE of one of that image's base windows. Measured the same way (digits, d = 8 for pHash;
# the windows alone, then both):
#     window d          0       2       4       6       8
#     windows alone     54.3    78.1    85.2    88.8    89.9 % of copies (shifts: 100% from 0)
#     false, alone      0       0.0004  0.0071  0.045   0.199 %
#     false, both       0.0820  0.0820  0.0860  0.114   %      (recall of both: 100% from 0)
# 4: every shifted digit found (4% with pHash alone), all digit copies 100%, false pairs 0.086% <= 0.1% (6
# would cross it); 4 bits rather than 0 so that a shifted copy that was also re-saved is found (the windows
# alone find 85% of all the other edits at 4, 54% at 0). Photos (224 px) have no windows: unchanged.
DEFAULT_WINDOW_DISTANCE = 4

_BITS = 64
_MAX_SUBSTRING_BITS = 22  # 3 substrings at least: a bucket table of at most 2**22 + 1 offsets (32 MiB)
_LOOKUPS_PER_CHUNK = 1 << 21  # (query, neighbouring key) lookups held at once
_CANDIDATES_PER_CHUNK = 1 << 22  # candidates verified at once (8 bytes each, a few arrays)
_BRUTE_FORCE_CELLS = 1 << 22  # query x base distances held at once by the brute-force search


@dataclass(frozen=True)
class NearPairs:
    """Every (query, base) pair within the distance, sorted by query then base index."""

    query: np.ndarray  # int64 index into the queries
    base: np.ndarray  # int64 index into the base hashes
    distance: np.ndarray  # uint8 Hamming distance, 0..64

    def __len__(self) -> int:
        return len(self.query)


@dataclass(frozen=True)
class NearClusters:
    """Groups of hashes linked by chains of near pairs inside one set (connected components of the
    within-distance graph), of two members or more, largest first."""

    members: tuple[np.ndarray, ...]  # int64 indices of each cluster, ascending
    hashes: int  # how many hashes were clustered

    @property
    def count(self) -> int:
        return len(self.members)

    @property
    def sizes(self) -> np.ndarray:
        return np.array([len(cluster) for cluster in self.members], dtype=np.int64)

    @property
    def clustered(self) -> int:
        """How many hashes have a near duplicate in the set."""
        return int(self.sizes.sum())


@dataclass(frozen=True)
class SearchPlan:
    """How ``near_pairs`` cuts the 64 bits and which substrings it searches within which radius."""

    widths: tuple[int, ...]  # substring widths, summing to 64, substring 0 in the lowest bits
    radii: tuple[int, ...] = field(default=())  # radius per searched substring (substrings 0..len-1)
    brute_force: bool = False  # no index pays off (tiny inputs or a distance near 64)

    @property
    def shifts(self) -> tuple[int, ...]:
        return tuple(int(s) for s in np.cumsum((0, *self.widths[:-1])))


def as_hashes(values: Sequence[int] | np.ndarray, name: str) -> np.ndarray:
    """``values`` as a 1-D uint64 array; a ValueError naming ``name`` for anything else."""
    # a list of Python ints goes through object: numpy would make [2**64 - 1, 5] float64
    array = values if isinstance(values, np.ndarray) else np.array(list(values), dtype=object)
    if array.ndim != 1:
        raise ValueError(f"{name}: a 1-D array of 64-bit hashes, got shape {array.shape}")
    if array.size == 0:
        return array.astype(np.uint64)
    if array.dtype == np.uint64:
        return array
    outside = ValueError(f"{name}: 64-bit hashes are integers in [0, 2**64), some are outside")
    if array.dtype.kind in "iu":
        if array.min() < 0:
            raise outside
        return array.astype(np.uint64)
    if array.dtype != object:
        raise ValueError(f"{name}: 64-bit hashes are unsigned integers, got dtype {array.dtype}")
    if not all(isinstance(v, int | np.integer) for v in array):
        raise ValueError(f"{name}: 64-bit hashes are unsigned integers, got {array.dtype} values")
    if min(int(v) for v in array) < 0 or max(int(v) for v in array) >= 1 << _BITS:
        raise outside
    return np.array([int(v) for v in array], dtype=np.uint64)


def _check_distance(max_distance: int) -> None:
    if isinstance(max_distance, bool) or not isinstance(max_distance, int | np.integer):
        raise ValueError(f"max_distance: a whole number of bits (0 to 64), got {max_distance!r}")
    if not 0 <= max_distance <= _BITS:
        raise ValueError(f"max_distance: 0 to 64 bits, got {max_distance}")


def popcount(values: np.ndarray) -> np.ndarray:
    """Set bits of each uint64, as uint8."""
    if hasattr(np, "bitwise_count"):  # numpy >= 2.0
        return np.bitwise_count(values)
    table = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)
    return table[values.view(np.uint8).reshape(*values.shape, 8)].sum(axis=-1, dtype=np.uint8)


def _ball(bits: int, radius: int) -> int:
    return sum(math.comb(bits, k) for k in range(radius + 1))


def plan_search(base_count: int, query_count: int, max_distance: int) -> SearchPlan:
    """The substring cut and radii with the least estimated work: per query, each neighbouring key looked up
    plus each candidate verified; plus building the bucket tables. Brute force when that is cheaper."""
    _check_distance(max_distance)
    best: tuple[float, SearchPlan] = (
        float(base_count) * query_count + base_count,
        SearchPlan((_BITS,), (), True),
    )
    budget = max_distance + 1  # sum(r_i + 1) over the searched substrings
    for substrings in range(3, max(3, budget) + 1):
        widths = tuple(_BITS // substrings + (1 if i < _BITS % substrings else 0) for i in range(substrings))
        if max(widths) > _MAX_SUBSTRING_BITS:
            continue
        searched = min(substrings, budget)
        radii = tuple(budget // searched - 1 + (1 if i < budget % searched else 0) for i in range(searched))
        lookups = [_ball(widths[i], radius) for i, radius in enumerate(radii)]
        per_query = sum(v * (1 + base_count / 2 ** widths[i]) for i, v in enumerate(lookups))
        cost = query_count * per_query + sum(2 ** widths[i] + base_count for i in range(searched))
        if cost < best[0]:
            best = (cost, SearchPlan(widths, radii))
    return best[1]


def _flip_masks(bits: int, radius: int) -> np.ndarray:
    """Every key XOR mask of at most ``radius`` set bits among ``bits``: the neighbours of a key."""
    masks = [0]
    for k in range(1, radius + 1):
        masks.extend(sum(1 << b for b in chosen) for chosen in combinations(range(bits), k))
    return np.array(masks, dtype=np.int64)


def _pairs_sorted(query: list[np.ndarray], base: list[np.ndarray], distance: list[np.ndarray]) -> NearPairs:
    q = np.concatenate(query) if query else np.zeros(0, np.int64)
    b = np.concatenate(base) if base else np.zeros(0, np.int64)
    d = np.concatenate(distance) if distance else np.zeros(0, np.uint8)
    order = np.lexsort((b, q))
    return NearPairs(query=q[order], base=b[order], distance=d[order])


def near_pairs_brute_force(
    queries: Sequence[int] | np.ndarray, base: Sequence[int] | np.ndarray, max_distance: int
) -> NearPairs:
    """Every pair within ``max_distance`` by comparing each query with every base hash (in chunks of a few
    million distances): the reference ``near_pairs`` is tested and benchmarked against."""
    _check_distance(max_distance)
    queries, base = as_hashes(queries, "queries"), as_hashes(base, "base")
    found_q, found_b, found_d = [], [], []
    step = max(1, _BRUTE_FORCE_CELLS // max(1, len(base)))
    for start in range(0, len(queries), step):
        distance = popcount(queries[start : start + step, None] ^ base[None, :])
        rows, cols = np.nonzero(distance <= max_distance)
        found_q.append(rows.astype(np.int64) + start)
        found_b.append(cols.astype(np.int64))
        found_d.append(distance[rows, cols])
    return _pairs_sorted(found_q, found_b, found_d)


def near_pairs(
    queries: Sequence[int] | np.ndarray,
    base: Sequence[int] | np.ndarray,
    max_distance: int,
    plan: SearchPlan | None = None,
) -> NearPairs:
    """Every (query, base) pair whose hashes differ in at most ``max_distance`` bits, by multi-index hashing.

    Args:
        queries: 64-bit hashes to look up (e.g. the test split), uint64 or non-negative integers.
        base: 64-bit hashes searched (e.g. the train split).
        max_distance: the largest Hamming distance reported, 0 to 64.
        plan: the substring cut and radii (default: ``plan_search`` for these sizes).

    Returns:
        NearPairs sorted by query then base index: exactly the pairs brute force finds.

    Memory stays bounded by the chunk sizes (a few tens of MiB) plus the tables (at most 32 MiB per searched
    substring) plus the pairs found.
    """
    _check_distance(max_distance)
    queries, base = as_hashes(queries, "queries"), as_hashes(base, "base")
    plan = plan or plan_search(len(base), len(queries), max_distance)
    if plan.brute_force or len(queries) == 0 or len(base) == 0:
        return near_pairs_brute_force(queries, base, max_distance)
    if sum(r + 1 for r in plan.radii) < max_distance + 1:
        raise ValueError(f"plan: radii {plan.radii} cannot guarantee every pair within {max_distance}")
    found_q: list[np.ndarray] = []
    found_b: list[np.ndarray] = []
    found_d: list[np.ndarray] = []
    shifts = plan.shifts
    earlier: list[tuple[int, int, int]] = []  # (shift, mask, radius) of the substrings searched before
    for index, radius in enumerate(plan.radii):
        shift, width = shifts[index], plan.widths[index]
        mask = (1 << width) - 1
        base_keys = ((base >> np.uint64(shift)) & np.uint64(mask)).astype(np.int64)
        order = np.argsort(base_keys, kind="stable")
        base_sorted = base[order]
        offsets = np.zeros((1 << width) + 1, dtype=np.int64)
        np.cumsum(np.bincount(base_keys, minlength=1 << width), out=offsets[1:])
        del base_keys
        flips = _flip_masks(width, radius)
        step = max(1, _LOOKUPS_PER_CHUNK // len(flips))
        for start in range(0, len(queries), step):
            chunk = queries[start : start + step]
            keys = ((chunk >> np.uint64(shift)) & np.uint64(mask)).astype(np.int64)
            neighbours = keys[:, None] ^ flips[None, :]
            first, last = offsets[neighbours], offsets[neighbours + 1]
            del neighbours
            for rows, pos in _candidates(first, last):
                found = chunk[rows] ^ base_sorted[pos]
                distance = popcount(found)
                keep = distance <= max_distance
                for prior_shift, prior_mask, prior_radius in earlier:  # found there already: once only
                    part = (found >> np.uint64(prior_shift)) & np.uint64(prior_mask)
                    keep &= popcount(part) > prior_radius
                found_q.append(rows[keep] + start)
                found_b.append(order[pos[keep]].astype(np.int64))
                found_d.append(distance[keep])
        earlier.append((shift, mask, radius))
    return _pairs_sorted(found_q, found_b, found_d)


def _candidates(first: np.ndarray, last: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(query row, position in the sorted base) of every candidate in the buckets [first, last) of each row, in
    groups of whole query rows of at most ``_CANDIDATES_PER_CHUNK`` (one row's candidates may exceed it)."""
    counts = (last - first).ravel()
    per_row = (last - first).sum(axis=1)
    ends = np.cumsum(per_row)
    lookups = first.shape[1]
    row = 0
    while row < len(per_row):
        start_total = ends[row - 1] if row else 0
        stop = max(row + 1, int(np.searchsorted(ends, start_total + _CANDIDATES_PER_CHUNK, side="right")))
        cells = slice(row * lookups, stop * lookups)
        group_counts, group_first = counts[cells], first.ravel()[cells]
        total = int(group_counts.sum())
        if total:
            rows = np.repeat(np.arange(row, stop, dtype=np.int64), per_row[row:stop])
            run_start = np.cumsum(group_counts) - group_counts
            pos = np.repeat(group_first - run_start, group_counts) + np.arange(total, dtype=np.int64)
            yield rows, pos
        row = stop


def _as_windows(values: np.ndarray, name: str) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 2:
        raise ValueError(f"{name}: an N x windows array of 64-bit hashes, got shape {array.shape}")
    return as_hashes(array.ravel(), name).reshape(array.shape)


def _nearest_per_pair(query: np.ndarray, base: np.ndarray, distance: np.ndarray) -> NearPairs:
    """One row per (query, base) pair, its least distance, sorted by query then base."""
    if not len(query):
        return NearPairs(query=query, base=base, distance=distance)
    order = np.lexsort((distance, base, query))
    query, base, distance = query[order], base[order], distance[order]
    first = np.ones(len(query), dtype=bool)
    first[1:] = (query[1:] != query[:-1]) | (base[1:] != base[:-1])
    return NearPairs(query=query[first], base=base[first], distance=distance[first])


def near_window_pairs(query_windows: np.ndarray, base_windows: np.ndarray, max_distance: int) -> NearPairs:
    """Every (query image, base image) pair of which some query window and some base window are within
    ``max_distance`` bits (the shift-aligned match of thumbnails, image.phash_windows), with the least such
    distance: one ``near_pairs`` search of all the query windows against all the base windows.

    Args:
        query_windows: N x k window hashes of the images looked up (val, test).
        base_windows: M x k' window hashes of the images searched (train).
        max_distance: the largest Hamming distance between two windows, 0 to 64.

    Returns:
        NearPairs over image indices, sorted by query then base: exactly the pairs of
        ``near_window_pairs_brute_force``.
    """
    _check_distance(max_distance)
    queries, base = _as_windows(query_windows, "query_windows"), _as_windows(base_windows, "base_windows")
    pairs = near_pairs(queries.ravel(), base.ravel(), max_distance)
    per_query, per_base = max(1, queries.shape[1]), max(1, base.shape[1])
    return _nearest_per_pair(pairs.query // per_query, pairs.base // per_base, pairs.distance)


def near_window_pairs_brute_force(
    query_windows: np.ndarray, base_windows: np.ndarray, max_distance: int
) -> NearPairs:
    """``near_window_pairs`` by comparing every query window with every base window: its reference."""
    _check_distance(max_distance)
    queries, base = _as_windows(query_windows, "query_windows"), _as_windows(base_windows, "base_windows")
    if not queries.size or not base.size:
        return NearPairs(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.uint8))
    least = np.full((len(queries), len(base)), _BITS + 1, dtype=np.int64)
    for i in range(queries.shape[1]):
        for j in range(base.shape[1]):
            least = np.minimum(least, popcount(queries[:, i, None] ^ base[None, :, j]))
    rows, cols = np.nonzero(least <= max_distance)
    return NearPairs(rows.astype(np.int64), cols.astype(np.int64), least[rows, cols].astype(np.uint8))


def near_clusters(hashes: Sequence[int] | np.ndarray, max_distance: int) -> NearClusters:
    """Clusters of near duplicates inside one set (e.g. train): hashes linked by chains of pairs within
    ``max_distance``, two members or more, largest first (ties: lowest first member)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    hashes = as_hashes(hashes, "hashes")
    pairs = near_pairs(hashes, hashes, max_distance)
    linked = pairs.query < pairs.base
    count = len(hashes)
    graph = coo_matrix(
        (np.ones(int(linked.sum()), dtype=np.int8), (pairs.query[linked], pairs.base[linked])),
        shape=(count, count),
    )
    _, labels = connected_components(graph, directed=False)
    sizes = np.bincount(labels, minlength=1) if count else np.zeros(0, np.int64)
    order = np.argsort(labels, kind="stable")
    groups = np.split(order, np.cumsum(sizes)[:-1]) if count else []
    members = sorted((g for g in groups if len(g) > 1), key=lambda g: (-len(g), int(g[0])))
    return NearClusters(members=tuple(np.asarray(g, dtype=np.int64) for g in members), hashes=count)
