"""Every relative link of the repository's Markdown files resolves: the file exists and, where the
link names an anchor, the target has a heading with that anchor (as GitHub renders it)."""
import glob
import os.path as osp
import re

import pytest

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
LINK = re.compile(r'\[[^\]]*\]\(([^)\s]+)\)')
FENCE = re.compile(r'^\s*(```|~~~)')


def markdown_files() -> list[str]:
    """The Markdown files of the repository (README, docs, tools, configs), relative paths."""
    patterns = ['*.md', 'docs/**/*.md', 'tools/**/*.md', 'configs/**/*.md']
    found = {osp.relpath(f, REPO) for p in patterns
             for f in glob.glob(osp.join(REPO, p), recursive=True)}
    return sorted(found)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text: lower case, every character but letters, digits,
    ``_``, ``-`` and spaces dropped, spaces turned into ``-``."""
    return re.sub(r'[^\w\- ]', '', heading.strip().lower()).replace(' ', '-')


def anchors(path: str) -> set[str]:
    """The anchors of the headings of ``path`` (outside code blocks; repeated headings get
    ``-1``, ``-2``, ... as on GitHub)."""
    seen, found, in_code = {}, set(), False
    with open(path, encoding='utf-8') as f:
        for line in f:
            if FENCE.match(line):
                in_code = not in_code
            elif not in_code and re.match(r'#{1,6} ', line):
                base = slug(line.lstrip('#'))
                count = seen.get(base, 0)
                seen[base] = count + 1
                found.add(base if count == 0 else f'{base}-{count}')
    return found


def links(path: str) -> list[str]:
    """The relative link targets of ``path`` (outside code blocks)."""
    found, in_code = [], False
    with open(path, encoding='utf-8') as f:
        for line in f:
            if FENCE.match(line):
                in_code = not in_code
            elif not in_code:
                found += [t for t in LINK.findall(line)
                          if not re.match(r'[a-z][a-z0-9+.-]*:', t)]  # http:, mailto:, ...
    return found


def test_slug_follows_githubs_anchors():
    assert slug('The main job (`make demo`)') == 'the-main-job-make-demo'
    assert slug('Ratios in one process (`--interleave`)') == 'ratios-in-one-process---interleave'
    assert slug("The four goals on the AMD EPYC, with their intervals") == \
        'the-four-goals-on-the-amd-epyc-with-their-intervals'


def test_anchors_number_repeated_headings(tmp_path):
    doc = tmp_path / 'doc.md'
    doc.write_text('# Title\n## Notes\n```\n# not a heading\n```\n## Notes\n')
    assert anchors(str(doc)) == {'title', 'notes', 'notes-1'}


def test_the_repository_has_markdown_files():
    files = markdown_files()
    assert 'README.md' in files and 'docs/results.md' in files


@pytest.mark.parametrize('relpath', markdown_files())
def test_relative_links_resolve(relpath):
    here = osp.dirname(osp.join(REPO, relpath))
    broken = []
    for target in links(osp.join(REPO, relpath)):
        path, _, anchor = target.partition('#')
        dest = osp.normpath(osp.join(here, path)) if path else osp.join(REPO, relpath)
        if not osp.exists(dest):
            broken.append(f'{target}: no such file')
        elif anchor and dest.endswith('.md') and anchor not in anchors(dest):
            broken.append(f'{target}: no heading #{anchor} in {osp.relpath(dest, REPO)}')
    assert not broken, f'{relpath}: ' + '; '.join(broken)
