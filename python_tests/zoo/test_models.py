"""Models by name or file as a library function (zoo/models.py); cli/test_loading.py loads every kind of file."""
import overinterp_fast.cli.loading as cli_loading
from overinterp_fast.zoo import models


def test_the_command_lines_module_is_the_librarys():
    """``overinterp_fast.cli.loading.load_model`` (the import path before) is the library's function."""
    assert cli_loading.load_model is models.load_model and cli_loading.LoadedModel is models.LoadedModel
    assert "cli" not in models.load_model.__module__
