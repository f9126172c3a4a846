"""The tier runtime: what moves weights between the tiers while llama.cpp loads and computes.

Common pieces here; dense layer streaming in `dense/`, MoE mechanisms in `moe/`.

    runtime.py        Runtime: the composition root of one model, owning every lifetime
    params.py         the decision's llama.cpp fields over the caller's, with one precedence
    device_list.py    the ggml devices list a load hands llama.cpp: RPC servers registered and measured, --device
    placement.py      loader hooks across the cffi boundary: place() and fill() for each tensor
    plan_policy.py    a Plan as a placement policy
    overrides.py      `-ot PATTERN=BUFFER_TYPE` as a placement policy
    load_reads.py     whether a load reads the file through the page cache or around it (O_DIRECT)
    mapped_weights.py RAM weights at home in the mapped file, pinned where they lie
    mechanism.py      Mechanism, the interface of decode-time tier mechanisms, and TierStats, their one stats type
    router.py         MoE routers' choices as the compute hooks report them
    read_pipeline.py  reads of many file ranges that keep the disk busy while the caller copies
    transfers.py      streamed layers loaded into their pool slots, on one loader thread
    stats.py          per-token metrics of a run, beside the plan's prediction
"""
