"""A Hub upload step materialized in a process of its own, for a test to kill mid-upload:

    python -m tests.support.hub_upload_worker PREFIX REPO_ID

uploads the output of `source_step()` (materialized under PREFIX first) to the dataset repo REPO_ID, with
`upload_step(REPO_ID)`; the hub is HF_ENDPOINT's, the token HF_TOKEN's. The test builds the same steps.
"""

import random
import sys
from pathlib import Path

from marin_assets.core.step import Step
from marin_assets.pipeline.data.hub_upload import hub_upload_step

BIG = 40 * 2**20
"""The LFS file's size: well over what the socket buffers between a client and a paused emulator hold (its
receive buffer clamped to 256 KiB, the sender's at most tcp_wmem's 4 MiB), so a PUT of it paused after its
first MiB is still short when its sender dies."""


def write_source(output_path: str) -> dict:
    """Five small text files (plain git on the hub) and one large binary one (LFS), in path order
    a.txt, b.txt, big.bin, c.txt, d.txt, e.txt: with two files per commit, big.bin goes in the second."""
    rng = random.Random(5)
    out = Path(output_path)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("a", "b", "c", "d", "e"):
        (out / f"{name}.txt").write_text("".join(f"{name} line {i} {rng.random()}\n" for i in range(200)))
    (out / "big.bin").write_bytes(rng.randbytes(BIG))
    return {"files": 6}


def source_step() -> Step:
    return Step(name="raw/hub-kill", fn=write_source, hash_attrs={"seed": 5, "big": BIG})


def upload_step(repo_id: str) -> Step:
    return hub_upload_step(f"uploads/{repo_id.replace('/', '-')}", source_step(), repo_id, repo_type="dataset",
                           max_commit_files=2)


if __name__ == "__main__":
    from marin_assets import materialize_step
    from tests.support.helpers import FAST

    prefix, repo_id = sys.argv[1:3]
    materialize_step(source_step(), prefix=prefix, settings=FAST)
    print(materialize_step(upload_step(repo_id), prefix=prefix, settings=FAST).output_path, flush=True)
