"""Hydra's config groups, shipped with the package as ``nvil.configs`` (``train.yaml``, ``evaluate.yaml``)."""
