"""ml_collections configs: ``configs/<arch>_<size>.py`` are thin files over ``base.py``."""
