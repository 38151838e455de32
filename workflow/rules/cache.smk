rule build_cache:
    input:
        unpack(cache_inputs),
    output:
        files=[
            cache_output(cache_file("{dataset}", "{backbone}", n))
            for n in cache_files()
        ],
        sentinel=cache_output(cache_file("{dataset}", "{backbone}", "sentinel.json")),
        provenance=cache_provenance_file("{dataset}", "{backbone}"),
    log:
        f"{RESULTS}/logs/build_cache/{{dataset}}__{{backbone}}.log",
    threads: THREADS
    resources:
        device=DEVICE,
        backbone_batch=BACKBONE_BATCH,
        disk_headroom=DISK_HEADROOM,
        batch_profile=BATCH_PROFILE,
        cache_profile_dirs=cache_profile_dirs,
        cache_profile_batches=cache_profile_batches,
    params:
        code=CODE["build_cache"],
        dataset_dir=input_dir("dataset"),
        backbone_dir=input_dir("backbone"),
        out_dir=output_dir("sentinel"),
    shell:
        "rffm build_cache --batch-size {resources.backbone_batch} --batch-profile {resources.batch_profile}"
        " --disk-headroom {resources.disk_headroom} --device {resources.device}"
        " --profile-dir {resources.cache_profile_dirs} --profile-batches {resources.cache_profile_batches}"
        " --threads {threads} --dataset-dir {params.dataset_dir} --backbone-dir {params.backbone_dir}"
        " --out-dir {params.out_dir} --provenance {output.provenance} > {log} 2>&1"
