rule build_cache:
    input:
        unpack(cache_inputs),
    output:
        sentinel=cache_file("{dataset}", "{backbone}", "sentinel.json"),
        provenance=cache_file("{dataset}", "{backbone}", "provenance.json"),
    log:
        f"{RESULTS}/logs/build_cache/{{dataset}}__{{backbone}}.log",
    group:
        cache_group
    threads: THREADS
    resources:
        device=DEVICE,
        backbone_batch=BACKBONE_BATCH,
        disk_headroom=DISK_HEADROOM,
        batch_profile=BATCH_PROFILE,
        scratch=SCRATCH,
        store=STORE,
        cache_profile_runs=cache_profile_runs,
        cache_profile_batches=cache_profile_batches,
    params:
        threads=THREADS,  # from the config, never capped by --cores: results never depend on it
        code=CODE["build_cache"],
        dataset_dir=input_dir("dataset"),
        backbone_dir=input_dir("backbone"),
        out_dir=output_dir("sentinel"),
    shell:
        "rffm build_cache --batch-size {resources.backbone_batch} --batch-profile {resources.batch_profile}"
        " --disk-headroom {resources.disk_headroom} --device {resources.device} --threads {params.threads}"
        " --scratch {resources.scratch} --store {resources.store}"
        " --profile-runs {resources.cache_profile_runs} --profile-batches {resources.cache_profile_batches}"
        " --dataset-dir {params.dataset_dir} --backbone-dir {params.backbone_dir}"
        " --out-dir {params.out_dir} > {log} 2>&1"
