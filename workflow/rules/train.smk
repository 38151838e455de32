rule train_epoch:
    input:
        unpack(epoch_inputs),
    output:
        checkpoint=epoch_file("{run}", "{epoch}", layout.CHECKPOINT_NAME),
        metrics=epoch_file("{run}", "{epoch}", layout.METRICS_NAME),
        provenance=epoch_file("{run}", "{epoch}", layout.PROVENANCE_NAME),
        sentinel=epoch_file("{run}", "{epoch}", layout.SENTINEL_NAME),
    log:
        log_path("train_epoch", "{run}/{epoch}"),
    group:
        epoch_group
    threads: config["epoch_threads"]
    resources:
        **CACHE_RESOURCES,
        torch_threads=config["epoch_threads"],  # the config's, never capped by --cores (which caps threads:)
        memo_store=MEMO_STORE,
        epoch_profile_batches=epoch_profile_batches,
    params:
        spec=epoch_spec,
        members=sweep_members,
        code=CODE["train_epoch"],
        cache_dir=input_dir("cache"),
        previous=previous_epoch_arg,
        out_dir=output_dir("sentinel"),
    shell:
        "rffm train_epoch --spec {params.spec:q} --threads {resources.torch_threads} --epoch {wildcards.epoch}"
        " --cache-record-dir {params.cache_dir} {params.previous} {params.members} --device {resources.device}"
        " --scratch {resources.scratch} --store {resources.store} --memo-store={resources.memo_store:q}"
        " --batch-size {resources.backbone_batch} --batch-profile {resources.batch_profile}"
        " --disk-headroom {resources.disk_headroom}"
        " --profile-batches {resources.epoch_profile_batches} --out-dir {params.out_dir} > {log} 2>&1"
