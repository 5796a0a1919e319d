"""bench warmstart's reading of a run: the first epoch at the target, and its steps."""

from tpustream.bench.warmstart import _reached


def _card(tops, steps_per_epoch=25):
    history = [{"epoch": i + 1, "val_top1": top} for i, top in enumerate(tops)]
    return {"history": history, "steps": steps_per_epoch * len(tops)}


def test_the_first_epoch_at_or_above_the_target_counts_even_if_a_later_one_dips():
    reached = _reached(_card([0.3, 0.85, 0.8, 0.9]), 0.85)
    assert reached["epochs_to_target"] == 2 and reached["steps_to_target"] == 50
    assert reached["val_top1_by_epoch"] == [0.3, 0.85, 0.8, 0.9] and reached["final_val_top1"] == 0.9


def test_a_run_that_never_reaches_the_target_says_so():
    reached = _reached(_card([0.3, 0.5]), 0.9)
    assert reached["epochs_to_target"] is None and reached["steps_to_target"] is None
