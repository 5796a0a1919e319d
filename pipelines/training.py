"""The training DAG: check source -> If(new data): shards (fanned out) -> check data -> train (a TPU custom
job on Vertex) -> evaluate -> If(candidate wins): validate in the serving container -> promote
-> If(endpoint): deploy as a canary.

``build_pipeline(tpu=..., cpu_image=..., tpu_image=..., resources=...)`` fixes the TPU type, images and
CPU steps' sizes at compile time; everything a scheduled run varies (source, model, epochs, thresholds)
is a pipeline parameter.
No credential or service account is compiled in: the TPU job runs as the pipeline run's own service
account and network (GCPC placeholders, resolved by Vertex when the task runs).

Vertex AI TensorBoard: the ``tensorboard`` parameter names an instance (``projects/P/locations/L/tensorboards/
ID``; "" none) that the TPU CustomJob streams its event files to. A parameter, not a compile-time constant, so
that ``pipeline submit`` and ``pipeline schedule`` set it without recompiling (``pipeline compile
--tensorboard`` only sets its default): GCPC's launcher drops an empty ``tensorboard`` from the CustomJob
(``json_util.recursive_remove_empty`` in container/v1/gcp_launcher/job_remote_runner.py), so "" is no instance.
The job always gets a base output directory under the run's pipeline root (``TRAIN_JOB_OUTPUT``, pipelines/steps.py), from which
Vertex sets ``AIP_TENSORBOARD_LOG_DIR`` (``<base>/logs/``, aiplatform_v1 CustomJobSpec.base_output_directory);
the trainer copies its event files there (tpustream/train/records.py), and with an instance Vertex uploads them.

Notifications: the whole DAG runs inside ONE exit handler. Its exit tasks run however the run ended, each given
the run DAG's final status: ``notify-webhook`` (ours) POSTs the run's state and outcome to the ``notify_webhook``
parameter's URL ("" none: the step only logs it); with ``notify_emails`` at compile time, GCPC's
``VertexNotificationEmailOp`` emails Vertex's final state to the recipients ("Configure email notifications",
https://cloud.google.com/vertex-ai/docs/pipelines/email-notifications, whose sample makes it the pipeline's
``dsl.ExitHandler`` exit task, as we do). kfp 2.17 allows one exit task per ``dsl.ExitHandler``, so the webhook
step is then the handler group's second one through ``.after(group).ignore_upstream_failure()``, which compiles
to what an exit task compiles to: ``dependentTasks: [exit-handler-1]``, ``triggerPolicy:
ALL_UPSTREAM_TASKS_COMPLETED`` and its status a ``taskFinalStatus`` of ``exit-handler-1`` (kfp's
compiler_test.py ``test_task_after_exit_handler_group_can_use_task_final_status``; Google's own AutoML Tabular
pipeline that Vertex runs has a task of that shape, ``automl-tabular-finalizer``, in GCPC's
v1/automl/tabular/automl_tabular_pipeline.yaml). No Google page or sample shows an exit handler inside a
sub-pipeline, which this module compiled before (issue 43, item 5).

The outcome the webhook reports is what the deciding steps (check source, check data, evaluate, promote, deploy)
recorded at ``OUTCOME_PATH``, and every step records beside it what failed it, task and error line
(tpustream/run/outcome.py): an exit task may take no other task's output, and the final status it is given
names no failed task. The email op runs only on Vertex (its executor raises elsewhere), so ``pipeline run-local``
compiles it out.

Caching is off on every task: the first step reads a live source whose URI never changes, and the
decision "is there anything new" is made by its fingerprint, not by KFP's cache (tpustream/run/new_data.py).

Each step's component and image are pipelines/steps.py's, its CPU and memory limits (``StepResources``)
pipelines/resources.py's; this module wires them into the DAG.
"""

import contextlib
from dataclasses import dataclass
from typing import Any

from kfp import dsl

from tpustream.dataset.check import DataCheckThresholds
from tpustream.dataset.plan import ShardConfig
from tpustream.registry.policy import PromotionPolicy
from tpustream.train.config import TrainConfig
from tpustream.train.pretrained import MODEL_DEFAULT

from .resources import StepResources
from .steps import LOCAL_IMAGE, TUNE_JOB_OUTPUT, build_components
from .tpu import PIPELINE_WORKERS, Capacity, train_hosts

