"""The lineage UI in a real browser: Debian's Chromium, driven by Playwright, against `dagster dev`
on loopback with a temporary DAGSTER_HOME, serving the demo's graph at test size (and an experiment
summary: its table and plots render inline).

What the UI shows is also read from the webserver's GraphQL API — the data the pages render — so
each test checks both what is on the screen and what it means. Screenshots go to
tests/artifacts/screenshots/ (the README's come from there).
"""

import json
import re
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from marin_assets.dagster.plots import SQUARES
from marin_assets.pipeline.training.checkpoints import list_checkpoints, run_dir_of
from tests.support import ui_definitions as ui
from tests.support.browser import dagster_dev_page
from tests.support.helpers import BIN, ROOT, corpus_and_tokenizer, subprocess_env, wait_for

SHOTS = ROOT / "tests" / "artifacts" / "screenshots"
DEFINITIONS = ROOT / "tests" / "support" / "ui_definitions.py"
FIRST_VISIT = "/asset-groups"
"""Where `make demo` and `make dev` send a first visit ("/" opens Dagster's run timeline instead)."""
GROUPS = ["hello", "raw", "tokenizers", "tokenized", "checkpoints", "exports", "evals", "reports"]


def materialize(env: dict, select: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "dagster"), "asset", "materialize", "-f", str(DEFINITIONS), "--select", select],
                          cwd=ROOT, env=env, capture_output=True, text=True)


def tick(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "marin-assets"), "tick", ui.SENSOR, "-f", str(DEFINITIONS), "--json"],
                          cwd=ROOT, env=env, capture_output=True, text=True)


