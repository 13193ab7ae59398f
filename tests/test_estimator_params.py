"""The estimators spell their Params out in ``__init__`` and ``setParams`` (as pyspark.ml's own
estimators do), so that help(), the API reference and IDEs list them: the written signatures
cannot drift from the Params (every Param present, with its default)."""

from __future__ import annotations

import inspect
import pydoc

import pytest
import torch

from sparkdl import InvalidArgumentError, NNClassifier, NNClassifierModel, NNEstimator, NNModel
from sparkdl.ml.estimators import OBJECT_ARGUMENTS

ESTIMATORS = [NNEstimator, NNClassifier]


def keywords(cls: type, method: str) -> dict[str, inspect.Parameter]:
    params = dict(inspect.signature(getattr(cls, method)).parameters)
    params.pop("self")
    return params


@pytest.mark.parametrize("method", ["__init__", "setParams"])
@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda c: c.__name__)
def test_signature_lists_every_param_with_its_default(cls, method):
    stage = cls()
    params = {p.name for p in stage.params}
    signature = keywords(cls, method)
    assert params - set(signature) == set(), "Params missing from the signature"
    others = set(signature) - params
    assert others == (set(OBJECT_ARGUMENTS) - {"lrScheduler"} if method == "__init__"
                      else set())
    for name, parameter in signature.items():
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, name
        assert parameter.annotation is not inspect.Parameter.empty, name
        if name in params:
            default = stage.getOrDefault(name)
            assert parameter.default == default and \
                type(parameter.default) is type(default), (name, parameter.default, default)
        else:
            assert parameter.default is None, name


@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda c: c.__name__)
def test_help_shows_the_params_and_their_defaults(cls):
    text = pydoc.render_doc(cls, renderer=pydoc.plaintext)
    for shown in ("batchSize: 'int' = 128", "featuresCols: 'list[str]' = []",
                  "optimizer: 'str' = 'adam'", "progressBar: 'bool' = True"):
        assert text.count(shown) == 3, shown   # the class's call, __init__ and setParams
    assert text.count("criterion: 'Callable[..., Any] | None' = None") == 2   # not setParams
    assert ("probabilityCol: 'str' = 'probability'" in text) == (cls is NNClassifier)


@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda c: c.__name__)
def test_constructor_sets_what_it_is_given_and_nothing_else(cls):
    net = torch.nn.Linear(4, 2)
    schedule = lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1)  # noqa: E731
    stage = cls(model=net, criterion=torch.nn.CrossEntropyLoss(), batchSize=32,
                featuresCols=["a", "b"], lrScheduler=schedule, outerOptimizer="nesterov")
    assert stage.model_spec is net and isinstance(stage.criterion, torch.nn.CrossEntropyLoss)
    assert stage.getBatchSize() == 32 and stage.getFeaturesCols() == ["a", "b"]
    assert stage.getLrScheduler() is schedule and stage.getOuterOptimizer() == "nesterov"
    explicit = {p.name for p in stage.params if stage.isSet(p)}
    assert explicit == {"batchSize", "featuresCols", "lrScheduler", "outerOptimizer"}
    assert cls().getFeaturesCols() == [] and cls().getFeaturesCols() is not \
        cls().getFeaturesCols()


@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda c: c.__name__)
def test_set_params_sets_only_the_given_params(cls):
    stage = cls(maxEpoch=4, learningRate=0.1)
    assert stage.setParams(batchSize=16, learningRate=0.5) is stage
    assert (stage.getBatchSize(), stage.getLearningRate(), stage.getMaxEpoch()) == (16, 0.5, 4)
    assert not stage.isSet("seed")
    with pytest.raises(InvalidArgumentError, match="'lrScheduler' Param of .* must be callable"):
        stage.setParams(lrScheduler="step")


@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda c: c.__name__)
def test_unknown_keywords_are_refused_with_the_params_and_a_suggestion(cls):
    name = cls.__name__
    with pytest.raises(InvalidArgumentError,
                       match=rf"^{name} has no Param 'learning_rate'; its Params are \['batchSize'"
                             r".*, and it also takes augment, collate, criterion, initialModel, "
                             r"model, optimizerFactory, preprocess, trainingStep, validationStep\."
                             r" Did you mean 'learningRate'\?$"):
        cls(learning_rate=0.1)
    with pytest.raises(InvalidArgumentError,
                       match=rf"^{name} has no Param 'model'; its Params are \[.*\]\.$"):
        cls().setParams(model=torch.nn.Linear(4, 2))      # an object, not a Param
    with pytest.raises(TypeError, match="forces keyword arguments"):
        cls(torch.nn.Linear(4, 2))


@pytest.mark.parametrize("cls", [NNModel, NNClassifierModel], ids=lambda c: c.__name__)
def test_fitted_models_refuse_unknown_params(cls):
    model = cls(torch.nn.Linear(4, 2))
    assert model.setParams(inferenceBatchSize=8) is model and model.getInferenceBatchSize() == 8
    with pytest.raises(InvalidArgumentError,
                       match=rf"^{cls.__name__} has no Param 'batchsize'; its Params are .*"
                             r" Did you mean 'batchSize'\?$"):
        model.setParams(batchsize=8)
