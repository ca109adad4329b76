"""A Griffe extension for the API reference: the checkout's ``models/`` and ``estimators/`` folders install as
``nvil.models`` and ``nvil.estimators`` (pyproject.toml, ``[tool.setuptools.package-dir]``), which Griffe's static
finder cannot see from ``nvil/``. When the ``nvil`` package is loaded, this loads both folders from the source, with
the same docstring settings, and attaches them to it under those names, so ``::: nvil.models.SBN`` resolves without
importing torch."""

from __future__ import annotations

from pathlib import Path

import griffe

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("models", "estimators")  # checkout folder = its name under nvil


class NvilLayout(griffe.Extension):
    """Load ``models/`` as ``nvil.models`` and ``estimators/`` as ``nvil.estimators`` beside ``nvil/``."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs) -> None:
        if pkg.name != "nvil":
            return
        folders = griffe.GriffeLoader(search_paths=[str(ROOT)], docstring_parser=loader.docstring_parser,
                                      docstring_options=loader.docstring_options,
                                      lines_collection=loader.lines_collection)
        for name in FOLDERS:
            if name not in pkg.members:
                pkg.set_member(name, folders.load(name, try_relative_path=False))
