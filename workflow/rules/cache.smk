rule build_cache:
    input:
        unpack(cache_inputs),
    output:
        files=[cache_file("{dataset}", "{backbone}", name) for name in CACHE_FILES],
        sentinel=cache_file("{dataset}", "{backbone}", "sentinel.json"),
        provenance=cache_provenance_file("{dataset}", "{backbone}"),
    params:
        spec=cache_spec,
        code=CODE["cache"],
        dataset_dir=dataset_file("{dataset}", ""),
        backbone_dir=backbone_file("{backbone}", ""),
        out_dir=cache_file("{dataset}", "{backbone}", ""),
    threads: THREADS
    log:
        f"{RESULTS}/logs/build_cache/{{dataset}}__{{backbone}}.log",
    shell:
        "rffm build-cache --spec {params.spec:q} --threads {threads}"
        " --dataset-dir {params.dataset_dir} --backbone-dir {params.backbone_dir}"
        " --out-dir {params.out_dir} --provenance {output.provenance} > {log} 2>&1"
