"""The one precedence of llama.cpp parameter changes (hypura/runtime/params.py)."""

import llama_cpp
import pytest

import hypura  # noqa: F401  first: our library
from hypura.errors import HypuraError
from hypura.runtime.params import LlamaParams


def test_what_the_plan_needs_is_set_and_the_callers_dict_stays_its_own():
    given = {"model_params": {"check_tensors": True}}
    params = LlamaParams(given)
    params.need("model_params", "the plan's placement", n_gpu_layers=33)
    params.need("context_params", "the plan's KV cache tier", offload_kqv=False)
    assert params.merged() == {"model_params": {"check_tensors": True, "n_gpu_layers": 33},
                               "context_params": {"offload_kqv": False}}
    assert given == {"model_params": {"check_tensors": True}}


def test_a_caller_value_that_contradicts_the_plan_is_refused():
    params = LlamaParams({"model_params": {"n_gpu_layers": 10}})
    with pytest.raises(HypuraError, match=r"model_params.n_gpu_layers=10 contradicts the plan, which needs 33"):
        params.need("model_params", "the plan's placement", n_gpu_layers=33)


def test_llama_cpps_own_defaults_are_no_choice_and_yield():
    default = llama_cpp.llama_model_default_params()
    params = LlamaParams({"model_params": {"n_gpu_layers": default.n_gpu_layers, "use_extra_bufts": True}})
    params.need("model_params", "experts paged from disk", use_extra_bufts=False, n_gpu_layers=0)
    assert params.merged()["model_params"] == {"n_gpu_layers": 0, "use_extra_bufts": False}


def test_the_decisions_fields_go_over_the_callers_and_under_the_plans_needs():
    params = LlamaParams({"model_params": {"load_mode": llama_cpp.LLAMA_LOAD_MODE_MMAP, "check_tensors": True},
                          "context_params": {"n_ubatch": 512}})
    params.decided("model_params", n_gpu_layers=-1, load_mode=llama_cpp.LLAMA_LOAD_MODE_NONE)
    params.decided("context_params", n_ubatch=2048)
    params.need("model_params", "the plan's placement", n_gpu_layers=5)
    assert params.merged() == {"model_params": {"n_gpu_layers": 5, "load_mode": llama_cpp.LLAMA_LOAD_MODE_NONE,
                                                "check_tensors": True},
                               "context_params": {"n_ubatch": 2048}}


def test_an_unknown_params_struct_is_refused():
    with pytest.raises(HypuraError, match="param_overrides takes model_params and context_params"):
        LlamaParams({"model_parms": {}})
