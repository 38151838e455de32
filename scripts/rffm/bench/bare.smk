# `rffm bench plan`'s yardstick: rffm's DAG shape (its rules, their edges, the groups rffm places) as bare shell rules
# with one output each and no input functions but lookups; the bench dry-runs it beside rffm's workflow.
# Config (written by rffm.bench.plan): runs {run: {dataset, backbone, epochs}}, groups {builds, epochs} or none.

RUNS = config["runs"]
GROUPS = config.get("groups")


wildcard_constraints:
    run="[^/]+",
    epoch="[0-9]+",


def epochs(run):
    return range(1, RUNS[run]["epochs"] + 1)


def done(run, step):
    return f"runs/{run}/{step}/sentinel.json"


rule final_qualification:
    default_target: True
    input:
        [done(run, step) for run in RUNS for step in ("export", "report", "summary")],


rule stage_dataset:
    output:
        "datasets/{dataset}/sentinel.json",
    shell:
        "touch {output}"


rule pretrain_backbone:
    input:
        lambda w: f"datasets/{next(r['dataset'] for r in RUNS.values() if r['backbone'] == w.backbone)}/sentinel.json",
    output:
        "backbones/{backbone}/sentinel.json",
    shell:
        "touch {output}"


rule build_cache:
    input:
        "datasets/{dataset}/sentinel.json",
        "backbones/{backbone}/sentinel.json",
    output:
        "caches/{dataset}__{backbone}/sentinel.json",
    group:
        lambda w: GROUPS and GROUPS["builds"][f"{w.dataset}__{w.backbone}"]
    shell:
        "touch {output}"


rule train_epoch:
    input:
        lambda w: f"caches/{RUNS[w.run]['dataset']}__{RUNS[w.run]['backbone']}/sentinel.json",
        lambda w: (
            []
            if int(w.epoch) == 1
            else f"runs/{w.run}/epochs/{int(w.epoch) - 1}/sentinel.json"
        ),
    output:
        "runs/{run}/epochs/{epoch}/sentinel.json",
    group:
        lambda w: GROUPS and GROUPS["epochs"][w.run]
    shell:
        "touch {output}"


rule select_checkpoint:
    input:
        lambda w: [f"runs/{w.run}/epochs/{e}/sentinel.json" for e in epochs(w.run)],
    output:
        done("{run}", "selection"),
    shell:
        "touch {output}"


rule plot_training:
    input:
        done("{run}", "selection"),
    output:
        done("{run}", "report"),
    shell:
        "touch {output}"


rule qualify:
    input:
        done("{run}", "selection"),
    output:
        done("{run}", "qualification"),
    shell:
        "touch {output}"


rule export:
    input:
        done("{run}", "qualification"),
    output:
        done("{run}", "export"),
    shell:
        "touch {output}"


rule summarize_manifest:
    input:
        done("{run}", "qualification"),
    output:
        done("{run}", "summary"),
    shell:
        "touch {output}"
