"""The execution layer: where a step's function runs.

`requests` maps a step's `Resources` to what Ray is asked for (CPU/GPU/TPU slice arithmetic,
feasibility), with no Ray import; `ray_runner` runs the function on Ray and relays its output.
Both use the protocol (`marin_assets.core`); neither knows Dagster.
"""
