"""`marin-assets`: what Dagster does not do — plan a selection, show where outputs are.

    marin-assets plan --select '*hello/report' [--json] [-f definitions.py | -m module]
    marin-assets status --select '*'
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import warnings
from typing import Any

import dagster as dg
from dotenv import dotenv_values

from marin_assets.core.plan import plan
from marin_assets.core.status import read_status
from marin_assets.core.step import Step, walk
from marin_assets.dagster.assets import STORAGE_KEY, storage_settings
from marin_assets.dagster.definitions import steps_of
from marin_assets.dagster.drift import previous_materializations
from resources.storage import StorageResource


def load_definitions(file: str | None, module: str | None) -> dg.Definitions:
    """The `Definitions` in a Python file (default `./definitions.py`) or module."""
    if module:
        mod = importlib.import_module(module)
    else:
        path = os.path.abspath(file or "definitions.py")
        if not os.path.exists(path):
            raise SystemExit(f"marin-assets: no definitions file at {path} (use -f or -m)")
        sys.path.insert(0, os.path.dirname(path))
        spec = importlib.util.spec_from_file_location("_marin_definitions", path)
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    found = [v for v in vars(mod).values() if isinstance(v, dg.Definitions)]
    if not found:
        raise SystemExit(f"marin-assets: no dagster.Definitions in {module or file}")
    return getattr(mod, "defs", found[0]) if isinstance(getattr(mod, "defs", None), dg.Definitions) else found[0]


def selected_steps(defs: dg.Definitions, select: str) -> tuple[dict[str, Step], set[str]]:
    """Steps by name, and the names the selection (Dagster's CLI syntax) picks."""
    by_key = steps_of(defs)
    with warnings.catch_warnings():  # `*` goes through a beta code path of Dagster's parser
        warnings.simplefilter("ignore", dg.BetaWarning)
        keys = dg.AssetSelection.from_coercible(select.split(",")).resolve(defs.resolve_asset_graph())
    steps = {s.name: s for s in by_key.values()}
    return steps, {by_key[k].name for k in keys if k in by_key}


def storage_of(defs: dg.Definitions) -> StorageResource:
    storage = (defs.resources or {}).get(STORAGE_KEY)
    return storage if isinstance(storage, StorageResource) else StorageResource()


def cmd_plan(args: argparse.Namespace) -> int:
    defs = load_definitions(args.file, args.module)
    steps, chosen = selected_steps(defs, args.select)
    if not chosen:
        print(f"marin-assets: selection {args.select!r} matches no step assets", file=sys.stderr)
        return 2
    prefix, settings = storage_settings(storage_of(defs))
    rows = plan([steps[n] for n in chosen], chosen, prefix, settings, previous_materializations(steps))
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=2))
        return 0
    width = max(len(r.asset_key) for r in rows)
    for r in rows:
        mark = " " if r.selected else "^"
        print(f"{mark} {r.asset_key:<{width}}  {r.action:<7}  {r.hash}  {r.output_path}")
        print(f"  {'':<{width}}  {r.reason}")
        for c in r.changed:
            print(f"  {'':<{width}}    {c['field']}: {c['old']!r} -> {c['new']!r}")
    print("\n(^ = upstream of the selection, not selected)")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Per asset: last materialization (cached or computed), status on disk, output path."""
    defs = load_definitions(args.file, args.module)
    steps, chosen = selected_steps(defs, args.select)
    prefix, _ = storage_settings(storage_of(defs))
    instance = dg.DagsterInstance.get() if os.environ.get("DAGSTER_HOME") else None
    rows: list[dict[str, Any]] = []
    for step in walk([steps[name] for name in chosen]):
        name = step.name
        out = step.output_path_under(prefix)
        status = read_status(out)
        row: dict[str, Any] = {"asset_key": name, "status": status.status.value if status else None,
                               "output_path": out, "hash": step.hash, "cached": None}
        if instance is not None:
            event = instance.get_latest_materialization_event(dg.AssetKey(name.split("/")))
            if event is not None and event.asset_materialization is not None:
                md = event.asset_materialization.metadata
                row["cached"] = md["cached"].value if "cached" in md else None
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max((len(r["asset_key"]) for r in rows), default=10)
    for r in rows:
        cached = {True: "cached: true", False: "cached: false", None: "not materialized"}[r["cached"]]
        print(f"{r['asset_key']:<{width}}  {str(r['status']):<8} {cached:<17} {r['output_path']}")
    return 0


def load_dotenv_like_dagster() -> None:
    """Read ./.env as Dagster's CLI does, so both find the same DAGSTER_HOME."""
    if os.path.exists(".env"):
        os.environ.update({k: v for k, v in dotenv_values(".env").items() if v is not None})


def main(argv: list[str] | None = None) -> int:
    load_dotenv_like_dagster()
    parser = argparse.ArgumentParser(prog="marin-assets", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, fn, help_ in (("plan", cmd_plan, "what materializing a selection would do, and why"),
                            ("status", cmd_status, "where outputs are and how they were last materialized")):
        p = sub.add_parser(name, help=help_)
        p.add_argument("--select", required=True,
                       help="Dagster asset selection, e.g. '*hello/report' (it and all upstream) or 'hello/stats+'")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        where = p.add_mutually_exclusive_group()
        where.add_argument("-f", "--file", help="definitions file (default ./definitions.py)")
        where.add_argument("-m", "--module", help="module holding the Definitions")
        p.set_defaults(fn=fn)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
