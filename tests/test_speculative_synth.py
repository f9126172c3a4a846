"""`hypura synth --draft-for`: a draft whose greedy tokens agree with its synthetic target about as
often as asked, measured by running both (teacher-forced over random tokens)."""

import numpy as np
from click.testing import CliRunner

from hypura.synth import write_synth
from hypura.synth.routing import Routing


def _argmax_per_position(path, tokens, n_threads):
    from hypura import Llama

    llm = Llama(str(path), n_ctx=512, n_threads=n_threads, n_threads_batch=n_threads, verbose=False, logits_all=True)
    try:
        llm.eval(tokens)
        return np.argmax(llm.scores[: len(tokens)], axis=1)
    finally:
        llm.close()


def test_draft_for_sets_agreement(tmp_path, n_threads):
    from hypura.cli.main import cli

    target = tmp_path / "target.gguf"
    write_synth("tiny-llama", target, routing=Routing(out_scale=1e-6))  # follows its embeddings
    tokens = np.random.default_rng(1).integers(0, 8000, 256).tolist()
    want = _argmax_per_position(target, tokens, n_threads)
    for agreement in (0.6, 0.9):
        draft = tmp_path / f"draft-{agreement}.gguf"
        r = CliRunner().invoke(cli, ["synth", "--draft-for", str(target), str(draft), "--agreement", str(agreement)])
        assert r.exit_code == 0, r.output
        got = _argmax_per_position(draft, tokens, n_threads)
        assert abs(np.mean(got == want) - agreement) < 0.12, (agreement, np.mean(got == want))
