"""kill -9 at random moments (fixed seed, bounded count): nothing partial is marked done, and
the next materialization takes over, resumes and succeeds. `bench/crash_soak.py` runs more."""

from tests.support.crash_trials import run_trials


def test_kill_9_at_random_moments_of_download_tokenize_and_training(tmp_path, prefix):
    report = run_trials({"download": 3, "tokenize": 2, "train": 2, "tokenize@ray": 1, "train@ray": 1}, tmp_path,
                        prefix, seed=0)
    print(f"\ncrash trials: {report}")
    assert report.failures == []
    assert report.trials == 9
    assert report.killed_running >= 4  # most kills landed mid-function, where they matter
