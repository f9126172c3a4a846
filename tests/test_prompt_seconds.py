"""A prompt's predicted seconds by its length (Prediction.prompt_seconds, what `inspect` prints): full micro-batches
at the predicted rate, a shorter one paying the weights it moves whole and its share of the matmuls."""

import pytest

from hypura.plan.cost import Prediction


def prediction(parts: dict, n_ubatch: int = 4096) -> Prediction:
    batch_s = max(parts["compute"] + parts["fixed"], parts["link"], parts["disk"])
    return Prediction(10.0, "cpu", n_ubatch / batch_s, "link", prefill_parts=parts, n_ubatch=n_ubatch)


def test_a_short_prompt_beside_op_offload_pays_the_copies_and_its_share_of_compute():
    pr = prediction({"compute": 0.4, "fixed": 0.28, "link": 0.0, "disk": 0.0})
    assert pr.prompt_seconds(4096) == pytest.approx(0.68)
    assert pr.prompt_seconds(1024) == pytest.approx(0.28 + 0.1)
    assert pr.prompt_seconds(4096 + 2048) == pytest.approx(0.68 + 0.28 + 0.2)


def test_a_link_bound_prompt_pays_the_whole_stream_whatever_its_length():
    pr = prediction({"compute": 0.17, "fixed": 0.0, "link": 0.29, "disk": 0.0})
    assert pr.prompt_seconds(512) == pytest.approx(pr.prompt_seconds(4096)) == pytest.approx(0.29)


def test_without_parts_the_rate_stands():
    pr = Prediction(10.0, "cpu", 1000.0, "compute")
    assert pr.prompt_seconds(2048) == pytest.approx(2.048)
