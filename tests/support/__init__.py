"""Helpers shared by the test modules: recipes, engines, subprocess runners. A test module
imports them from here (``from tests.support.engines import make_engine``), never from another
test module; fixtures shared by several modules are in ``tests/conftest.py``."""
