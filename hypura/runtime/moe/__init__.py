"""MoE mechanisms: expert caches in GPU slots, disk experts paged by selection, recorded routing."""
