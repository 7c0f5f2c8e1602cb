# Training: one run directory per (task, model, method, seed), the same shape for every method.
# ES methods train directly; RL methods train every cell of the model's grid (registry
# methods.<method>.grid; one "default" cell without a grid) and `select_rl` keeps the best
# cell by training reward as the method's run. Paths come from PLAN (src/esrepro/workflow.py).


rule train:
    input:
        model="results/models/{model}/base",
        data="data/prepared/{task}",
    output:
        checkpoint=directory("results/runs/{task}/{model}/{method}/seed{seed}/checkpoint"),
        log="results/runs/{task}/{model}/{method}/seed{seed}/log.jsonl",
        manifest="results/runs/{task}/{model}/{method}/seed{seed}/manifest.json",
    wildcard_constraints:
        method=PLAN.methods_regex(rl=False),
    params:
        spec=lambda wildcards: PLAN.method_spec_json(wildcards.model, wildcards.task, wildcards.method),
        dtype=lambda wildcards: REGISTRY[wildcards.model]["dtype"],
        chat=lambda wildcards: "--chat" if PLAN.uses_chat(wildcards.model) else "",
        run="results/runs/{task}/{model}/{method}/seed{seed}",
    threads: lambda wildcards: PLAN.threads(wildcards.task, wildcards.method)
    resources:
        **resources_of("train"),
    conda:
        ENV
    log:
        "results/logs/train/{task}/{model}/{method}/seed{seed}.log",
    shell:
        "esrepro train --method {wildcards.method} --task {wildcards.task} --model {wildcards.model} "
        "--model-dir {input.model} --dtype {params.dtype} --data-dir {input.data} "
        "--spec {params.spec:q} {params.chat} --seed {wildcards.seed} --out {params.run} --threads {threads} > {log} 2>&1"


rule train_cell:
    input:
        model="results/models/{model}/base",
        data="data/prepared/{task}",
    output:
        checkpoint=directory("results/runs/{task}/{model}/{method}/grid/{cell}/seed{seed}/checkpoint"),
        log="results/runs/{task}/{model}/{method}/grid/{cell}/seed{seed}/log.jsonl",
        manifest="results/runs/{task}/{model}/{method}/grid/{cell}/seed{seed}/manifest.json",
    wildcard_constraints:
        method=PLAN.methods_regex(rl=True),
    params:
        spec=lambda wildcards: PLAN.cell_spec_json(wildcards.model, wildcards.task, wildcards.method, wildcards.cell),
        dtype=lambda wildcards: REGISTRY[wildcards.model]["dtype"],
        chat=lambda wildcards: "--chat" if PLAN.uses_chat(wildcards.model) else "",
        run="results/runs/{task}/{model}/{method}/grid/{cell}/seed{seed}",
    threads: config["threads"]
    resources:
        **resources_of("train"),
    conda:
        ENV
    log:
        "results/logs/train/{task}/{model}/{method}/grid/{cell}/seed{seed}.log",
    shell:
        "esrepro train --method {wildcards.method} --task {wildcards.task} --model {wildcards.model} "
        "--model-dir {input.model} --dtype {params.dtype} --data-dir {input.data} "
        "--spec {params.spec:q} {params.chat} --seed {wildcards.seed} --out {params.run} --threads {threads} > {log} 2>&1"


rule select_rl:
    input:
        logs=lambda w: [f"{d}/log.jsonl" for d in PLAN.cell_runs(w.task, w.model, w.method, w.seed)],
        manifests=lambda w: [f"{d}/manifest.json" for d in PLAN.cell_runs(w.task, w.model, w.method, w.seed)],
    output:
        checkpoint=directory("results/runs/{task}/{model}/{method}/seed{seed}/checkpoint"),
        log="results/runs/{task}/{model}/{method}/seed{seed}/log.jsonl",
        manifest="results/runs/{task}/{model}/{method}/seed{seed}/manifest.json",
        selection="results/runs/{task}/{model}/{method}/seed{seed}/selection.json",
    wildcard_constraints:
        method=PLAN.methods_regex(rl=True),
    params:
        grid=lambda w: json.dumps(PLAN.grid(w.model, w.method), sort_keys=True),
        cells=lambda w: " ".join(
            f"--cell {c}={PLAN.cell_dir(w.task, w.model, w.method, c, w.seed)}" for c in PLAN.grid_cells(w.model, w.method)
        ),
        run="results/runs/{task}/{model}/{method}/seed{seed}",
    conda:
        ENV
    log:
        "results/logs/select/{task}/{model}/{method}/seed{seed}.log",
    shell:
        "esrepro select --task {wildcards.task} --model {wildcards.model} --method {wildcards.method} "
        "--seed {wildcards.seed} --grid {params.grid:q} {params.cells} --out {params.run} > {log} 2>&1"
