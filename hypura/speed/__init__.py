"""`hypura bench`: measured speed beside the bound, llama-bench and llama-batched-bench style.

    bound.py        the one bound: a decode step of b tokens at each path's measured rate (a plan's, or
                    llama.cpp's resident placement), and an expert cache's at its measured hit rate
    single.py       one sequence: prefill of p tokens (a sweep of p: the verification-cost curve) and decode
    batched.py      the batched engine at B sequences: aggregate prefill and decode
    speculative.py  speculative decoding beside plain: tok/s, accepted tokens a pass, the pass's bound
    run.py          the run: load as hypura-cli loads (the one decision), measure, the result as one dict
    report.py       the lines printed
"""
