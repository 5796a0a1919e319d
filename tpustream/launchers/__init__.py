"""The KFP components' launchers: each component in ``components/`` is a declaration (its signature and docstring,
which KFP compiles) plus one call into ``launch_*`` here, which maps the component's parameters and artifacts
onto ``tpustream`` and records its outputs (GCPC's ``component.py -> launcher.py``).

A launcher takes the component's parameters by keyword, without defaults (the declaration owns them), and its
KFP artifact objects as they are (``.uri``, ``.metadata``, ``.log_metric``), so a test calls it with artifacts it
builds itself, without kfp.local. Each launcher runs inside ``failure_recorded`` (the run's notification names
the task that failed) and imports what it needs inside that block, so importing it loads nothing heavy. One
module per component file: ``check``, ``shards``, ``check_data``, ``weights``, ``train``, ``evaluate``,
``validate_serving``, ``promote``, ``deploy``, ``experiment``, ``notify``.
"""

__all__: list[str] = []
