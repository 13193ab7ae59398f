"""Training steps for models that compute their own loss: Hugging Face ``transformers`` models
(:mod:`sparkdl.adapters.huggingface`) and Lightning modules (:mod:`sparkdl.adapters.lightning`);
pretrained Hugging Face models given by where they are stored, LoRA included
(:class:`PretrainedModel`, :mod:`sparkdl.adapters.pretrained`), their adapters saved in
``peft``'s format (:mod:`sparkdl.adapters.adapter_files`), and text columns tokenized on the
executors (:mod:`sparkdl.adapters.tokenization`).

Each adapter turns the model's own training code into a ``training_step``
(:mod:`sparkdl.training_step`) for :class:`sparkdl.DistriOptimizer` or the estimators'
``trainingStep``. Neither imports its framework: install it as the extra ``sparkdl-torch[huggingface]``
or ``sparkdl-torch[lightning]`` where the model is built.

Example::

    from sparkdl.adapters import huggingface_step, lightning_arguments
    DistriOptimizer(bert, rdd, optimizer=opt, batch_size=32,
                    training_step=huggingface_step(("input_ids", "attention_mask")))
    DistriOptimizer(module, rdd, batch_size=32, **lightning_arguments(module))
"""

from .huggingface import HuggingFaceStep, huggingface_step
from .lightning import LightningStep, lightning_arguments, lightning_step
from .adapter_files import load_adapter, merged_model, save_adapter
from .pretrained import PretrainedModel
from .tokenization import tokenize_column

__all__ = ["HuggingFaceStep", "huggingface_step", "LightningStep", "lightning_step",
           "lightning_arguments", "PretrainedModel", "save_adapter", "load_adapter",
           "merged_model", "tokenize_column"]