class UI:
    def __init__(self, base: str, env: dict, page, tmp: Path):
        self.base, self.env, self.page, self.tmp = base, env, page, tmp
        self.materialized_report: str | None = None
        """hello/report's identity (opVersion) as the module materialized it."""

    def graphql(self, query: str, **variables) -> dict:
        body = json.dumps({"query": query, "variables": variables}).encode()
        request = urllib.request.Request(f"{self.base}/graphql", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            data = json.load(response)
        assert "errors" not in data, data["errors"]
        return data["data"]

    def latest_materialization(self, key: str) -> dict:
        data = self.graphql(LATEST, assetKey={"path": key.split("/")})
        [event] = data["assetOrError"]["assetMaterializations"]
        return {"runId": event["runId"], "metadata": {e["label"]: e for e in event["metadataEntries"]}}

    def node(self, key: str) -> dict:
        return self.graphql(NODE, assetKey={"path": key.split("/")})["assetNodeOrError"]

    def materialize_cli(self, select: str) -> subprocess.CompletedProcess:
        return materialize(self.env, select)

    def reload_definitions(self) -> None:
        """What the UI's "Reload definitions" does, through the API: the code location loads the definitions again."""
        entries = self.graphql(LOCATIONS)["workspaceOrError"]["locationEntries"]
        for entry in entries:
            reloaded = self.graphql(RELOAD, location=entry["name"])["reloadRepositoryLocation"]
            assert reloaded["__typename"] == "WorkspaceLocationEntry", reloaded

    def shot(self, name: str) -> Path:
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / name
        self.page.screenshot(path=str(path))
        return path


LATEST = """
query Latest($assetKey: AssetKeyInput!) {
  assetOrError(assetKey: $assetKey) {
    ... on Asset {
      assetMaterializations(limit: 1) {
        runId
        metadataEntries {
          __typename label
          ... on MarkdownMetadataEntry { mdStr }
          ... on PathMetadataEntry { path }
          ... on FloatMetadataEntry { floatValue }
          ... on IntMetadataEntry { intValue }
          ... on TextMetadataEntry { text }
          ... on BoolMetadataEntry { boolValue }
          ... on JsonMetadataEntry { jsonString }
          ... on TableMetadataEntry { table { records schema { columns { name } } } }
        }
      }
    }
  }
}"""

PARTITIONS = """
query Partitions($assetKey: AssetKeyInput!) {
  assetNodeOrError(assetKey: $assetKey) {
    ... on AssetNode { partitionKeys partitionStats { numMaterialized numPartitions numFailed } }
  }
}"""

LOCATIONS = """
query Locations { workspaceOrError { ... on Workspace { locationEntries { name } } } }"""

RELOAD = """
mutation Reload($location: String!) {
  reloadRepositoryLocation(repositoryLocationName: $location) { __typename }
}"""

NODE = """
query Node($assetKey: AssetKeyInput!) {
  assetNodeOrError(assetKey: $assetKey) {
    ... on AssetNode {
      groupName description opVersion kinds staleStatus
      staleCauses { key { path } category reason }
      assetChecksOrError {
        ... on AssetChecks {
          checks { name executionForLatestMaterialization { status evaluation { success description } } }
        }
      }
    }
  }
}"""


@pytest.fixture(scope="module")
def ui_server(tmp_path_factory):
    """The tiny demo materialized by the CLI, then `dagster dev` serving it, and a browser."""
    tmp = tmp_path_factory.mktemp("ui")
    home = tmp / "home"
    subprocess.run(["make", "-s", f"DAGSTER_HOME={home}", f"{home}/dagster.yaml"], cwd=ROOT, check=True)  # as make demo
    settings = tmp / "settings.json"
    settings.write_text(json.dumps({"title": "Hello"}))
    followed = tmp / "followed"  # a source the source sensor follows: its asset has a freshness policy
    followed.mkdir()
    (followed / "json.txt").write_text(json.__doc__)  # real text: the standard library's json docstring
    env = subprocess_env(DAGSTER_HOME=str(home), MARIN_PREFIX=str(tmp / "outputs"), MARIN_UI_SETTINGS=str(settings),
                         MARIN_UI_FOLLOWED=str(followed))
    first = materialize(env, ui.SELECTION)
    assert first.returncode == 0, first.stderr[-3000:]
    evals = tick(env)  # what make demo does next: every checkpoint's evaluation partition
    assert evals.returncode == 0, evals.stderr[-3000:]

    with dagster_dev_page(DEFINITIONS, env, tmp / "dagster-dev.log") as (base, page):
        ui_server = UI(base, env, page, tmp)
        ui_server.materialized_report = ui_server.node("hello/report")["opVersion"]  # its identity, as materialized
        yield ui_server


@pytest.fixture
def report_as_materialized(ui_server):
    """`dagster dev` serving hello/report as the module materialized it (title "Hello"): a test may have changed
    its title and reloaded the definitions before (then they are set back and reloaded again)."""
    if ui_server.node("hello/report")["opVersion"] != ui_server.materialized_report:
        Path(ui_server.env["MARIN_UI_SETTINGS"]).write_text(json.dumps({"title": "Hello"}))
        ui_server.reload_definitions()
        wait_for(lambda: ui_server.node("hello/report")["opVersion"] == ui_server.materialized_report,
                 "the reload to bring the materialized title back", timeout=60, interval=0.5)


@pytest.fixture
def tokenizer_restored(ui_server):
    """The tokenizer's files as materialized, after a test that replaces them in place."""
    tokenizer_json = Path(ui.pipeline["tokenizer"].output_path_under(ui_server.env["MARIN_PREFIX"])) / "tokenizer.json"
    kept = tokenizer_json.read_bytes()
    yield
    tokenizer_json.write_bytes(kept)


def shows_after_loading(page, text: str) -> bool:
    """Whether `page` shows `text` once its requests have settled, else reload it. After "Reload definitions" the
    UI may first draw the definitions it held before (a CI run once waited 60 s on an asset page showing the new
    status beside the old description); a new load asks for them again."""
    page.wait_for_load_state("networkidle")
    if page.get_by_text(text).count():
        return True
    page.reload()
    return False


def materialize_button(page):
    # The button's accessible name includes its icon's label ("materialization Materialize").
    return page.locator("button").filter(has_text=re.compile(r"^Materialize$"))


def test_a_first_visit_opens_on_the_graph_with_every_checkpoint_evaluated(ui_server):
    """After make demo's two commands (materialize, one checkpoint-sensor tick) on the instance the Makefile
    writes: no "Join the Dagster community" modal (shown only on a 127.0.0.1/localhost origin, as here), the
    asset graph, and one materialized evaluation partition per checkpoint of the training run."""
    makefile = (ROOT / "Makefile").read_text()
    assert f"127.0.0.1:3000{FIRST_VISIT}" in makefile and f"marin-assets tick {ui.SENSOR}" in makefile
    page = ui_server.page.context.browser.new_page(viewport={"width": 1800, "height": 1100})  # nothing remembered
    try:
        page.goto(ui_server.base + FIRST_VISIT)  # the address make demo and make dev print
        for group in GROUPS:  # the graph, its groups collapsed
            page.locator(f'[data-tooltip="{group}"]').first.wait_for()
        page.wait_for_load_state("networkidle")
        page.wait_for_timeout(1500)  # the modal, when enabled, opens once its query answers
        assert page.get_by_text("Join the Dagster community").count() == 0
        assert page.get_by_role("dialog").count() == 0
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "first-visit.png"))
    finally:
        page.close()

    family = ui.per_checkpoint[0]
    checkpoints = sorted(list_checkpoints(run_dir_of(family.train.output_path_under(ui_server.env["MARIN_PREFIX"]))))
    assert checkpoints == [5, 10, 11]
    stats = ui_server.graphql(PARTITIONS, assetKey={"path": family.name.split("/")})["assetNodeOrError"]
    assert sorted(int(k) for k in stats["partitionKeys"]) == checkpoints
    assert stats["partitionStats"]["numMaterialized"] == len(checkpoints)
    rows = [json.loads(r) for r in
            ui_server.latest_materialization(family.name)["metadata"]["all_checkpoints"]["table"]["records"]]
    assert [r["step"] for r in rows] == checkpoints and all(r["loss"] > 0 for r in rows)
    page = ui_server.page
    page.goto(f"{ui_server.base}/assets/{family.name}?view=partitions")
    page.get_by_text(f"Materialized ({len(checkpoints)})", exact=True).first.wait_for()
    for checkpoint in checkpoints:
        page.get_by_text(str(checkpoint), exact=True).first.wait_for()
    page.wait_for_load_state("networkidle")
    ui_server.shot("checkpoint-partitions.png")

    again = json.loads(tick(ui_server.env).stdout)  # a second tick: every run key has succeeded, nothing runs
    assert [(r["partition_key"], r["outcome"]) for r in again["runs"]] == [(str(c), "skipped") for c in checkpoints]


