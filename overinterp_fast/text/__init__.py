"""Text classifiers: input reduction (Feng et al. 2018) and token SIS with masking (docs: algorithms.md, Input reduction)."""
from .mitigation import EntropyFinetune, entropy_finetune
from .model import HFSequenceClassifier, TextModelFn
from .reduction import InputReduction, Reduction, input_reduction
from .sis import token_sis

__all__ = ["input_reduction", "token_sis", "entropy_finetune", "EntropyFinetune", "InputReduction", "Reduction", "HFSequenceClassifier", "TextModelFn"]
