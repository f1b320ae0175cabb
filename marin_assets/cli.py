"""`marin-assets`: what Dagster does not do — plan, show where outputs are, collect garbage, tick a sensor, run quietly.

    marin-assets plan --select '*hello/report' [--json] [-f definitions.py | -m module]
    marin-assets status --select '*'
    marin-assets materialize --select '*hello/report' [--partition KEY] [--verbose]   (one line per asset)
    marin-assets gc [--older-than 7d] [--also module.or/file.py ...] [--json] [--delete]
    marin-assets tick marin_checkpoint_evals [--verbose]     (one sensor tick, its runs here: no daemon needed)
    marin-assets serve checkpoints/tiny-llama [--port 8000] [--checkpoint-step N]   (OpenAI's API, until Ctrl-C)

`materialize` and `tick` are quiet: what Dagster, Ray, JAX and the steps print goes to a log file under
$DAGSTER_HOME/logs (the run's events are in the instance and the UI); `--verbose` prints it all here.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import importlib.util
import json
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import dagster as dg
from dotenv import dotenv_values

from marin_assets.core.gc import Deletion, StepFamily, delete_garbage, find_garbage, parse_duration
from marin_assets.core.plan import plan
from marin_assets.core.priced_plan import plan_price_lines, price_plan
from marin_assets.core.prices import PriceFileError, PriceTable
from marin_assets.core.pricing import over_budget, unpriced, unpriced_words
from marin_assets.core.step import Step, walk
from marin_assets.core.stores import read_status
from marin_assets.dagster.assets import STORAGE_KEY, Partitioned, storage_settings
from marin_assets.dagster.console import (
    UI_RUNS,
    RunPresenter,
    console_log_path,
    following,
    human_seconds,
    materialize_quietly,
    quiet_console,
    shown_path,
)
from marin_assets.dagster.definitions import steps_of
from marin_assets.dagster.drift import previous_materializations
from marin_assets.dagster.sensor_tick import SENSOR_NAME_TAG, tick_sensor
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
    try:
        prices = PriceTable.load(args.prices)
    except PriceFileError as e:
        print(f"marin-assets plan: {e}", file=sys.stderr)
        return 2
    priced = price_plan(rows, steps, prefix, prices)
    refused = over_budget(priced, args.max_device_hours, args.max_cost, args.refuse_unpriced)
    budgeted = args.max_device_hours is not None or args.max_cost is not None or args.refuse_unpriced
    missing = unpriced(priced, args.max_device_hours, args.max_cost) if budgeted else []
    if args.json:
        by_step = {p.step: p.to_dict() for p in priced.predictions}
        print(json.dumps({"rows": [{**r.to_dict(), "prediction": by_step.get(r.asset_key)} for r in rows],
                          "totals": priced.totals, "prices": prices.to_dict(),
                          "budget": {"max_device_hours": args.max_device_hours, "max_cost": args.max_cost,
                                     "refuse_unpriced": args.refuse_unpriced,
                                     "unpriced": [p.step for p in missing], "refused": refused}}, indent=2))
    else:
        width = max(len(r.asset_key) for r in rows)
        for r in rows:
            mark = " " if r.selected else "^"
            print(f"{mark} {r.asset_key:<{width}}  {r.action:<7}  {r.hash}  {r.output_path}")
            print(f"  {'':<{width}}  {r.reason}")
            for c in r.changed:
                print(f"  {'':<{width}}    {c['field']}: {c['old']!r} -> {c['new']!r}")
        print("\n(^ = upstream of the selection, not selected)\n")
        print("\n".join(plan_price_lines(priced)))
    if refused:
        print(f"marin-assets plan: over budget: {refused}", file=sys.stderr)
        return 3
    if missing:
        print(f"marin-assets plan: budget: {unpriced_words(missing)}; they count 0 against it (--refuse-unpriced"
              " refuses them)", file=sys.stderr)
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
        print(f"{r['asset_key']:<{width}}  {status_words(r['status'], r['cached']):<25}  {r['output_path']}")
    return 0


def status_words(status: str | None, cached: bool | None) -> str:
    """`SUCCESS  cached: true`; `not materialized` when nothing is on disk (the JSON says null); `SUCCESS  (no run
    here)` when the output exists but this instance has no materialization of it; `FAILED` alone."""
    if status is None:
        return "not materialized"
    if cached is None:
        last = "(no run here)" if status == "SUCCESS" else ""
    else:
        last = "cached: true" if cached else "cached: false"
    return f"{status:<8} {last}".rstrip()


def selected_keys(defs: dg.Definitions, select: str) -> list[dg.AssetKey]:
    """Every asset key (step assets and partitioned families alike) a selection in Dagster's CLI syntax picks."""
    with warnings.catch_warnings():  # `*` goes through a beta code path of Dagster's parser
        warnings.simplefilter("ignore", dg.BetaWarning)
        return sorted(dg.AssetSelection.from_coercible(select.split(",")).resolve(defs.resolve_asset_graph()))


