rule qualify:
    input:
        unpack(qualify_inputs),
    output:
        metrics=report(
            run_file("{run}", "qualification/metrics.json"),
            caption="../report/metrics.rst",
            category="{run}",
            subcategory="2. qualification (test split)",
            labels={"figure": "test metrics (JSON)"},
        ),
        accuracy_vs_snr=report(
            run_file("{run}", "qualification/accuracy_vs_snr.png"),
            caption="../report/accuracy_vs_snr.rst",
            category="{run}",
            subcategory="2. qualification (test split)",
            labels={"figure": "accuracy vs SNR"},
        ),
        confusion=report(
            run_file("{run}", "qualification/confusion_matrix.png"),
            caption="../report/confusion_matrix.rst",
            category="{run}",
            subcategory="2. qualification (test split)",
            labels={"figure": "normalized confusion matrix"},
        ),
        manifest=run_file("{run}", "qualification/run_manifest.json"),
        provenance=run_file("{run}", "qualification/provenance.json"),
        sentinel=run_file("{run}", "qualification/sentinel.json"),
    log:
        f"{RESULTS}/logs/qualify/{{run}}.log",
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
