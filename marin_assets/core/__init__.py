"""The core: steps, identity, status and lease, records, execution, plan, Dagster adapter."""
