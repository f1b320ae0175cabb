"""The pipeline library: plain functions that write an output, and factories returning steps."""
