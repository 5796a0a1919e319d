"""tpustream/dataset/near_duplicates.py: multi-index hashing finds exactly the pairs brute force finds (random
and planted hashes, every distance the data check uses), clusters are the connected components, and bad input
is refused with its name."""

import numpy as np
import pytest

from tpustream.dataset.near_duplicates import (
    SearchPlan,
    near_clusters,
    near_pairs,
    near_pairs_brute_force,
    plan_search,
    popcount,
)


def _hashes(rng: np.random.Generator, count: int) -> np.ndarray:
    return rng.integers(0, 2**64 - 1, count, dtype=np.uint64, endpoint=True)


def _flip(value: int, bits: np.ndarray) -> int:
    for bit in bits:
        value ^= 1 << int(bit)
    return value


def _planted(
    seed: int, base_count: int, query_count: int, max_distance: int
) -> tuple[np.ndarray, np.ndarray]:
    """Random hashes, a third of the queries copies of a base hash with 0..d+1 bits flipped, a few base
    hashes repeated (several base hashes per bucket and per query)."""
    rng = np.random.default_rng(seed)
    base, queries = _hashes(rng, base_count), _hashes(rng, query_count)
    base[-5:] = base[:5]
    for i in range(0, query_count, 3):
        flips = rng.choice(64, int(rng.integers(0, max_distance + 2)), replace=False)
        queries[i] = _flip(int(base[rng.integers(base_count)]), flips)
    return queries, base


def _same(found, expected) -> bool:
    return all(
        np.array_equal(a, b)
        for a, b in (
            (found.query, expected.query),
            (found.base, expected.base),
            (found.distance, expected.distance),
        )
    )


@pytest.mark.parametrize("max_distance", [0, 1, 2, 4, 6, 8, 10, 12, 16])
def test_same_pairs_as_brute_force_on_planted_hashes(max_distance):
    queries, base = _planted(max_distance, 3000, 600, max_distance)
    expected = near_pairs_brute_force(queries, base, max_distance)
    assert len(expected) >= 600 // 3 * (max_distance + 1) // (max_distance + 2) - 20  # the plants are there
    assert _same(near_pairs(queries, base, max_distance), expected)


@pytest.mark.parametrize(
    "plan",
    [
        SearchPlan((22, 21, 21), (3, 3, 2)),  # the 1M x 100k plan at d = 10
        SearchPlan((6,) * 9 + (5, 5), (0,) * 11),  # the pigeonhole m = d + 1 plan
        SearchPlan((16, 16, 16, 16), (2, 2, 2, 1)),
    ],
)
def test_every_plan_that_covers_the_distance_is_exact(plan):
    queries, base = _planted(7, 4000, 300, 10)
    assert _same(near_pairs(queries, base, 10, plan=plan), near_pairs_brute_force(queries, base, 10))


def test_a_plan_that_cannot_cover_the_distance_is_refused():
    with pytest.raises(ValueError, match="cannot guarantee every pair within 10"):
        near_pairs([1, 2], [3, 4], 10, plan=SearchPlan((22, 21, 21), (2, 2, 2)))


def test_a_crowded_bucket_is_searched_in_bounded_groups(monkeypatch):
    """Many equal hashes (a folder of identical images): candidate groups split, pairs still all found."""
    import tpustream.dataset.near_duplicates as module

    monkeypatch.setattr(module, "_CANDIDATES_PER_CHUNK", 1000)
    rng = np.random.default_rng(3)
    base = np.concatenate([np.full(3000, 12345, dtype=np.uint64), _hashes(rng, 2000)])
    queries = np.concatenate([np.full(5, 12345 ^ 0b101, dtype=np.uint64), _hashes(rng, 200)])
    found = near_pairs(queries, base, 4, plan=SearchPlan((22, 21, 21), (1, 1, 0)))
    assert _same(found, near_pairs_brute_force(queries, base, 4))
    assert len(found) >= 5 * 3000


def test_the_planner_picks_an_index_at_scale_and_brute_force_when_tiny():
    assert plan_search(1_000_000, 100_000, 10) == SearchPlan((22, 21, 21), (3, 3, 2))
    assert plan_search(10, 10, 4).brute_force
    assert plan_search(1_000_000, 100_000, 64).brute_force