__all__ = [
    "build_pipeline",
    "Gate",
    "GATES",
    "OUTCOME_PATH",
    "PIPELINE_NAME",
]

# Where the run's deciding steps record its outcome, every step what failed it (failures/ beside it), and the exit
# step reads both (tpustream/run/outcome.py), under the run's job ID: the placeholder GCPC builds a run's
# resource name from (v1/model/upload_model/component.py), one value for every task of a run on Vertex and on
# kfp.local (one id per run, kfp/local/pipeline_orchestrator.py). Not PIPELINE_JOB_NAME, which kfp documents as
# the run's display name (kfp/dsl/__init__.py): the same for every run of a schedule.
OUTCOME_PATH = f"{dsl.PIPELINE_ROOT_PLACEHOLDER}/{dsl.PIPELINE_JOB_ID_PLACEHOLDER}/run-outcome.json"
PIPELINE_NAME = "tpustream-training"


@dataclass(frozen=True, kw_only=True)
class Gate:
    """A ``dsl.If`` of the DAG in the user's words, for ``pipeline run-local`` to name a skipped condition by
    what it means (``promotion skipped: candidate refused``) instead of its compiled name (``condition-3``).

    ``name`` is the If's name (the compiled condition task's display name); ``guards`` what runs inside it;
    ``when_false`` what a false condition means; ``opt_in``: false only says an option was not given (an
    endpoint, an experiment), not worth a line of run-local's summary."""

    name: str
    guards: str
    when_false: str
    opt_in: bool = False


# Every If of build_pipeline's DAG (tests/unit/test_pipeline_local.py checks that none lacks its Gate).
GATES = {
    gate.name: gate
    for gate in (
        Gate(name="new-data", guards="training", when_false="no new data since the last run"),
        Gate(name="candidate-wins", guards="promotion", when_false="candidate refused"),
        Gate(name="deploy-requested", guards="deploy", when_false="no endpoint given", opt_in=True),
        Gate(name="experiment-requested", guards="experiment", when_false="no experiment given", opt_in=True),
    )
}


