"""`marin-assets`: what Dagster does not do — plan, show where outputs are, collect garbage, tick a sensor once.

    marin-assets plan --select '*hello/report' [--json] [-f definitions.py | -m module]
    marin-assets status --select '*'
    marin-assets gc [--older-than 7d] [--also module.or/file.py ...] [--json] [--delete]
    marin-assets tick marin_checkpoint_evals     (one sensor tick, its runs here: no daemon needed)
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import os
import sys
import warnings
from typing import Any

import dagster as dg
from dotenv import dotenv_values

from marin_assets.core.gc import Deletion, StepFamily, delete_garbage, find_garbage, parse_duration
from marin_assets.core.plan import plan
from marin_assets.core.step import Step, walk
from marin_assets.core.stores import read_status
from marin_assets.dagster.assets import STORAGE_KEY, Partitioned, storage_settings
from marin_assets.dagster.definitions import steps_of
from marin_assets.dagster.drift import previous_materializations
from marin_assets.dagster.sensor_tick import tick_sensor
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


def family_of(name: str, step_for: Any) -> StepFamily:
    """A family whose members are `{name}/{key}` or, for checkpoints, `{name}/step-{key}`."""
    def step_named(member: str) -> Step | None:
        rest = member[len(name) + 1:]
        for key in dict.fromkeys((rest, rest.removeprefix("step-"))):
            try:
                step = step_for(key)
            except Exception:  # not a key of this family
                continue
            if isinstance(step, Step) and step.name == member:
                return step
        return None

    return StepFamily(name, step_named)


def references_in(defs: dg.Definitions) -> tuple[list[Step], list[StepFamily]]:
    """The steps of a code location and its partitioned step families (per-checkpoint evaluations)."""
    families = []
    for assets_def in defs.resolve_asset_graph().assets_defs:
        family = getattr(getattr(assets_def.node_def, "compute_fn", None), "marin_partitioned", None)
        if isinstance(family, Partitioned):
            families.append(family_of(family.name, family.step_for))
    return list(steps_of(defs).values()), families


def load_also(target: str) -> tuple[list[Step], list[StepFamily]]:
    """Steps and families in a module or file given to `--also`: its `Definitions`, `Step`s, per-checkpoint
    evaluation families, and lists or dicts of them."""
    try:
        if target.endswith(".py") or os.sep in target:
            path = os.path.abspath(target)
            if not os.path.exists(path):
                raise FileNotFoundError(f"no file {path}")
            spec = importlib.util.spec_from_file_location(f"_marin_also_{abs(hash(path))}", path)
            assert spec and spec.loader
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        else:
            mod = importlib.import_module(target)
    except (ImportError, FileNotFoundError) as e:
        raise SystemExit(f"marin-assets gc: --also {target}: cannot load it ({type(e).__name__}: {e})") from None
    steps: list[Step] = []
    families: list[StepFamily] = []
    values: list[Any] = []
    for value in vars(mod).values():
        values.extend(value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple))
                      else [value])
    for value in values:
        if isinstance(value, dg.Definitions):
            more, fams = references_in(value)
            steps += more
            families += fams
        elif isinstance(value, Step):
            steps.append(value)
        elif isinstance(getattr(value, "train", None), Step) and callable(getattr(value, "step", None)) \
                and isinstance(getattr(value, "name", None), str):  # a per-checkpoint evaluation family
            families.append(family_of(value.name, lambda key, f=value: f.step(int(key))))
    if not steps and not families:
        raise SystemExit(f"marin-assets gc: --also {target}: no steps, step families or dagster.Definitions in it")
    return steps, families


def human_bytes(n: float) -> str:
    """`1.5 KiB`, `3.0 GiB`."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"  # unreachable


