# The qualified classifier as one deployable program (torch.export .pt2, ONNX, safetensors, model card),
# checked against rffm's own evaluation on the validation split. It reads the qualification's sentinel
# (the test result it reports), never the test split.


rule export:
    input:
        unpack(export_inputs),
    output:
        program=export_file("{run}", layout.EXPORT_PROGRAM),
        onnx=export_file("{run}", layout.EXPORT_ONNX),
        weights=export_file("{run}", layout.EXPORT_WEIGHTS),
        model_card=export_file("{run}", layout.MODEL_CARD),
        provenance=export_file("{run}", layout.PROVENANCE_NAME),
        sentinel=export_file("{run}", layout.SENTINEL_NAME),
    log:
        log_path("export", "{run}"),
    threads: THREADS
    resources:
        store=STORE,
        torch_threads=THREADS,  # the config's, never capped by --cores (which caps threads:)
    params:
        spec=run_spec,
        code=CODE["export"],
        dirs=export_dirs,
        out_dir=output_dir("sentinel"),
    shell:
        "rffm export --spec {params.spec:q} --threads {resources.torch_threads}"
        " --qualification-dir {params.dirs[qualification]} --selection-dir {params.dirs[selection]}"
        " --dataset-dir {params.dirs[dataset]} --backbone-dir {params.dirs[backbone]}"
        " --cache-record-dir {params.dirs[cache]}"
        " --store {resources.store} --out-dir {params.out_dir} > {log} 2>&1"
