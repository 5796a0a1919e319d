"""Builders several test modules share (tiny model artifacts, image folders and other SOURCE inputs, shard
helpers, training runs, report facts, a model server), so no test module imports another. Fixtures stay in
conftest.py."""
