"""No import cycle anywhere in the package (module-level and function-level imports)."""
import ast
import os

from repo_files import REPO


def _modules() -> dict:
    mods = {}
    for dirpath, _, files in os.walk(os.path.join(REPO, 'mmdinomamba')):
        for f in files:
            if f.endswith('.py'):
                path = os.path.join(dirpath, f)
                name = os.path.relpath(path, REPO)[:-3].replace(os.sep, '.')
                mods[name[:-len('.__init__')] if name.endswith('.__init__') else name] = path
    return mods


def _imports(name: str, path: str, mods: dict) -> set:
    """The package modules ``name`` imports (``from pkg import sub`` counts as ``pkg.sub``)."""
    package = name if path.endswith('__init__.py') else name.rpartition('.')[0]
    out = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                parts = package.split('.')
                base = '.'.join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            targets = [f'{base}.{a.name}' if f'{base}.{a.name}' in mods else base
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in mods:
                t = t.rpartition('.')[0]
            if t and t != name:
                out.add(t)
    return out


def test_no_import_cycles():
    mods = _modules()
    graph = {m: _imports(m, p, mods) for m, p in mods.items()}
    done, path, cycles = set(), [], []

    def visit(m):
        if m in path:
            cycles.append(path[path.index(m):] + [m])
            return
        if m in done:
            return
        path.append(m)
        for n in sorted(graph[m]):
            visit(n)
        path.pop()
        done.add(m)

    for m in sorted(graph):
        visit(m)
    assert not cycles, ' ; '.join(' -> '.join(c) for c in cycles)
