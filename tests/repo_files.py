"""Load the repository's scripts (``tools/...``) and test helpers as modules in tests."""
import importlib.util
import os.path as osp

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))


def load_file(relpath: str):
    """The module of ``REPO/relpath`` (a script under tools/ or a test helper), executed anew."""
    name = '_' + relpath.replace('/', '_').replace('.', '_')
    spec = importlib.util.spec_from_file_location(name, osp.join(REPO, relpath))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
