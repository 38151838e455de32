"""Two submitters qualify at once: the ledger's create-only entry decides, in the store itself.

Each race starts two processes released by one barrier, both claiming the same (split, run) with
*different* artifacts (two submitters whose configs selected different checkpoints for one run id),
against a POSIX results tree (link(2) of a finished temporary file: fails when the name exists) and
against Cloud Storage (an upload with ifGenerationMatch=0). The Cloud Storage side runs on
fake-gcs-server, which enforces that precondition atomically as the service does; gcp-storage-emulator,
used by the Batch workflow tests, ignores it (the last test shows why it cannot stand in here).
"""

from __future__ import annotations

import multiprocessing
import os

import pytest
from batch_support import PROJECT, free_port, precondition_gcs

from rffm.errors import ExposureError
from rffm.records import ledger
from rffm.records.store import GcsStore, PosixStore

SPLIT = "xxh3_128_of_parts:" + "5e" * 16
OTHER_SPLIT = "xxh3_128_of_parts:" + "7a" * 16
BUCKET = "rffm-ledger-race"
RACES = 6
MESSAGE = "already spent its test exposure"


def gcs_store(url: str) -> GcsStore:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(project=PROJECT, credentials=AnonymousCredentials(), client_options={"api_endpoint": url})
    return GcsStore(f"gs://{BUCKET}/rffm/results", client=client)


def open_store(kind: str, where: str):
    return PosixStore(where) if kind == "posix" else gcs_store(where)


def qualification(run: str, artifact: str) -> dict:
    return {"split_digest": SPLIT, "run": run, "artifact_sha256": artifact, "metrics": {"accuracy": 0.5}, "submitter": artifact}


def submitter(kind: str, where: str, run: str, artifact: str, barrier, answers) -> None:
    """One qualify process: its own store client, released together with the other submitter."""
    store = open_store(kind, where)
    barrier.wait(timeout=30)
    try:
        recorded = ledger.claim(store, qualification(run, artifact))
        answers.put((run, artifact, "recorded", recorded["artifact_sha256"]))
    except ExposureError as error:
        answers.put((run, artifact, "refused", str(error)))