def test_the_graph_shows_every_stage_and_asset(ui_server):
    page = ui_server.page
    page.set_viewport_size({"width": 1800, "height": 1700})  # the graph draws only what fits: let all of it
    expanded = ",".join(f"global@global:{group}" for group in GROUPS)  # groups start collapsed
    page.goto(f"{ui_server.base}/asset-groups?expanded={urllib.parse.quote(expanded)}")
    for group in GROUPS:
        page.locator(f'[data-tooltip="{group}"]').first.wait_for()
    graph = page.locator("svg").filter(has_text="tiny-stories-bpe").first  # zoomed out, nodes show their names
    for name, count in [("numbers", 1), ("stats", 1), ("report", 1), ("tiny-stories", 1), ("tiny-stories-bpe", 2),
                        ("tiny-stories-llama", 3)]:
        names = graph.get_by_text(name, exact=True)
        names.first.wait_for()
        assert names.count() == count, (name, names.count())
    graph.get_by_text(re.compile(r"^tiny-.*checkpoints$")).first.wait_for()  # the long name is shortened
    page.wait_for_load_state("networkidle")
    ui_server.shot("asset-graph.png")
    page.set_viewport_size({"width": 1800, "height": 1100})
    node = ui_server.node("tokenized/tiny-stories-bpe")
    assert node["groupName"] == "tokenized" and set(node["kinds"]) == {"tokenize", "levanter", "ray"}
    assert "Made by `marin_assets.pipeline.tokens.tokenize.tokenize`" in node["description"]


