"""``bench load``'s peer adapters: each installed peer writes the same samples into its own format and reads
them back as shuffled, full uint8 batches of the bench's output size, in both variants."""

import itertools
from collections import Counter
from functools import partial

import pytest

from tpustream.bench import peers as bench_peers
from tpustream.bench.load import _split_samples
from tpustream.dataset import write as shards
from tpustream.dataset.manifest import read_manifest
from tpustream.dataset.plan import ShardConfig

pytestmark = pytest.mark.integration

PEER_MODULES = {"litdata": "litdata", "grain": "grain", "mosaic-streaming": "streaming"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    """synthetic-cifar:48 (32x32, 10 classes) as our shards: the train split has 38 samples."""
    out = str(tmp_path_factory.mktemp("tiny") / "dataset")
    shards.create_shards(ShardConfig(source="synthetic-cifar:48", output=out, num_shards=2), progress=False)
    return out, read_manifest(out)


@pytest.mark.parametrize("peer", sorted(PEER_MODULES))
def test_peer_writes_its_own_format_and_both_variants_yield_uint8_batches(peer, tiny, tmp_path):
    pytest.importorskip(PEER_MODULES[peer])
    dataset, manifest = tiny
    samples = partial(_split_samples, dataset, manifest, "train")
    written = bench_peers.write_peer_formats(str(tmp_path), samples, peers=[peer])
    assert list(written) == [peer] and any((tmp_path / peer).iterdir())

    pipelines = bench_peers.peer_pipelines([], 24, 8, 0, True, written)
    pipelines = {name: make for name, make in pipelines.items() if name.startswith(peer)}
    assert set(pipelines) == {peer, f"{peer}+our-decoder"}
    written_order = [label for _, _, _, label in samples()]
    for name, make in pipelines.items():
        full = len(written_order) // 8  # one epoch's full batches
        batches = list(itertools.islice(make(), full))
        assert len(batches) == full, name
        labels = []
        for images, batch_labels in batches:
            assert tuple(images.shape) == (8, 3, 24, 24) and str(images.dtype) == "torch.uint8", name
            assert int(images.max()) > int(images.min()), name  # pixels, not an empty buffer
            labels += [int(label) for label in batch_labels]
        assert not Counter(labels) - Counter(written_order), name  # within one epoch: no sample twice
        assert labels != written_order[: len(labels)], name  # shuffled
