"""Tiny model artifacts built here (eager CPU, a few SGD steps on real shards): what evaluate, promote,
serving and batch prediction tests score, register and serve."""

from __future__ import annotations

import json

import torch

from tpustream.image.transforms import normalize
from tpustream.loader.shard_loader import LoaderConfig, ShardLoader
from tpustream.models import build_model
from tpustream.storage import io as storage

DIGITS = [str(d) for d in range(10)]


def make_model(root, data, *, seed, steps, classes=DIGITS):
    """A tiny model artifact: `steps` eager-CPU SGD steps on the train split (0 = random init)."""
    torch.manual_seed(seed)
    model = build_model("tiny", num_classes=len(classes), input_size=16)
    if steps:
        loader = ShardLoader(
            LoaderConfig(data=data, batch_size=64, input_size=16, workers=0, num_replicas=1, replica_index=0)
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        done = 0
        for epoch in range(100):
            for batch in loader.epoch(epoch):
                loss = torch.nn.functional.cross_entropy(model(normalize(batch["image"])), batch["label"])
                opt.zero_grad()
                loss.backward()
                opt.step()
                done += 1
                if done == steps:
                    break
            if done == steps:
                break
    model.eval()
    root = str(root)
    with open(f"{root}.pt", "wb") as f:
        torch.save(model.state_dict(), f)
    storage.upload_file(f"{root}.pt", storage.join(root, "model.pt"))
    card = {
        "format": "tpustream.model/v1",
        "arch": "tiny",
        "classes": list(classes),
        "input_size": 16,
    }
    storage.write_bytes(storage.join(root, "model.json"), json.dumps(card).encode())
    return root