def test_an_asset_page_tells_what_the_training_made(ui_server):
    page = ui_server.page
    page.goto(f"{ui_server.base}/assets/checkpoints/tiny-stories-llama")
    page.get_by_text("Metadata", exact=True).first.wait_for()
    for label in ["output_path", "hash", "hash_attrs", "cached", "duration_s", "result.final_train_loss",
                  "result.tokens_per_second", "result.checkpoint_steps", "result.loss_curve"]:
        page.get_by_text(label, exact=True).first.wait_for()
    plot = page.locator(".dagster-markdown img").first
    plot.wait_for()
    assert plot.evaluate("img => img.complete && img.naturalWidth") > 0  # the loss curve rendered
    page.wait_for_load_state("networkidle")
    ui_server.shot("asset-page-training.png")
    page.get_by_text("result.loss_curve", exact=True).first.scroll_into_view_if_needed()
    page.mouse.wheel(0, -250)
    page.wait_for_timeout(300)
    ui_server.shot("loss-curve.png")

    md = ui_server.latest_materialization("checkpoints/tiny-stories-llama")["metadata"]
    assert md["output_path"]["path"].endswith(ui.pipeline["train"].name_with_hash)
    assert md["result.checkpoint_steps"]["text"] == "5, 10, 11"
    assert md["result.final_train_loss"]["floatValue"] < json.loads(md["result"]["jsonString"])["loss_curve"][0][1]
    checks = {c["name"]: c["executionForLatestMaterialization"]
              for c in ui_server.node("checkpoints/tiny-stories-llama")["assetChecksOrError"]["checks"]}
    assert checks["loss_finite_and_fell"]["status"] == "SUCCEEDED"

    evals = ui_server.latest_materialization("evals/tiny-stories-llama")["metadata"]
    rows = [json.loads(r) for r in evals["result.per_dataset"]["table"]["records"]]
    assert [r["name"] for r in rows] == ["stories"] and rows[0]["loss"] > 0 and rows[0]["bpb"] > 0
    tokenized = ui_server.latest_materialization("tokenized/tiny-stories-bpe")["metadata"]
    splits = {json.loads(r)["name"]: json.loads(r) for r in tokenized["result.splits"]["table"]["records"]}
    assert splits["train"]["tokens"] > 0 and splits["validation"]["documents"] == 60
    assert tokenized["result.tokenizer"]["text"].endswith(ui.pipeline["tokenizer"].name_with_hash)


def test_materialize_from_the_asset_page_launches_a_run_that_succeeds(ui_server, report_as_materialized):
    page = ui_server.page
    before = ui_server.latest_materialization("hello/report")["runId"]
    page.goto(f"{ui_server.base}/assets/hello/report")
    page.get_by_text("Metadata", exact=True).first.wait_for()
    materialize_button(page).first.click()
    page.get_by_text("Launched run").first.wait_for()
    page.get_by_role("link", name="View").first.click()
    page.wait_for_url("**/runs/**")
    run_id = page.url.rstrip("/").split("/runs/")[1].split("?")[0]
    page.get_by_text("Success", exact=True).first.wait_for(timeout=180_000)
    latest = ui_server.latest_materialization("hello/report")
    assert latest["runId"] == run_id != before  # the new materialization is this run's
    assert latest["metadata"]["cached"]["boolValue"] is True  # identity unchanged: a cache hit
    page.goto(f"{ui_server.base}/assets/hello/report?view=events")
    page.get_by_text(run_id[:8]).first.wait_for()


