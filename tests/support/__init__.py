"""What the tests share that is not a fixture: local servers speaking real protocols, worker
scripts run as separate processes, small pipelines, and helpers. `conftest.py` holds fixtures
only and is never imported."""
