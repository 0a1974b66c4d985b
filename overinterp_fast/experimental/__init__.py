"""Research options of the responsibility method: surrogate (virtual and gated) descents and the mutant memory.

They are measured and tested but no default uses them; their interface may change.
"""
