"""The extender's local control plane for `kubectl gpushare` tests: tests/extender/conftest.py
loaded by path (two conftest modules cannot both be imported as ``conftest``), its fixtures
re-exported here. A session in this directory gets a small cluster of its own (2 nodes of 2
T4) with kube-scheduler calling a real extender."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "gpushare_extender_fixtures_for_cli", Path(__file__).parents[1] / "extender" / "conftest.py"
)
assert _spec is not None and _spec.loader is not None
_extender = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _extender  # its dataclasses look their module up
_spec.loader.exec_module(_extender)

k8s_bin_dir = _extender.k8s_bin_dir
extender_cluster = _extender.extender_cluster
ekube = _extender.ekube
ens = _extender.ens
ewatch = _extender.ewatch
