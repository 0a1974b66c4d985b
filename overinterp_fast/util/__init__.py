"""Helpers below every other layer: optional imports (:mod:`.optional`) and durable files (:mod:`.files`).

Nothing here imports the rest of the package; every layer may import it.
"""
