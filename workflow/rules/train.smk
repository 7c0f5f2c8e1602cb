# Training: one run directory per (task, model, method, seed), the same shape for every method.
# ES and study methods train directly; RL methods train every cell of the model's grid
# (registry methods.<method>.grid; one "default" cell without a grid) and `select_rl` keeps the
# best cell by training reward as the method's run.

from esrepro.pipeline import ESSA_REF

RUN_OUTPUTS = {
    "checkpoint": directory(f"{R.RUN}/{P.CHECKPOINT}"),
    "log": f"{R.RUN}/{P.TRAIN_LOG}",
    "manifest": f"{R.RUN}/{P.MANIFEST}",
}
TRAIN_SHELL = (
    "{params.launcher}esrepro train --method {wildcards.method} --task {wildcards.task} --model {wildcards.model} "
    "--model-dir {params.model_dir} --dtype {params.dtype} --data-dir {input.data} --spec {params.spec:q} "
    "{params.chat} --seed {wildcards.seed} --out {params.run} --threads {threads} --device {params.device} > {log} 2>&1"
)


# A train job's cluster layout (esrepro.planning.cluster): ES jobs take the registry's train_es resources
# where a model has them; a job on several nodes runs under scripts/ray-slurm; PPO and GRPO jobs
# run one training process per GPU under torchrun (the registry's `processes` for CPU processes).
# Its runtime is its estimated time with a margin (esrepro.planning.scaling.schedule), the registry's `runtime`
# being the ceiling of one attempt; a longer job continues from its resume state on the next attempt.
RAY_SLURM = os.path.join(workflow.basedir, "scripts", "ray-slurm")
TRAIN_RESOURCES = {
    k: (lambda w, k=k: job_time.train_resource(PIPELINE, w.task, w.model, w.method, k))
    for k in cluster.TRAIN_RESOURCES
}
# An RL job outside `train` (a grid cell, the ESSA study's GRPO baseline): the registry's `train` entry, with as
# many processes (GPUs) as share the run's per-step batch evenly (esrepro.planning.cluster.rl_job).
RL_RESOURCES = {
    k: (lambda w, k=k: job_time.train_resource(PIPELINE, w.task, w.model, w.method, k, getattr(w, "cell", None)))
    for k in cluster.TRAIN_RESOURCES
}


# A run with `start_from` starts from another run's kept snapshot (v2 App. A.6's ESCHKPT-2): it waits for that
# run's manifest and reads the snapshot in place of the base model (esrepro.planning.plan.Plan.start_dir).
rule train:
    input:
        model=lambda w: PLAN.start_input(w.task, w.model, w.method, w.seed),
        data=R.PREPARED,
    output:
        **RUN_OUTPUTS,
    wildcard_constraints:
        method=PLAN.methods_regex(rl=False),
    params:
        model_dir=lambda w: PLAN.start_dir(w.task, w.model, w.method, w.seed),
        spec=lambda w: specs.as_json(specs.method_spec(PIPELINE, w.model, w.task, w.method)),
        dtype=dtype_of,
        device=CFG.device,
        chat=chat_flag,
        run=folder_of_manifest,
        launcher=lambda w: cluster.launcher(PIPELINE, w.task, w.model, w.method, RAY_SLURM),
    threads: lambda w: cluster.train_job(PIPELINE, w.task, w.model, w.method).threads()
    priority: lambda w: PLAN.train_priority(w.method)
    resources:
        **TRAIN_RESOURCES,
    conda:
        ENV
    log:
        f"{R.LOGS}/train/{{task}}/{{model}}/{{method}}/seed{{seed}}.log",
    shell:
        TRAIN_SHELL


