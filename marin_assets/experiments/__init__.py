"""Experiments: lists of steps built with the pipeline library's factories."""
