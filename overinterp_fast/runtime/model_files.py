"""What a model file holds, read from its first bytes and its zip directory (nothing unpickled, nothing run): the
kinds of torch file that are not ONNX models, so that a path given where an ONNX model goes is refused in one line
that names what the file is and the loader that reads it.

    torch_file_kind("cnn.ts")      # TORCHSCRIPT
    not_onnx_message("cnn.ts")     # "'cnn.ts' is a TorchScript archive (torch.jit.save), and a model given by ..."
"""
from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass

LOADER = "overinterp_fast.zoo.models.load_model"  # reads every kind below (the command line's --model)
PICKLE_START = b"\x80"  # the first byte of a pickle of protocol 2 or later: torch.save's format before its zip one


@dataclass(frozen=True)
class FileKind:
    """A kind of torch model file. ``what``: how a message names it; ``suffixes``: the names the loader reads it
    under (:func:`overinterp_fast.zoo.models.load_model` chooses its reader by the file's suffix)."""

    what: str
    suffixes: tuple[str, ...]


TORCHSCRIPT = FileKind("a TorchScript archive (torch.jit.save)", (".ts", ".pt", ".pth"))
EXPORTED = FileKind("a torch.export program (torch.export.save)", (".pt2",))
PICKLED = FileKind("a torch.save file (a pickled model or a state dict)", (".pt", ".pth"))


def torch_file_kind(path: str | os.PathLike) -> FileKind | None:
    """Which torch file ``path`` is: a zip archive with code (TorchScript), with an ``archive_format`` entry (a
    ``torch.export`` program) or with a ``data.pkl`` (``torch.save``), or a bare pickle (``torch.save`` before
    its zip format); None for anything else (an ONNX model, another file, or one that cannot be read)."""
    path = os.fspath(path)
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                names = zf.namelist()
            if any("/code/" in n for n in names):
                return TORCHSCRIPT
            if any(n.endswith("/archive_format") for n in names):
                return EXPORTED
            return PICKLED if any(n.endswith("data.pkl") for n in names) else None
        with open(path, "rb") as fh:
            return PICKLED if fh.read(1) == PICKLE_START else None
    except (OSError, zipfile.BadZipFile):
        return None


def not_onnx_message(path: str | os.PathLike) -> str | None:
    """One line for a path given as an ONNX model that holds a torch model instead: what the file is and how to
    load it (:data:`LOADER`, which reads it by its suffix: a file under another name is to be renamed first);
    None when the file is no torch file."""
    kind = torch_file_kind(path)
    if kind is None:
        return None
    path = os.fspath(path)
    head = f"{path!r} is {kind.what}, and a model given by its path must be an ONNX file"
    if os.path.splitext(path)[1].lower() in kind.suffixes:
        return f"{head}: load this one with {LOADER}({path!r}).model and pass the module"
    return (f"{head}: give this one a {', '.join(kind.suffixes)} name, then load it with {LOADER}(path).model "
            f"(the suffix chooses the reader, as for the command line's --model)")
