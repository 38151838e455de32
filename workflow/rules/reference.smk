# End-to-end supervised references (config `references:`): a standard CNN trained from scratch on a
# staged dataset's train split, its epoch chosen on val (train_reference), then qualified once on the
# test split under its own id and exposure (qualify_reference). Code: scripts/rffm/steps/<rule>.py.


rule train_reference:
    input:
        unpack(reference_train_inputs),
    output:
        selection=selection_file("{reference}", layout.SELECTION_NAME),
        history=selection_file("{reference}", layout.HISTORY_NAME),
        provenance=selection_file("{reference}", layout.PROVENANCE_NAME),
        sentinel=selection_file("{reference}", layout.SENTINEL_NAME),
    log:
        log_path("train_reference", "{reference}"),
    threads: THREADS
    resources:
        torch_threads=THREADS,  # the config's, never capped by --cores (which caps threads:)
        store=STORE,
    params:
        spec=reference_spec,
        members=reference_members,
        code=CODE["train_reference"],
        dataset_dir=input_dir("dataset"),
        out_dir=output_dir("sentinel"),
    shell:
        "rffm train_reference --spec {params.spec:q} --threads {resources.torch_threads} --dataset-dir {params.dataset_dir}"
        " --store {resources.store} --out-dir {params.out_dir} {params.members} > {log} 2>&1"


rule qualify_reference:
    input:
        unpack(reference_qualify_inputs),
    output:
        metrics=report(
            qualification_file("{reference}", layout.METRICS_NAME),
            caption="../report/metrics.rst",
            category="{reference}",
            subcategory="2. qualification (test split)",
            labels={"figure": "test metrics (JSON)"},
        ),
        accuracy_vs_snr=report(
            qualification_file("{reference}", layout.ACCURACY_FIGURE),
            caption="../report/accuracy_vs_snr.rst",
            category="{reference}",
            subcategory="2. qualification (test split)",
            labels={"figure": "accuracy vs SNR"},
        ),
        confusion=report(
            qualification_file("{reference}", layout.CONFUSION_FIGURE),
            caption="../report/confusion_matrix.rst",
            category="{reference}",
            subcategory="2. qualification (test split)",
            labels={"figure": "normalized confusion matrix"},
        ),
        manifest=qualification_file("{reference}", layout.MANIFEST_NAME),
        provenance=qualification_file("{reference}", layout.PROVENANCE_NAME),
        sentinel=qualification_file("{reference}", layout.SENTINEL_NAME),
    log:
        log_path("qualify_reference", "{reference}"),
    threads: THREADS
    resources:
        torch_threads=THREADS,  # the config's, never capped by --cores (which caps threads:)
        store=STORE,
    params:
        spec=reference_spec,
        source=lambda wildcards: as_json(selection_source(wildcards.reference)),
        code=CODE["qualify_reference"],
        selection_dir=input_dir("selection"),
        dataset_dir=input_dir("dataset"),
        out_dir=output_dir("sentinel"),
    shell:
        "rffm qualify_reference --spec {params.spec:q} --source {params.source:q} --threads {resources.torch_threads}"
        " --selection-dir {params.selection_dir} --dataset-dir {params.dataset_dir}"
        " --store {resources.store} --out-dir {params.out_dir} > {log} 2>&1"