def test_an_unsynced_asset_shows_which_attribute_changed(ui_server, report_as_materialized):
    page = ui_server.page
    old_hash = ui_server.node("hello/report")["opVersion"]
    Path(ui_server.env["MARIN_UI_SETTINGS"]).write_text(json.dumps({"title": "Hello, again"}))
    page.goto(f"{ui_server.base}/asset-groups")
    page.get_by_text("Reload definitions").first.click()
    wait_for(lambda: ui_server.node("hello/report")["opVersion"] != old_hash, "the reload to pick up the new title",
             timeout=60, interval=0.5)
    node = ui_server.node("hello/report")
    assert node["staleStatus"] == "STALE" and node["staleCauses"][0]["category"] == "CODE"
    assert "`title`: 'Hello' → 'Hello, again'" in node["description"]
    page.goto(f"{ui_server.base}/assets/hello/report")
    page.get_by_text(re.compile(r"^Unsynced")).first.wait_for()
    wait_for(lambda: shows_after_loading(page, "Changed since the last materialization"),
             "the asset page to show the new definition's description", timeout=300, interval=0)
    page.get_by_text("'Hello' → 'Hello, again'").first.wait_for()
    page.wait_for_load_state("networkidle")
    ui_server.shot("unsynced-asset.png")


def test_a_cache_built_with_another_tokenizer_fails_its_check(ui_server, tokenizer_restored):
    # Someone replaced the tokenizer's files in place: the cache no longer matches what it declares.
    _, other = corpus_and_tokenizer(ui_server.tmp / "other", train_documents=200, validation_documents=10, seed=7,
                                    shards=1, vocab_size=300)
    tokenizer_dir = Path(ui.pipeline["tokenizer"].output_path_under(ui_server.env["MARIN_PREFIX"]))
    (tokenizer_dir / "tokenizer.json").write_bytes((Path(other) / "tokenizer.json").read_bytes())
    run = ui_server.materialize_cli("tokenized/tiny-stories-bpe")
    assert run.returncode != 0  # the check is blocking: the run fails
    checks = {c["name"]: c["executionForLatestMaterialization"]
              for c in ui_server.node("tokenized/tiny-stories-bpe")["assetChecksOrError"]["checks"]}
    assert checks["tokenizer_matches"]["status"] == "FAILED"
    assert checks["tokenizer_matches"]["evaluation"]["success"] is False
    assert "fingerprint" in checks["tokenizer_matches"]["evaluation"]["description"]
    assert checks["cache_not_empty"]["status"] == "SUCCEEDED"

    page = ui_server.page
    page.goto(f"{ui_server.base}/assets/tokenized/tiny-stories-bpe?view=checks")
    page.get_by_text("tokenizer_matches").first.click()
    page.get_by_text("Evaluation result").first.wait_for()
    page.get_by_text("Failed", exact=True).first.wait_for()
    page.wait_for_load_state("networkidle")
    ui_server.shot("failed-check.png")


FRESHNESS_AND_CHECKS = """
query Node($assetKey: AssetKeyInput!) {
  assetNodeOrError(assetKey: $assetKey) {
    ... on AssetNode {
      internalFreshnessPolicy { ... on TimeWindowFreshnessPolicy { failWindowSeconds warnWindowSeconds } }
      freshnessStatusInfo { freshnessStatus }
      assetChecksOrError { ... on AssetChecks { checks {
        name partitionDefinition { description }
        partitionStatuses { ... on AssetCheckDefaultPartitionStatuses { succeededPartitions failedPartitions } }
      } } }
    }
  }
}"""


