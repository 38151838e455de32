import json
import time
from pathlib import Path

import pytest
import torch

from rffm.runtime import batching


def run(total: int, controller: batching.AdaptiveBatch, monkeypatch, limit: int | None) -> list[tuple[int, int]]:
    if limit is None:
        monkeypatch.delenv(batching.INJECT_ENV, raising=False)
    else:
        monkeypatch.setenv(batching.INJECT_ENV, str(limit))
    done: list[tuple[int, int]] = []
    batching.run_adaptive(total, controller, lambda start, stop: done.append((start, stop)))
    return done


def test_oom_halves_and_retries_the_same_rows(monkeypatch):
    controller = batching.AdaptiveBatch(maximum=64)
    done = run(100, controller, monkeypatch, limit=20)
    assert done[0] == (0, 16)  # 64 and 32 failed on rows 0.., 16 went through
    covered = [row for start, stop in done for row in range(start, stop)]
    assert covered == list(range(100))
    assert controller.stats["ooms"] == 2 and controller.oom_bound == 32
    assert max(stop - start for start, stop in done) <= 20


def test_growth_after_three_full_successes_capped_by_maximum_and_bound(monkeypatch):
    controller = batching.AdaptiveBatch(maximum=100, current=8)
    done = run(2000, controller, monkeypatch, limit=None)
    sizes = [stop - start for start, stop in done]
    assert sizes[:4] == [8, 8, 8, 10]  # +25% after 3 full successes
    assert max(sizes) == 100
    bounded = batching.AdaptiveBatch(maximum=100, current=8)
    bounded.seed(None, 40)
    sizes = [stop - start for start, stop in run(2000, bounded, monkeypatch, limit=None)[:60]]
    assert max(sizes[:30]) == 39  # never at the remembered failing size until a probe


def test_probe_above_the_bound_after_32_successes_with_backoff(monkeypatch):
    controller = batching.AdaptiveBatch(maximum=64)
    run(40 * 200, controller, monkeypatch, limit=40)
    # the bound settles just above the limit; failed probes double the wait each time
    assert controller.oom_bound == 41 and controller.current == 40
    assert controller.failed_probes >= 1 and controller.probe_after == batching.PROBE_AFTER * 2**controller.failed_probes
    assert controller.stats["probes"] == controller.failed_probes


def test_a_probe_that_succeeds_clears_the_bound(monkeypatch):
    controller = batching.AdaptiveBatch(maximum=64)
    controller.seed(32, 33)  # remembered from a tighter machine
    run(64 * 60, controller, monkeypatch, limit=None)
    assert controller.oom_bound is None and controller.current == 64


def test_minimum_size_oom_is_raised(monkeypatch):
    with pytest.raises(torch.OutOfMemoryError, match="minimum batch"):
        run(10, batching.AdaptiveBatch(maximum=4, minimum=2), monkeypatch, limit=1)


def test_profile_seeds_are_bounded_and_expire(tmp_path: Path, monkeypatch):
    profile = batching.BatchProfile(tmp_path / "profile.json", ttl_s=60)
    learned = batching.AdaptiveBatch(maximum=1024)
    run(5000, learned, monkeypatch, limit=300)
    profile.remember("k", learned, learned.largest_good, {"note": "test"})
    entry = json.loads((tmp_path / "profile.json").read_text())["entries"]["k"]
    assert entry["good"] == learned.largest_good <= 300 and entry["oom_bound"] == learned.oom_bound

    seeded = batching.AdaptiveBatch(maximum=1024)
    assert profile.seed("k", seeded) and seeded.current == entry["good"]
    capped = batching.AdaptiveBatch(maximum=64)
    assert profile.seed("k", capped) and capped.current == 64 and capped.oom_bound is None
    assert not profile.seed("other-key", batching.AdaptiveBatch(maximum=8))
    real_time = time.time
    monkeypatch.setattr(batching.time, "time", lambda: real_time() + 61)
    assert profile.lookup("k") is None and not profile.seed("k", batching.AdaptiveBatch(maximum=1024))


def test_seeded_passes_probe_far_less(monkeypatch):
    fresh = batching.AdaptiveBatch(maximum=1024)
    run(20000, fresh, monkeypatch, limit=300)
    seeded = batching.AdaptiveBatch(maximum=1024)
    seeded.seed(fresh.largest_good, fresh.oom_bound)
    run(20000, seeded, monkeypatch, limit=300)
    assert seeded.stats["ooms"] <= 0.25 * fresh.stats["ooms"]


def test_profile_key_is_exact(tmp_path: Path):
    context = batching.device_context("cpu")
    key = batching.profile_key("fp", (2, 128), "float32", context)
    assert key == batching.profile_key("fp", (2, 128), "float32", dict(context))
    assert key != batching.profile_key("fp", (2, 1024), "float32", context)
    assert key != batching.profile_key("fp", (2, 128), "float32", {**context, "memory_budget_bytes": 1})
