rule build_cache:
    input:
        unpack(cache_inputs),
    output:
        sentinel=cache_file("{dataset}", "{backbone}", layout.SENTINEL_NAME),
        provenance=cache_file("{dataset}", "{backbone}", layout.PROVENANCE_NAME),
    log:
        log_path("build_cache", "{dataset}__{backbone}"),
    group:
        cache_group
    threads: THREADS
    resources:
        **CACHE_RESOURCES,
        torch_threads=THREADS,  # the config's, never capped by --cores (which caps threads:)
        cache_profile_runs=cache_profile_runs,
        cache_profile_batches=cache_profile_batches,
    params:
        code=CODE["build_cache"],
        encoder=cache_encoder,
        dataset_dir=input_dir("dataset"),
        backbone_dir=input_dir("backbone"),
        out_dir=output_dir("sentinel"),
    shell:
        "rffm build_cache --batch-size {resources.backbone_batch} --batch-profile {resources.batch_profile}"
        " --disk-headroom {resources.disk_headroom} --device {resources.device} --threads {resources.torch_threads}"
        " --scratch {resources.scratch} --store {resources.store}"
        " --profile-runs {resources.cache_profile_runs} --profile-batches {resources.cache_profile_batches}"
        " --dataset-dir {params.dataset_dir} --backbone-dir {params.backbone_dir} --encoder {params.encoder:q}"
        " --out-dir {params.out_dir} > {log} 2>&1"
