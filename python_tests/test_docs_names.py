"""The documentation speaks the API's current names: no page (README.md, docs/ but the notes of past runs in
docs/notes/) and no example uses a renamed keyword as if it were current. Only the paragraphs that explain the
earlier names (they say "earlier name") name them."""
import os
import re

import pytest

from overinterp_fast.attr._base import DATA_RENAMES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pages() -> list[str]:
    """README.md, the docs' pages outside docs/notes/ (records of past runs, in the names of their day) and the
    examples' scripts."""
    out = [os.path.join(ROOT, "README.md")]
    for folder, subfolders, files in os.walk(os.path.join(ROOT, "docs")):
        subfolders[:] = [s for s in subfolders if s != "notes"]
        out += [os.path.join(folder, f) for f in files if f.endswith(".md")]
    examples = os.path.join(ROOT, "examples")
    return out + [os.path.join(examples, f) for f in os.listdir(examples) if f.endswith(".py")]


def stale_uses(text: str, old: str) -> list[str]:
    """The paragraphs of ``text`` that use the keyword ``old`` (as `old` or old=), but for those about the earlier
    names."""
    use = re.compile(rf"`{old}`|(?<![\w.]){old}\s*=(?!=)")
    return [p.strip() for p in re.split(r"\n\s*\n", text)
            if use.search(p) and "earlier name" not in " ".join(p.lower().split())]


def test_stale_uses_are_found():
    assert stale_uses("An integer feature map (`features` in `fast_sis`).", "features")
    assert stale_uses("audit.RunOptions(progress=False)", "progress")
    assert not stale_uses("audit.RunOptions(show_progress=False); res.features = 3; x == progress", "progress")
    assert not stale_uses("The earlier\nnames still work: `mask_value` (now `baselines`).", "mask_value")


@pytest.mark.parametrize("old", sorted(DATA_RENAMES))
def test_the_docs_use_the_current_keyword_names(old):
    found = {os.path.relpath(page, ROOT): uses for page in pages()
             if (uses := stale_uses(open(page, encoding="utf-8").read(), old))}
    assert not found, f"{old!r} (now {DATA_RENAMES[old]!r}) used in {found}"