def test_a_followed_source_shows_its_freshness_and_each_checkpoint_its_own_check(ui_server):
    """Freshness where time means something (a source the source sensor follows: Dagster's freshness daemon,
    part of `dagster dev`, passes it once evaluated) and the per-checkpoint evaluation's check partitioned like
    the asset: each checkpoint's result on its own partition, shown on the Checks tab."""
    source = ui_server.graphql(FRESHNESS_AND_CHECKS, assetKey={"path": ["raw", "ui-followed-docs"]})["assetNodeOrError"]
    assert source["internalFreshnessPolicy"] == {"failWindowSeconds": 7 * 86400, "warnWindowSeconds": 86400}
    page = ui_server.page
    page.goto(f"{ui_server.base}/assets/raw/ui-followed-docs")
    page.get_by_text("Freshness policy").first.wait_for()
    page.get_by_text("Fails if more than 7 days since last materialization").first.wait_for()
    wait_for(lambda: ui_server.graphql(FRESHNESS_AND_CHECKS, assetKey={"path": ["raw", "ui-followed-docs"]})
             ["assetNodeOrError"]["freshnessStatusInfo"]["freshnessStatus"] == "HEALTHY",
             "the freshness daemon to evaluate the followed source (every 30 s)", timeout=180, interval=2)
    page.reload()
    page.get_by_text("Passing", exact=True).first.wait_for()
    ui_server.shot("freshness.png")

    family = ui.per_checkpoint[0]
    node = ui_server.graphql(FRESHNESS_AND_CHECKS, assetKey={"path": family.name.split("/")})["assetNodeOrError"]
    assert node["internalFreshnessPolicy"] is None  # its training had finished when the definitions loaded
    [check] = node["assetChecksOrError"]["checks"]
    assert "Dynamic partitions" in check["partitionDefinition"]["description"]
    statuses = check["partitionStatuses"]
    assert sorted(statuses["succeededPartitions"], key=int) == ["5", "10", "11"] and statuses["failedPartitions"] == []
    page.goto(f"{ui_server.base}/assets/{family.name}?view=checks")
    page.get_by_text(check["name"]).first.wait_for()
    page.get_by_text("Passed", exact=True).first.wait_for()  # the per-partition statuses: asserted above
    page.get_by_text("Partition", exact=True).first.wait_for()  # the latest execution names its checkpoint
    ui_server.shot("partitioned-checks.png")


def test_the_summary_page_shows_its_table_and_plots(ui_server):
    page = ui_server.page
    page.goto(f"{ui_server.base}/assets/reports/ui-sweep")
    page.get_by_text("Metadata", exact=True).first.wait_for()
    for label in ["result.rows", "result.eval_loss_vs_lr", "result.train_loss_curves", "result.varied"]:
        page.get_by_text(label, exact=True).first.wait_for()
    plot = page.locator('.dagster-markdown img[alt="eval loss vs learning rate"]').first
    plot.wait_for()
    assert plot.evaluate("img => img.complete && img.naturalWidth") == 360  # the SVG rendered inline
    page.get_by_text("checkpoints/ui-h48-lr0.01", exact=True).first.wait_for()  # a row of the table
    page.get_by_text("result.eval_loss_vs_lr", exact=True).first.scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    ui_server.shot("experiment-summary.png")
    # the 4 overlaid loss curves show inline too, each with its legend: a colored square per run
    assert page.get_by_text("[Show Markdown]").count() == 0
    curves = page.locator('.dagster-markdown img[alt="train loss"]').first
    curves.wait_for()
    assert curves.evaluate("img => img.complete && img.naturalWidth") == 360
    legend = page.locator(".dagster-markdown").filter(has=page.locator('img[alt="train loss"]')).first.inner_text()
    runs = [(32, 0.001), (32, 0.01), (48, 0.001), (48, 0.01)]
    assert [f"{square} h{h}-lr{lr}" in legend for square, (h, lr) in zip(SQUARES, runs, strict=False)] == [True] * 4
    curves.scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    ui_server.shot("experiment-summary-curves.png")
