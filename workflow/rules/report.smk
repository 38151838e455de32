# Figures and tables for `snakemake --report`. Each is a small rule of its own reading
# sentinels (and the manifest), so adding or changing a figure never reruns a training step.
# They run on the submitting host under cluster executors: seconds of CPU, not worth a node or VM.


localrules:
    plot_training,
    summarize_manifest,
    summarize_profiling,
    plot_cache_lifecycle,
    plot_comparison,


rule plot_training:
    input:
        epochs=lambda wildcards: [
            epoch_file(wildcards.run, e, layout.SENTINEL_NAME)
            for e in run_epochs(wildcards.run)
        ],
        selection=selection_file("{run}", layout.SENTINEL_NAME),
        linked=ancient(lambda wildcards: cache_record(wildcards.run)),
    output:
        curves=report(
            report_file("{run}", "validation", layout.TRAINING_CURVES),
            caption="../report/training_curves.rst",
            category="{run}",
            subcategory="1. validation",
            labels={"figure": "training curves"},
        ),
        evidence=report(
            report_file("{run}", "validation", layout.SELECTION_EVIDENCE),
            caption="../report/selection_evidence.rst",
            category="{run}",
            subcategory="1. validation",
            labels={"figure": "selection evidence"},
        ),
        provenance=report_file("{run}", "validation", layout.PROVENANCE_NAME),
        sentinel=report_file("{run}", "validation", layout.SENTINEL_NAME),
    log:
        log_path("plot_training", "{run}"),
    params:
        code=CODE["plot_training"],
        epoch_dirs=lambda wildcards, input: " ".join(
            path.rsplit("/", 1)[0] for path in input.epochs
        ),
        selection_dir=lambda wildcards, input: input.selection.rsplit("/", 1)[0],
        out_dir=output_dir("sentinel"),
    shell:
        "rffm plot_training --run {wildcards.run} --epoch-dirs {params.epoch_dirs}"
        " --selection-dir {params.selection_dir} --out-dir {params.out_dir} > {log} 2>&1"


rule summarize_manifest:
    input:
        unpack(manifest_inputs),
    output:
        table=report(
            report_file("{run}", "qualification", layout.MANIFEST_SUMMARY),
            caption="../report/manifest_summary.rst",
            category="{run}",
            subcategory="2. qualification (test split)",
            labels={"figure": "run manifest"},
        ),
        provenance=report_file("{run}", "qualification", layout.PROVENANCE_NAME),
        sentinel=report_file("{run}", "qualification", layout.SENTINEL_NAME),
    log:
        log_path("summarize_manifest", "{run}"),
    params:
        code=CODE["summarize_manifest"],
        qualification_dir=lambda wildcards, input: input.qualification.rsplit("/", 1)[0],
        out_dir=output_dir("sentinel"),
    shell:
        "rffm summarize_manifest --run {wildcards.run} --qualification-dir {params.qualification_dir}"
        " --out-dir {params.out_dir} > {log} 2>&1"


rule summarize_profiling:
    input:
        unpack(profiling_inputs),
    output:
        summary=profiling_file("{run}", layout.CACHE_LIFECYCLE_SUMMARY),
        provenance=profiling_file("{run}", layout.PROVENANCE_NAME),
        sentinel=profiling_file("{run}", layout.SENTINEL_NAME),
    log:
        log_path("summarize_profiling", "{run}"),
    resources:
        store=STORE,
    params:
        code=CODE["summarize_profiling"],
        cache_dir=input_dir("cache"),
        epoch_dirs=input_dirs("epochs"),
        profile_dir=output_dir("summary"),
    shell:
        "rffm summarize_profiling --run {wildcards.run} --cache-record-dir {params.cache_dir}"
        " --epoch-dirs {params.epoch_dirs} --store {resources.store} --profile-dir {params.profile_dir} > {log} 2>&1"


rule plot_cache_lifecycle:
    input:
        profiling=lambda wildcards: profiling_file(wildcards.run, layout.SENTINEL_NAME),
        summary=ancient(profiling_summary),
        linked=ancient(
            lambda wildcards: [cache_record(wildcards.run)]
            + [
                epoch_file(wildcards.run, e, layout.SENTINEL_NAME)
                for e in profiled_epochs(wildcards.run)
            ]
        ),
    output:
        figure=report(
            report_file("{run}", "profiling", layout.CACHE_LIFECYCLE),
            caption="../report/cache_lifecycle.rst",
            category="{run}",
            subcategory="3. performance",
            labels={"figure": "cache lifecycle timings"},
        ),
        provenance=report_file("{run}", "profiling", layout.PROVENANCE_NAME),
        sentinel=report_file("{run}", "profiling", layout.SENTINEL_NAME),
    log:
        log_path("plot_cache_lifecycle", "{run}"),
    params:
        code=CODE["plot_cache_lifecycle"],
        out_dir=output_dir("sentinel"),
    shell:
        "rffm plot_cache_lifecycle --run {wildcards.run} --summary {input.summary}"
        " --out-dir {params.out_dir} > {log} 2>&1"


rule plot_comparison:
    input:
        unpack(comparison_inputs),
    output:
        figure=report(
            COMPARISON,
            caption="../report/comparison.rst",
            category="comparison",
            labels={"figure": "floor | frozen backbone | end-to-end"},
        ),
        table=comparison_file(layout.COMPARISON_TABLE),
        provenance=comparison_file(layout.PROVENANCE_NAME),
        sentinel=comparison_file(layout.SENTINEL_NAME),
    log:
        log_path("plot_comparison"),
    params:
        code=CODE["plot_comparison"],
        runs=" ".join([*config["runs"], *config["references"]]),
        results_dir=comparison_root,
        out_dir=output_dir("sentinel"),
    shell:
        "rffm plot_comparison --results-dir {params.results_dir} --runs {params.runs}"
        " --out-dir {params.out_dir} > {log} 2>&1"
