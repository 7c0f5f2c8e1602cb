# Training: one run directory per (task, model, method, seed), the same shape for every method.
# ES and study methods train directly; RL methods train every cell of the model's grid
# (registry methods.<method>.grid; one "default" cell without a grid) and `select_rl` keeps the
# best cell by training reward as the method's run.

RUN_OUTPUTS = {
    "checkpoint": directory(f"{P.RUN}/{P.CHECKPOINT}"),
    "log": f"{P.RUN}/{P.TRAIN_LOG}",
    "manifest": f"{P.RUN}/{P.MANIFEST}",
}
TRAIN_SHELL = (
    "{params.launcher}esrepro train --method {wildcards.method} --task {wildcards.task} --model {wildcards.model} "
    "--model-dir {input.model} --dtype {params.dtype} --data-dir {input.data} --spec {params.spec:q} "
    "{params.chat} --seed {wildcards.seed} --out {params.run} --threads {threads} --device {params.device} > {log} 2>&1"
)


# A train job's cluster layout. ES methods take the registry's `train_es` resources where the model
# has them (the population engines' layout, e.g. two nodes for a 7B model), other methods `train`.
# A job on several nodes (or asking for ray_cluster) runs under scripts/ray-slurm, which starts a
# Ray cluster across its nodes for the ES engines to join. For the SLURM executor plugin (2.8.0)
# such a job asks for one task per node (nodes, tasks) and sets mpi, so the plugin's job step runs
# the shell command directly on the first node instead of inside `srun -n1` (ray-slurm starts its
# own steps); its GPUs go per node as gres (the plugin's gpu becomes --gpus, a total that SLURM may
# split unevenly); tasks_per_gpu 0 keeps the plugin from turning tasks into --ntasks-per-gpu.
RAY_SLURM = os.path.join(workflow.basedir, "scripts", "ray-slurm")
TRAIN_RESOURCES = (*SNAKEMAKE_RESOURCES, "gres", "tasks", "tasks_per_gpu", "mpi")


def train_resources_key(wildcards):
    """The registry resources entry of a train job: `train_es` for an ES method where the model has one."""
    es = PIPELINE.algorithm_of(wildcards.task, wildcards.method).name == "es"
    return "train_es" if es and "train_es" in PIPELINE.model(wildcards.model).resources else "train"


def train_job(wildcards):
    """The registry resources of one train job."""
    return PIPELINE.resources(wildcards.model, train_resources_key(wildcards))


def on_ray_cluster(res):
    return res.nodes > 1 or res.ray_cluster


def train_resource(res, key):
    """One Snakemake resource of a train job; None leaves it out."""
    several = res.nodes > 1
    if key in ("gpu", "gpu_model") and several:
        return None
    if key == "gres":
        if not (several and res.gpu):
            return None
        return f"gpu:{res.gpu_model}:{res.gpu}" if res.gpu_model else f"gpu:{res.gpu}"
    if key == "tasks":
        return res.nodes if several else None
    if key == "tasks_per_gpu":
        return 0 if several and res.gpu else None
    if key == "mpi":
        return "srun" if several else None
    return getattr(res, key)


def train_resources():
    return {k: (lambda wildcards, k=k: train_resource(train_job(wildcards), k)) for k in TRAIN_RESOURCES}


def ray_layout(wildcards):
    """A train job's layout in words, e.g. "2 nodes x 4 GPUs: 8 vllm engines, tp 1"."""
    res = train_job(wildcards)
    nodes = f"{res.nodes} node{'s' if res.nodes > 1 else ''}"
    per_node = f"{res.gpu} GPUs" if res.gpu else f"{res.threads()} CPUs"
    settings = PIPELINE.method_settings(wildcards.model, wildcards.task, wildcards.method)
    if settings.algorithm != "es":
        return f"{nodes} x {per_node}"
    tp = settings.tensor_parallel_size
    engines = settings.engines or (res.nodes * res.gpu // tp if res.gpu else 1)
    return f"{nodes} x {per_node}: {engines} {settings.backend} engines" + (f", tp {tp}" if res.gpu else "")


def ray_launcher(wildcards):
    """The command a train job runs under: scripts/ray-slurm for a Ray cluster across its nodes, else none."""
    if not on_ray_cluster(train_job(wildcards)):
        return ""
    return f"{shlex.quote(RAY_SLURM)} --cluster --layout {shlex.quote(ray_layout(wildcards))} -- "


rule train:
    input:
        model=P.BASE_MODEL,
        data=P.PREPARED,
    output:
        **RUN_OUTPUTS,
    wildcard_constraints:
        method=PLAN.methods_regex(rl=False),
    params:
        spec=lambda w: specs.as_json(specs.method_spec(PIPELINE, w.model, w.task, w.method)),
        dtype=dtype_of,
        device=CFG.device,
        chat=chat_flag,
        run=folder_of_manifest,
        launcher=ray_launcher,
    threads: lambda wildcards: train_job(wildcards).threads()
    resources:
        **train_resources(),
    conda:
        ENV
    log:
        f"{P.LOGS}/train/{{task}}/{{model}}/{{method}}/seed{{seed}}.log",
    shell:
        TRAIN_SHELL


rule train_cell:
    input:
        model=P.BASE_MODEL,
        data=P.PREPARED,
    output:
        checkpoint=directory(f"{P.CELL_RUN}/{P.CHECKPOINT}"),
        log=f"{P.CELL_RUN}/{P.TRAIN_LOG}",
        manifest=f"{P.CELL_RUN}/{P.MANIFEST}",
    wildcard_constraints:
        method=PLAN.methods_regex(rl=True),
    params:
        spec=lambda w: specs.as_json(specs.method_spec(PIPELINE, w.model, w.task, w.method, w.cell)),
        dtype=dtype_of,
        device=CFG.device,
        chat=chat_flag,
        run=folder_of_manifest,
        launcher="",
    threads: threads_of("train")
    resources:
        **resources_of("train"),
    conda:
        ENV
    log:
        f"{P.LOGS}/train/{{task}}/{{model}}/{{method}}/grid/{{cell}}/seed{{seed}}.log",
    shell:
        TRAIN_SHELL


rule select_rl:
    input:
        logs=lambda w: [f"{d}/{P.TRAIN_LOG}" for d in PLAN.cell_runs(w.task, w.model, w.method, w.seed)],
        manifests=lambda w: [f"{d}/{P.MANIFEST}" for d in PLAN.cell_runs(w.task, w.model, w.method, w.seed)],
    output:
        **RUN_OUTPUTS,
        selection=f"{P.RUN}/{P.SELECTION}",
    wildcard_constraints:
        method=PLAN.methods_regex(rl=True),
    params:
        grid=lambda w: specs.as_json(PIPELINE.grid(w.model, w.method)),
        cells=lambda w: " ".join(f"--cell {c}={d}" for c, d in zip(PIPELINE.grid_cells(w.model, w.method),
                                                                   PLAN.cell_runs(w.task, w.model, w.method, w.seed))),
        run=folder_of_manifest,
    resources:
        **resources_of("select"),
    conda:
        ENV
    log:
        f"{P.LOGS}/select/{{task}}/{{model}}/{{method}}/seed{{seed}}.log",
    shell:
        "esrepro select --task {wildcards.task} --model {wildcards.model} --method {wildcards.method} "
        "--seed {wildcards.seed} --grid {params.grid:q} {params.cells} --out {params.run} > {log} 2>&1"
