"""One sensor tick without the daemon (`marin-assets tick`, what make demo runs): the partitions the sensor
adds or deletes, each request run in this process and recorded in the instance with the sensor's tags, a failed
run reported without stopping the rest, and a run key that already succeeded skipped on the next tick.
(The browser test ticks the real checkpoint sensor through the CLI.)"""

import dagster as dg

from marin_assets.dagster.sensor_tick import tick_sensor

letters = dg.DynamicPartitionsDefinition(name="letters")
made: list[str] = []


@dg.asset(partitions_def=letters)
def letter(context: dg.AssetExecutionContext) -> None:
    if context.partition_key == "bad":
        raise ValueError("a bad letter")
    made.append(context.partition_key)


@dg.sensor(asset_selection=dg.AssetSelection.assets(letter))
def letters_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    return dg.SensorResult(
        run_requests=[dg.RunRequest(run_key=f"letter:{k}", partition_key=k) for k in ("a", "b", "bad")],
        dynamic_partitions_requests=[letters.build_add_request(["a", "b", "bad", "old"]),
                                     letters.build_delete_request(["old"])])


@dg.sensor(asset_selection=dg.AssetSelection.assets(letter))
def idle_sensor(context: dg.SensorEvaluationContext) -> dg.SkipReason:
    return dg.SkipReason("nothing new")


def test_a_tick_adds_partitions_runs_its_requests_here_and_skips_what_already_succeeded():
    defs = dg.Definitions(assets=[letter], sensors=[letters_sensor, idle_sensor])
    with dg.instance_for_test() as instance:
        runs, skip = tick_sensor(defs, "letters_sensor", instance)
        assert skip is None
        assert [(r.partition_key, r.outcome, r.assets) for r in runs] == [
            ("a", "succeeded", ("letter",)), ("b", "succeeded", ("letter",)), ("bad", "failed", ("letter",))]
        assert made == ["a", "b"]
        assert instance.get_dynamic_partitions("letters") == ["a", "b", "bad"]  # "old" added, then deleted
        assert instance.get_materialized_partitions(letter.key) == {"a", "b"}
        [run] = instance.get_runs(filters=dg.RunsFilter(tags={"dagster/run_key": "letter:a"}))
        assert run.run_id == runs[0].run_id and run.tags["dagster/sensor_name"] == "letters_sensor"

        again, _ = tick_sensor(defs, "letters_sensor", instance)
        assert [(r.partition_key, r.outcome) for r in again] == [("a", "skipped"), ("b", "skipped"),
                                                                  ("bad", "failed")]  # a failure is tried again
        assert made == ["a", "b"]

        assert tick_sensor(defs, "idle_sensor", instance) == ([], "nothing new")
