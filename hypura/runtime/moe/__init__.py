"""MoE mechanisms: expert caches in GPU slots, disk experts paged by selection, recorded routing.

    expert_streaming.py  ExpertStreamer: slots that small batches compute from, filled as routers select
    expert_cache.py      a layer's cache of expert slots and the policies that choose a miss's victim
    expert_paging.py     ExpertPager: disk-tier experts read when a router selects them, dropped again
    disk_probe.py        the rate the disk gives a decode's expert reads now
    coactivation.py      the routing recorder, and which experts fire at layer l+1 given those at l
"""
