"""What the documentation says.

- It speaks the API's current names: no page (README.md, docs/ but the notes of past runs in docs/notes/) and no
  example uses a renamed keyword as if it were current. Only the paragraphs that explain the earlier names (they
  say "earlier name") name them.
- It says what the software does and what was measured, never how the machines that measured it were lent: no
  time allowances of a borrowed machine, nothing carried to one, no GPU time spent.
"""
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


LENDING = re.compile(r"\blent\b|\blend(s|ing)?\b|\bborrow|\bto carry\b|carry=|\.whl/?`?\s+carried|device tool|GPU time|"
                     r"GPU minute|went cold|window's limit|too large to carry", re.IGNORECASE)


def test_lending_talk_is_found():
    for line in ("A lent GPU machine comes in short windows", "the script's header says how to carry their wheels",
                 "(it came after the GPU time was spent)", "builds again only if the machine went cold",
                 "pass carry=[\".whl\"]", "with the wheels of `.whl/` carried"):
        assert LENDING.search(line), line
    for line in ("its 82 calls carry the set-up of a job", "the extension carried its own libstdc++",
                 "a step's 100 s timeout", "calendar", "the lender's id"):
        assert not LENDING.search(line), line


def test_the_docs_never_say_how_the_measuring_machines_were_lent():
    files = pages() + [os.path.join(ROOT, "scripts", "gpu_check.sh")]
    benchmarks = os.path.join(ROOT, "benchmarks")
    files += [os.path.join(benchmarks, f) for f in os.listdir(benchmarks) if f.endswith((".py", ".md"))]
    for folder, _, names in os.walk(os.path.join(ROOT, "docs", "notes")):
        files += [os.path.join(folder, f) for f in names if f.endswith((".md", ".txt"))]
    found = [f"{os.path.relpath(path, ROOT)}:{n}: {line.strip()}" for path in files
             for n, line in enumerate(open(path, encoding="utf-8"), 1) if LENDING.search(line)]
    assert not found, "\n".join(found)
