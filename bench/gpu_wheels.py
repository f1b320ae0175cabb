"""Stage the wheels a GPU machine without a package registry lacks to run `bench/gpu_train.py`.

The GPU machines we can borrow (docs/gpu.md) have Python 3.12, JAX with CUDA, transformers, but no Levanter,
haliax, draccus or Marin's packages, reach no registry, and take at most 64 MiB of files per transfer. This
script, run *here*:

1. lists every distribution the two sides of the GPU benchmark import — our train step and bare Levanter's
   `train_lm` — by importing them in a fresh interpreter and mapping `sys.modules` to distributions;
2. drops those the machine already has at the same version (`--have`: the machine's `pip list --format=freeze`,
   fetched by one short run there; without it, the image's package list as last read is assumed);
3. downloads the rest as wheels for CPython 3.12 on manylinux x86-64 and packs them into folders of at most
   `--batch-mib` MiB (`.whl/batch-1`, `.whl/batch-2`, …), printing the run commands that carry them over.

Usage: `.venv/bin/python bench/gpu_wheels.py [--have gpu-packages.txt] [--out .whl] [--batch-mib 60]`.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

IMPORTS = ("levanter.main.train_lm", "marin_assets.pipeline.training.pretrain.step", "marin_assets.core.materialize",
           "marin_assets.pipeline.tokens.tokenize")
"""What `gpu_train.py` imports on the GPU machine (the cache and tokenizer travel prebuilt)."""

IMAGE_PACKAGES = {
    # The GPU image's packages as docs/gpu.md last recorded them (versions where they were read): a package
    # listed here is assumed present at the version we use unless --have says otherwise.
    "jax": "0.11.2", "jaxlib": "0.11.2", "transformers": "5.17.0", "huggingface-hub": "1.33.0", "numpy": "2.5.2",
    "tokenizers": "0.23.2", "safetensors": "0.8.0", "jaxtyping": "0.3.11", "tiktoken": "0.14.0",
}
"""Seen versions of the image's packages (`pip list` in a session there, 2026-11)."""


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_distributions() -> dict[str, str]:
    """{distribution: version} of every module the benchmark imports, from a fresh interpreter of this venv."""
    code = ("import importlib, importlib.metadata as m, json, sys\n"
            f"for name in {list(IMPORTS)!r}: importlib.import_module(name)\n"
            "tops = {n.split('.')[0] for n in list(sys.modules)}\n"
            "dists = m.packages_distributions()\n"
            "found = {d for t in tops for d in dists.get(t, [])}\n"
            "print(json.dumps({d: m.version(d) for d in sorted(found)}))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
    return {normalize(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()
            if normalize(k) != "marin-assets"}  # ours travels as source with the working tree


def machine_packages(have: Path | None) -> dict[str, str]:
    if have is None:
        return dict(IMAGE_PACKAGES)
    pins = (line.split("==", 1) for line in have.read_text().splitlines() if "==" in line)
    return {normalize(name): version.strip() for name, version in pins}


def download(needed: dict[str, str], dest: Path) -> list[Path]:
    """Wheels of exactly these versions for CPython 3.12 on manylinux x86-64 (no dependencies: all are named)."""
    platforms = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)] + ["manylinux2014_x86_64",
                                                                                      "manylinux1_x86_64"]
    args = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
            "--python-version", "3.12", "--implementation", "cp", "-d", str(dest)]
    for platform in platforms:
        args += ["--platform", platform]
    subprocess.run(args + [f"{name}=={version}" for name, version in sorted(needed.items())], check=True)
    return sorted(dest.glob("*.whl"))


def batches(wheels: list[Path], limit: int) -> list[list[Path]]:
    """Largest first into the first batch with room (first-fit decreasing); a wheel over the limit is an error."""
    packed: list[list[Path]] = []
    sizes: list[int] = []
    for wheel in sorted(wheels, key=lambda w: -w.stat().st_size):
        size = wheel.stat().st_size
        if size > limit:
            raise SystemExit(f"{wheel.name} is {size / 2**20:.1f} MiB, over one transfer's {limit / 2**20:.0f} MiB")
        for i, used in enumerate(sizes):
            if used + size <= limit:
                packed[i].append(wheel)
                sizes[i] += size
                break
        else:
            packed.append([wheel])
            sizes.append(size)
    return packed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--have", type=Path, help="the GPU machine's `pip list --format=freeze`")
    parser.add_argument("--out", type=Path, default=ROOT / ".whl")
    parser.add_argument("--batch-mib", type=int, default=60)
    args = parser.parse_args()
    have = machine_packages(args.have)
    wanted = imported_distributions()
    needed = {name: version for name, version in wanted.items() if have.get(name) != version}
    print(f"{len(wanted)} distributions imported; {len(needed)} to carry: {', '.join(sorted(needed))}")
    shutil.rmtree(args.out, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheels = download(needed, Path(tmp))
        for i, group in enumerate(batches(wheels, args.batch_mib * 2**20), 1):
            folder = args.out / f"batch-{i}"
            folder.mkdir(parents=True)
            for wheel in group:
                shutil.move(str(wheel), folder / wheel.name)
            mib = sum(w.stat().st_size for w in folder.iterdir()) / 2**20
            where = folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder
            print(f"run(carry=['{where}'], command='mkdir -p /tmp/wheels && cp {where}/*.whl /tmp/wheels/')"
                  f"   # {len(group)} wheels, {mib:.1f} MiB")
    print("then: run(command='python3 -m pip install -q --no-index --no-deps --target /tmp/site /tmp/wheels/*.whl"
          " && PYTHONPATH=/tmp/site:. python3 bench/gpu_train.py --out $OUT')")


if __name__ == "__main__":
    main()
