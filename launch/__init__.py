"""Thin absl entry points; the logic lives in hwh_jax and is tested there."""
import logging


def setup_logging() -> None:
    """INFO from the project's loggers; absl (Orbax's per-save chatter) only from WARNING."""
    logging.getLogger().setLevel(logging.INFO)
    logging.getLogger("absl").setLevel(logging.WARNING)
