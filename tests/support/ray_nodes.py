"""Wait until the alive nodes of a Ray cluster do (`present`) or do not (`absent`) offer a resource, as the
cluster's GCS reports them (what a step's feasibility check and its fan-out see).

argv: address resource present|absent timeout_s. Prints the alive nodes' resources as one JSON line; exit
status 0 once they are as asked, 1 if they still are not after `timeout_s` (a bound against a hang).
"""

import json
import sys
import time

import ray

address, resource, want, timeout = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
ray.init(address=address, logging_level="ERROR", log_to_driver=False)
deadline = time.time() + timeout
while True:
    alive = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    if any(resource in offered for offered in alive) == (want == "present") or time.time() > deadline:
        break
    time.sleep(0.2)
print(json.dumps(alive), flush=True)
ray.shutdown()
sys.exit(0 if any(resource in offered for offered in alive) == (want == "present") else 1)