def selection_problem(defs: dg.Definitions, keys: list[dg.AssetKey], partition: str | None) -> str | None:
    """Why a selection cannot run as one run (as Dagster's CLI refuses it), or None."""
    if not keys:
        return "matches no assets"
    graph = defs.resolve_asset_graph()
    partitioned = [k.to_user_string() for k in keys if graph.get(k).partitions_def is not None]
    if partitioned and not partition:
        return f"has partitioned assets ({', '.join(partitioned)}): give --partition"
    if partition and not partitioned:
        return "has no partitioned asset, yet --partition was given"
    return None


def quiet_or_verbose(args: argparse.Namespace, command: str) -> tuple[Any, str | None]:
    """The console of a command that runs steps: quiet (a log file; see `dagster.console`) unless --verbose."""
    if args.verbose:
        return contextlib.nullcontext(sys.stdout), None
    log_path = console_log_path(command)
    return quiet_console(log_path), log_path


def cmd_materialize(args: argparse.Namespace) -> int:
    """Materialize a selection with Dagster's execution in this process — the instance, run record and event log
    `dagster asset materialize` makes — showing one line per asset, a training's loss as it falls and a summary."""
    if not os.environ.get("DAGSTER_HOME"):
        raise SystemExit("marin-assets materialize: DAGSTER_HOME is not set (runs are recorded in that instance)")
    console, log_path = quiet_or_verbose(args, "materialize")
    with console as out:
        defs = load_definitions(args.file, args.module)
        try:
            keys = selected_keys(defs, args.select)
        except dg.DagsterError as e:  # a key no asset supplies (SystemExit: said on stderr, once it is back)
            raise SystemExit(f"marin-assets materialize: --select {args.select!r}: {e}") from None
        if problem := selection_problem(defs, keys, args.partition):
            raise SystemExit(f"marin-assets materialize: selection {args.select!r} {problem}")
        presenter = RunPresenter(out, log_path)
        prefix, _ = storage_settings(storage_of(defs))
        with dg.DagsterInstance.get() as instance:
            print(f"Materializing {len(keys)} asset{'s' if len(keys) != 1 else ''}"
                  + (f", partition {args.partition}" if args.partition else "")
                  + (f"; everything printed goes to {shown_path(log_path)}" if log_path else ""), file=out, flush=True)
            try:
                run = materialize_quietly(defs, keys, instance, presenter, partition_key=args.partition)
            except dg.DagsterError as e:  # refused before any step ran (e.g. a partition key), not a step failure
                raise SystemExit(f"marin-assets materialize: {type(e).__name__}: {e}") from None
        print(presenter.summary(), file=out)
        if not run.success:
            failed = [o.asset for o in run.outcomes if o.outcome == "failed"] or ["the run"]
            print(f"marin-assets materialize: failed: {', '.join(failed)} (the cause is above)", file=out)
            return 1
        print(f"Outputs under {shown_path(prefix)}; the run's events: {UI_RUNS}/{run.run_id} (make dev)", file=out)
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


def tick_run_line(outcome: str, seconds: float | None, partition: str | None, assets: Sequence[str],
                  run_id: str | None) -> str:
    """`succeeded   53.2 s  partition 50      evals/a, evals/b  (run …)`: one run of a tick."""
    took = human_seconds(seconds) if seconds is not None else ""
    return (f"{outcome:<9} {took:>8}  partition {partition or '-':<6}  {', '.join(assets)}"
            + (f"  (run {run_id})" if run_id else "  (its run key already succeeded)"))


