"""The LoRA benchmarks' own arithmetic: the bases' sizes and the per-iteration medians."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "bench"))

from llama_bases import CONFIGS, parameter_count  # noqa: E402
from lora_vs_td import per_iteration_s  # noqa: E402


@pytest.mark.parametrize("name", list(CONFIGS))
def test_parameter_count_is_the_built_models(name):
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=False, **CONFIGS[name]))
    assert parameter_count(name) == sum(p.numel() for p in model.parameters())


def test_the_100m_base_is_about_100m():
    assert 90e6 < parameter_count("100M") < 110e6


def test_per_iteration_of_synchronous_marks_skips_the_warmup():
    marks = [(1, 0.0), (2, 5.0), (3, 6.0), (4, 8.0), (5, 9.0), (6, 10.5)]
    # after 2 warm-up iterations: 1.0, 2.0, 1.0, 1.5
    assert per_iteration_s(marks, 1, 2) == pytest.approx(1.25, abs=1e-12)


def test_per_iteration_of_rounds_takes_each_round_over_its_iterations():
    # a trigger asked for every iteration of a round at its end: bursts of 4 marks
    marks = [(i, t + 1e-4 * (i % 4)) for i, t in
             [(1, 1.0), (2, 1.0), (3, 1.0), (4, 1.0), (5, 5.0), (6, 5.0), (7, 5.0), (8, 5.0),
              (9, 7.0), (10, 7.0), (11, 7.0), (12, 7.0), (13, 13.0), (14, 13.0), (15, 13.0),
              (16, 13.0)]]
    # rounds ending at 8, 12, 16 after a warm-up of 4: 4 s, 2 s, 6 s over 4 iterations each
    assert per_iteration_s(marks, 4, 4) == pytest.approx(1.0, abs=1e-12)
    assert per_iteration_s(marks + [(16, 99.0)], 4, 4) == pytest.approx(1.0, abs=1e-12)


def test_per_iteration_without_a_timed_turn_says_so():
    with pytest.raises(ValueError, match="no timed turn of 4"):
        per_iteration_s([(4, 1.0), (8, 2.0)], 4, 8)
