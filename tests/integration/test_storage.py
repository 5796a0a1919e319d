"""The storage seam against local paths and the real GCS-API server on loopback (fake-gcs-server)."""

import threading

import pytest

from tpustream.storage import io as storage

pytestmark = pytest.mark.integration


def test_write_read_stream_list_size_delete(root):
    uri = storage.join(root, "a", "x.bin")
    payload = bytes(range(256)) * 40_000  # 10 MB: several buffered range reads
    storage.write_bytes(uri, payload)
    assert storage.exists(uri) and storage.size(uri) == len(payload)
    assert storage.read_bytes(uri) == payload
    with storage.open_read(uri) as f:
        head = f.read(1000)
        rest = f.read()
    assert head + rest == payload
    storage.write_bytes(storage.join(root, "a", "y.bin"), b"y")
    storage.write_bytes(storage.join(root, "b", "z.bin"), b"zz")
    listed = storage.list_objects(storage.join(root, "a"))
    assert [(o.uri.rsplit("/", 1)[1], o.size) for o in listed] == [("x.bin", len(payload)), ("y.bin", 1)]
    storage.delete(uri)
    assert not storage.exists(uri)
    with pytest.raises(storage.NotFound):
        storage.read_bytes(uri)
    storage.delete(uri)  # missing_ok by default
    with pytest.raises(storage.NotFound):
        storage.delete(uri, missing_ok=False)


def test_create_only(root):
    uri = storage.join(root, "once")
    storage.write_bytes(uri, b"1", create_only=True)
    with pytest.raises(storage.PreconditionFailed, match="already exists"):
        storage.write_bytes(uri, b"2", create_only=True)
    assert storage.read_bytes(uri) == b"1"


def test_compare_and_swap(root):
    uri = storage.join(root, "champion.json")
    assert storage.read_with_generation(uri) == (None, 0)
    gen1 = storage.replace_if_generation(uri, b'{"v": 1}', 0)
    with pytest.raises(storage.PreconditionFailed):
        storage.replace_if_generation(uri, b'{"v": 9}', 0)
    data, gen = storage.read_with_generation(uri)
    assert (data, gen) == (b'{"v": 1}', gen1)
    gen2 = storage.replace_if_generation(uri, b'{"v": 2}', gen1)
    assert gen2 != gen1
    with pytest.raises(storage.PreconditionFailed):
        storage.replace_if_generation(uri, b'{"v": 3}', gen1)  # stale generation loses
    assert storage.read_with_generation(uri) == (b'{"v": 2}', gen2)


def test_compare_and_swap_race_has_one_winner(root):
    uri = storage.join(root, "pointer.json")
    storage.replace_if_generation(uri, b"0", 0)
    _, gen = storage.read_with_generation(uri)
    results: list[str] = []
    barrier = threading.Barrier(4)

    def contender(n):
        barrier.wait()
        try:
            storage.replace_if_generation(uri, str(n).encode(), gen)
            results.append(f"won {n}")
        except storage.PreconditionFailed:
            results.append("lost")

    threads = [threading.Thread(target=contender, args=(n,)) for n in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if r.startswith("won")]
    assert len(winners) == 1 and results.count("lost") == 3
    assert storage.read_bytes(uri) == winners[0].split()[1].encode()


def test_copy_and_upload_file(root, tmp_path):
    local = tmp_path / "f.bin"
    local.write_bytes(b"abc" * 1000)
    storage.upload_file(str(local), storage.join(root, "up", "f.bin"))
    storage.copy(storage.join(root, "up", "f.bin"), storage.join(root, "copy", "f.bin"))
    assert storage.read_bytes(storage.join(root, "copy", "f.bin")) == b"abc" * 1000
    storage.copy(storage.join(root, "copy", "f.bin"), str(tmp_path / "back.bin"))
    assert (tmp_path / "back.bin").read_bytes() == b"abc" * 1000


def test_copy_and_move_across_backends_go_through_a_local_file(gcs_bucket, tmp_path):
    # Within one backend a copy is its own (server-side on GCS), a move a rename or copy+delete; across
    # backends the bytes pass through a local file and the source is deleted after.
    local = tmp_path / "f.bin"
    local.write_bytes(b"xyz" * 1000)
    on_gcs = storage.join(gcs_bucket, "moved", "f.bin")
    storage.move(str(local), on_gcs)
    assert not local.exists() and storage.read_bytes(on_gcs) == b"xyz" * 1000
    storage.move(on_gcs, str(tmp_path / "back" / "f.bin"))
    assert not storage.exists(on_gcs) and (tmp_path / "back" / "f.bin").read_bytes() == b"xyz" * 1000
    storage.copy(str(tmp_path / "back" / "f.bin"), on_gcs)
    assert storage.read_bytes(on_gcs) == b"xyz" * 1000 and (tmp_path / "back" / "f.bin").exists()
    with pytest.raises(storage.NotFound):
        storage.copy(str(tmp_path / "missing"), on_gcs)
    with pytest.raises(storage.PathKindError, match="is a directory, not a file"):
        storage.copy(str(tmp_path), on_gcs)
    with pytest.raises(storage.NotFound):
        storage.copy(storage.join(gcs_bucket, "missing"), str(tmp_path / "copy"))
    assert not (tmp_path / "copy").exists()


def test_missing_bucket_is_named(gcs_bucket):
    with pytest.raises(storage.NotFound, match="bucket gs://no-such-bucket does not exist"):
        storage.read_bytes("gs://no-such-bucket/x")
    with pytest.raises(storage.NotFound, match="create it or fix the URI"):
        storage.ensure_prefix_writable("gs://no-such-bucket/out")


def test_object_in_the_way_of_an_output_prefix(gcs_bucket):
    storage.write_bytes(f"{gcs_bucket}/out", b"x")
    with pytest.raises(storage.StorageError, match="is an object, not a directory prefix"):
        storage.ensure_prefix_writable(f"{gcs_bucket}/out")


def test_retries_through_injected_faults(gcs_bucket, fault_proxy):
    payload = bytes(range(256)) * 20_000
    for i in range(15):
        storage.write_bytes(f"{gcs_bucket}/f/{i}", payload)
        assert storage.read_bytes(f"{gcs_bucket}/f/{i}") == payload
        with storage.open_read(f"{gcs_bucket}/f/{i}") as f:
            assert f.read() == payload
    assert fault_proxy.faults > 0  # the faults really happened and were absorbed
