"""The tier runtime: what moves weights between the tiers while llama.cpp loads and computes.

Common pieces here (placement hooks, pools, routers, the read pipeline, transfers, stats); dense
layer streaming in `dense/`, MoE mechanisms in `moe/`.
"""
