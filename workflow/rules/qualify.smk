rule qualify:
    input:
        unpack(qualify_inputs),
    output:
        metrics=report(
            qualification_file("{run}", layout.METRICS_NAME),
            caption="../report/metrics.rst",
            category="{run}",
            subcategory="2. qualification (test split)",
            labels={"figure": "test metrics (JSON)"},
        ),
        accuracy_vs_snr=report(
            qualification_file("{run}", layout.ACCURACY_FIGURE),
            caption="../report/accuracy_vs_snr.rst",
            category="{run}",
            subcategory="2. qualification (test split)",
            labels={"figure": "accuracy vs SNR"},
        ),
        confusion=report(
            qualification_file("{run}", layout.CONFUSION_FIGURE),
            caption="../report/confusion_matrix.rst",
            category="{run}",
            subcategory="2. qualification (test split)",
            labels={"figure": "normalized confusion matrix"},
        ),
        manifest=qualification_file("{run}", layout.MANIFEST_NAME),
        provenance=qualification_file("{run}", layout.PROVENANCE_NAME),
        sentinel=qualification_file("{run}", layout.SENTINEL_NAME),
    log:
        log_path("qualify", "{run}"),
    threads: THREADS
    resources:
        torch_threads=THREADS,  # the config's, never capped by --cores (which caps threads:)
        device=DEVICE,
        backbone_batch=BACKBONE_BATCH,
        batch_profile=BATCH_PROFILE,
        store=STORE,
        launch_profile=LAUNCH_PROFILE,
    params:
        spec=run_spec,
        source=lambda wildcards: as_json(selection_source(wildcards.run)),
        code=CODE["qualify"],
        dirs=qualify_dirs,
        out_dir=output_dir("sentinel"),
    shell:
        "rffm qualify --spec {params.spec:q} --source {params.source:q} --threads {resources.torch_threads}"
        " --selection-dir {params.dirs[selection]} --dataset-dir {params.dirs[dataset]}"
        " --backbone-dir {params.dirs[backbone]} --cache-record-dir {params.dirs[cache]}"
        " --epoch-dirs {params.dirs[epochs]} --launch-profile={resources.launch_profile:q}"
        " --batch-size {resources.backbone_batch} --batch-profile {resources.batch_profile}"
        " --store {resources.store} --device {resources.device} --out-dir {params.out_dir} > {log} 2>&1"
