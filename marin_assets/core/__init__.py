"""The protocol, the bottom layer: what a step is and how its output is made exactly once.

`step` (the `Step` description of one output) and `identity` (the hash of what produces it); `status`,
`lease`, `decision` and `stores` (one small status object next to each output, and who may compute it, on
local disks, GCS, S3 and other fsspec stores); `materialize` (status and lease, the function, its checks,
the `.artifact.json` record of `record` with its typed result from `results`, then SUCCESS), `interrupt`
(a step stopped when its lease is lost), `light`, `checks`, `files`, `paths`, `provenance` and `versions`;
`plan`, and the priced plan (`estimate`, `pricing`, `prices`, `throughput`, `priced_plan`); `gc` (unreferenced
outputs deleted through the lease).

It reads nothing of the project above it and imports neither Dagster nor Ray, Levanter or JAX (`make lint`
checks this): the execution layer, the pipeline and the Dagster layer are built on it. Users take its names
from `marin_assets` (`Step`, `materialize_step`, `load_result`, …) and the step factories from the front
door, `marin_assets.steps`; the module paths here may change (docs/stability.md).
"""