rule train_cell:
    input:
        model=R.BASE_MODEL,
        data=R.PREPARED,
    output:
        checkpoint=directory(f"{R.CELL_RUN}/{P.CHECKPOINT}"),
        log=f"{R.CELL_RUN}/{P.TRAIN_LOG}",
        manifest=f"{R.CELL_RUN}/{P.MANIFEST}",
    wildcard_constraints:
        method=PLAN.methods_regex(rl=True),
    params:
        model_dir=lambda w, input: input.model,
        spec=lambda w: specs.as_json(specs.method_spec(PIPELINE, w.model, w.task, w.method, w.cell)),
        dtype=dtype_of,
        device=CFG.device,
        chat=chat_flag,
        run=folder_of_manifest,
        launcher=lambda w: cluster.rl_launcher(PIPELINE, w.model, rl_settings(w)),
    threads: lambda w: cluster.rl_job(PIPELINE, w.model, rl_settings(w)).threads()
    resources:
        **RL_RESOURCES,
    conda:
        ENV
    log:
        f"{R.LOGS}/train/{{task}}/{{model}}/{{method}}/grid/{{cell}}/seed{{seed}}.log",
    shell:
        TRAIN_SHELL


rule select_rl:
    input:
        logs=lambda w: [f"{d}/{P.TRAIN_LOG}" for d in PLAN.cell_runs(w.task, w.model, w.method, w.seed)],
        manifests=lambda w: [f"{d}/{P.MANIFEST}" for d in PLAN.cell_runs(w.task, w.model, w.method, w.seed)],
    output:
        **RUN_OUTPUTS,
        selection=f"{R.RUN}/{P.SELECTION}",
    wildcard_constraints:
        method=PLAN.methods_regex(rl=True),
    params:
        grid=lambda w: specs.as_json(PIPELINE.grid_record(w.model, w.method)),
        cells=lambda w: " ".join(f"--cell {c}={d}" for c, d in zip(PIPELINE.grid_cells(w.model, w.method),
                                                                   PLAN.cell_runs(w.task, w.model, w.method, w.seed))),
        run=folder_of_manifest,
    resources:
        **timed_resources_of("select", "select_rl"),
    conda:
        ENV
    log:
        f"{R.LOGS}/select/{{task}}/{{model}}/{{method}}/seed{{seed}}.log",
    shell:
        "esrepro select --task {wildcards.task} --model {wildcards.model} --method {wildcards.method} "
        "--seed {wildcards.seed} --grid {params.grid:q} {params.cells} --out {params.run} > {log} 2>&1"


# --- the ESSA study's GRPO baseline, from the reference ESSA run's SFT start (its ESSA runs use `train`) --------
rule essa_grpo:
    input:
        model=R.BASE_MODEL,
        data=R.PREPARED,
        ref=lambda w: f"{PLAN.essa_ref_run(w.model, w.seed, w.task)}/{P.MANIFEST}",
    output:
        **RUN_OUTPUTS,
    wildcard_constraints:
        method=PLAN.essa_grpo_regex(),
    params:
        spec=lambda w: specs.as_json(specs.method_spec(PIPELINE, w.model, w.task, w.method)),
        ref_spec=lambda w: specs.as_json(specs.method_spec(PIPELINE, w.model, w.task, ESSA_REF)),
        sft=lambda w: f"{PLAN.essa_ref_run(w.model, w.seed, w.task)}/sft",
        trains=PIPELINE.essa_study().grpo_trains if PIPELINE.essa_study() else "adapter",
        launcher=lambda w: cluster.rl_launcher(PIPELINE, w.model, rl_settings(w)),
        dtype=dtype_of,
        device=CFG.device,
        chat=chat_flag,
        run=folder_of_manifest,
    threads: lambda w: cluster.rl_job(PIPELINE, w.model, rl_settings(w)).threads()
    priority: PLAN.train_priority(ESSA_REF)  # the second half of the chain its reference run starts
    resources:
        **RL_RESOURCES,
    conda:
        ENV
    log:
        f"{R.LOGS}/train/{{task}}/{{model}}/{{method}}/seed{{seed}}.log",
    shell:
        "{params.launcher}esrepro essa-grpo --method {wildcards.method} --task {wildcards.task} --model {wildcards.model} "
        "--model-dir {input.model} --sft-dir {params.sft} --dtype {params.dtype} --data-dir {input.data} "
        "--spec {params.spec:q} --ref-spec {params.ref_spec:q} {params.chat} --seed {wildcards.seed} "
        "--trains {params.trains} --out {params.run} --threads {threads} --device {params.device} > {log} 2>&1"
