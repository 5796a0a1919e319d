"""What `pipeline run-local` prints (pipelines/local.py): the conditions of the real compiled DAG named by
what they mean, and the summary of kfp.local's output: a failed task's one-line reason under it, the tasks
skipped after it and why. The summary is fed lines as kfp.local 2.17 writes them (ANSI colours included);
tests/integration/test_pipeline_datacheck.py checks it on a real failing run."""

import io

from tpustream.pipelines.local import RunSummary, Skipped, condition_tasks
from tpustream.pipelines.training import GATES, build_pipeline


def test_every_condition_of_the_dag_is_named_by_what_it_means():
    spec = build_pipeline(tpu=None).pipeline_spec
    conditions = condition_tasks(spec)
    names = {
        name: task.task_info.name
        for dag in [spec.root.dag, *(c.dag for c in spec.components.values())]
        for name, task in dag.tasks.items()
        if task.trigger_policy.condition
    }
    assert set(conditions) == set(names) and len(names) == len(GATES)
    assert {names[task] for task in conditions} == set(GATES)  # no If without its Gate
    meanings = {(c.guards, c.when_false, c.quiet) for c in conditions.values()}
    assert ("promotion", "candidate refused", False) in meanings
    assert ("training", "no new data since the last run", False) in meanings
    assert ("experiment", "no experiment given", True) in meanings


def test_an_if_without_a_gate_is_named_by_the_tasks_it_holds_and_its_condition():
    from kfp import dsl

    @dsl.component(base_image="python:3.11")
    def say(text: str) -> str:
        return text

    @dsl.pipeline(name="p")
    def pipeline(flag: str = "no") -> None:
        with dsl.If(flag == "yes", name="flag-set"):
            say(text="a").set_display_name("say a")

    (skipped,) = condition_tasks(pipeline.pipeline_spec).values()
    assert skipped.guards == "say a" and skipped.when_false.startswith("flag-set not met (")


def _summarize(conditions, *lines):
    log, terminal = io.StringIO(), io.StringIO()
    summary = RunSummary(log, terminal, conditions)
    summary.write("".join(line + "\n" for line in lines))
    assert log.getvalue() == "".join(line + "\n" for line in lines)  # the log gets everything
    return terminal.getvalue().splitlines(), summary


CONDITIONS = {
    "condition-1": Skipped("training", "no new data since the last run"),
    "condition-3": Skipped("promotion", "candidate refused"),
    "condition-5": Skipped("experiment", "no experiment given", quiet=True),
}
ANOMALY = "train-val-leak: 1 image(s) are in both train and val (limit 0): e.g. a.png (train) = b.png (val)"


def test_a_failed_data_check_prints_its_anomalies_and_what_it_stopped():
    printed, summary = _summarize(
        CONDITIONS,
        "05:41:39.977 - INFO - Executing task \x1b[96m'check-data'\x1b[0m",
        f"    [KFP Executor 2026-11-28 05:41:40,373 WARNING]: data check anomaly {ANOMALY}",
        "    [KFP Executor 2026-11-28 05:41:40,374 WARNING]: data check warning tiny-class: 1 class(es) ...",
        "    Traceback (most recent call last):",
        '      File "/work/tpustream/run/data_gate.py", line 92, in check_for_pipeline',
        "        raise DataCheckFailed(report.failure_line(report_uri))",
        "    tpustream.run.data_gate.DataCheckFailed: data check of /d: 1 anomaly, train-val-leak: ...",
        "",
        "05:41:40.418 - ERROR - Task \x1b[96m'check-data'\x1b[0m finished with status \x1b[91mFAILURE\x1b[0m",
        "05:41:40 - INFO - Skipping task train-model: upstream task(s) ['check-data'] failed.",
        "05:41:40 - INFO - Skipping task evaluate-model: upstream task(s) ['check-data', 'train-model'] failed.",
        "05:41:40 - INFO - Skipping task condition-3: upstream task(s) ['evaluate-model', 'train-model'] failed.",
        "05:41:40 - INFO - Skipping task condition-3: upstream task(s) ['evaluate-model', 'train-model'] failed.",
        "05:41:40 - INFO - Skipping conditional task condition-5 (condition evaluated to False)",
    )
    assert printed == [
        "  check-data: FAILURE",
        f"    anomaly {ANOMALY}",
        "    warning tiny-class: 1 class(es) ...",
        "  train-model: skipped (check-data failed)",
        "  evaluate-model: skipped (check-data failed)",  # the failure behind the skipped train-model
        "  promotion skipped: check-data failed",  # once, though logged twice
    ]  # the experiment nobody asked for: no line
    assert summary.failed == {"check-data": "data check of /d: 1 anomaly, train-val-leak: ..."}


def test_a_failed_task_prints_its_error_line_and_a_false_condition_its_meaning():
    printed, summary = _summarize(
        CONDITIONS,
        "05:00:00.000 - INFO - Executing task 'train-model'",
        "    Traceback (most recent call last):",
        '      File "x.py", line 1, in f',
        "    KeyError: 'lr'",
        "",
        "    During handling of the above exception, another exception occurred:",
        "",
        "    Traceback (most recent call last):",
        '      File "x.py", line 2, in g',
        "    tpustream.errors.ConfigError: --lr must be positive, got -1.0",
        "05:00:01.000 - ERROR - Task 'train-model' finished with status FAILURE",
        "05:00:02.000 - INFO - Executing task 'evaluate-model'",
        "    [KFP Executor 2026-11-28 05:00:02,000 INFO]: decision: keep the champion (top-1 0.5 < 0.6)",
        "05:00:03.000 - INFO - Task 'evaluate-model' finished with status SUCCESS",
        "05:00:03 - INFO - Skipping conditional task condition-3 (condition evaluated to False)",
        "05:00:03 - INFO - Skipping conditional task condition-9 (condition evaluated to False)",
    )
    assert printed == [
        "  train-model: FAILURE",
        "    error: --lr must be positive, got -1.0",  # our own error: its message; the last of a chain
        "  decision: keep the champion (top-1 0.5 < 0.6)",
        "  evaluate-model: SUCCESS",
        "  promotion skipped: candidate refused",
        "  condition-9: skipped (condition not met)",  # not in the DAG's conditions: as kfp.local names it
    ]
    _, other = _summarize(
        {},
        "    Traceback (most recent call last):",
        "    KeyError: 'lr'",
        "x - Task 'a' finished with status FAILURE",
    )
    assert other.failed == {"a": "KeyError: 'lr'"}  # anything else: its type too
