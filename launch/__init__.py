"""Thin absl entry points; the logic lives in hwh_jax and is tested there."""