def race(kind: str, where: str, run: str, artifacts: tuple[str, str]) -> list[tuple[str, str, str]]:
    """Both artifacts claimed for `run` at the same moment, each by its own process; (artifact, outcome, detail) each."""
    context = multiprocessing.get_context("fork")
    barrier, answers = context.Barrier(len(artifacts)), context.Queue()
    processes = [context.Process(target=submitter, args=(kind, where, run, artifact, barrier, answers)) for artifact in artifacts]
    for process in processes:
        process.start()
    found = [answers.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0
    return sorted((artifact, outcome, detail) for _, artifact, outcome, detail in found)


@pytest.fixture(params=["posix", "gcs"])
def store_at(request, tmp_path):
    """(kind, where) of an empty results store: a directory, or a bucket on fake-gcs-server."""
    if request.param == "posix":
        yield "posix", str(tmp_path / "results")
        return
    with precondition_gcs(tmp_path / "fake-gcs-server.log") as url:
        saved = os.environ.get("STORAGE_EMULATOR_HOST")
        os.environ["STORAGE_EMULATOR_HOST"] = url  # google-cloud-storage uploads go to the fake then
        try:
            gcs_store(url).client.create_bucket(BUCKET)
            yield "gcs", url
        finally:
            if saved is None:
                os.environ.pop("STORAGE_EMULATOR_HOST", None)
            else:
                os.environ["STORAGE_EMULATOR_HOST"] = saved


def test_two_artifacts_qualified_at_once_for_one_run_record_exactly_one(store_at):
    kind, where = store_at
    store = open_store(kind, where)
    ledger.claim(store, {**qualification("earlier", "art-earlier"), "split_digest": SPLIT})  # another run on the split
    ledger.claim(store, {**qualification("elsewhere", "art-elsewhere"), "split_digest": OTHER_SPLIT})
    winners = {}
    for number in range(RACES):
        run = f"run-{number}"
        outcomes = race(kind, where, run, (f"art-{number}-a", f"art-{number}-b"))
        recorded = [(artifact, detail) for artifact, outcome, detail in outcomes if outcome == "recorded"]
        refused = [detail for _, outcome, detail in outcomes if outcome == "refused"]
        assert len(recorded) == 1 and len(refused) == 1, outcomes
        [(winner, entry_artifact)], [message] = recorded, refused
        assert entry_artifact == winner
        assert message.startswith(f"run {run!r} {MESSAGE}: artifact {winner[:16]}") and "new id" in message, message
        assert ledger.read(store, ledger.entry_key(SPLIT, run))["submitter"] == winner, "the refused submitter replaced the entry"
        winners[run] = winner
    # the count of the split: one artifact per raced run plus the earlier run's; the other split is apart
    assert ledger.exposure_count(store, SPLIT) == RACES + 1
    assert ledger.exposure_count(store, OTHER_SPLIT) == 1
    assert {run: entries[0]["artifact_sha256"] for run, entries in ledger.runs_qualified(store).items()} == {
        **winners,
        "earlier": "art-earlier",
        "elsewhere": "art-elsewhere",
    }
    # a process that starts later (a qualify job on another VM or node) sees the same ledger
    later = open_store(kind, where)
    with pytest.raises(ExposureError, match=MESSAGE):
        ledger.claim(later, qualification("run-0", "art-0-c"))
    assert ledger.claim(later, qualification("run-0", winners["run-0"]))["submitter"] == winners["run-0"]


def test_the_same_artifact_qualified_at_once_is_one_entry_and_both_get_it(store_at):
    kind, where = store_at
    outcomes = race(kind, where, "twice", ("art-same", "art-same"))
    assert outcomes == [("art-same", "recorded", "art-same")] * 2  # both answers are the one recorded entry
    assert ledger.exposure_count(open_store(kind, where), SPLIT) == 1


def test_gcp_storage_emulator_ignores_the_precondition():
    """Why the race runs on fake-gcs-server: this emulator lets a second create-only upload replace the first."""
    from gcp_storage_emulator.server import create_server

    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    saved = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
    try:
        store = gcs_store(f"http://127.0.0.1:{port}")
        store.client.create_bucket(BUCKET)
        assert store.create("ledger/x/run.json", b"first") and store.create("ledger/x/run.json", b"second")
        assert store.read("ledger/x/run.json") == b"second"
    finally:
        server.stop()
        if saved is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = saved


def test_a_job_overwriting_an_entry_create_only_fails_and_the_entry_reports_its_protection(tmp_path):
    """Issue 23 on Cloud Storage: what fake-gcs-server enforces (a create-only upload over an entry: 412) and what it only
    stores (an object retention: reported by the store, never enforced here; profiles/README.md, Write-once ledger)."""
    import datetime

    with precondition_gcs(tmp_path / "fake-gcs.log") as url:
        store = gcs_store(url)
        store.client.create_bucket(BUCKET)
        ledger.claim(store, qualification("run-a", "art-1"))
        key = ledger.entry_key(SPLIT, "run-a")
        assert store.create(key, ledger.encode(qualification("run-a", "art-forged"))) is False  # the service refused it
        assert ledger.read(store, key)["artifact_sha256"] == "art-1"
        [(where, protection)] = ledger.protections(store)
        assert where == f"gs://{BUCKET}/rffm/results/{key}"
        assert protection.startswith("created create-only (ifGenerationMatch=0), no retention")
        locked = ledger.entry_key(SPLIT, "run-b")
        blob = store.bucket.blob(f"rffm/results/{locked}")
        blob.retention.mode = "Locked"
        blob.retention.retain_until_time = datetime.datetime(2100, 1, 1, tzinfo=datetime.UTC)
        blob.upload_from_string(ledger.encode(qualification("run-b", "art-2")), if_generation_match=0)
        assert dict(ledger.protections(store))[store.where(locked)].startswith("Locked retention until 2100-01-01")
