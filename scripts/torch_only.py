"""Make FOLDER hold torch alone: symlinks to the installed torch and to every distribution it requires (its
extras' requirements included: cuda-toolkit[cublas, ...]), files and metadata both, and nothing else.

    python scripts/torch_only.py FOLDER

A new virtual environment whose site-packages holds a .pth file naming FOLDER then imports this torch (and pip
counts it as installed) without copying its gigabytes: scripts/check_fresh_install.sh installs the package into
such an environment. Run it with the interpreter whose torch is meant.
"""
import importlib.metadata as md
import os
import sys

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def torch_closure() -> dict[str, md.Distribution]:
    """torch and what it requires, recursively, as installed here (markers evaluated, extras followed)."""
    found: dict[str, md.Distribution] = {}
    extras: dict[str, set[str]] = {"torch": {""}}
    todo = ["torch"]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found[name] = dist = md.distribution(name)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras.get(name, {""})):
                dep = canonicalize_name(req.name)
                extras.setdefault(dep, {""}).update(req.extras)
                todo.append(dep)
    return found


def link(folder: str) -> list[str]:
    """Symlink into ``folder`` the top-level entries (packages, modules, .dist-info) of torch's closure."""
    os.makedirs(folder, exist_ok=True)
    for dist in torch_closure().values():
        base = str(dist.locate_file(""))
        for top in sorted({p.parts[0] for p in dist.files or [] if p.parts and p.parts[0] != ".."}):
            src, dst = os.path.join(base, top), os.path.join(folder, top)
            if os.path.exists(src) and not os.path.lexists(dst) and not top.endswith(".pth"):
                os.symlink(src, dst)
    return sorted(os.listdir(folder))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    link(sys.argv[1])
