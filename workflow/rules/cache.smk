rule build_cache:
    input:
        unpack(cache_inputs),
    output:
        files=[
            cache_output(cache_file("{dataset}", "{backbone}", n)) for n in CACHE_FILES
        ],
        sentinel=cache_output(cache_file("{dataset}", "{backbone}", "sentinel.json")),
        provenance=cache_provenance_file("{dataset}", "{backbone}"),
    log:
        f"{RESULTS}/logs/build_cache/{{dataset}}__{{backbone}}.log",
    conda:
        "../../envs/rffm.yaml"
    threads: THREADS
    resources:
        # an execution knob, not a param: outputs are identical whatever it is
        backbone_batch=config["cache"]["batch_size"],
    params:
        code=CODE["cache"],
        full_hash="--full-hash" if config["cache"]["full_hash"] else "",
        profiling=cache_profiling_args,
        batch_profile=batch_profile_arg,
        device=device_arg,
        headroom=lambda wildcards, resources: config["cache"]["disk_headroom"],
        dataset_dir=input_dir("dataset"),
        backbone_dir=input_dir("backbone"),
        out_dir=output_dir("sentinel"),
    shell:
        "rffm build-cache --batch-size {resources.backbone_batch} {params.batch_profile}"
        " --disk-headroom {params.headroom} {params.full_hash} {params.profiling}"
        " {params.device} --threads {threads}"
        " --dataset-dir {params.dataset_dir} --backbone-dir {params.backbone_dir}"
        " --out-dir {params.out_dir} --provenance {output.provenance} > {log} 2>&1"
