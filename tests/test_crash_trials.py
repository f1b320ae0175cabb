"""kill -9 at chosen and random moments (fixed seed, bounded count): nothing partial is marked done, and the next
materialization takes over, resumes and succeeds with the same files, token arrays and losses as an uninterrupted
run. `bench/crash_soak.py` runs more."""

from tests.support.crash_trials import run_trials


def test_kill_9_at_random_moments_of_download_tokenize_and_training(tmp_path, prefix):
    report = run_trials({"download": 3, "tokenize": 2, "train": 2, "tokenize@ray": 1, "train@ray": 1}, tmp_path,
                        prefix, seed=0)
    print(f"\ncrash trials: {report}")
    assert report.failures == []
    assert report.trials == 9
    # Chosen moments make these branches run whatever the random kills hit: killed with work committed, the
    # recovery continued from it (shown on disk); killed after SUCCESS, the rerun was a cache hit.
    assert all(report.interleavings.get(f"{kind}/resumed", 0) >= 1 for kind in ("download", "tokenize", "train"))
    assert report.interleavings.get("tokenize/cached") and report.interleavings.get("train/cached")
    assert report.killed_running >= 3  # the kills at a first commit landed mid-function