def human_age(seconds: float) -> str:
    """`3d`, `5h`, `12m`, `40s`."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def cmd_gc(args: argparse.Namespace) -> int:
    """List outputs no definition references (and old partial ones); with --delete, delete them safely."""
    try:
        older_than = parse_duration(args.older_than)
    except ValueError as e:
        raise SystemExit(f"marin-assets gc: --older-than: {e}") from None
    defs = load_definitions(args.file, args.module)
    steps, families = references_in(defs)
    for target in args.also or ():
        more, fams = load_also(target)
        steps += more
        families += fams
    prefix, settings = storage_settings(storage_of(defs))
    report = find_garbage(args.prefix or prefix, steps, families=families, older_than_s=older_than,
                          settings=settings)
    deletions: list[Deletion] = []
    if args.delete:
        def progress(d: Deletion) -> None:
            if not args.json:
                print(f"{'deleted' if d.deleted else 'kept   '}  {d.relative}"
                      + ("" if d.deleted else f"  ({d.reason})"), flush=True)

        deletions = list(delete_garbage(report, settings, on_done=progress))
    if args.json:
        out = report.to_dict()
        if args.delete:
            out["deletions"] = [d.to_dict() for d in deletions]
            out["deleted"] = {"outputs": sum(d.deleted for d in deletions),
                              "bytes": sum(d.freed_bytes for d in deletions)}
        print(json.dumps(out, indent=2))
        return 0
    doomed = report.to_delete
    print(f"prefix {report.prefix}: {len(report.entries)} outputs to report ({report.scanned_files} files scanned)")
    width = max((len(e.relative) for e in report.entries), default=10)
    for entry in report.entries:
        print(f"{entry.action:<6}  {str(entry.status):<7}  {human_bytes(entry.size_bytes):>10}"
              f"  {human_age(entry.age_s):>4}  {entry.relative:<{width}}  {entry.reason}")
    total = human_bytes(sum(e.size_bytes for e in doomed))
    if not args.delete:
        print(f"{len(doomed)} to delete ({total}); nothing deleted: run again with --delete to delete them")
    else:
        freed = human_bytes(sum(d.freed_bytes for d in deletions))
        print(f"deleted {sum(d.deleted for d in deletions)} of {len(doomed)} ({freed})")
    return 0


def cmd_tick(args: argparse.Namespace) -> int:
    """Evaluate a sensor once and run what it asks for in this process; exit 1 if a run failed."""
    defs = load_definitions(args.file, args.module)
    names = [s.name for s in defs.sensors or ()]
    if args.sensor not in names:
        raise SystemExit(f"marin-assets tick: no sensor {args.sensor!r} in the definitions (they have: "
                         f"{', '.join(sorted(names)) or 'none'})")
    if not os.environ.get("DAGSTER_HOME"):
        raise SystemExit("marin-assets tick: DAGSTER_HOME is not set (runs are recorded in that instance)")
    with dg.DagsterInstance.get() as instance:
        runs, skip = tick_sensor(defs, args.sensor, instance)
    if args.json:
        print(json.dumps({"sensor": args.sensor, "skip_reason": skip, "runs": [dataclasses.asdict(r) for r in runs]},
                         indent=2))
    else:
        if skip:
            print(f"{args.sensor}: skipped: {skip}")
        for r in runs:
            print(f"{r.outcome:<9}  partition {r.partition_key or '-':<6}  {', '.join(r.assets)}"
                  + (f"  (run {r.run_id})" if r.run_id else "  (its run key already succeeded)"))
    return 1 if any(r.outcome == "failed" for r in runs) else 0


def add_definitions_arguments(parser: argparse.ArgumentParser) -> None:
    """`-f FILE` or `-m MODULE`: where a command finds the Definitions (`load_definitions`)."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("-f", "--file", help="definitions file (default ./definitions.py)")
    where.add_argument("-m", "--module", help="module holding the Definitions")


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
        add_definitions_arguments(p)
        p.set_defaults(fn=fn)
    p = sub.add_parser("gc", help="outputs no definition references, and old partial ones; --delete deletes them")
    add_definitions_arguments(p)
    p.add_argument("--also", action="append", metavar="MODULE_OR_FILE",
                   help="more definitions whose outputs are kept (a module or a .py file; repeatable)")
    p.add_argument("--older-than", default="7d",
                   help="partial outputs (FAILED, stale RUNNING, no status) go only when older than this (default 7d)")
    p.add_argument("--prefix", help="storage prefix to collect (default: the definitions' storage resource)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--delete", action="store_true", help="delete what is listed as `delete` (default: only list)")
    p.set_defaults(fn=cmd_gc)
    p = sub.add_parser("tick", help="evaluate a sensor once and run its requests here, as one daemon tick would")
    p.add_argument("sensor", help="sensor name, e.g. marin_checkpoint_evals")
    add_definitions_arguments(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(fn=cmd_tick)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