def cmd_tick(args: argparse.Namespace) -> int:
    """Evaluate a sensor once and run what it asks for in this process; exit 1 if a run failed.
    Quiet unless --verbose: one line per run as it ends (outcome, seconds, partition, assets), a failed run's
    cause under it."""
    if not os.environ.get("DAGSTER_HOME"):
        raise SystemExit("marin-assets tick: DAGSTER_HOME is not set (runs are recorded in that instance)")
    console, log_path = quiet_or_verbose(args, "tick")
    with console as out:
        defs = load_definitions(args.file, args.module)
        names = [s.name for s in defs.sensors or ()]
        if args.sensor not in names:
            raise SystemExit(f"marin-assets tick: no sensor {args.sensor!r} in the definitions (they have: "
                             f"{', '.join(sorted(names)) or 'none'})")
        shown: set[str] = set()  # runs whose line was printed as they ended
        with dg.DagsterInstance.get() as instance:
            if args.json or args.verbose:
                runs, skip = tick_sensor(defs, args.sensor, instance)
            else:
                def presenter_for(run_id: str) -> RunPresenter:
                    run = instance.get_run_by_id(run_id)
                    partition = run.tags.get("dagster/partition") if run else None
                    assets = sorted(k.to_user_string() for k in (run.asset_selection or ())) if run else []

                    def ended(success: bool, seconds: float) -> None:
                        shown.add(run_id)
                        print(tick_run_line("succeeded" if success else "failed", seconds, partition, assets, run_id),
                              file=out, flush=True)

                    return RunPresenter(out, log_path, run_id=run_id, per_asset=False, on_run_end=ended)

                with following(instance, {SENSOR_NAME_TAG: args.sensor}, presenter_for):
                    runs, skip = tick_sensor(defs, args.sensor, instance)
            if args.json:
                print(json.dumps({"sensor": args.sensor, "skip_reason": skip,
                                  "runs": [dataclasses.asdict(r) for r in runs]}, indent=2), file=out)
            else:
                if skip:
                    print(f"{args.sensor}: skipped: {skip}", file=out)
                for r in runs:
                    if r.run_id in shown:
                        continue
                    stats = instance.get_run_stats(r.run_id) if r.run_id else None
                    seconds = stats.end_time - stats.start_time if stats and stats.start_time and stats.end_time \
                        else None
                    print(tick_run_line(r.outcome, seconds, r.partition_key, r.assets, r.run_id), file=out)
    return 1 if any(r.outcome == "failed" for r in runs) else 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve a model behind OpenAI's API (Levanter's server) until SIGINT or SIGTERM; print its URL."""
    import signal
    import threading

    from marin_assets.pipeline.evals.serving import ServeError, checkpoint_at, served

    target = args.model
    if not (os.path.exists(target) or "://" in target):  # an asset name: its output under the storage prefix
        defs = load_definitions(args.file, args.module)
        steps = {s.name: s for s in steps_of(defs).values()}
        if target not in steps:
            near = [n for n in sorted(steps) if target.split("/")[-1] in n][:8]
            print(f"marin-assets serve: no asset {target!r} and no such path"
                  f"{'; did you mean ' + ', '.join(near) if near else ''}", file=sys.stderr)
            return 2
        target = steps[target].output_path_under(storage_settings(storage_of(defs))[0])
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        checkpoint = checkpoint_at(target, args.checkpoint_step)
        with served(checkpoint, host=args.host, port=args.port, model_name=args.model_name,
                    who=f"the model at {target}") as server:
            print(f"serving {checkpoint.path} as {server.model_name!r} at {server.url}", flush=True)
            print(f"  openai.OpenAI(base_url={server.url!r}, api_key='none'); Ctrl-C stops it", flush=True)
            stop.wait()
    except ServeError as e:
        print(f"marin-assets serve: {e}", file=sys.stderr)
        return 1
    print("stopped", flush=True)
    return 0


def add_definitions_arguments(parser: argparse.ArgumentParser) -> None:
    """`-f FILE` or `-m MODULE`: where a command finds the Definitions (`load_definitions`)."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("-f", "--file", help="definitions file (default ./definitions.py)")
    where.add_argument("-m", "--module", help="module holding the Definitions")


def add_budget_arguments(parser: argparse.ArgumentParser) -> None:
    """`plan`'s price table and budget: over a budget, the plan exits 3 naming the steps that cost most."""
    parser.add_argument("--prices", metavar="FILE",
                        help="price table (TOML: per_device_hour, peak_flops, assumed_mfu; default $MARIN_PRICES,"
                             " else the documented defaults)")
    parser.add_argument("--max-device-hours", type=float, metavar="H",
                        help="exit 3 if what would run is predicted to take more device-hours")
    parser.add_argument("--max-cost", type=float, metavar="AMOUNT",
                        help="exit 3 if what would run is predicted to cost more (in the price table's currency)")
    parser.add_argument("--refuse-unpriced", action="store_true",
                        help="exit 3 if a step that would run could not be priced (by default such steps count 0"
                             " against the budget and are named)")


def add_verbose_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print everything (Dagster's DEBUG event log, the steps' own lines, Ray and JAX) here,"
                             " not to a log file under $DAGSTER_HOME/logs")


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
        if name == "plan":
            add_budget_arguments(p)
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
    add_verbose_argument(p)
    p.set_defaults(fn=cmd_tick)
    p = sub.add_parser("materialize", help="materialize a selection as `dagster asset materialize` does, quietly:"
                                           " one line per asset, a training's loss, a summary")
    p.add_argument("--select", required=True,
                   help="Dagster asset selection, e.g. '*hello/report' (it and all upstream) or 'hello/stats+'")
    p.add_argument("--partition", help="the partition to materialize (selected assets must share partitions)")
    add_definitions_arguments(p)
    add_verbose_argument(p)
    p.set_defaults(fn=cmd_materialize)
    p = sub.add_parser("serve", help="serve a trained model, export or Hub model behind OpenAI's API (Levanter's"
                                     " server: completions, chat completions, streaming) until Ctrl-C")
    p.add_argument("model", help="an asset name (checkpoints/…, exports/…) or a path (a Hugging Face model folder,"
                                 " a step's output)")
    p.add_argument("--checkpoint-step", type=int, help="a training run's checkpoint (default: its last)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: a free one)")
    p.add_argument("--model-name", default="marin", help="the model id clients ask for (default marin)")
    add_definitions_arguments(p)
    p.set_defaults(fn=cmd_serve)
    from marin_assets.execution import local_ray  # its Ray is imported only by the process that holds it

    local_ray.add_arguments(sub.add_parser("ray", help="a local Ray that outlives one run: `start` it once and"
                                                       " every run joins it until `stop`; `status`"))
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