def build_pipeline(
    *,
    tpu: str | None = None,
    cpu_image: str = LOCAL_IMAGE,
    tpu_image: str = LOCAL_IMAGE,
    capacity: Capacity | None = None,
    resources: StepResources | None = None,
    serve_image: str = "",
    tensorboard: str = "",
    notify_emails: list[str] | None = None,
    notify_webhook: str = "",
    tune: bool = False,
) -> Any:
    """The pipeline function, for kfp's compiler or kfp.local (``tpu=None``: every step runs as is).

    ``resources``: the CPU steps' limits (default ``StepResources()``); kfp.local's SubprocessRunner runs
    every step in this machine's processes and ignores them. ``tensorboard``: the default of the
    ``tensorboard`` parameter (a run may set another). ``notify_emails``: compile in Vertex's email
    notification (the module doc), these recipients the default of the ``notify_emails`` parameter; none: no
    email step. ``notify_webhook``: the default of the ``notify_webhook`` parameter. ``tune``: the candidate
    comes from a hyperparameter search of the ``tune_space`` parameter's space instead of one train step: on
    Vertex (``tpu``) a HyperparameterTuningJob whose trials run on the slice, its best trial's model handed on;
    otherwise one step searching with optuna (tpustream/tune/)."""
    ops = build_components(cpu_image, tpu_image, tpu, capacity, serve_image)
    sizes = resources or StepResources()
    default_tensorboard = tensorboard
    default_emails, default_webhook = list(notify_emails or []), notify_webhook

    def sized(task: Any, step: str) -> Any:
        cpu, memory = sizes.limits(step)
        return task.set_cpu_limit(cpu).set_memory_limit(memory)

    def train_extra(tensorboard: Any) -> dict[str, object]:
        """The CustomJob's own inputs (GCPC): the slice's pools and the run's TensorBoard instance."""
        return {"worker_pool_specs": ops.train_pools, "tensorboard": tensorboard} if tpu else {}

    promote_extra = {}
    if (
        cpu_image != LOCAL_IMAGE
    ):  # compiled for Vertex: the run's own project and region (kfp.local lacks them)
        from google_cloud_pipeline_components import _placeholders

        promote_extra = {
            "project": _placeholders.PROJECT_ID_PLACEHOLDER,
            "location": _placeholders.LOCATION_PLACEHOLDER,
        }

    @dsl.pipeline(
        name=PIPELINE_NAME,
        description="Image source -> (new data?) shards -> TPU ResNet -> evaluate -> promote",
    )
    # A default that a config dataclass owns is read from it (TrainConfig.epochs): KFP compiles the value, a
    # literal in the YAML as any other. The rest are the pipeline's own: a stand-in for None, which a KFP
    # parameter cannot take (0, -1), or a value unlike the CLI's on purpose (tests/unit/test_option_layers.py
    # says which and why).
    def tpustream_training(
        registry: str,
        source: str = ShardConfig.source,
        datasets_root: str = "",
        num_shards: int = 0,  # train shards; 0 = auto: ~2,000 samples each, at least one per loader worker of the slice
        val_fraction: float = -1.0,
        test_fraction: float = ShardConfig.test_fraction,  # held out from training and model selection; 0: none
        upsample: int = ShardConfig.upsample,
        seed: int = ShardConfig.seed,
        max_side: int = 0,  # downsize images whose longer side exceeds this at write time (0: keep sizes)
        strict: bool = ShardConfig.strict,  # fail on the first unreadable image instead of skipping and counting it
        exclude_keys: str = "",  # a file (local or gs://) of sources to leave out, one a line; "" none
        relabel: str = "",  # a CSV file of source,class rows: samples given another class; "" none
        shards_per_task: int = 4,
        model_name: str = TrainConfig.model,
        epochs: int = TrainConfig.epochs,
        batch_size: int = TrainConfig.batch_size,
        lr: float = 0.0,
        bf16: bool = True,
        workers: int = PIPELINE_WORKERS,
        input_size: int = 0,  # training input side; 0 = the dataset's rule (median shorter side, within [16, 224])
        init_from: str = "champion",  # warm start: "champion" (none yet: random), "" random, or a model/registry URI
        pretrained: str = MODEL_DEFAULT,  # the model's torchvision DEFAULT weights; "" random init; a weights name (resnet50.IMAGENET1K_V2) or a staged .pth/.safetensors URI
        freeze_epochs: int = TrainConfig.freeze_epochs,  # fine-tuning: the head alone for N epochs, then everything
        backbone_lr_scale: float = TrainConfig.backbone_lr_scale,  # fine-tuning: the backbone's fraction of the LR
        head_lr_scale: float = -1.0,  # the head's multiple of the LR; < 0: the model's (10 for ConvNeXt from pretrained weights, else 1)
        class_weights: str = TrainConfig.class_weights,  # "auto": loss weighted by inverse class frequency
        recipe: str = TrainConfig.recipe,  # the training recipe: "auto" by model and data size, or a name
        augment: str = "",  # the recipe's transforms.v2 policy unless given: none, trivial, randaugment
        random_erasing: float = -1.0,  # the recipe's values unless >= 0 (these five)
        mixup_alpha: float = -1.0,
        cutmix_alpha: float = -1.0,
        ema_decay: float = -1.0,
        layer_decay: float = -1.0,  # ViT only
        patience: int = TrainConfig.patience,  # early stopping: epochs without a val top-1 gain of more than early_stop_min_delta
        early_stop_min_delta: float = TrainConfig.min_delta,
        compile_cache: str = "auto",  # persistent XLA compile cache: auto = PIPELINE_ROOT/xla-cache, "" off, or a URI
        metric: str = "top1",
        min_delta: float = 0.0,
        max_class_drop: float = -1.0,  # refuse a candidate if a class's accuracy drops more (< 0: no check)
        min_metric: float = -1.0,  # quality floor on `metric`, with or without a champion (< 0: none)
        min_class_recall: float = -1.0,  # quality floor on every class's recall (< 0: none)
        max_p_value: float = -1.0,  # a gain over the champion must have McNemar's p-value at most this (< 0: off)
        beat_majority_baseline: bool = PromotionPolicy.beat_majority_baseline,  # refuse a candidate not above always answering the largest class
        min_class_support: int = PromotionPolicy.min_class_support,  # a class with fewer deciding samples cannot refuse by its drop
        retrain: bool = False,
        data_check: str = "fail",  # an anomaly in the new dataset stops the run before train; "warn": log it; "off"
        max_duplicate_fraction: float = DataCheckThresholds.max_duplicate_fraction,  # why each: tpustream/dataset/check_thresholds.py
        max_leaked_images: int = DataCheckThresholds.max_leaked_images,
        max_skipped_rate: float = DataCheckThresholds.max_skipped_rate,
        max_class_share_shift: float = DataCheckThresholds.max_class_share_shift,
        max_skipped_rate_increase: float = DataCheckThresholds.max_skipped_rate_increase,
        min_class_train_samples: int = DataCheckThresholds.min_class_train_samples,  # a warning, never a failure
        near_duplicate_distance: int = DataCheckThresholds.near_duplicate_distance,  # pHash bits; -1: exact-only
        vertex_model: str = "",  # also upload a promoted model to this Vertex AI Model Registry model
        serving_image: str = "",  # ... with this serving image (containers/serve; Cloud Build's serve.ref)
        endpoint: str = "",  # then deploy it to this Vertex AI endpoint as a canary (display name or resource); "" none
        canary_percent: int = 10,  # the new version's share of the endpoint's traffic (`tpustream rollback` undoes)
        serving_machine_type: str = "n1-standard-4",
        serving_min_replicas: int = 1,
        serving_max_replicas: int = 1,
        tensorboard: str = default_tensorboard,  # a Vertex AI TensorBoard instance the TPU job streams to; "" none
        experiment: str = "",  # the Vertex AI Experiment a scheduled run joins (tpustream/vertex/experiments.py); "" none
        notify_emails: list = default_emails,  # who Vertex emails the run's final state (compiled in only with recipients)
        notify_webhook: str = default_webhook,  # a URL the exit step POSTs the run's state and outcome to (JSON); "" none
        tune_space: str = "",  # with the tune switch compiled in: the search space file's URI; "" the default space
    ) -> None:
        # ONE exit handler around the whole DAG (an ExitStack: the DAG's body keeps its indentation). Its exit
        # task is Vertex's email op when compiled in (GCPC: it "can only be used as an ExitHandler's exit task"),
        # else the webhook step; with both, the webhook follows the handler's group with
        # ignore_upstream_failure(), which compiles to exactly what an exit task is (the module doc).
        email = None
        if default_emails:
            from google_cloud_pipeline_components.v1.vertex_notification_email import (
                VertexNotificationEmailOp,
            )

            email = VertexNotificationEmailOp(recipients=notify_emails)
            email.set_display_name("email the run's final state").set_caching_options(False)

        def webhook() -> Any:
            notify = ops.notify(
                webhook=notify_webhook,
                run_outcome=OUTCOME_PATH,
                pipeline=PIPELINE_NAME,
                # the run's name in the webhook: on Vertex its job ID (the console's name for it; the job name
                # is the display name, the same for every run), on kfp.local its run directory's name
                run=dsl.PIPELINE_JOB_ID_PLACEHOLDER if promote_extra else dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
            )
            return (
                sized(notify, "notify-webhook").set_display_name("notify webhook").set_caching_options(False)
            )

        on_exit = contextlib.ExitStack()
        run = on_exit.enter_context(dsl.ExitHandler(email or webhook(), name="notify-on-exit"))
        shard_args = dict(
            source=source,
            num_shards=num_shards,
            val_fraction=val_fraction,
            test_fraction=test_fraction,
            upsample=upsample,
            seed=seed,
            max_side=max_side,
            strict=strict,
            exclude_keys=exclude_keys,
            relabel=relabel,
            train_hosts=train_hosts(tpu),  # with the run's workers: auto's floor, a shard per loader worker
            loader_workers=workers,
        )
        # Every step records what fails it at OUTCOME_PATH's folder (tpustream/run/outcome.py): the exit
        # step's notification names the failed task and its error line, which no runner's final status says.
        check = ops.check(
            datasets_root=datasets_root,
            registry=registry,
            model_name=model_name,
            epochs=epochs,
            batch_size=batch_size,
            lr=lr,
            bf16=bf16,
            retrain=retrain,
            run_outcome=OUTCOME_PATH,
            **shard_args,
        ).set_display_name("check source for new data")
        sized(check, "check-source").set_caching_options(False)
        with dsl.If(check.outputs["Output"] == "train", name="new-data"):
            plan = ops.plan(
                shards_per_task=shards_per_task,
                dataset=check.outputs["dataset"],
                run_outcome=OUTCOME_PATH,
                **shard_args,
            )
            sized(plan, "plan-shards").set_display_name("plan shards").set_caching_options(False)
            with dsl.ParallelFor(plan.outputs["Output"], name="shard-ranges") as shard_range:
                write = ops.write(
                    shard_range=shard_range,
                    dataset=check.outputs["dataset"],
                    run_outcome=OUTCOME_PATH,
                    **shard_args,
                )
                sized(write, "write-shards").set_display_name("write shards").set_retry(num_retries=2)
                write.set_caching_options(False)
            finalize = ops.finalize(
                planned=check.outputs["dataset"],
                written=dsl.Collected(write.output),
                run_outcome=OUTCOME_PATH,
                **shard_args,
            ).set_display_name("finalize manifest")
            sized(finalize, "finalize-shards").set_caching_options(False)
            check_data = ops.check_data(
                dataset=finalize.outputs["dataset"],
                registry=registry,
                data_check=data_check,
                max_duplicate_fraction=max_duplicate_fraction,
                max_leaked_images=max_leaked_images,
                max_skipped_rate=max_skipped_rate,
                max_class_share_shift=max_class_share_shift,
                max_skipped_rate_increase=max_skipped_rate_increase,
                min_class_train_samples=min_class_train_samples,
                near_duplicate_distance=near_duplicate_distance,
                run_outcome=OUTCOME_PATH,
                class_weights=class_weights,
            ).set_display_name("check data")
            sized(check_data, "check-data").set_caching_options(False)
            # A named weight set is fetched here, once, on CPU: the TPU job's hosts read the cached copy.
            weights = ops.weights(
                pretrained=pretrained,
                model_name=model_name,
                pipeline_root=dsl.PIPELINE_ROOT_PLACEHOLDER,
                run_outcome=OUTCOME_PATH,
            ).set_display_name("resolve pretrained weights")
            sized(weights, "resolve-weights").set_caching_options(False)

            def tuned(**train_args: Any) -> Any:
                """The tune switch's candidate, from the train step's own arguments: on Vertex plan -> Vizier's
                HyperparameterTuningJob (trials on the slice) -> its best trial's model; else one optuna step."""
                for custom_job_input in ("worker_pool_specs", "tensorboard"):  # train_extra's: not a trial's
                    train_args.pop(custom_job_input, None)
                if not tpu:
                    return sized(ops.tune(**train_args, tune_space=tune_space), "tune-model")
                from google_cloud_pipeline_components import _placeholders

                plan = ops.tune_plan(
                    **train_args,
                    trial_pool=ops.trial_pool,
                    trial_image=ops.trial_image,
                    tune_space=tune_space,
                ).set_display_name("plan tuning job")
                sized(plan, "plan-tuning").set_caching_options(False)
                plan.after(check_data)
                job = ops.tuning_job(
                    display_name="tpustream-tune",
                    base_output_directory=TUNE_JOB_OUTPUT,
                    worker_pool_specs=plan.outputs["worker_pool_specs"],
                    study_spec_metrics=plan.outputs["study_spec_metrics"],
                    study_spec_parameters=plan.outputs["study_spec_parameters"],
                    max_trial_count=plan.outputs["max_trial_count"],
                    parallel_trial_count=plan.outputs["parallel_trial_count"],
                    service_account=_placeholders.SERVICE_ACCOUNT_PLACEHOLDER,  # the run's, as the train job's
                    network=_placeholders.NETWORK_PLACEHOLDER,
                    **promote_extra,
                ).set_display_name("tune on Vertex AI Vizier")
                job.set_caching_options(False)
                pick = ops.tune_pick(
                    gcp_resources=job.outputs["gcp_resources"],
                    base_output_directory=TUNE_JOB_OUTPUT,
                    space=plan.outputs["space"],
                    run_outcome=OUTCOME_PATH,
                )
                return sized(pick, "pick-trial")

            train = (tuned if tune else ops.train)(
                dataset=finalize.outputs["dataset"],
                model_name=model_name,
                epochs=epochs,
                batch_size=batch_size,
                lr=lr,
                bf16=bf16,
                workers=workers,
                input_size=input_size,
                init_from=init_from,
                pretrained=weights.output,
                freeze_epochs=freeze_epochs,
                backbone_lr_scale=backbone_lr_scale,
                head_lr_scale=head_lr_scale,
                class_weights=class_weights,
                recipe=recipe,
                augment=augment,
                random_erasing=random_erasing,
                mixup_alpha=mixup_alpha,
                cutmix_alpha=cutmix_alpha,
                ema_decay=ema_decay,
                layer_decay=layer_decay,
                registry=registry,
                patience=patience,
                early_stop_min_delta=early_stop_min_delta,
                compile_cache=compile_cache,
                pipeline_root=dsl.PIPELINE_ROOT_PLACEHOLDER,
                run_outcome=OUTCOME_PATH,
                **train_extra(tensorboard),
            ).set_display_name("tune: best trial" if tune else "train")
            train.after(check_data)  # no TPU time on data the check refused (data_check=fail)
            # A retried task resumes from `last` in its own output (resume=auto): it continues, not restarts.
            train.set_retry(num_retries=2, backoff_duration="60s").set_caching_options(False)
            evaluate = ops.evaluate(
                model=train.outputs["model"],
                dataset=finalize.outputs["dataset"],
                registry=registry,
                metric=metric,
                min_delta=min_delta,
                max_class_drop=max_class_drop,
                min_metric=min_metric,
                min_class_recall=min_class_recall,
                max_p_value=max_p_value,
                beat_majority_baseline=beat_majority_baseline,
                min_class_support=min_class_support,
                data_check=check_data.outputs["report"],  # into the run report
                run_outcome=OUTCOME_PATH,
            ).set_display_name("evaluate vs champion")
            sized(evaluate, "evaluate-model").set_caching_options(False)
            with dsl.If(evaluate.outputs["Output"] == "promote", name="candidate-wins"):
                # In the serving container, as Vertex would start it: answers as evaluate's, 400 on bad input.
                validate = ops.validate(
                    model=train.outputs["model"],
                    dataset=finalize.outputs["dataset"],
                    run_outcome=OUTCOME_PATH,
                )
                sized(validate, "validate-serving").set_display_name("validate in serving container")
                validate.set_caching_options(False)
                promote = ops.promote(
                    validation=validate.outputs["validation"],
                    model=train.outputs["model"],
                    evaluation=evaluate.outputs["evaluation"],
                    registry=registry,
                    dataset=finalize.outputs["dataset"],
                    data_check=check_data.outputs["report"],
                    metric=metric,
                    min_delta=min_delta,
                    max_class_drop=max_class_drop,
                    min_metric=min_metric,
                    min_class_recall=min_class_recall,
                    max_p_value=max_p_value,
                    beat_majority_baseline=beat_majority_baseline,
                    min_class_support=min_class_support,
                    vertex_model_name=vertex_model,
                    serving_image=serving_image,
                    run_outcome=OUTCOME_PATH,
                    **promote_extra,
                ).set_display_name("promote")
                # A retry repairs a failed Model Registry upload: promote finds its champion and uploads it then.
                sized(promote, "promote-model").set_caching_options(False)
                promote.set_retry(num_retries=2, backoff_duration="60s")
                with dsl.If(endpoint != "", name="deploy-requested"):
                    deploy = ops.deploy(
                        vertex_model=promote.outputs["vertex_model"],
                        endpoint=endpoint,
                        traffic_percent=canary_percent,
                        machine_type=serving_machine_type,
                        min_replicas=serving_min_replicas,
                        max_replicas=serving_max_replicas,
                        run_outcome=OUTCOME_PATH,
                    ).set_display_name("deploy canary")
                    # a retry is safe: the deployed version is found and its share set, nothing is duplicated
                    sized(deploy, "deploy-model").set_caching_options(False)
                    deploy.set_retry(num_retries=2, backoff_duration="120s")
        with dsl.If(experiment != "", name="experiment-requested"):
            # A scheduled run joins its experiment itself (a Schedule cannot carry one: components/experiment.py),
            # at its start (it waits for no other task); every run, skip runs too, as `pipeline submit
            # --experiment` adds every run it submits.
            join = ops.experiment(
                experiment=experiment,
                pipeline_job_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER if promote_extra else "",
                run_outcome=OUTCOME_PATH,
                **promote_extra,
            ).set_display_name("join experiment")
            sized(join, "join-experiment").set_caching_options(False)
        on_exit.close()  # what this run did is its outcome (OUTCOME_PATH): no output leaves an exit handler
        if email is not None:  # the webhook: the handler's second exit task, as the email op is its first
            webhook().after(run).ignore_upstream_failure()

    return tpustream_training
