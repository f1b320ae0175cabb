"""kill -9 at random moments (fixed seed, bounded count): nothing partial is marked done, and
the next materialization takes over, resumes and succeeds. `bench/crash_soak.py` runs more."""

from tests.support.crash_trials import run_trials


def test_kill_9_at_random_moments_of_download_tokenize_and_training(tmp_path, prefix):
    report = run_trials({"download": 4, "tokenize": 3, "train": 3, "tokenize@ray": 1, "train@ray": 1}, tmp_path,
                        prefix, seed=0)
    print(f"\ncrash trials: {report}")
    assert report.failures == []
    assert report.trials == 12
    assert report.killed_running >= 6  # most kills landed mid-function, where they matter