def test_clusters_are_the_connected_components_of_near_pairs():
    hashes = np.array([0b0, 0b1, 0b11, 0b111 << 40, (0b111 << 40) ^ 0b1, 0xFFFF << 20], dtype=np.uint64)
    clusters = near_clusters(hashes, 1)  # 0-1-3 chain (0 and 3 are 2 apart), and the pair at bit 40
    assert [list(c) for c in clusters.members] == [[0, 1, 2], [3, 4]]
    assert clusters.count == 2 and clusters.clustered == 5 and clusters.hashes == 6
    assert near_clusters(hashes, 0).count == 0
    assert near_clusters(np.zeros(0, dtype=np.uint64), 3).count == 0


def test_clusters_match_a_brute_force_union_on_random_planted_hashes():
    queries, base = _planted(11, 800, 400, 6)
    hashes = np.concatenate([base, queries])
    pairs = near_pairs_brute_force(hashes, hashes, 6)
    parent = list(range(len(hashes)))

    def root(i):
        while parent[i] != i:
            i = parent[i]
        return i

    for a, b in zip(pairs.query, pairs.base, strict=True):
        parent[root(int(a))] = root(int(b))
    groups: dict[int, list[int]] = {}
    for i in range(len(hashes)):
        groups.setdefault(root(i), []).append(i)
    expected = sorted((g for g in groups.values() if len(g) > 1), key=lambda g: (-len(g), g[0]))
    assert [list(c) for c in near_clusters(hashes, 6).members] == expected


def test_python_ints_and_signed_arrays_are_hashes_too():
    found = near_pairs([2**64 - 1, 5], np.array([4, 7], dtype=np.int64), 1)
    assert list(zip(found.query, found.base, strict=True)) == [(1, 0), (1, 1)]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: near_pairs([[1, 2]], [1], 2), "queries: a 1-D array of 64-bit hashes"),
        (lambda: near_pairs([1], [1.5], 2), "base: 64-bit hashes are unsigned integers, got object values"),
        (
            lambda: near_pairs(np.ones(2), [1], 2),
            "queries: 64-bit hashes are unsigned integers, got dtype float64",
        ),
        (lambda: near_pairs([-1], [1], 2), r"queries: 64-bit hashes are integers in \[0, 2\*\*64\)"),
        (lambda: near_pairs([1], [1], 65), "max_distance: 0 to 64 bits, got 65"),
        (lambda: near_clusters([1], 2.5), "max_distance: a whole number of bits"),
    ],
)
def test_bad_input_is_refused_naming_it(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_popcount_without_numpy_2_counts_the_same(monkeypatch):
    values = _hashes(np.random.default_rng(5), 1000)
    expected = np.array([bin(int(v)).count("1") for v in values], dtype=np.uint8)
    assert np.array_equal(popcount(values), expected)
    monkeypatch.delattr(np, "bitwise_count")  # numpy 1.26, which pyproject allows, has none
    assert np.array_equal(popcount(values), expected)


@pytest.mark.parametrize("max_distance", [0, 2, 4, 8])
def test_window_pairs_are_exactly_brute_force_with_the_least_window_distance(max_distance):
    from tpustream.dataset.near_duplicates import near_window_pairs, near_window_pairs_brute_force

    rng = np.random.default_rng(max_distance)
    base = rng.integers(0, 2**64 - 1, (400, 9), dtype=np.uint64, endpoint=True)
    queries = rng.integers(0, 2**64 - 1, (150, 9), dtype=np.uint64, endpoint=True)
    for row in range(0, 150, 3):  # some query windows near some base windows, in any slot
        source = rng.integers(0, 400)
        flips = np.uint64(0)
        for bit in rng.choice(64, int(rng.integers(0, max_distance + 3)), replace=False):
            flips |= np.uint64(1) << np.uint64(bit)
        queries[row, rng.integers(0, 9)] = base[source, rng.integers(0, 9)] ^ flips
    queries[1, :] = base[7, 0]  # every window of one query equal to one base window: one pair, distance 0
    found = near_window_pairs(queries, base, max_distance)
    reference = near_window_pairs_brute_force(queries, base, max_distance)
    assert len(reference) >= 10
    assert np.array_equal(found.query, reference.query) and np.array_equal(found.base, reference.base)
    assert np.array_equal(found.distance, reference.distance)
    assert [(q, b, d) for q, b, d in zip(found.query, found.base, found.distance, strict=True) if q == 1][
        :1
    ] == [(1, 7, 0)]
